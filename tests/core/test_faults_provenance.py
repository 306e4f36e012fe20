"""Committed arm files are checked before they are believed: one that does not parse, contradicts itself or was
edited after the runner signed it is refused in one line naming the file; `resign-arm` re-signs an intended edit."""

import json
import shutil
from pathlib import Path

import pytest

from flywheel.cli import main
from flywheel.core.provenance import CHECKSUM, ArmFileError, arm_file, read_arm, write_arm

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted((REPO / "experiments" / "results").glob("*/arms/*.json"))
SAMPLE = REPO / "experiments" / "results" / "cpu-alfworld" / "arms" / "bpo.json"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results folder holding a copy of one committed arm file (arms/bpo.json)."""
    (tmp_path / "arms").mkdir()
    shutil.copy(SAMPLE, tmp_path / "arms" / "bpo.json")
    return tmp_path


def _refused(results: Path, arm: str = "bpo") -> str:
    with pytest.raises(ArmFileError) as info:
        read_arm(results, arm)
    message = str(info.value)
    assert "\n" not in message and str(arm_file(results, arm)) in message
    return message


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_every_committed_arm_file_is_signed_and_agrees_with_itself(path: Path):
    assert read_arm(path.parent.parent, path.stem)["arm"] == path.stem


def test_a_truncated_arm_file_is_refused_in_one_line_naming_it(results: Path):
    path = arm_file(results, "bpo")
    path.write_text(path.read_text()[:5000])
    assert "cannot be read" in _refused(results)


def test_flipped_outcomes_are_refused_even_when_re_signed(results: Path):
    path = arm_file(results, "bpo")
    data = json.loads(path.read_text())
    tasks = data["outcomes"]["1|seen"]
    for task in list(tasks)[:7]:  # 7 outcomes flipped by hand
        tasks[task][0] = not tasks[task][0]
    path.write_text(json.dumps(data))
    assert "contradicts itself" in _refused(results)
    assert main(["resign-arm", str(path)]) == 2  # re-signing checks first: numbers that disagree stay refused
    assert "contradicts itself" in _refused(results)


def test_a_rate_outside_its_own_interval_is_refused(results: Path):
    path = arm_file(results, "bpo")
    data = json.loads(path.read_text())
    data["results"]["per_k"][1]["splits"]["seen"]["rate"] = 0.875
    path.write_text(json.dumps(data))
    assert "rate 0.875 is not successes/n" in _refused(results)


def test_an_edited_file_is_refused_until_re_signed(results: Path, capsys):
    path = arm_file(results, "bpo")
    data = json.loads(path.read_text())
    data["provenance"]["hosts"] = ["elsewhere"]  # consistent, but not what the runner wrote
    path.write_text(json.dumps(data))
    assert "resign-arm" in _refused(results)
    del data[CHECKSUM]
    path.write_text(json.dumps(data))
    assert "has no checksum" in _refused(results)
    assert main(["resign-arm", str(path)]) == 0
    assert read_arm(results, "bpo")["provenance"]["hosts"] == ["elsewhere"]
    assert f"re-signed {path}" in capsys.readouterr().out


def test_the_runner_signs_what_it_writes(tmp_path: Path):
    data = {k: v for k, v in json.loads(SAMPLE.read_text()).items() if k != CHECKSUM}
    path = write_arm(tmp_path, "bpo", {**data, "origin_dir": Path("/x")})  # a Path is written as text
    read = read_arm(tmp_path, "bpo")
    assert read[CHECKSUM] and read["origin_dir"] == "/x" and json.loads(path.read_text()) == read


def test_the_cli_refuses_a_damaged_arm_file_in_one_line_exit_2(results: Path, capsys):
    path = arm_file(results, "bpo")
    path.write_text("{")
    assert main(["resign-arm", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err
