"""ALFWorld data problems are clear errors, and the index follows the folder's content.

(a) An empty `json_2.1.1/` (FLYWHEEL_ALFWORLD_DIR) used to give 0 tasks and pass validation:
    it is a MissingDataError naming the folder and the fix, so check_data fails at once.
(b) The index of a foreign folder used to be cached by path forever (0 tasks even after the games
    were copied in): it is keyed on the folder's content, so copied games are found.
(c) A truncated or zero-byte archive used to raise raw lzma/tarfile errors: the error names the
    archive and the fix, and leaves no half-unpacked folder behind.
"""

import json
import tarfile
from pathlib import PurePosixPath

import pytest

from envs.alfworld import data as alf
from envs.alfworld.tasks import load_tasks
from envs.data import MissingDataError
from flywheel.core.validation import ConfigurationError, check_data
from tests.helpers import ARCHIVE


def real_games(n: int) -> list[tuple[str, bytes]]:
    """The first n playable train games of the shared archive (read from the start of the stream)."""
    out = []
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        for member in tar:
            name = PurePosixPath(member.name)
            if member.isfile() and name.name == alf.GAME_FILE and name.parts[1] == "train":
                raw = tar.extractfile(member).read()
                if alf.playable(name.parts[2], json.loads(raw)):
                    out.append((member.name, raw))
                    if len(out) == n:
                        return out
    raise AssertionError("not enough games in the archive")


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE_DIR", str(tmp_path / "cache"))
    alf._load_index.cache_clear()
    yield tmp_path
    alf._load_index.cache_clear()


def test_empty_game_folder_is_an_error_and_copied_games_are_found(isolated, monkeypatch):
    root = isolated / "alfworld"
    (root / alf.JSON_DIR).mkdir(parents=True)
    monkeypatch.setenv(alf.ENV_VAR, str(root))
    with pytest.raises(MissingDataError, match=f"{root / alf.JSON_DIR} holds no playable ALFWorld game.*alfworld-download"):
        load_tasks("train")
    with pytest.raises(ConfigurationError, match="alfworld data missing for split 'train'.*no playable ALFWorld game"):
        check_data("alfworld")
    for name, raw in real_games(2):  # the user copies the games in afterwards
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
    tasks = load_tasks("train")
    assert len(tasks) == 2 and all(t.goal for t in tasks)
    check_data("alfworld", splits=("train",))


@pytest.mark.parametrize("size", [0, 65_536])
def test_truncated_or_empty_archive_names_the_path_and_the_fix(isolated, monkeypatch, size):
    archive = isolated / "data" / alf.ARCHIVE
    archive.parent.mkdir(parents=True)
    with open(ARCHIVE, "rb") as src:
        archive.write_bytes(src.read(size))
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(isolated / "data"))
    dest = isolated / "unpacked"
    monkeypatch.setenv(alf.ENV_VAR, str(dest))
    with pytest.raises(MissingDataError) as err:
        load_tasks("train", limit=1)
    msg = str(err.value)
    assert f"The ALFWorld archive {archive} is damaged or truncated" in msg and f"{size:,} bytes" in msg
    assert "Copy a complete json_2.1.1_tw-pddl.tar.xz" in msg and "alfworld-download" in msg
    assert not dest.exists() and not list(isolated.glob(".unpacked-unpack-*"))  # nothing half-done left
