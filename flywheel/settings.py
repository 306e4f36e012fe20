"""Project paths that every layer agrees on, overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def runs_dir() -> Path:
    """Where the store and checkpoints live (`$FLYWHEEL_RUNS_DIR`, else `<repo>/runs`)."""
    return Path(os.environ.get("FLYWHEEL_RUNS_DIR", REPO_ROOT / "runs")).expanduser()


def default_base_model() -> str:
    return os.environ.get("FLYWHEEL_BASE_MODEL", str(REPO_ROOT / ".cache" / "models" / "smollm2-135m"))


def max_iteration() -> int:
    """Highest iteration partition k (iterations are 0..K)."""
    value = int(os.environ.get("FLYWHEEL_MAX_ITERATION", "3"))
    if value < 0:
        raise ValueError(f"FLYWHEEL_MAX_ITERATION must be >= 0, got {value}")
    return value
