"""The last line names the cause: a failed stage's closing line carries the user's exception (type and
message) under Dagster's wrappers, a failure no rerun can fix (configuration, a full disk, a teacher that
refuses) exits 2, and the demo's closing table is never what fails. Before: the line said "Error occurred while
executing op ..." (the cause in the middle of a 100-line traceback), such failures exited 1, and with the runs
folder full the demo crashed in its closing table with a DuckDB traceback."""

import errno

import dagster as dg
import pytest

import flywheel.cli as cli
from flywheel.drivers.demo import closing_table
from flywheel.drivers.pipeline import StageFailed, run_stage
from flywheel.orchestration.failures import fail_once
from flywheel.teacher.base import TeacherError, TeacherRefused

PARTS = dg.StaticPartitionsDefinition(["p"])


def _raises(kind: str):
    def body(context):
        if kind == "disk-full":  # as a checkpoint save meets a full disk, re-raised by the trainer's wrapper
            try:
                raise OSError(errno.ENOSPC, "No space left on device", "/runs/ckpt/model.safetensors")
            except OSError as exc:
                raise RuntimeError("saving the checkpoint failed") from exc
        if kind == "configuration":
            fail_once(context, "ConfigurationError: every example is longer than max_length 64: raise "
                      "policy.max_length")
        if kind == "teacher-refused":
            raise TeacherRefused("teacher endpoint refused the request: 401 invalid key")
        raise TeacherError("teacher endpoint failed after 6 attempt(s): 503 Service Unavailable")

    return dg.asset(name="stage", partitions_def=PARTS)(body)


def _failed(kind: str) -> StageFailed:
    job = dg.Definitions(assets=[_raises(kind)], jobs=[dg.define_asset_job("stage_job", partitions_def=PARTS)]
                         ).resolve_job_def("stage_job")
    with pytest.raises(StageFailed) as info:
        run_stage(job, "p", ["stage"], dg.DagsterInstance.ephemeral())
    assert "Error occurred while executing" not in str(info.value)
    return info.value


@pytest.mark.parametrize("kind, cause, retryable", [
    ("disk-full", "OSError: [Errno 28] No space left on device: '/runs/ckpt/model.safetensors'", False),
    ("configuration", "ConfigurationError: every example is longer than max_length 64", False),
    ("teacher-5xx", "TeacherError: teacher endpoint failed after 6 attempt(s): 503 Service Unavailable", True),
    ("teacher-refused", "TeacherRefused: teacher endpoint refused the request: 401 invalid key", False),
])
def test_a_failed_stage_names_the_users_exception_and_whether_a_rerun_can_fix_it(kind, cause, retryable):
    failed = _failed(kind)
    assert cause in str(failed) and failed.retryable is retryable


@pytest.mark.parametrize("kind, code", [("disk-full", 2), ("configuration", 2), ("teacher-5xx", 1)])
def test_the_closing_line_of_a_command_is_the_cause(kind, code, monkeypatch, capsys):
    failed = _failed(kind)

    def report(args):
        raise failed

    monkeypatch.setattr(cli, "cmd_report", report)
    assert cli.main(["report"]) == code
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("flywheel: stopped early: stage_job p failed: ") and str(failed).split(": ", 1)[1] in last


def test_a_full_disk_outside_a_stage_is_one_line_exit_2(monkeypatch, capsys):
    def report(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/flywheel.duckdb.wal")

    monkeypatch.setattr(cli, "cmd_report", report)
    assert cli.main(["report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OSError: [Errno 28] No space left on device" in err[0] and "free space" in err[0]


def test_the_demos_closing_table_is_never_what_fails(tmp_path):
    damaged = tmp_path / "flywheel.duckdb"
    damaged.write_bytes(b"\0" * 5000)  # what a full disk can leave
    line = closing_table(damaged, "scienceworld")
    assert line.startswith(f"(no table: the store {damaged} could not be read: ") and "\n" not in line
    assert closing_table(tmp_path / "none.duckdb", "scienceworld") == "(no evaluation recorded)"
