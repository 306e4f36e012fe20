"""Drive the asset graph from Python: the demo and the tests use the same code path as the UI."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import dagster as dg

from flywheel.definitions import build_defs
from flywheel.evaluation import markdown_table
from flywheel.partitions import partition_key
from flywheel.store import Store

log = logging.getLogger(__name__)

QUIET = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


class StageFailed(RuntimeError):
    pass


def _run(job: dg.JobDefinition, key: str, selection: Iterable[str], instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    result = job.execute_in_process(
        partition_key=key, instance=instance, run_config=QUIET,
        asset_selection=[dg.AssetKey(a) for a in selection], raise_on_error=False,
    )
    failed = [e for e in result.all_events if e.is_step_failure]
    checks = [e for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    bad_checks = [c for c in checks if not c.event_specific_data.passed]
    if failed or not result.success:
        reasons = "; ".join(str(e.event_specific_data.error.message).strip() for e in failed if e.event_specific_data)
        raise StageFailed(f"{job.name} {key} failed: {reasons or 'see the Dagster run log'}")
    if bad_checks:
        names = ", ".join(c.event_specific_data.check_name for c in bad_checks)
        raise StageFailed(f"{job.name} {key}: blocking check(s) failed: {names}")
    return result


def run_flywheel(
    benchmark: str,
    *,
    resources: dict[str, dg.ConfigurableResource],
    iterations: int,
    instance: dg.DagsterInstance,
    evaluate_last_only: bool = False,
) -> None:
    """Bootstrap, then iterations 0..iterations-1 (SFT, rollouts, gate, evaluation), then SFT+eval of the last."""
    defs = build_defs(resources)
    bootstrap = defs.resolve_job_def("bootstrap_job")
    iteration = defs.resolve_job_def("iteration_job")
    log.info("== stage 1/2: expert replay, teacher quaternions, curriculum (%s)", benchmark)
    _run(bootstrap, benchmark, ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"], instance)
    for k in range(iterations):
        log.info("== iteration %d: SFT, rollouts, reward gate, evaluation", k)
        selection = ["sft_checkpoint", "rollouts", "gated_dataset"]
        if not evaluate_last_only:
            selection.append("evaluation")
        _run(iteration, str(partition_key(benchmark, k)), selection, instance)
    log.info("== iteration %d: SFT on seeds + gated successes, evaluation", iterations)
    _run(iteration, str(partition_key(benchmark, iterations)), ["sft_checkpoint", "evaluation"], instance)


def results_table(store: Store, benchmark: str) -> str:
    """Success of every evaluated checkpoint, seen and unseen side by side."""
    df = store.query(
        "SELECT iteration, split, success_rate, avg_reward, mean_steps, prompt_tokens_per_step, "
        "tokens_per_step, invalid_action_rate, episodes FROM evaluations WHERE benchmark = ? ORDER BY iteration, split",
        [benchmark],
    )
    rows: dict[int, dict] = {}
    for r in df.iter_rows(named=True):
        row = rows.setdefault(r["iteration"], {"checkpoint": f"k={r['iteration']}"})
        s = r["split"]
        row[f"{s} success"] = r["success_rate"]
        row[f"{s} reward"] = r["avg_reward"]
        row[f"{s} steps"] = r["mean_steps"]
        row[f"{s} invalid"] = r["invalid_action_rate"]
        row[f"{s} n"] = r["episodes"]
        row["prompt tok/step"] = r["prompt_tokens_per_step"]
    cols = ["checkpoint", "seen success", "unseen success", "seen reward", "unseen reward", "seen steps",
            "unseen steps", "seen invalid", "unseen invalid", "prompt tok/step", "seen n", "unseen n"]
    return markdown_table(list(rows.values()), cols)
