"""Configured keys never leak, whatever their shape, for the teacher and the policy client.

The key here has no known prefix (no `sk-`, no `Bearer`): only redaction of the configured
value itself catches it. The endpoints echo it in a 401 body and inside a 200 answer; it must
reach none of: the Dagster event log, run storage and captured compute logs (all under the
instance root), the DuckDB store, stdout/stderr, the Python log.
"""

import json
from pathlib import Path

import dagster as dg
import pytest
from dagster._serdes import serialize_value

from flywheel.core.redaction import Redactor
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.inference import OpenAICompatibleGenerator
from flywheel.resources import EnvResource, OpenAICompatiblePolicy, StoreResource
from tests.helpers import BENCH, answer, experts, failure_message, files_containing, materialize_teacher
from tests.openai_stub import StubServer

KEY = "Zq9vK2mW7xT4bN8pR3dL6hY1uQ0e"  # no known credential shape


def assert_nowhere(instance, tmp_path, db, capfd, caplog, results):
    root = Path(instance.root_directory)
    assert files_containing(root, KEY.encode()) == []
    assert files_containing(tmp_path, KEY.encode()) == []
    for table, column in db.query(
        "SELECT table_name, column_name FROM information_schema.columns WHERE data_type = 'VARCHAR'"
    ).rows():
        assert db.query(f"SELECT count(*) FROM {table} WHERE {column} LIKE ?", [f"%{KEY}%"]).item() == 0
    for result in results:
        run = instance.get_run_by_id(result.run_id)
        assert KEY not in json.dumps(run.run_config) + json.dumps(dict(run.tags))
        assert KEY not in serialize_value(instance.all_logs(result.run_id))
    out, err = capfd.readouterr()
    assert KEY not in out + err + caplog.text


def test_redactor_masks_the_configured_value_whatever_its_shape():
    redact = Redactor([KEY, "", None])
    assert redact(f"401: invalid key {KEY}!") == "401: invalid key ***!"
    assert redact("Bearer abcdefgh123 and sk-abcdef123456") == "Bearer *** and sk-***"
    assert redact("nothing secret") == "nothing secret"


def test_teacher_key_without_known_prefix_never_leaks(tmp_path, monkeypatch, capfd, caplog):
    monkeypatch.setenv("FLYWHEEL_TEACHER_API_KEY", KEY)
    db = Store(tmp_path / "fw.duckdb")
    db.write_trajectories(experts(n_trajs=2))
    with dg.instance_for_test() as instance:
        with StubServer([(401, f"invalid api key {KEY}")]) as denied:
            failed = materialize_teacher(tmp_path, denied.base_url, instance)
        assert not failed.success and len(denied.requests) == 1  # a 401 is not retried
        # An answer that quotes the key inside a thought: stored and cached only redacted.
        quoting = json.dumps({"steps": [{"thought": f"My key is {KEY}.", "plan": "go"}, {"thought": "t", "plan": "p"}]})
        with StubServer([(200, quoting), (200, answer(2))]) as up:
            ok = materialize_teacher(tmp_path, up.base_url, instance)
        assert ok.success
        assert db.query("SELECT count(*) FROM steps WHERE thought = 'My key is ***.'").item() == 1
        assert_nowhere(instance, tmp_path, db, capfd, caplog, [failed, ok])


def generate_op_job(base_url: str):
    @dg.op
    def generate(context: dg.OpExecutionContext):
        gen = OpenAICompatibleGenerator(base_url=base_url, model="served", api_key=KEY, concurrency=2)
        context.log.info(f"generator {gen.model_id}")
        gen.generate([[{"role": "user", "content": "hi"}]], temperature=0.0, max_new_tokens=8)

    @dg.job
    def policy_call():
        generate()

    return policy_call


def test_policy_key_without_known_prefix_never_leaks(tmp_path, monkeypatch, capfd, caplog):
    """The rollouts asset on real ScienceWorld through OpenAICompatiblePolicy, whose server quotes the
    key in every answer; then a server that rejects the key and echoes it, inside a Dagster run."""
    monkeypatch.setenv("FLYWHEEL_POLICY_API_KEY", KEY)
    db = Store(tmp_path / "fw.duckdb")
    db.record_checkpoint({"checkpoint_id": "scienceworld-k0-stub", "benchmark": BENCH, "iteration": 0,
                          "path": str(tmp_path / "served"), "base_model": "stub", "n_examples": 1,
                          "n_trajectories": 1, "train_loss": 0.0, "lineage": {}})
    quoting = f"Thought: the key is {KEY}.\nPlan: look.\nAction: look around\n"
    with dg.instance_for_test() as instance:
        with StubServer([(200, quoting)]) as server:
            resources = {"store": StoreResource(path=str(tmp_path / "fw.duckdb")),
                         "envs": EnvResource(task_types={BENCH: ["find-non-living-thing"]}, train_limit=1, max_steps=2),
                         "policy": OpenAICompatiblePolicy(base_url=server.base_url, served_model="served",
                                                          samples_per_task=1, concurrency=2)}
            played = build_defs(resources).resolve_job_def("iteration_job").execute_in_process(
                partition_key=str(partition_key(BENCH, 0)), instance=instance, raise_on_error=False,
                asset_selection=[dg.AssetKey("rollouts")])
        assert played.success
        assert {k.lower(): v for k, v in server.headers[0].items()}["authorization"] == f"Bearer {KEY}"
        thought = db.query("SELECT thought FROM steps").rows()
        assert len(thought) == 2 and {e for (e,) in thought} == {"the key is ***."}
        with StubServer([(401, f"key {KEY} is not valid")]) as denied:
            failed = generate_op_job(denied.base_url).execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success
        msg = failure_message(failed)
        assert "policy endpoint failed: AuthenticationError" in msg and "key *** is not valid" in msg
        assert_nowhere(instance, tmp_path, db, capfd, caplog, [played, failed])


def test_policy_client_error_is_redacted_outside_dagster_too():
    with StubServer([(500, f"boom {KEY}")]) as srv:
        gen = OpenAICompatibleGenerator(base_url=srv.base_url, model="m", api_key=KEY)
        with pytest.raises(RuntimeError) as err:
            gen.generate([[{"role": "user", "content": "x"}]], temperature=0.0, max_new_tokens=4)
    assert KEY not in str(err.value) and "***" in str(err.value) and err.value.__cause__ is None
