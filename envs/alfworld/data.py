"""ALFWorld game files on disk: one lazy, atomic unpack plus a small index.

The shared archive holds only `game.tw-pddl` files. ALFWorld's own tools also
want `logic/` (shipped in the alfworld wheel) and a `traj_data.json` per game
(rebuilt here from the ALFRED folder name). Everything is built in a temporary
folder and renamed into place, so a killed unpack leaves nothing half-done.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import lzma
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from envs.data import MissingDataError, cache_dir, data_dir

ARCHIVE = "alfworld/json_2.1.1_tw-pddl.tar.xz"
ENV_VAR = "FLYWHEEL_ALFWORLD_DIR"
JSON_DIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
INDEX_FILE = "flywheel_index.json"
LOGIC_FILES = ("alfred.pddl", "alfred.twl2")
SPLIT_FOLDERS = ("train", "valid_seen", "valid_unseen", "valid_train")

_GOAL_RE = re.compile(r"Your task is to: ([^\"\n\\]*)")


def archive_path() -> Path:
    """The shared tar.xz, or an error that says how to get the data."""
    path = data_dir() / ARCHIVE
    if not path.exists():
        raise MissingDataError(
            f"Missing ALFWorld archive {path}. Put the project's shared data there (or set "
            f"FLYWHEEL_DATA_DIR), or fetch the official games with `alfworld-download` and set "
            f"{ENV_VAR} to the folder holding json_2.1.1/ (usually ~/.cache/alfworld)."
        )
    return path


def alfworld_root(root: str | Path | None = None) -> Path:
    """Folder holding `json_2.1.1/` and `logic/`, unpacking the archive on first use.

    Order: explicit `root`, then `$FLYWHEEL_ALFWORLD_DIR`, then `<cache>/alfworld`.
    A folder that already holds `json_2.1.1/` (e.g. an official `alfworld-download`)
    is used as it is; an empty or missing one receives the unpacked archive.
    """
    chosen = root or os.environ.get(ENV_VAR)
    path = Path(chosen).expanduser() if chosen else cache_dir() / "alfworld"
    if not (path / INDEX_FILE).exists() and not (path / JSON_DIR).is_dir():
        ensure_unpacked(path)
    return path


def ensure_unpacked(dest: Path) -> None:
    """Unpack the archive into `dest` once; concurrent callers wait on a lock."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _lock(dest.parent / f".{dest.name}.lock"):
        if (dest / INDEX_FILE).exists():
            return
        if dest.exists() and any(dest.iterdir()):
            raise MissingDataError(
                f"{dest} exists but holds no complete ALFWorld data ({JSON_DIR}/ and {INDEX_FILE}). "
                "Empty or remove it to have the archive unpacked there."
            )
        for stale in dest.parent.glob(f".{dest.name}-unpack-*"):  # left by a killed unpack (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-unpack-", dir=dest.parent))
        try:
            _unpack_into(archive_path(), tmp)
            if dest.exists():
                dest.rmdir()
            os.rename(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _unpack_into(archive: Path, out: Path) -> None:
    """Extract game files, write traj_data + logic + index, all under `out`.

    A truncated, empty or otherwise damaged archive is a MissingDataError naming it and the fix.
    """
    try:
        index = _extract_games(archive, out)
    except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError) as exc:
        raise MissingDataError(
            f"The ALFWorld archive {archive} is damaged or truncated ({type(exc).__name__}: {exc}; "
            f"{archive.stat().st_size:,} bytes). {_ARCHIVE_FIX}"
        ) from None
    if not any(index.values()):
        raise MissingDataError(f"The ALFWorld archive {archive} holds no playable {GAME_FILE} games. {_ARCHIVE_FIX}")
    copy_logic(out / "logic")
    (out / INDEX_FILE).write_text(json.dumps(index))


_ARCHIVE_FIX = (
    "Copy a complete json_2.1.1_tw-pddl.tar.xz from the project's shared data over it (or set FLYWHEEL_DATA_DIR), "
    f"or fetch the official games with `alfworld-download` and set {ENV_VAR} to the folder holding json_2.1.1/."
)


def _extract_games(archive: Path, out: Path) -> dict[str, dict[str, Any]]:
    from tqdm.auto import tqdm

    index: dict[str, dict[str, Any]] = {split: {} for split in SPLIT_FOLDERS}
    # A progress bar over the compressed bytes read (rate, ETA) on a terminal; silent otherwise.
    with open(archive, "rb") as raw_file, tqdm.wrapattr(
        raw_file, "read", total=archive.stat().st_size, desc=f"unpacking {archive.name}", disable=None,
        dynamic_ncols=True, mininterval=0.5,
    ) as counted, tarfile.open(fileobj=counted, mode="r:xz") as tar:
        for member in tar:
            name = PurePosixPath(member.name)
            if not member.isfile() or name.name != GAME_FILE:
                continue
            if name.is_absolute() or ".." in name.parts or len(name.parts) != 5 or name.parts[0] != JSON_DIR:
                raise MissingDataError(f"Unexpected member {member.name!r} in {archive}")
            _, split, folder, trial, _ = name.parts
            raw = tar.extractfile(member).read()  # type: ignore[union-attr]
            target = out.joinpath(*name.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(raw)
            (target.parent / TRAJ_FILE).write_text(json.dumps(traj_data(folder, trial)))
            if playable(folder, game := json.loads(raw)):
                index.setdefault(split, {})[f"{folder}/{trial}"] = _index_entry(game)
    return index


def copy_logic(logic_dir: Path) -> None:
    """Copy alfred.pddl / alfred.twl2 from the installed alfworld wheel."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError("The alfworld package is missing: pip install -e '.[alfworld]'.")
    source = Path(next(iter(spec.submodule_search_locations))) / "data"
    logic_dir.mkdir(parents=True, exist_ok=True)
    for name in LOGIC_FILES:
        shutil.copyfile(source / name, logic_dir / name)


def traj_data(folder: str, trial: str = "") -> dict[str, Any]:
    """The minimal ALFRED traj_data.json ALFWorld's expert reads, from a folder name.

    `<task_type>-<object>-<movable_recep>-<parent_recep>-<scene>`; for
    look_at_obj_in_light the fourth field is the lamp (`toggle_target`).
    """
    parts = folder.split("-")
    if len(parts) != 5 or not parts[4].isdigit():
        raise ValueError(f"Not an ALFRED game folder name: {folder!r}")
    task_type, obj, mrecep, parent, scene = parts
    sliced = obj.endswith("Sliced")
    look = task_type == "look_at_obj_in_light"
    return {
        "task_type": task_type,
        "task_id": trial,
        "pddl_params": {
            "object_target": obj.removesuffix("Sliced"),
            "object_sliced": sliced,
            "mrecep_target": "" if mrecep == "None" else mrecep,
            "parent_target": "" if look or parent == "None" else parent,
            "toggle_target": parent if look else "",
        },
        "scene": {"scene_num": int(scene)},
        "rebuilt_from_folder_name": True,
    }


def playable(folder: str, game: dict[str, Any]) -> bool:
    """AlfredTWEnv's own filter: solvable games, no movable-receptacle or sliced tasks."""
    return bool(game.get("solvable")) and "movable" not in folder and "Sliced" not in folder


def _index_entry(game: dict[str, Any]) -> dict[str, Any]:
    match = _GOAL_RE.search(game.get("grammar", ""))
    return {"goal": match.group(1).strip() if match else "", "walkthrough": list(game.get("walkthrough") or [])}


def load_index(root: Path) -> dict[str, dict[str, Any]]:
    """split folder -> game id -> {goal, walkthrough}; built once per content for foreign folders.

    A folder unpacked here carries its own index. For any other folder the index is cached
    under a key of its content (each split folder's entry count and mtime), so games copied
    in later are seen; a folder with no playable game is a MissingDataError naming the fix.
    """
    resolved = root.resolve()
    own = resolved / INDEX_FILE
    return _load_index(str(resolved), "own" if own.exists() else _content_key(resolved))


def _content_key(root: Path) -> str:
    """Cheap fingerprint of a game folder: per split folder, its entry count and mtime (a few stats)."""
    parts = []
    for split in SPLIT_FOLDERS:
        folder = root / JSON_DIR / split
        try:
            parts.append(f"{split}:{len(os.listdir(folder))}:{folder.stat().st_mtime_ns}")
        except OSError:
            parts.append(f"{split}:-")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def _load_index(resolved: str, key: str) -> dict[str, dict[str, Any]]:
    root = Path(resolved)
    own = root / INDEX_FILE
    if key == "own" and own.exists():
        return json.loads(own.read_text())
    digest = hashlib.sha1(f"{resolved}|{key}".encode()).hexdigest()[:12]
    cached = cache_dir() / f"alfworld_index_{digest}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    index = {split: _scan_split(root / JSON_DIR / split) for split in SPLIT_FOLDERS}
    if not any(index.values()):
        raise MissingDataError(
            f"{root / JSON_DIR} holds no playable ALFWorld game (expected <split>/<task>/<trial>/{GAME_FILE} "
            f"under {', '.join(SPLIT_FOLDERS)}). Copy the games there (`alfworld-download` writes them to "
            f"~/.cache/alfworld), point {ENV_VAR} at a folder that holds them, or unset {ENV_VAR} to use the "
            "project's shared archive."
        )
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, cached)
    return index


def _scan_split(folder: Path) -> dict[str, dict[str, Any]]:
    if not folder.is_dir():
        return {}
    index = {}
    for path in sorted(folder.glob(f"*/*/{GAME_FILE}")):
        if playable(path.parent.parent.name, game := json.loads(path.read_text())):
            index[f"{path.parent.parent.name}/{path.parent.name}"] = _index_entry(game)
    return index


def game_file(root: Path, split_folder: str, game_id: str) -> Path:
    """Path of one game, or a ValueError naming what was asked for."""
    parts = PurePosixPath(game_id).parts
    if len(parts) != 2 or ".." in parts:
        raise ValueError(f"Unknown ALFWorld game id {game_id!r}: expected '<folder>/<trial>'.")
    path = root / JSON_DIR / split_folder / game_id / GAME_FILE
    if not path.is_file():
        raise ValueError(f"Unknown ALFWorld game {game_id!r} in split folder {split_folder!r} (no {path}).")
    return path


def load_traj_data(game: Path) -> dict[str, Any]:
    """The game's traj_data.json if present (official data), else the rebuilt one."""
    path = game.parent / TRAJ_FILE
    if path.exists():
        return json.loads(path.read_text())
    return traj_data(game.parent.parent.name, game.parent.name)
