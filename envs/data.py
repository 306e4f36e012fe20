"""Where offline data lives. One lookup, one clear error."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "FLYWHEEL_DATA_DIR"


class MissingDataError(FileNotFoundError):
    pass


def data_dir() -> Path:
    """`$FLYWHEEL_DATA_DIR`, else `../shared/data` beside the repository."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def require(relative: str) -> Path:
    """Path of a required data file, or an error that says how to fix it."""
    path = data_dir() / relative
    if not path.exists():
        raise MissingDataError(
            f"Missing data file {path}. Put the project's shared data there or set "
            f"{ENV_VAR} to the folder that holds '{relative}'."
        )
    return path


CACHE_ENV_VAR = "FLYWHEEL_CACHE_DIR"


def cache_dir() -> Path:
    """Writable folder for unpacked data and converted models (`$FLYWHEEL_CACHE_DIR`, else `<repo>/.cache`)."""
    root = os.environ.get(CACHE_ENV_VAR)
    path = Path(root).expanduser() if root else Path(__file__).resolve().parents[1] / ".cache"
    path.mkdir(parents=True, exist_ok=True)
    return path
