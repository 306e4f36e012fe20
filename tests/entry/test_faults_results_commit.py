"""`experiment --commit-results` when the commit fails: a stale `.git/index.lock` (a `git commit` that was
killed) is reported in one line naming it, the arm's results stay on disk, the experiment goes on to the next
arm, and the next commit (or a rerun's) commits what was left. Before: a CalledProcessError traceback stopped
every rerun before its next arm."""

import subprocess
from pathlib import Path

import pytest
import yaml

import flywheel.drivers.experiment as experiment
from flywheel.cli import _commit_results
from flywheel.config.presets import load_preset


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> Path:
    for var in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(var, "test")
    for var in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(var, "test@example.invalid")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README").write_text("x\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "start")
    return repo


def test_a_stale_index_lock_is_one_line_and_the_next_commit_takes_what_was_left(repo: Path, capsys):
    results = repo / "experiments" / "results" / "mini"
    (results / "arms").mkdir(parents=True)
    (results / "arms" / "a.json").write_text("{}\n")
    lock = repo / ".git" / "index.lock"
    lock.write_text("")  # left by a git commit that was killed
    commit = _commit_results(results)
    commit("a", results / "arms" / "a.json")  # does not raise
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(lock) in err[0] and "arm a's results stay uncommitted" in err[0]
    assert (results / "arms" / "a.json").exists()
    assert _git(repo, "log", "--oneline").count("\n") == 1
    lock.unlink()
    (results / "arms" / "b.json").write_text("{}\n")
    commit("b", results / "arms" / "b.json")
    assert capsys.readouterr().err == ""
    assert set(_git(repo, "show", "--name-only", "--format=", "HEAD").split()) == {
        "experiments/results/mini/arms/a.json", "experiments/results/mini/arms/b.json"}


def test_the_experiment_goes_on_to_the_next_arm_when_a_commit_fails(repo: Path, tmp_path: Path, monkeypatch, capsys):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "benchmark": "webshop", "iterations": 0, "model": "tiny",
                                    "arms": {"a": {}, "b": {}}}))
    preset = load_preset(str(path))
    results = repo / "results"
    ran: list[str] = []

    def run_arm(preset, arm, arm_dir, **_):
        ran.append(arm)
        (results / "arms").mkdir(parents=True, exist_ok=True)
        (results / "arms" / f"{arm}.json").write_text("{}\n")

    monkeypatch.setattr(experiment, "run_arm", run_arm)
    monkeypatch.setattr(experiment, "resolve_model", lambda model, runs: "/nonexistent")
    monkeypatch.setattr(experiment, "write_report", lambda preset, runs, results: {})
    (repo / ".git" / "index.lock").write_text("")
    experiment.run_experiment(preset, runs=tmp_path / "runs", results=results, instance=None,
                              on_arm_done=_commit_results(results))
    assert ran == ["a", "b"]
    assert capsys.readouterr().err.count("index.lock is left by a git that was killed") == 2
