"""Two iterations of the living flywheel, driven by the sensor, on real ScienceWorld.

Bootstrap by hand, then only `flywheel_sensor` (evaluated with build_sensor_context against
the instance) decides; the runs it requests execute in process. K = 1: the sensor starts
iteration 0, continues to 1 once the gate check passed and the evaluation materialized,
and stops at the budget. Policy: the oracle double of tests/loop_support.py.
"""

import json

import dagster as dg
import pytest

from flywheel.definitions import build_defs
from flywheel.pipeline import iterations_table
from flywheel.policy.models import build_tiny_model
from flywheel.sensors import flywheel_schedule, flywheel_sensor
from flywheel.store import Store
from tests.loop_support import BENCH, loop_resources

FLYWHEEL_ASSETS = ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", vocab_size=512))


def materialized(instance, asset):
    return set(instance.get_materialized_partitions(dg.AssetKey(asset)))


def check_evaluations(result):
    return {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def test_two_iterations_driven_by_the_sensor(tmp_path, tiny):
    res = loop_resources(tmp_path, tiny, max_iterations=1)
    defs = build_defs(res)
    sensor_res = {"store": res["store"], "loop": res["loop"]}
    job = defs.resolve_job_def("iteration_job")
    db = Store(tmp_path / "fw.duckdb")
    with dg.instance_for_test() as instance:
        boot = defs.resolve_job_def("bootstrap_job").execute_in_process(partition_key=BENCH, instance=instance)
        assert boot.success

        cursor, runs = None, []
        for _ in range(4):  # K=1 needs 3 ticks: start 0, continue to 1, stop
            with dg.build_sensor_context(instance=instance, cursor=cursor, resources=sensor_res) as ctx:
                tick = flywheel_sensor(ctx)
            cursor = tick.cursor
            if not tick.run_requests:
                break
            for req in tick.run_requests:
                out = job.execute_in_process(partition_key=req.partition_key, instance=instance, tags=req.tags,
                                             raise_on_error=False)
                runs.append((req, out))

        assert [(r.partition_key, r.tags["flywheel/decision"]) for r, _ in runs] == [
            ("scienceworld|0", "start"), ("scienceworld|1", "continue")]
        assert all(out.success for _, out in runs)
        # The decision rides on the run: tags in the instance, visible in the UI.
        launched = instance.get_run_by_id(runs[1][1].run_id)
        assert launched.tags["flywheel/after_iteration"] == "0" and launched.tags["dagster/priority"] == "-1"
        assert "added 2 new unique successes" in launched.tags["flywheel/reason"]
        # The last tick stopped at the budget; its cursor says why.
        assert not tick.run_requests and "reached the iteration budget K=1" in tick.skip_reason.skip_message
        assert json.loads(cursor)[BENCH]["state"] == "stopped"

        for asset in FLYWHEEL_ASSETS:
            assert materialized(instance, asset) == {"scienceworld|0", "scienceworld|1"}, asset
        # Gate checks passed; the policy-quality check (WARN, non-blocking) compared k=1 with k=0.
        for _, out in runs:
            assert check_evaluations(out)["gated_dataset_is_usable"].passed
        quality = check_evaluations(runs[1][1])["seen_success_vs_previous"]
        assert quality.severity == dg.AssetCheckSeverity.WARN
        assert {"delta", "ci_low", "ci_high", "method"} <= set(quality.metadata)

        # The iterations table: what each iteration added and why the loop went on or stopped.
        it = db.iterations(BENCH)
        assert it["iteration"].to_list() == [0, 1]
        assert it["new_unique_successes"].to_list() == [2, 2] and it["gated_total"].to_list() == [2, 4]
        assert it["decision"].to_list() == ["continue", "stop"] and it["decided_by"].to_list() == ["sensor", "sensor"]
        assert it["seen_success"].to_list() == [0.0, 0.0] and all(it["gate_check_passed"])
        assert it["train_trajectories"].to_list() == [2, 4]  # seeds; seeds + the 2 gated of k=0
        assert "budget" in it["reason"][1] and "| 1 | 2 | 4 |" in iterations_table(db, BENCH)
        # Per-task attempts and successes of both iterations (2 tasks x 2 samples each).
        stats = db.task_stats(BENCH).select("iteration", "attempts", "successes").rows()
        assert stats == [(0, 2, 2), (0, 2, 2), (1, 2, 2), (1, 2, 2)]

        # The schedule evaluates the same logic and agrees: nothing to launch.
        with dg.build_schedule_context(instance=instance, resources=sensor_res) as sctx:
            out = flywheel_schedule(sctx)
        assert isinstance(out, dg.SkipReason) and "stopped at k=1" in out.skip_message
