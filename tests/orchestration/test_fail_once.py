"""One launch, one failure, one reason: under the shipped dagster.yaml's run retries, failures that
cannot pass on retry fail once (no op retry, no run retry) with the fix in the message; transient
ones keep their retries. And the gate binds every run of sft_checkpoint(b, k+1), not only the sensor.

Real pieces: the instance configured by the repository's dagster.yaml (run_retries on, max 2), the
project's jobs and assets, and the run-retry daemon's own filter (`filter_runs_to_should_retry`, what
`dagster-daemon` calls before re-executing a failed run). SFT itself is replaced by a stub where
training would only cost time (the gate and the retry decision happen before or after it).
"""

from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.storage.tags import WILL_RETRY_TAG
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import filter_runs_to_should_retry

import flywheel.assets.training as training_assets
from flywheel.core.decisions import gate_allows_next
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.failures import FAIL_ONCE_TAG, NO_RUN_RETRY_TAG
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.sft import TrainResult
from flywheel.resources import (
    CurriculumResource,
    EnvResource,
    LoopResource,
    StoreResource,
    TransformersPolicy,
)
from tests.fakes import BENCH, store_with_seeds

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def instance():
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert config["run_retries"]["enabled"] and config["run_retries"]["max_retries"] >= 1
    with dg.instance_for_test(overrides=config) as inst:
        yield inst


def resources(tmp_path, *, model: str = "model", **overrides):
    """The run's resources; `model` names a stand-in model folder (training is stubbed), absent when "missing"."""
    if model != "missing":
        (tmp_path / model).mkdir(exist_ok=True)
        (tmp_path / model / "config.json").write_text("{}")
    out = {"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": EnvResource(),
           "policy": TransformersPolicy(base_model_path=str(tmp_path / model), checkpoints_dir=str(tmp_path / "ck")),
           "curriculum": CurriculumResource(synthesize=False), "loop": LoopResource()}
    return {**out, **overrides}


def run(instance, res, k, selection):
    job = build_defs(res).resolve_job_def("iteration_job")
    result = job.execute_in_process(partition_key=str(partition_key(BENCH, k)), instance=instance, raise_on_error=False,
                                    asset_selection=[dg.AssetKey(a) for a in selection])
    return result, instance.get_run_by_id(result.run_id)


def failure_messages(result):
    return [e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure]


def retried_by_daemon(instance, dagster_run) -> bool:
    return [r.run_id for r in filter_runs_to_should_retry([dagster_run], instance)] == [dagster_run.run_id]


@pytest.fixture
def fake_train(monkeypatch):
    calls = []

    def train(base, examples, out, cfg, progress=None):
        calls.append(len(examples))
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        return TrainResult(path=str(out), n_examples=len(examples) - 1, n_dropped=1, train_loss=1.23456789, steps=1,
                           dropped=(0,))

    monkeypatch.setattr(training_assets, "train_sft", train)
    return calls


def test_k_plus_one_before_gate_k_fails_once_with_the_fix(tmp_path, instance, fake_train):
    store_with_seeds(tmp_path / "fw.duckdb")
    result, dagster_run = run(instance, resources(tmp_path), 1, ["sft_checkpoint"])
    assert not result.success and fake_train == []
    [message] = failure_messages(result)
    assert f"needs gated_dataset {BENCH}|0" in message and "materialize iteration 0 first" in message
    assert "not retried" in message
    assert dagster_run.tags[NO_RUN_RETRY_TAG] == "false" and "needs gated_dataset" in dagster_run.tags[FAIL_ONCE_TAG]
    assert dagster_run.tags[WILL_RETRY_TAG] == "false"
    assert not retried_by_daemon(instance, dagster_run)


def test_missing_model_fails_once_and_missing_checkpoint_skips_op_retries(tmp_path, instance):
    store_with_seeds(tmp_path / "fw.duckdb")
    # The policy resource checks its model before any step: the run fails at resource init, once.
    result, dagster_run = run(instance, resources(tmp_path, model="missing"), 0, ["sft_checkpoint"])
    assert not result.success
    assert "No Hugging Face model" in dagster_run.tags[FAIL_ONCE_TAG] and "prepare-model --tiny --out" in \
        dagster_run.tags[FAIL_ONCE_TAG] + "".join(failure_messages(result)) + str(result.all_events)
    assert dagster_run.tags[WILL_RETRY_TAG] == "false" and not retried_by_daemon(instance, dagster_run)

    # rollouts has an op retry policy (2 retries) for env crashes; a missing checkpoint skips it.
    result, dagster_run = run(instance, resources(tmp_path), 0, ["rollouts"])
    [message] = failure_messages(result)
    assert f"no sft_checkpoint recorded for {BENCH}|0" in message
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert dagster_run.tags[WILL_RETRY_TAG] == "false"


def test_invalid_loop_config_fails_once(tmp_path, instance, fake_train):
    store_with_seeds(tmp_path / "fw.duckdb")
    result, dagster_run = run(instance, resources(tmp_path, loop=LoopResource(patience=0)), 0, ["sft_checkpoint"])
    assert not result.success and fake_train == []
    assert "loop.patience must be an integer in 1..1000" in dagster_run.tags[FAIL_ONCE_TAG]
    assert dagster_run.tags[WILL_RETRY_TAG] == "false" and not retried_by_daemon(instance, dagster_run)


def test_transient_failure_keeps_its_run_retries(tmp_path, instance, monkeypatch):
    store_with_seeds(tmp_path / "fw.duckdb")

    def oom(*_args, **_kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(training_assets, "train_sft", oom)
    result, dagster_run = run(instance, resources(tmp_path), 0, ["sft_checkpoint"])
    assert not result.success and "out of memory" in failure_messages(result)[0]
    assert NO_RUN_RETRY_TAG not in dagster_run.tags and FAIL_ONCE_TAG not in dagster_run.tags
    assert dagster_run.tags[WILL_RETRY_TAG] == "true" and retried_by_daemon(instance, dagster_run)


def test_failed_blocking_check_binds_k_plus_one_unless_opted_out(tmp_path, instance, fake_train):
    db = store_with_seeds(tmp_path / "fw.duckdb")
    # The gate of k=0 over no rollouts: empty, so its blocking check fails, and that run fails once.
    result, gate_run = run(instance, resources(tmp_path), 0, ["gated_dataset"])
    assert not result.success and db.gated_iterations(BENCH) == [0]
    assert gate_run.tags[WILL_RETRY_TAG] == "false" and "gated_dataset_is_usable failed" in gate_run.tags[FAIL_ONCE_TAG]

    result, dagster_run = run(instance, resources(tmp_path), 1, ["sft_checkpoint"])
    [message] = failure_messages(result)
    assert "gate_check_failed" in message and "blocking check gated_dataset_is_usable failed" in message
    assert "continue_on_empty_gate" in message and fake_train == []
    assert not retried_by_daemon(instance, dagster_run)

    # The explicit opt-out (what experiment presets with continue_on_empty_gate set) trains k+1 anyway.
    # (This store has no k=0 checkpoint: k=1 trains from the base model, not from k-1 as by default.)
    base = TransformersPolicy(base_model_path=str(tmp_path / "model"), checkpoints_dir=str(tmp_path / "ck"),
                              refine_from="base")
    # (No k=0 checkpoint for the promotion gate to compare k=1 with: the gate is off here.)
    result, _ = run(instance, resources(tmp_path, loop=LoopResource(continue_on_empty_gate=True, promotion_gate=False),
                                        policy=base), 1,
                    ["sft_checkpoint"])
    assert result.success and len(fake_train) == 1
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["train_loss"].value == 1.2346 and meta["examples_dropped_too_long"].value == 1
    assert "1 of" in meta["warning"].value
    warnings = [e for e in result.all_node_events if "dropped 1 of" in (e.message or "")]
    assert warnings or any("dropped 1 of" in (r.user_message or "")
                           for r in instance.all_logs(result.run_id) if r.level >= 30)
    # The exact pairs are stored, the dropped one flagged.
    ck = db.latest_checkpoint(BENCH, 1)["checkpoint_id"]
    pairs = db.training_examples(ck, kept_only=False)
    assert len(pairs) == fake_train[0] and [p["kept"] for p in pairs].count(False) == 1 and not pairs[0]["kept"]
    assert pairs[0]["completion"][0]["role"] == "assistant" and pairs[0]["traj_id"]


def test_gate_check_verdict_goes_to_the_store_even_when_the_check_raises(tmp_path, instance, monkeypatch):
    """The loop reads the check's verdict from the store: a gate run with its check first clears the old
    verdict (Dagster's "planned"), and a check that raises is recorded as failed (as Dagster records it)."""
    import flywheel.assets.refinement as refinement

    db = store_with_seeds(tmp_path / "fw.duckdb")
    db.record_gate_check(BENCH, 0, passed=True, trajectories=3, problems=[])  # an earlier gate's verdict
    seen = []

    def boom(trajs, **_):
        seen.append(db.gate_check_passed(BENCH, 0))
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(refinement, "dataset_problems", boom)
    result, _ = run(instance, resources(tmp_path), 0, ["gated_dataset"])
    assert not result.success and "disk on fire" in failure_messages(result)[0]
    assert seen == [None] and db.gate_check_passed(BENCH, 0) is False
    assert "disk on fire" in db.query("SELECT first_problem FROM gate_checks")["first_problem"][0]


def test_gate_rule_table():
    # The one rule the sensor and sft_checkpoint share (flywheel.core.decisions.gate_allows_next).
    assert gate_allows_next(True, gated_new=0) and not gate_allows_next(False, gated_new=5)
    assert gate_allows_next(None, gated_new=1) and not gate_allows_next(None, gated_new=0)
    assert gate_allows_next(False, gated_new=0, continue_on_empty_gate=True)


def test_sensor_applies_the_same_rule(tmp_path, instance):
    """After an empty gate the sensor stops; with continue_on_empty_gate it requests k+1."""
    from flywheel.sensors import evaluate_loop

    db = Store(tmp_path / "fw.duckdb")
    store_with_seeds(tmp_path / "fw.duckdb")
    run(instance, resources(tmp_path), 0, ["gated_dataset"])  # empty gate, failed check
    # What the sensor also waits for: the curriculum, a checkpoint and the evaluation of k=0.
    for key, partition in (("synthetic_curriculum", BENCH), ("evaluation", str(partition_key(BENCH, 0)))):
        instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))
    db.record_checkpoint({"checkpoint_id": "ck0", "benchmark": BENCH, "iteration": 0, "path": "x"})
    tick = evaluate_loop(instance, db, LoopResource(benchmarks=[BENCH], iterations=2), trigger="sensor")
    assert tick.status[BENCH]["state"] == "stopped" and tick.status[BENCH]["reason"].startswith("gate_check_failed")
    assert not tick.run_requests
    db.clear_decision(BENCH, 0)
    tick = evaluate_loop(instance, db, LoopResource(benchmarks=[BENCH], iterations=2, continue_on_empty_gate=True,
                                                    min_new_successes=0), trigger="sensor")
    assert [r.partition_key for r in tick.run_requests] == [str(partition_key(BENCH, 1))]
    assert db.iterations(BENCH)["gate_check_passed"].to_list() == [False]  # recorded as it was


def test_unaffordable_rollout_budget_fails_once_before_any_work(tmp_path, instance):
    """No train_limit: the budget rule applies to the tasks the run really has, before any episode."""
    store_with_seeds(tmp_path / "fw.duckdb")
    res = resources(tmp_path, policy=TransformersPolicy(base_model_path=str(tmp_path / "model"),
                                                        checkpoints_dir=str(tmp_path / "ck"), samples_per_task=20))
    result, dagster_run = run(instance, res, 0, ["rollouts"])
    [message] = failure_messages(result)
    n = len(EnvResource().tasks(BENCH, "train"))
    assert n * 20 > 20_000
    assert f"the {n} training tasks (envs.train_limit) x policy.samples_per_task = {n} x 20" in message
    assert "lower policy.samples_per_task" in message
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert dagster_run.tags[WILL_RETRY_TAG] == "false"
    assert Store(tmp_path / "fw.duckdb").query("SELECT count(*) AS n FROM trajectories WHERE source = 'policy'")["n"][0] == 0


def test_an_empty_gate_the_loop_goes_on_past_is_a_labelled_warn_not_a_failure(tmp_path, instance):
    """loop.continue_on_empty_gate (the demo's): the gate check warns (WARN severity, a `warning` entry), the run
    succeeds with no step failure or stack trace, and the store still records the verdict the loop reads."""
    from flywheel.drivers.pipeline import empty_gate_warnings

    db = store_with_seeds(tmp_path / "fw.duckdb")
    result, gate_run = run(instance, resources(tmp_path, loop=LoopResource(continue_on_empty_gate=True)), 0,
                           ["gated_dataset"])
    assert result.success and not failure_messages(result)
    [check] = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["warning"].value.startswith(f"empty reward gate {BENCH}|0")
    [warning] = empty_gate_warnings(result)
    assert "continue_on_empty_gate" in warning and FAIL_ONCE_TAG not in gate_run.tags
    assert db.gate_check_passed(BENCH, 0) is False
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["warning"].value == "empty: admitted 0 of 0 rollouts"
