"""The sensor and the schedule over facts written straight into the store (gate, its check's
verdict, evaluations) and the Dagster instance (runless materializations): every branch of the
loop in seconds, no env, no model.
The real two-iteration run is tests/e2e/test_loop_sensor.py."""

import json
import time
from contextlib import contextmanager

import dagster as dg
import pytest

from flywheel.core.store import Store
from flywheel.core.validation import ConfigurationError
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.resources import LoopResource, StoreResource
from flywheel.sensors import evaluate_loop

defs = build_defs()  # the defaults (no profile): every benchmark, iterations 0..3
flywheel_sensor, flywheel_schedule = defs.resolve_sensor_def("flywheel_sensor"), defs.resolve_schedule_def("flywheel_schedule")

B = "scienceworld"


@contextmanager
def world(tmp_path):
    # A schedule context needs a persistent instance. Not a yield fixture: Dagster keeps the
    # instance's state storage in a ContextVar that a fixture teardown would not reset.
    path = str(tmp_path / "fw.duckdb")
    with dg.instance_for_test() as instance:
        yield instance, Store(path), path


def resources(path, **loop):
    return {"store": StoreResource(path=path), "loop": LoopResource(benchmarks=[B], **loop)}


def sensor(instance, path, cursor=None, **loop):
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources(path, **loop),
                                 last_sensor_start_time=time.time()) as ctx:  # a real tick, not a preview
        return flywheel_sensor(ctx)


def schedule(instance, path, **loop):
    # Closed at once: an evaluation context left to the garbage collector resets Dagster's
    # ContextVar of state storage to a dead instance's later on.
    with dg.build_schedule_context(instance=instance, resources=resources(path, **loop)) as ctx:
        return flywheel_schedule(ctx)


def bootstrap(instance):
    instance.report_runless_asset_event(dg.AssetMaterialization("synthetic_curriculum", partition=B))


def start(db, k):
    db.record_checkpoint({"checkpoint_id": f"{B}-k{k}", "benchmark": B, "iteration": k, "path": "/x", "n_trajectories": 2 + k})


def finish(instance, db, k, *, new=2, seen=0.5, passed=True, evaluated=True, checked=True):
    part = str(partition_key(B, k))
    db.write_gated(B, k, [(f"g{k}-{i}", "t") for i in range(new)], candidates=4)
    db.record_gate_stats(B, k, candidates=4, new_unique_successes=new, gated_total=new * (k + 1))
    if checked:  # what gated_dataset_is_usable records after the gate
        db.record_gate_check(B, k, passed=passed, trajectories=new, problems=[] if passed else ["empty gate"])
    if evaluated:
        for split in ("seen", "unseen"):
            db.write_evaluation({"benchmark": B, "iteration": k, "split": split, "checkpoint_id": f"{B}-k{k}",
                                 "episodes": 10, "success_rate": seen})
        instance.report_runless_asset_event(dg.AssetMaterialization("evaluation", partition=part))


def test_sensor_walks_the_loop_and_records_each_decision(tmp_path):
    with world(tmp_path) as (instance, db, path):
        r = sensor(instance, path, iterations=2)
        assert not r.run_requests and "synthetic_curriculum not materialized" in r.skip_reason.skip_message

        bootstrap(instance)
        r = sensor(instance, path, iterations=2)
        [req] = r.run_requests
        assert req.partition_key == "scienceworld|0" and req.tags["flywheel/decision"] == "start"
        assert json.loads(r.cursor)[B]["state"] == "launched"
        out = schedule(instance, path, iterations=2)  # iteration 0 is claimed once: the schedule skips
        assert isinstance(out, dg.SkipReason) and "already requested" in out.skip_message

        start(db, 0)
        finish(instance, db, 0, evaluated=False)
        r = sensor(instance, path, iterations=2)
        assert not r.run_requests and "waiting for evaluation of scienceworld|0" in r.skip_reason.skip_message

        finish(instance, db, 0, seen=0.2, checked=False)
        r = sensor(instance, path, iterations=2)
        [req] = r.run_requests
        assert req.partition_key == "scienceworld|1" and req.tags["flywheel/decision"] == "continue"
        assert req.tags["flywheel/after_iteration"] == "0" and "added 2 new unique successes" in req.tags["flywheel/reason"]
        row = db.iterations(B).row(0, named=True)
        assert (row["decision"], row["decided_by"], row["seen_success"], row["train_trajectories"]) == ("continue", "sensor", 0.2, 2)

        # The launch was lost (daemon died after deciding): the next tick asks again, same run key.
        again = sensor(instance, path, iterations=2).run_requests
        assert [(q.partition_key, q.run_key) for q in again] == [(req.partition_key, req.run_key)]

        start(db, 1)
        r = sensor(instance, path, iterations=2)
        assert not r.run_requests and json.loads(r.cursor)[B] == {
            "state": "waiting", "iteration": 1, "reason": "waiting for gated_dataset, gated_dataset_is_usable, evaluation of scienceworld|1"}

        # Iteration 1 does not improve on seen: with patience 1 the *schedule* stops the loop.
        finish(instance, db, 1, seen=0.2)
        out = schedule(instance, path, iterations=2, patience=1)
        assert isinstance(out, dg.SkipReason) and "seen-split success stopped improving" in out.skip_message
        rows = db.iterations(B).select("iteration", "decision", "decided_by").rows()
        assert rows == [(0, "continue", "sensor"), (1, "stop", "schedule")]
        r = sensor(instance, path, iterations=2, patience=1)  # the sensor reads the same decision
        assert not r.run_requests and json.loads(r.cursor)[B]["state"] == "stopped"


def test_a_preview_shows_the_tick_and_writes_nothing(tmp_path):
    """The UI's "Preview tick result" evaluates the sensor without `last_sensor_start_time`."""
    def preview(**loop):
        with dg.build_sensor_context(instance=instance, resources=resources(path, **loop)) as ctx:
            return flywheel_sensor(ctx)

    with world(tmp_path) as (instance, db, path):
        bootstrap(instance)
        [req] = preview(iterations=2).run_requests
        assert req.partition_key == "scienceworld|0"
        assert [req.run_key] == [q.run_key for q in sensor(instance, path, iterations=2).run_requests]  # not claimed
        start(db, 0)
        finish(instance, db, 0)
        before = db.iterations(B).rows()
        r = preview(iterations=0)  # would stop at the budget
        assert "reached the iteration budget K=0" in r.skip_reason.skip_message
        assert db.iterations(B).rows() == before  # no decision recorded
        [req] = preview(iterations=2).run_requests  # would continue
        assert req.partition_key == "scienceworld|1" and db.iterations(B).rows() == before
        [req] = sensor(instance, path, iterations=2).run_requests  # a real tick records it
        assert db.iterations(B).row(0, named=True)["decision"] == "continue"


def test_budget_stop_reopens_when_k_is_raised(tmp_path):
    with world(tmp_path) as (instance, db, path):
        bootstrap(instance)
        start(db, 0)
        finish(instance, db, 0)
        r = sensor(instance, path, iterations=0)
        assert not r.run_requests and "reached the iteration budget K=0" in r.skip_reason.skip_message
        [req] = sensor(instance, path, iterations=1).run_requests
        assert req.partition_key == "scienceworld|1"


def test_failed_gate_check_stops_and_a_new_gate_reopens(tmp_path):
    with world(tmp_path) as (instance, db, path):
        bootstrap(instance)
        start(db, 0)
        finish(instance, db, 0, new=0, passed=False)
        r = sensor(instance, path, iterations=3)
        assert not r.run_requests and "gated_dataset_is_usable failed for iteration 0" in r.skip_reason.skip_message
        finish(instance, db, 0, new=3, passed=True)  # rollouts and gate re-run: k is decided again
        [req] = sensor(instance, path, iterations=3).run_requests
        assert req.partition_key == "scienceworld|1"


def test_bad_loop_config_fails_the_tick_loudly(tmp_path):
    with world(tmp_path) as (instance, db, path):
        with pytest.raises(ConfigurationError, match="must be >= 0"):
            evaluate_loop(instance, db, LoopResource(iterations=-1), trigger="sensor")
        with pytest.raises(ConfigurationError, match="Unknown benchmark 'nosuch'"):
            evaluate_loop(instance, db, LoopResource(benchmarks=["nosuch"]), trigger="sensor")
        with pytest.raises(ConfigurationError, match="raise the profile's iterations to at least 99"):
            evaluate_loop(instance, db, LoopResource(iterations=99), trigger="sensor")


def test_definitions_carry_the_loop():
    assert {s.name for s in defs.sensors} == {"flywheel_sensor"}
    assert {s.name for s in defs.schedules} == {"flywheel_schedule"}
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert {"gated_dataset_is_usable", "seen_success_vs_previous"} <= checks
    tags = defs.resolve_job_def("iteration_job").partitioned_config.get_tags_for_partition_key("scienceworld|2")
    assert tags["flywheel/benchmark"] == "scienceworld" and tags["dagster/priority"] == "-2"
    rollouts = defs.resolve_assets_def("rollouts")
    assert rollouts.op.retry_policy is not None and rollouts.op.retry_policy.max_retries >= 1
