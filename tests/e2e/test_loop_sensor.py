"""Two iterations of the living flywheel, driven by the sensor, on the test benchmark (tests/tinybench).

Bootstrap by hand, then only `flywheel_sensor` (evaluated with build_sensor_context against
the instance) decides; the runs it requests execute in process. K = 1: the sensor starts
iteration 0, continues to 1 once the gate check passed and the evaluation materialized,
and stops at the budget. Policy: the oracle double of tests/loop_support.py, which solves
the first training task and never the second; iteration 1 shares the same rollout budget by what
iteration 0 learned (adaptive sampling, rule "teaching": the unsolved task at most its uniform share).
"""

import json
import time

import dagster as dg

from flywheel.core.store import Store
from flywheel.drivers.pipeline import iterations_table, run_loop
from flywheel.orchestration.partitions import partition_key
from tests.loop_support import BENCH, loop_defs, loop_profile, loop_resources, train_tasks

FLYWHEEL_ASSETS = ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"]




def materialized(instance, asset):
    return set(instance.get_materialized_partitions(dg.AssetKey(asset)))


def check_evaluations(result):
    return {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def key(k: int) -> str:
    return str(partition_key(BENCH, k))


def test_two_iterations_driven_by_the_sensor(tmp_path, tiny):
    solved, unsolved = train_tasks()
    defs = loop_defs(tmp_path, tiny, iterations=1, fail_tasks=[unsolved])
    # The sensor and schedule of these definitions: over the test benchmark's partitions.
    flywheel_sensor, flywheel_schedule = defs.resolve_sensor_def("flywheel_sensor"), defs.resolve_schedule_def("flywheel_schedule")
    sensor_res = {"store": defs.resources["store"], "loop": defs.resources["loop"]}
    job = defs.resolve_job_def("iteration_job")
    db = Store(tmp_path / "fw.duckdb")
    with dg.instance_for_test() as instance:
        boot = defs.resolve_job_def("bootstrap_job").execute_in_process(partition_key=BENCH, instance=instance)
        assert boot.success

        cursor, runs = None, []
        for _ in range(4):  # K=1 needs 3 ticks: start 0, continue to 1, stop
            with dg.build_sensor_context(instance=instance, cursor=cursor, resources=sensor_res,
                                         last_sensor_start_time=time.time()) as ctx:
                tick = flywheel_sensor(ctx)
            cursor = tick.cursor
            if not tick.run_requests:
                break
            for req in tick.run_requests:
                out = job.execute_in_process(partition_key=req.partition_key, instance=instance, tags=req.tags,
                                             raise_on_error=False)
                runs.append((req, out))

        assert [(r.partition_key, r.tags["flywheel/decision"]) for r, _ in runs] == [
            (key(0), "start"), (key(1), "continue")]
        assert all(out.success for _, out in runs)
        # The decision rides on the run: tags in the instance, visible in the UI.
        launched = instance.get_run_by_id(runs[1][1].run_id)
        assert launched.tags["flywheel/after_iteration"] == "0" and launched.tags["dagster/priority"] == "-1"
        assert "added 1 new unique successes" in launched.tags["flywheel/reason"]
        # The last tick stopped at the budget; its cursor says why.
        assert not tick.run_requests and "reached the iteration budget K=1" in tick.skip_reason.skip_message
        assert json.loads(cursor)[BENCH]["state"] == "stopped"

        for asset in FLYWHEEL_ASSETS:
            assert materialized(instance, asset) == {key(0), key(1)}, asset
        # Gate checks passed; the policy-quality check (WARN, non-blocking) compared k=1 with k=0.
        for _, out in runs:
            assert check_evaluations(out)["gated_dataset_is_usable"].passed
        quality = check_evaluations(runs[1][1])["seen_success_vs_previous"]
        assert quality.severity == dg.AssetCheckSeverity.WARN
        assert {"delta", "ci_low", "ci_high", "method"} <= set(quality.metadata)

        # The iterations table: what each iteration added and why the loop went on or stopped.
        it = db.iterations(BENCH)
        assert it["iteration"].to_list() == [0, 1]
        # One new unique success per iteration (the oracle's 2nd sample repeats the 1st: deduplicated).
        assert it["new_unique_successes"].to_list() == [1, 1] and it["gated_total"].to_list() == [1, 2]
        assert it["decision"].to_list() == ["continue", "stop"] and it["decided_by"].to_list() == ["sensor", "sensor"]
        assert it["seen_success"].to_list() == [0.0, 0.0] and all(it["gate_check_passed"])
        assert it["train_trajectories"].to_list() == [2, 3]  # seeds; seeds + the gated one of k=0
        assert "budget" in it["reason"][1] and "| 1 | 1 | 2 | 3 |" in iterations_table(db, BENCH)
        # Per-task attempts and successes: uniform at k=0 (2 each); at k=1 the same total of 4, shared by
        # loop.sampling_rule "teaching": the task never solved gets at most its uniform share (2), and with no
        # task sometimes solved the one always solved takes the rest (tests/core/test_teaching_sampling.py).
        stats = {(r[0], r[1]): r[2:] for r in db.task_stats(BENCH).select("iteration", "task_id", "attempts", "successes").rows()}
        assert stats == {(0, solved): (2, 2), (0, unsolved): (2, 0), (1, solved): (2, 2), (1, unsolved): (2, 0)}
        rollouts_k1 = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("rollouts"), asset_partitions=[key(1)]), limit=1).records[0]
        assert rollouts_k1.asset_materialization.metadata["sampling"].value == "adaptive"
        assert rollouts_k1.asset_materialization.metadata["sampling_rule"].value == "teaching"

        # The schedule evaluates the same logic and agrees: nothing to launch.
        with dg.build_schedule_context(instance=instance, resources=sensor_res) as sctx:
            out = flywheel_schedule(sctx)
        assert isinstance(out, dg.SkipReason) and "stopped at k=1" in out.skip_message


def test_raising_k_reopens_the_loop_run_unattended(tmp_path, tiny):
    """`pipeline.run_loop` (sensor ticks + in-process runs, no daemon) from bootstrap to the
    stop; then K is raised and the same call continues from the budget stop."""
    res = loop_resources(tmp_path, tiny, iterations=0)
    db = Store(tmp_path / "fw.duckdb")
    with dg.instance_for_test() as instance:
        boot = loop_defs(tmp_path, tiny, iterations=0).resolve_job_def("bootstrap_job").execute_in_process(
            partition_key=BENCH, instance=instance)
        assert boot.success
        first = run_loop(resources=res, instance=instance, profile=loop_profile(0))
        assert [p for p, _ in first.runs] == [key(0)] and "budget K=0" in first.last_message
        more = run_loop(resources=loop_resources(tmp_path, tiny, iterations=2), instance=instance,
                        profile=loop_profile(2))
        assert [p for p, _ in more.runs] == [key(1), key(2)]
        assert all(r.success for _, r in more.runs)
        assert "budget K=2" in more.last_message
        assert db.iterations(BENCH)["decision"].to_list() == ["continue", "continue", "stop"]
