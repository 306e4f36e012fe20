"""Drive the asset graph from Python: the demo and the tests use the same code path as the UI."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from flywheel.core.metrics import markdown_table
from flywheel.core.store import Store
from flywheel.core.validation import ConfigurationError, check_benchmark
from flywheel.definitions import build_defs
from flywheel.orchestration.failures import FAIL_ONCE_TAG
from flywheel.orchestration.methods import job_for, method_stages
from flywheel.orchestration.partitions import max_partition_for
from flywheel.profile import Profile

log = logging.getLogger(__name__)

def console(level: str) -> dict:
    """Run config for Dagster's console logger at `level`: INFO prints every progress line of every asset,
    WARNING (the demo's) only warnings; `stage_lines` then says what each asset did, one line each."""
    return {"loggers": {"console": {"config": {"log_level": level}}}}


QUIET = console("INFO")
# What `stage_lines` reports of an asset, from its materialization's metadata, in this order (those present).
SUMMARY_KEYS = ("trajectories", "train_steps", "train_loss", "train_seconds", "episodes_played", "tasks_with_a_success",
                "candidates", "passed", "yield_per_100_episodes", "steps_before_cleaning", "steps_after_cleaning",
                "seen_successes", "seen_episodes", "unseen_successes", "unseen_episodes", "validation_successes",
                "validation_episodes")


# Exceptions no rerun can fix (the user changes something first); a full disk is one too (`disk_full`).
NOT_RETRYABLE = frozenset({"ConfigurationError", "ModelNotFoundError", "MissingDataError", "ForeignStoreError",
                           "NotRetryable", "TeacherRefused", "ArmFileError"})


class StageFailed(RuntimeError):
    """A stage's run failed; the message ends with the user's exception (`root_cause`), and `retryable` says
    whether a rerun can succeed as it is (not after a configuration error, a full disk, a teacher that refuses)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class GateBlocked(StageFailed):
    """A blocking check stopped the flywheel (e.g. nothing passed the reward gate): a result, not a crash."""


def run_stage(job: dg.JobDefinition, key: str, selection: Iterable[str], instance: dg.DagsterInstance,
              *, log_level: str = "INFO") -> dg.ExecuteInProcessResult:
    result = job.execute_in_process(
        partition_key=key, instance=instance, run_config=console(log_level),
        asset_selection=[dg.AssetKey(a) for a in selection], raise_on_error=False,
    )
    failed = [e for e in result.all_events if e.is_step_failure]
    checks = [e for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    # WARN-severity checks (policy k vs k-1) inform; only ERROR checks (the gate) stop the demo.
    bad_checks = [c for c in checks if not c.event_specific_data.passed
                  and c.event_specific_data.severity == dg.AssetCheckSeverity.ERROR]
    names = [c.event_specific_data.check_name for c in bad_checks]
    genuine = [e for e in failed if not any(e.step_key.endswith(n) for n in names)]
    if genuine or (not result.success and not bad_checks):
        raise stage_failure(f"{job.name} {key}", genuine, result, instance)
    if bad_checks:
        raise GateBlocked(f"{job.name} {key}: blocking check(s) failed: {', '.join(names)}")
    if log_level != "INFO":  # Dagster's own lines are off: one line per asset and check says what happened
        for line in stage_lines(result):
            log.info("%s", line)
    for warning in empty_gate_warnings(result):
        log.warning("%s", warning)
    for promoted, verdict in promotion_verdicts(result):
        (log.info if promoted else log.warning)("promotion gate: %s", verdict)
    return result


def stage_lines(result: dg.ExecuteInProcessResult) -> list[str]:
    """One line per materialized asset (its SUMMARY_KEYS metadata) and per asset check (passed, or its
    severity, and its verdict), in the order the run produced them."""
    lines = []
    for e in result.all_events:
        data = e.event_specific_data
        if e.event_type_value == "ASSET_MATERIALIZATION":
            meta = data.materialization.metadata
            shown = [f"{k} {_plain(meta[k].value)}" for k in SUMMARY_KEYS if k in meta]
            lines.append(f"   {data.materialization.asset_key.to_user_string()}: {', '.join(shown) or 'done'}")
        elif e.event_type_value == "ASSET_CHECK_EVALUATION":
            verdict = data.metadata.get("verdict")  # a WARN's own text is logged once, as a warning
            state = "passed" if data.passed else f"{data.severity.value}"
            lines.append(f"   check {data.check_name}: {state}" + (f" ({verdict.value})" if verdict else ""))
    return lines


def _plain(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def stage_failure(what: str, failed: list[dg.DagsterEvent], result: dg.ExecuteInProcessResult,
                  instance: dg.DagsterInstance) -> StageFailed:
    """StageFailed naming the user's exception of each failed step (else the run's first error) and whether a
    rerun can fix it: not after `fail_once` tagged the run, an exception in NOT_RETRYABLE or a full disk."""
    errors = [e.event_specific_data.error for e in failed if e.event_specific_data] or [
        err for e in result.all_events if (err := getattr(e.event_specific_data, "error", None)) is not None][:1]
    causes = [root_cause(err) for err in errors]
    run = instance.get_run_by_id(result.run_id)
    fail_once = run is not None and FAIL_ONCE_TAG in run.tags
    full = any(disk_full(text) for _, text in causes)
    reasons = "; ".join(text if cls == "Failure" else f"{cls}: {text}" for cls, text in causes)
    if full:
        reasons += (" (the disk is full: free space there, or point runs_dir elsewhere, and rerun; finished stages "
                    "and recorded episodes are kept)")
    retryable = not (fail_once or full or any(cls in NOT_RETRYABLE for cls, _ in causes))
    return StageFailed(f"{what} failed: {reasons or 'see the Dagster run log'}", retryable=retryable)


def root_cause(error: Any) -> tuple[str, str]:
    """(type, message in one line) of the user's exception that a step failure wraps: the end of the error's
    `cause` chain, past Dagster's DagsterExecutionStepExecutionError ("Error occurred while executing op ...")
    and any exception the user's code raised `from` it. A `dg.Failure` (fail_once) keeps its description."""
    while error is not None and error.cause is not None:
        error = error.cause
    if error is None:
        return "Error", "see the Dagster run log"
    text = " ".join(str(error.message).split())
    head, sep, rest = text.partition(": ")
    if sep and head.rsplit(".", 1)[-1] == error.cls_name:  # Dagster prefixes the message with the class
        text = rest
    return error.cls_name or "Error", text


def disk_full(text: str) -> bool:
    """An error text of a full disk (OSError errno 28, DuckDB's "No space left on device")."""
    return "[Errno 28]" in text or "No space left on device" in text


def empty_gate_warnings(result: dg.ExecuteInProcessResult) -> list[str]:
    """The labelled warnings of a run's empty gates: the gate check's WARN (loop.continue_on_empty_gate)."""
    out = []
    for e in result.all_events:
        data = e.event_specific_data if e.event_type_value == "ASSET_CHECK_EVALUATION" else None
        if data is not None and data.check_name == "gated_dataset_is_usable" and not data.passed \
                and data.severity == dg.AssetCheckSeverity.WARN:
            entry = data.metadata.get("warning")
            out.append(str(entry.value) if entry is not None else f"empty reward gate ({e.partition})")
    return out


def promotion_verdicts(result: dg.ExecuteInProcessResult) -> list[tuple[bool, str]]:
    """(promoted, verdict) of each promotion gate a run evaluated (`checkpoint_is_promoted` on sft_checkpoint)."""
    out = []
    for e in result.all_events:
        data = e.event_specific_data if e.event_type_value == "ASSET_CHECK_EVALUATION" else None
        if data is not None and data.check_name == "checkpoint_is_promoted":
            entry = data.metadata.get("verdict")
            out.append((bool(data.passed), str(entry.value) if entry is not None else f"({e.partition})"))
    return out


def run_flywheel(
    benchmark: str,
    *,
    resources: dict[str, dg.ConfigurableResource],
    iterations: int,
    instance: dg.DagsterInstance,
    evaluate_last_only: bool = False,
    benchmark_refs: dict[str, str] | None = None,
    profile: Profile | None = None,
    log_level: str = "INFO",
) -> list[str]:
    """Bootstrap, then iterations 0..iterations-1 (SFT, rollouts, gate, evaluation), then SFT+eval of the last.
    `benchmark_refs` names a benchmark outside the registry (name -> "module:attribute", as in a profile);
    `profile` (the demo's) sizes the partitions instead (`_defs`), and names the references.

    An empty reward gate (its blocking check failed) raises GateBlocked, unless the `loop` resource says
    `continue_on_empty_gate`: then k+1 trains anyway (as `sft_checkpoint` allows it) and the gate's message
    is returned, one per empty gate. `log_level` is Dagster's console level (`console`; the demo's is WARNING,
    with `stage_lines` instead)."""
    refs = dict(profile.benchmark_refs if profile else benchmark_refs or {})
    check_benchmark(benchmark, where="run_flywheel(benchmark=...)", refs=refs)
    if iterations < 0:
        raise ConfigurationError(f"iterations must be >= 0, got {iterations}")
    defs = _defs(benchmark, resources, profile or _run_profile(benchmark, iterations, refs))
    continue_on_empty_gate = bool(getattr(resources.get("loop"), "continue_on_empty_gate", False))
    empty_gates: list[str] = []
    # The method's stages (orchestration.methods.method_stages, the planner experiments use too), one Dagster run
    # per partition: bootstrap, then each k's SFT, rollouts, gate and evaluation together.
    for key, stages in itertools.groupby(method_stages(benchmark, iterations, "bpo"), key=lambda s: s[1]):
        stages = list(stages)
        selection = [a for _, _, assets in stages for a in assets]
        if key is None:
            log.info("== stage 1/2: expert replay, teacher quaternions, curriculum (%s)", benchmark)
            run_stage(defs.resolve_job_def(f"{job_for(stages[0][0])}_job"), benchmark, selection, instance,
                      log_level=log_level)
            continue
        k = int(stages[0][0].split(":")[1])
        if evaluate_last_only and k < iterations:
            selection = [a for a in selection if a != "evaluation"]
        log.info("== iteration %d: %s", k, "SFT, rollouts, reward gate, evaluation" if k < iterations
                 else "SFT on seeds + gated successes, evaluation")
        try:
            result = run_stage(defs.resolve_job_def(f"{job_for(stages[0][0])}_job"), key, selection, instance,
                               log_level=log_level)
            empty_gates += empty_gate_warnings(result)
        except GateBlocked as exc:
            if not continue_on_empty_gate or k == iterations:
                raise
            log.warning("%s; continuing (loop.continue_on_empty_gate)", exc)
            empty_gates.append(str(exc))
    return empty_gates


def _run_profile(benchmark: str, iterations: int, refs: dict[str, str]) -> Profile:
    """The partitions of a run of iterations 0..K: this benchmark, 0..K (max_partition_for: at least the default
    range)."""
    return Profile(benchmarks=(benchmark,), benchmark_refs=refs, iterations=max_partition_for(iterations))


def _defs(benchmark: str, resources: dict[str, dg.ConfigurableResource], profile: Profile) -> dg.Definitions:
    if benchmark not in profile.benchmarks:
        raise ConfigurationError(f"benchmark {benchmark!r} is not one of the profile's {list(profile.benchmarks)}")
    return build_defs(resources, profile=profile)


def materialize_dashboard(benchmark: str, *, resources: dict[str, dg.ConfigurableResource],
                          instance: dg.DagsterInstance, profile: Profile, log_level: str = "INFO") -> bool:
    """Materialize `flywheel_summary` (the dashboard) of `benchmark` from the store's evaluations, so the UI shows
    it after the demo; a store without evaluations is one warning line (the asset says why), not a failure."""
    log.info("== dashboard: flywheel_summary %s (the per-iteration table and chart in the UI)", benchmark)
    job = _defs(benchmark, resources, profile).resolve_job_def("summary_job")
    try:
        run_stage(job, benchmark, ["flywheel_summary"], instance, log_level=log_level)
    except StageFailed as exc:
        log.warning("no dashboard: %s", exc)
        return False
    return True


@dataclass
class LoopRun:
    """What `run_loop` did: the runs in launch order, and the loop's last word."""

    runs: list[tuple[str, dg.ExecuteInProcessResult]] = field(default_factory=list)
    cursor: str | None = None
    last_message: str = ""


def run_loop(
    *,
    resources: dict[str, dg.ConfigurableResource],
    instance: dg.DagsterInstance,
    max_runs: int = 50,
    trigger: str = "sensor",
    profile: Profile | None = None,
) -> LoopRun:
    """Drive the living flywheel in this process, without a daemon: evaluate `flywheel_sensor`
    (or `flywheel_schedule`) against `instance`, execute the runs it requests in order, repeat
    until it requests nothing. Same code path as the daemon, minus the process boundary; like
    the daemon, a run key is launched at most once. `profile` sizes the partitions (`build_defs`'s)."""
    defs = build_defs(resources, profile=profile)
    job = defs.resolve_job_def("iteration_job")
    # The definitions' own sensor and schedule: over the profile's partitions, as the daemon runs them.
    flywheel_sensor, flywheel_schedule = defs.resolve_sensor_def("flywheel_sensor"), defs.resolve_schedule_def("flywheel_schedule")
    res = {"store": defs.resources["store"], "loop": defs.resources["loop"]}
    out = LoopRun()
    seen_keys: set[str] = set()
    started = time.time()
    while len(out.runs) < max_runs:
        # Contexts are closed at once (a context left to the garbage collector would reset
        # Dagster's state-storage ContextVar to a dead instance's later on).
        if trigger == "schedule":
            with dg.build_schedule_context(instance=instance, resources=res) as sctx:
                result = flywheel_schedule(sctx)
            requests = [r for r in (result if isinstance(result, list) else []) if isinstance(r, dg.RunRequest)]
            out.last_message = result.skip_message if isinstance(result, dg.SkipReason) else ""
        else:
            with dg.build_sensor_context(instance=instance, cursor=out.cursor, resources=res,
                                         last_sensor_start_time=started) as ctx:  # a real tick, not a preview
                result = flywheel_sensor(ctx)
            out.cursor = result.cursor
            requests = list(result.run_requests or [])
            out.last_message = result.skip_reason.skip_message if result.skip_reason else ""
        requests = [r for r in requests if r.run_key not in seen_keys]
        if not requests:
            break
        for req in requests:
            seen_keys.add(str(req.run_key))
            log.info("== loop: %s %s (%s)", req.partition_key, req.tags.get("flywheel/decision"), req.tags.get("flywheel/reason"))
            run = job.execute_in_process(partition_key=req.partition_key, instance=instance, tags=dict(req.tags),
                                         run_config=QUIET, raise_on_error=False)
            out.runs.append((str(req.partition_key), run))
    return out


def iterations_table(store: Store, benchmark: str) -> str:
    """The loop's record: what each iteration added and why the loop continued or stopped."""
    df = store.iterations(benchmark)
    cols = ["iteration", "new_unique_successes", "gated_total", "train_trajectories", "seen_success",
            "unseen_success", "gate_check_passed", "decision", "reason"]
    return markdown_table(list(df.iter_rows(named=True)), cols)
