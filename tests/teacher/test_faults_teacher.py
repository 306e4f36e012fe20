"""Teacher endpoint faults at the asset level, and the API key never leaking.

The `teacher_quaternions` asset with `OpenAITeacherResource` (key from
FLYWHEEL_TEACHER_API_KEY) against the local stub server:
(c) the endpoint keeps failing -> the run fails with a clear message after the retry limit;
    answers already paid for stay cached and a re-run does not ask for them again;
(e) the key (which the failing endpoint even echoes back) appears nowhere: not in the
    DuckDB file, the Dagster instance's storage (event log, run config, tags, metadata,
    captured compute logs: what the UI shows), nor the captured process output.
"""

import json
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._serdes import serialize_value

from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.drivers.pipeline import StageFailed, run_stage
from flywheel.resources import OpenAITeacherResource, StoreResource
from tests.helpers import answer, experts, failure_message, files_containing, materialize_teacher
from tests.openai_stub import StalledServer, StubServer

SECRET = "sk-flywheel-TEST-5f3a9c1e7b2d4a60"
BENCH = "scienceworld"












def test_teacher_asset_fails_clearly_keeps_paid_answers_and_never_leaks_the_key(tmp_path, monkeypatch, capfd, caplog):
    monkeypatch.setenv("FLYWHEEL_TEACHER_API_KEY", SECRET)
    db = Store(tmp_path / "fw.duckdb")
    db.write_trajectories(experts())
    with dg.instance_for_test() as instance:
        # The first answer arrives, then the endpoint is down (and echoes the key in its error body).
        with StubServer([(200, answer(2)), (503, f"overloaded; your key {SECRET} is fine")]) as down:
            failed = materialize_teacher(tmp_path, down.base_url, instance)
        assert not failed.success
        msg = failure_message(failed)
        assert "teacher endpoint failed after 3 attempt(s)" in msg and "stay cached" in msg and SECRET not in msg
        assert len(down.requests) == 1 + 3  # one answer, then 3 attempts for the second trajectory
        assert {k.lower(): v for k, v in down.headers[0].items()}["authorization"] == f"Bearer {SECRET}"
        assert db.query("SELECT count(*) FROM teacher_cache").item() == 1
        assert db.trajectory_table(source="teacher").height == 0  # nothing half-written

        with StubServer([(200, answer(2))]) as up:
            ok = materialize_teacher(tmp_path, up.base_url, instance)
        assert ok.success
        assert len(up.requests) == 2  # the paid answer came from the cache
        assert db.trajectory_table(source="teacher").height == 3

        # (e) The key is nowhere Dagster keeps what the UI shows (event log, run storage,
        # captured compute logs, all under the instance root), nor in DuckDB.
        root = Path(instance.root_directory)
        assert list((root / "storage").rglob(f"*{failed.run_id}*")) or list((root / "storage").rglob("*.err"))
        assert files_containing(root, SECRET.encode()) == []
        assert files_containing(tmp_path, SECRET.encode()) == []
        for table, column in db.query(
            "SELECT table_name, column_name FROM information_schema.columns WHERE data_type = 'VARCHAR'"
        ).rows():
            assert db.query(f"SELECT count(*) FROM {table} WHERE {column} LIKE ?", [f"%{SECRET}%"]).item() == 0
        for result in (failed, ok):
            run = instance.get_run_by_id(result.run_id)
            assert SECRET not in json.dumps(run.run_config) + json.dumps(dict(run.tags))
            assert SECRET not in serialize_value(instance.all_logs(result.run_id))
    out, err = capfd.readouterr()
    assert SECRET not in out + err + caplog.text


def test_unusable_answers_are_never_cached_but_asked_again(tmp_path):
    """A 200 with null content, prose, or a 5 MB body is not cached: it is asked again, and after the
    retry limit the error shows the answer's first characters (redacted); a later run asks anew."""
    from flywheel.teacher import OpenAITeacher, TeacherError
    from tests.fakes import make_traj

    db = Store(tmp_path / "fw.duckdb")
    key = "k3y-with-no-known-shape-77"
    junk = [(200, None), (200, f"Sure! Here are your annotations, {key}."), (200, "x" * 5_000_000)]
    with StubServer(junk) as bad:
        teacher = OpenAITeacher(base_url=bad.base_url, model="m", api_key=key, cache=db, max_retries=2, sleep=lambda s: None)
        with pytest.raises(TeacherError) as err:
            teacher.annotate(make_traj(n=2), "instr")
    assert len(bad.requests) == 3 and db.query("SELECT count(*) FROM teacher_cache").item() == 0
    msg = str(err.value)
    assert "after 3 attempt(s)" in msg and "unusable answer" in msg and "'xxxxxxxx" in msg and "5000000 chars" in msg
    assert key not in msg
    with StubServer([(200, "I cannot do JSON today"), (200, answer(2))]) as flaky:
        teacher = OpenAITeacher(base_url=flaky.base_url, model="m", api_key=key, cache=db, max_retries=2, sleep=lambda s: None)
        notes = teacher.annotate(make_traj(n=2), "instr")
        assert [n.plan for n in notes] == ["plan 0", "plan 1"] and len(flaky.requests) == 2  # asked again, not cached junk
        assert [r for (r,) in db.query("SELECT response FROM teacher_cache").rows()] == [answer(2)]
        assert teacher.annotate(make_traj(n=2), "instr") == notes and len(flaky.requests) == 2  # now from the cache
    with StubServer([(200, "no tasks here")]) as prose:  # the curriculum stage needs a task list
        teacher = OpenAITeacher(base_url=prose.base_url, model="m", api_key=key, cache=db, max_retries=1, sleep=lambda s: None)
        with pytest.raises(TeacherError, match="no tasks here"):
            teacher.propose_tasks(benchmark=BENCH, instructions="i", schema="s", seeds=[], candidates=[], n=2)
    assert db.query("SELECT count(*) FROM teacher_cache").item() == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["trickle", "hang"])
def test_a_stage_on_a_stalled_teacher_ends_within_its_timeout_naming_the_cause(tmp_path, monkeypatch, mode):
    """Before: the teacher's per-read timeout let an endpoint trickling a byte every 2 s hold one request for 150 s
    against `timeout_s: 5`, and the stage's last line was Dagster's "Error occurred while executing op"."""
    monkeypatch.setenv("FLYWHEEL_TEACHER_API_KEY", SECRET)
    Store(tmp_path / "fw.duckdb").write_trajectories(experts())
    with StalledServer(mode) as srv, dg.instance_for_test() as instance:
        teacher = OpenAITeacherResource(base_url=srv.base_url, model="stub-model", timeout_s=2.0, max_retries=5)
        defs = build_defs({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "teacher": teacher})
        started = time.monotonic()
        with pytest.raises(StageFailed) as info:
            run_stage(defs.resolve_job_def("bootstrap_job"), BENCH, ["teacher_quaternions"], instance)
        assert time.monotonic() - started < 30  # the first trajectory's request: 2 s, retries included
    assert "TeacherError: teacher endpoint failed after 1 attempt(s): APITimeoutError" in str(info.value)
    assert info.value.retryable and SECRET not in str(info.value)
