"""Input checked before work, and names that become paths: each mistake is one line, exit 2, and nothing
is written (no store, no progress.json, no report, no partial export).

Before: a preset's `samples_per_task: 0` or a bad `start_from` failed only after bootstrap wrote the store;
`runs_dir: 5` in a profile, `--runs-dir` at a file, `--out` at a file gave tracebacks; `1e6` for an integer
flag gave argparse's usage block; the demo with an unknown task type or a damaged ALFWorld archive failed
inside a Dagster step after creating a store; a preset `name: ../../x` wrote its report outside the
repository; `export --benchmark ../../x` wrote outside --out; export into a used folder left stale files.
"""

import json
import time
from pathlib import Path

import pytest
import yaml

from envs.alfworld import data as alf
from flywheel.cli import main
from tests.helpers import ARCHIVE

MINI = {"name": "mini", "benchmark": "webshop", "iterations": 0, "model": "tiny"}


def refused(capsys, argv, *needles):
    """`argv` exits 2 with one line on stderr holding every needle."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (argv, code, err)
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    return err[0]


def preset(tmp_path, **fields):
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump({**MINI, **fields}))
    return str(path)


@pytest.mark.parametrize("fields, needles", [
    ({"policy": {"samples_per_task": 0}}, ["policy.samples_per_task must be an integer in 1..256", "got 0"]),
    ({"envs": {"max_steps": -1}}, ["envs.max_steps must be"]),
    ({"arms": {"a": {"method": {"start_from": "a"}}}}, ["start_from 'a' must name another arm"]),
    ({"arms": {"a": {"method": {"start_from": "nosuch"}}}}, ["start_from 'nosuch'"]),
    ({"arms": {"a": {"method": {"start_from": "b"}}, "b": {"method": {"start_from": "a"}}}}, ["in a cycle"]),
    ({"name": "../../../x"}, ["name '../../../x' must be a plain file name"]),
    ({"arms": {"../x": {}}}, ["arm '../x' must be a plain file name"]),
])
def test_a_bad_preset_is_refused_before_bootstrap_writes_anything(tmp_path, capsys, fields, needles):
    runs, results = tmp_path / "runs", tmp_path / "results"
    refused(capsys, ["experiment", preset(tmp_path, **fields), "--runs-dir", str(runs), "--results-dir", str(results)],
            *needles)
    assert not runs.exists() and not results.exists()


def test_profile_fields_of_the_wrong_type_or_out_of_bounds(tmp_path, capsys):
    prof = tmp_path / "p.yaml"
    prof.write_text("runs_dir: 5\n")
    refused(capsys, ["--profile", str(prof), "report"], "runs_dir must be a non-empty string, got 5")
    prof.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "r"), "policy": {"max_new_tokens": 0}}))
    refused(capsys, ["--profile", str(prof), "report"], "policy.max_new_tokens must be")


# A billion laughs in free-form fields: 9 levels of 10 aliases each expand to 10^9 strings.
BOMB = "".join(f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}" if i else "lol"] * 10) + "]\n" for i in range(9))
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("text, needle", [
    (BOMB + "notes: *x8\n", "has more than 10000 YAML nodes"),
    (BOMB + "envs: {env_options: {webshop: {x: *x8}}}\n", "has more than 10000 YAML nodes"),
    (f"envs: {{env_options: {{webshop: {{deep: {DEEP}}}}}}}\n", "nests deeper than 16 levels"),
    ("notes: &n [*n]\n", "an alias refers to the node that contains it"),
], ids=["bomb-in-notes", "bomb-in-env-options", "5000-deep", "alias-cycle"])
@pytest.mark.timeout(120)  # before: the bombs hung the run, the deep list was a 2,992-line RecursionError
def test_yaml_bombs_and_deep_nesting_are_refused_at_once(tmp_path, capsys, text, needle):
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(MINI) + text)
    started = time.monotonic()
    refused(capsys, ["experiment", str(path), "--runs-dir", str(tmp_path / "r"), "--report-only"], str(path), needle)
    prof = tmp_path / "profile.yaml"
    prof.write_text(text)
    refused(capsys, ["--profile", str(prof), "report"], str(prof), needle)
    assert time.monotonic() - started < 20 and not (tmp_path / "r").exists()


@pytest.mark.timeout(120)
def test_the_arm_count_is_bounded(tmp_path, capsys):
    started, runs = time.monotonic(), ["--runs-dir", str(tmp_path / "r"), "--report-only"]
    refused(capsys, ["experiment", preset(tmp_path, arms={f"a{i}": {} for i in range(65)}), *runs], "65 arms, more than 64")
    refused(capsys, ["experiment", preset(tmp_path, arms={f"a{i}": {} for i in range(10_000)}), *runs], "YAML nodes")
    assert time.monotonic() - started < 20  # 10,000 arms built their resources for about 12 minutes


@pytest.mark.parametrize("flag, value", [("--samples", "1e6"), ("--samples", "nan"), ("--train-tasks", "abc"),
                                         ("--lr", "abc"), ("--lr", "nan"), ("--iterations", "1.5")])
def test_non_numbers_get_the_one_line_range_message(tmp_path, capsys, flag, value):
    refused(capsys, ["demo", "--runs-dir", str(tmp_path / "r"), flag, value], flag, "must be", value)
    assert not (tmp_path / "r").exists()


def test_demo_refuses_what_it_can_check_before_any_run_or_store(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    refused(capsys, ["demo", "--benchmark", "scienceworld", "--task-types", "nosuch", "--runs-dir", str(runs)],
            "nosuch", "--task-types")
    assert not runs.exists()
    data = tmp_path / "data"  # ALFWorld whose archive is truncated
    (data / alf.ARCHIVE).parent.mkdir(parents=True)
    (data / alf.ARCHIVE).write_bytes(ARCHIVE.read_bytes()[:65_536])
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(data))
    monkeypatch.setenv("FLYWHEEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(alf.ENV_VAR, str(tmp_path / "unpacked"))
    alf._load_index.cache_clear()
    try:
        refused(capsys, ["demo", "--benchmark", "alfworld", "--runs-dir", str(runs)], "damaged or truncated")
    finally:
        alf._load_index.cache_clear()
    assert not runs.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    refused(capsys, ["demo", "--benchmark", "webshop", "--runs-dir", str(a_file)], "--runs-dir", "is a file")
    refused(capsys, ["experiment", preset(tmp_path), "--runs-dir", str(a_file)], "--runs-dir", "is a file")
    assert a_file.read_text() == "x"


def test_export_names_are_checked_and_it_never_leaves_a_partial_or_stale_folder(store, tmp_path, capsys):  # noqa: F811
    runs = store[0]
    out = tmp_path / "out"
    for bad in ("../../x", "nosuch"):
        refused(capsys, ["export", "--runs-dir", str(runs), "--out", str(out), "--benchmark", bad],
                f"--benchmark {bad!r} is in neither the store")
    assert not out.exists() and not (tmp_path / "x").exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    refused(capsys, ["export", "--runs-dir", str(runs), "--out", str(a_file)], "--out", "is a file")

    assert main(["export", "--runs-dir", str(runs), "--out", str(out), "--jsonl-only"]) == 0
    (out / "b" / "stale.jsonl").write_text("{}\n")  # a file from an earlier export
    before = sorted(str(p) for p in out.rglob("*"))
    refused(capsys, ["export", "--runs-dir", str(runs), "--out", str(out), "--jsonl-only"], "not an empty folder",
            "--replace")
    assert sorted(str(p) for p in out.rglob("*")) == before
    assert main(["export", "--runs-dir", str(runs), "--out", str(out), "--jsonl-only", "--replace"]) == 0
    assert not (out / "b" / "stale.jsonl").exists() and (out / "b" / "sft_k0.jsonl").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no work folder left

    # A write that fails half-way (a read-only folder, a full disk) leaves nothing: --out is as it was.
    import flywheel.reports.export as export

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:
            raise PermissionError(13, "Permission denied", str(out / "b" / "hf"))
        return original(*args, **kwargs)

    original = export._write
    before = {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(export, "_write", failing)
        refused(capsys, ["export", "--runs-dir", str(runs), "--out", str(out), "--replace", "--jsonl-only"],
                "nothing was written", "Permission denied")
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    assert json.loads((out / "b" / "sft_k0.jsonl").read_text().splitlines()[0])["prompt"]
    assert Path(out).is_dir()
