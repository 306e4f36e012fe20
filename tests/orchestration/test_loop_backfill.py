"""A backfill over one benchmark's iterations, launched through Dagster's GraphQL API (what the
UI's "Launch backfill" sends), runs its iterations in order.

Fast test: the run queue launches the backfill's runs one at a time, lowest k first (the
launcher only records). Then the same with real run workers, on the test benchmark (tests/tinybench).

Real pieces: the GraphQL schema the webserver serves, a code server process loading
tests/loop_support.py, the backfill daemon's and the run queue daemon's iterations (called
here instead of waiting for `dagster-daemon`'s intervals), the instance configured by the
repository's dagster.yaml, and run worker processes executing the iterations.

The backfill submits (b,1) *before* (b,0) on purpose: the order comes from the run queue
(one iteration per benchmark, `dagster/priority` = -k), not from submission order.
"""

import logging
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION
from dagster_graphql.test.utils import (
    define_out_of_process_context,
    execute_dagster_graphql,
    infer_repository_selector,
)

from flywheel.core.store import Store
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.models import build_tiny_model
from tests import loop_support
from tests.loop_support import BENCH, MODEL_ENV, ROOT_ENV, RecordingRunLauncher, loop_defs

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def wait_for(instance, run_id, timeout=300):
    """The run once it is finished: terminal, and, if it failed, with Dagster's retry decision
    (`dagster/will_retry`) recorded. The instance writes the failure status first and adds that tag in a second
    write (`handle_new_event`, run retries on, as the shipped dagster.yaml has them): read in between, under load,
    the tag was missing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run.status in TERMINAL and (run.status != dg.DagsterRunStatus.FAILURE or "dagster/will_retry" in run.tags):
            return run
        time.sleep(1)
    run = instance.get_run_by_id(run_id)
    raise TimeoutError(f"run {run_id} still {run.status}, tags {run.tags}")


def key(k: int) -> str:
    return str(partition_key(BENCH, k))


def runs_by_partition(instance):
    return {r.tags["dagster/partition"]: r for r in instance.get_runs(filters=dg.RunsFilter(job_name="iteration_job"))}


def launch_backfill(ctx, partitions, run_config=None):
    params = {"selector": {"partitionSetName": "iteration_job_partition_set",
                           "repositorySelector": infer_repository_selector(ctx)},
              "partitionNames": partitions}
    if run_config:
        params["runConfigData"] = run_config
    result = execute_dagster_graphql(ctx, LAUNCH_PARTITION_BACKFILL_MUTATION, {"backfillParams": params})
    launched = result.data["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


def test_graphql_backfill_is_dequeued_lowest_iteration_first(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    monkeypatch.setenv(MODEL_ENV, str(tmp_path / "unused-model"))
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["run_launcher"] = {"module": "tests.loop_support", "class": "RecordingRunLauncher"}
    RecordingRunLauncher.launched.clear()
    log = logging.getLogger("test_backfill")
    with dg.instance_for_test(overrides=config) as instance:
        with define_out_of_process_context(loop_support.__file__, "defs", instance) as ctx:
            backfill_id = launch_backfill(ctx, [key(2), key(1), key(0)])
            list(execute_backfill_iteration(ctx.process_context, log))
            runs = runs_by_partition(instance)
            assert len(runs) == 3 and {r.tags["dagster/backfill"] for r in runs.values()} == {backfill_id}
            queue = QueuedRunCoordinatorDaemon(interval_seconds=1)
            for i, expected in enumerate([key(0), key(1), key(2)]):
                list(queue.run_iteration(ctx.process_context))
                list(queue.run_iteration(ctx.process_context))  # a second pass launches nothing more
                assert RecordingRunLauncher.launched == [key(0), key(1), key(2)][: i + 1]
                instance.report_dagster_event(  # the iteration finishes
                    DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value, job_name="iteration_job"),
                    run_id=runs[expected].run_id)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_graphql_backfill_runs_iterations_in_order(tmp_path, monkeypatch):
    tiny = str(build_tiny_model(tmp_path / "tiny", vocab_size=512))
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    monkeypatch.setenv(MODEL_ENV, tiny)
    instance_config = yaml.safe_load((REPO / "dagster.yaml").read_text())  # the shipped run queue settings
    log = logging.getLogger("test_backfill")
    with dg.instance_for_test(overrides=instance_config) as instance:
        boot = loop_defs(tmp_path, tiny).resolve_job_def("bootstrap_job")
        assert boot.execute_in_process(partition_key=BENCH, instance=instance).success

        with define_out_of_process_context(loop_support.__file__, "defs", instance) as ctx:
            backfill_id = launch_backfill(  # in_process: one process per run, a faster test
                ctx, [key(1), key(0)], {"execution": {"config": {"in_process": {}}}})

            list(execute_backfill_iteration(ctx.process_context, log))  # the daemon submits both runs
            runs = runs_by_partition(instance)
            assert set(runs) == {key(0), key(1)}
            assert all(r.status == dg.DagsterRunStatus.QUEUED and r.tags["dagster/backfill"] == backfill_id
                       for r in runs.values())
            assert runs[key(1)].tags["dagster/priority"] == "-1"

            queue = QueuedRunCoordinatorDaemon(interval_seconds=1)
            list(queue.run_iteration(ctx.process_context))  # dequeues k=0 only: k=1 waits its turn
            runs = runs_by_partition(instance)
            assert runs[key(1)].status == dg.DagsterRunStatus.QUEUED
            assert runs[key(0)].status != dg.DagsterRunStatus.QUEUED
            first = wait_for(instance, runs[key(0)].run_id)
            assert first.status == dg.DagsterRunStatus.SUCCESS

            list(queue.run_iteration(ctx.process_context))
            second = wait_for(instance, runs[key(1)].run_id)
            assert second.status == dg.DagsterRunStatus.SUCCESS

        r0, r1 = instance.get_run_record_by_id(first.run_id), instance.get_run_record_by_id(second.run_id)
        assert r0.end_time <= r1.start_time
        db = Store(tmp_path / "fw.duckdb")
        ck = db.query("SELECT iteration, lineage FROM checkpoints ORDER BY created_at")
        assert ck["iteration"].to_list() == [0, 1] and '"gated_iterations": [0]' in ck["lineage"][1]
        assert db.gated_iterations(BENCH) == [0, 1]
        assert db.iterations(BENCH)["new_unique_successes"].to_list() == [2, 2]
        mats = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("sft_checkpoint"), asset_partitions=[key(1)]), limit=1)
        meta = mats.records[0].asset_materialization.metadata
        assert meta["gated_trajectories"].value == 2 and "gated_dataset iterations [0]" in meta["back_edge"].value


def test_backfill_of_k_plus_one_after_a_failed_gate_fails_once(tmp_path, monkeypatch):
    """The gate binds backfills too: a backfill of (b,1), launched through GraphQL and executed by a
    real run worker process, refuses in sft_checkpoint because gated_dataset(b,0)'s blocking check
    failed, once: no op retry, no run retry, no checkpoint, the reason and the fix in the message."""
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import filter_runs_to_should_retry

    from flywheel.orchestration.failures import FAIL_ONCE_TAG
    model = tmp_path / "model"  # never loaded: the refusal comes before training
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    monkeypatch.setenv(MODEL_ENV, str(model))
    db = Store(tmp_path / "fw.duckdb")
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())  # run retries on, the shipped queue
    with dg.instance_for_test(overrides=config) as instance:
        # Gate 0 over no rollouts: empty, so its blocking check fails.
        gate = loop_defs(tmp_path, str(model)).resolve_job_def("iteration_job").execute_in_process(
            partition_key=key(0), instance=instance, raise_on_error=False,
            asset_selection=[dg.AssetKey("gated_dataset")])
        assert not gate.success and db.gate_run(BENCH, 0) is not None

        with define_out_of_process_context(loop_support.__file__, "defs", instance) as ctx:
            backfill_id = launch_backfill(ctx, [key(1)], {"execution": {"config": {"in_process": {}}}})
            list(execute_backfill_iteration(ctx.process_context, logging.getLogger("test_backfill")))
            list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(ctx.process_context))
            queued = runs_by_partition(instance)[key(1)]
            assert queued.tags["dagster/backfill"] == backfill_id
            run = wait_for(instance, queued.run_id)

        assert run.status == dg.DagsterRunStatus.FAILURE
        assert run.tags[FAIL_ONCE_TAG].startswith(f"gate_check_failed: gated_dataset {key(0)}")
        [failure] = [e.dagster_event.event_specific_data.error.message for e in instance.all_logs(run.run_id)
                     if e.dagster_event and e.dagster_event.event_type == dg.DagsterEventType.STEP_FAILURE]
        assert "blocking check gated_dataset_is_usable failed" in failure and "continue_on_empty_gate" in failure
        assert run.tags["dagster/will_retry"] == "false" and not list(filter_runs_to_should_retry([run], instance))
        steps = {e.step_key: e.dagster_event.event_type for e in instance.all_logs(run.run_id)
                 if e.dagster_event and e.dagster_event.is_step_event}
        assert steps.get("sft_checkpoint") == dg.DagsterEventType.STEP_FAILURE
        assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in steps.values()
        assert db.latest_checkpoint(BENCH, 1) is None
        assert len(instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))) == 1  # no retry run
