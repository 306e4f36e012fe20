"""The living flywheel: a sensor and a schedule that run iterations k = 0..K per benchmark.

Both evaluate the same `evaluate_loop`, per benchmark:

1. not bootstrapped (`synthetic_curriculum(b)` never materialized) -> nothing to do;
2. iteration 0 not started -> request `iteration_job(b, 0)`;
3. walk k = 0, 1, ... over the decisions recorded in the store's `iterations` table;
   at the first undecided k: wait until `gated_dataset(b,k)` ran, its blocking check
   `gated_dataset_is_usable` was evaluated (both read from the store, where they record
   themselves) and `evaluation(b,k)` materialized (read from the Dagster instance through its
   public API), then `flywheel.core.decisions.decide` says continue or stop and why;
   the decision is claimed in `iterations` (so the sensor and the schedule never both
   launch), and "continue" requests `iteration_job(b, k+1)` with the decision in its tags.

The cursor of the sensor holds the latest state per benchmark (shown in the UI), the run
tags say why each run was started, and `iterations` keeps the whole history. A stop at
the budget is reopened when K is raised. A sensor preview (the UI's "Preview tick result", a
dry run: no `last_sensor_start_time`, which the daemon always passes) shows the same result and
writes nothing: no decision, no claim, no freed slot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from flywheel.core.decisions import Decision, IterationFacts, StopRules, decide, gate_allows_next
from flywheel.core.settings import DEFAULT_LOOP_CRON
from flywheel.core.store import Store
from flywheel.orchestration.partitions import DEFAULT as DEFAULT_PARTITIONS
from flywheel.orchestration.partitions import DEFAULT_ITERATIONS, Partitions, parse_key, partition_key
from flywheel.orchestration.slots import release_dead_slots
from flywheel.resources import LoopResource, StoreResource

ITERATION_JOB = "iteration_job"
CURRICULUM = dg.AssetKey("synthetic_curriculum")
EVALUATION = dg.AssetKey("evaluation")
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
TAG_PREFIX = "flywheel/"


@dataclass
class LoopTick:
    run_requests: list[dg.RunRequest] = field(default_factory=list)
    status: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self) -> str:
        if not self.status:
            return "no benchmark to drive"
        return "; ".join(f"{b}: {s['state']}" + (f" at k={s['iteration']}" if s.get("iteration") is not None else "")
                         + f" ({s['reason']})" for b, s in sorted(self.status.items()))

    def cursor(self) -> str:
        return json.dumps(self.status, sort_keys=True)


# -- facts from the Dagster instance ---------------------------------------------------------
def _materialization(instance: dg.DagsterInstance, asset: dg.AssetKey, partition: str) -> Any | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset, asset_partitions=[partition]), limit=1
    ).records
    return records[0] if records else None


def in_flight(instance: dg.DagsterInstance, partition: str) -> bool:
    return bool(instance.get_run_records(
        filters=dg.RunsFilter(job_name=ITERATION_JOB, statuses=IN_FLIGHT, tags={"dagster/partition": partition}),
        limit=1,
    ))


# -- the tick ---------------------------------------------------------------------------------
def _started(instance: dg.DagsterInstance, db: Store, benchmark: str, k: int) -> bool:
    """Iteration k is running, or was trained after the gate it depends on."""
    if in_flight(instance, str(partition_key(benchmark, k))):
        return True
    ckpt = db.latest_checkpoint(benchmark, k)
    if ckpt is None:
        return False
    if k == 0:
        return True
    gate = db.gate_run(benchmark, k - 1)
    return gate is None or ckpt["created_at"] >= gate["created_at"]


def _request(benchmark: str, k: int, run_key: str, trigger: str, decision: Decision | None, after: int | None) -> dg.RunRequest:
    tags = {f"{TAG_PREFIX}trigger": trigger, f"{TAG_PREFIX}decision": decision.action if decision else "start",
            f"{TAG_PREFIX}reason": (decision.reason if decision else "bootstrap complete: starting iteration 0")[:480]}
    if after is not None:
        tags[f"{TAG_PREFIX}after_iteration"] = str(after)
    return dg.RunRequest(run_key=run_key, partition_key=str(partition_key(benchmark, k)), tags=tags)


def _facts(db: Store, benchmark: str, k: int, rows: dict[int, dict[str, Any]], check_passed: bool) -> IterationFacts:
    row = rows.get(k) or {}
    gate = db.gate_run(benchmark, k) or {}
    by_split = {split: r["success_rate"] for split, r in db.evaluations_at(benchmark, k).items()}
    new = row.get("new_unique_successes")
    total = row.get("gated_total")
    return IterationFacts(
        iteration=k, gate_check_passed=check_passed,
        new_unique_successes=int(new if new is not None else gate.get("passed", 0) or 0),
        gated_total=int(total if total is not None else len(db.traj_ids_gated_up_to(benchmark, k))),
        seen_success=by_split.get("seen"), unseen_success=by_split.get("unseen"),
    )


def _benchmark_tick(instance: dg.DagsterInstance, db: Store, rules: StopRules, benchmark: str, trigger: str,
                    tick: LoopTick, *, continue_on_empty_gate: bool = False, dry_run: bool = False) -> None:
    def state(name: str, k: int | None, reason: str) -> None:
        tick.status[benchmark] = {"state": name, "iteration": k, "reason": reason}

    curriculum = _materialization(instance, CURRICULUM, benchmark)
    if curriculum is None:
        return state("not_bootstrapped", None, "synthetic_curriculum not materialized: run bootstrap_job")
    if not _started(instance, db, benchmark, 0):
        run_key = f"flywheel:{benchmark}:0:curriculum@{curriculum.storage_id}"
        if not dry_run and not db.claim_start(benchmark, run_key, trigger):
            return state("waiting", 0, f"iteration 0 already requested ({run_key}); no checkpoint yet: see that run")
        tick.run_requests.append(_request(benchmark, 0, run_key, trigger, None, None))
        return state("launched", 0, "bootstrap complete: starting iteration 0")
    rows = {r["iteration"]: r for r in db.iterations(benchmark).iter_rows(named=True)}
    k = 0
    while True:
        partition = str(partition_key(benchmark, k))
        row = rows.get(k) or {}
        decided = row.get("decision")
        if decided == "stop" and str(row.get("reason", "")).startswith("budget") and k < rules.iterations:
            if not dry_run:
                db.clear_decision(benchmark, k)  # K was raised since: decide again
            decided = None
        if decided == "continue":
            if not _started(instance, db, benchmark, k + 1):
                tick.run_requests.append(_request(
                    benchmark, k + 1, row.get("next_run_key") or f"flywheel:{benchmark}:{k + 1}:retry",
                    trigger, Decision("continue", row["reason"], k + 1), k))
                return state("launched", k + 1, str(row["reason"]))
            k += 1
            continue
        if decided is not None:
            return state("stopped", k, str(row["reason"]))
        if in_flight(instance, partition):
            return state("running", k, f"iteration_job {partition} is running")
        gate = db.gate_run(benchmark, k)
        passed = db.gate_check_passed(benchmark, k)
        missing = [what for what, ok in (
            ("gated_dataset", gate is not None), ("gated_dataset_is_usable", passed is not None),
            ("evaluation", _materialization(instance, EVALUATION, partition) is not None)) if not ok]
        if missing:
            return state("waiting", k, f"waiting for {', '.join(missing)} of {partition}")
        history = [_facts(db, benchmark, i, rows, True) for i in range(k)]
        # The one gate rule (flywheel.core.decisions.gate_allows_next), also applied by sft_checkpoint(b, k+1).
        gate_ok = gate_allows_next(passed, gated_new=int(gate.get("passed") or 0) if gate else 0,
                                   continue_on_empty_gate=continue_on_empty_gate)
        history.append(_facts(db, benchmark, k, rows, gate_ok))
        decision = decide(history, rules)
        cur = history[-1]
        ckpt = db.latest_checkpoint(benchmark, k) or {}
        run_key = f"flywheel:{benchmark}:{k + 1}:gate@{gate['created_at'].isoformat()}" if gate else None
        claimed = dry_run or db.claim_decision(benchmark, k, {
            "checkpoint_id": ckpt.get("checkpoint_id"), "train_trajectories": ckpt.get("n_trajectories"),
            "seen_success": cur.seen_success, "unseen_success": cur.unseen_success, "gate_check_passed": bool(passed),
            "decision": decision.action, "reason": decision.reason, "decided_by": trigger,
            "next_run_key": run_key if decision.action == "continue" else None,
        })
        if not claimed:  # the other trigger decided k in the meantime: read it next tick
            return state("decided", k, "decided by another trigger")
        if decision.action == "continue" and not _started(instance, db, benchmark, k + 1):
            tick.run_requests.append(_request(benchmark, k + 1, str(run_key), trigger, decision, k))
            return state("launched", k + 1, decision.reason)
        return state("stopped" if decision.action == "stop" else "continued", k, decision.reason)


def evaluate_loop(instance: dg.DagsterInstance, db: Store, loop: LoopResource, *, trigger: str,
                  partitions: Partitions = DEFAULT_PARTITIONS, dry_run: bool = False) -> LoopTick:
    """One tick of the loop over the configured benchmarks (default: every benchmark partition);
    `dry_run`: the same result, nothing written to the store."""
    # a bad config (K beyond the partitions, a loop benchmark that is no partition) fails the tick loudly
    rules = loop.stop_rules(max_partition=partitions.max_partition, partitions=partitions.benchmarks)
    tick = LoopTick()
    for benchmark in loop.benchmarks or sorted(partitions.benchmarks):
        _benchmark_tick(instance, db, rules, benchmark, trigger, tick, continue_on_empty_gate=loop.continue_on_empty_gate,
                         dry_run=dry_run)
    return tick


def loop_automation(
    cron: str = DEFAULT_LOOP_CRON, partitions: Partitions = DEFAULT_PARTITIONS,
) -> tuple[dg.SensorDefinition, dg.ScheduleDefinition]:
    """The loop's sensor and schedule over `partitions`; the cadence comes from the profile (`loop_cron`)."""

    @dg.sensor(
        name="flywheel_sensor",
        job_name=ITERATION_JOB,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Starts flywheel iteration k+1 once iteration k's gate check passed and its evaluation "
        "materialized; stops at K or when the gated dataset / seen success stop improving (see `iterations`).",
    )
    def flywheel_sensor(context: dg.SensorEvaluationContext, store: StoreResource, loop: LoopResource) -> dg.SensorResult:
        dry_run = context.last_sensor_start_time is None  # a preview: the daemon's ticks always pass it
        if not dry_run:
            free_dead_slots(context.instance, context.log)
        tick = evaluate_loop(context.instance, store.get(), loop, trigger="sensor", partitions=partitions,
                             dry_run=dry_run)
        if tick.run_requests:
            return dg.SensorResult(run_requests=tick.run_requests, cursor=tick.cursor())
        return dg.SensorResult(skip_reason=tick.summary(), cursor=tick.cursor())

    @dg.schedule(
        name="flywheel_schedule",
        cron_schedule=cron,
        job_name=ITERATION_JOB,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"The flywheel loop on a cadence ({cron}, the profile's loop_cron): the same decisions as "
        "flywheel_sensor.",
    )
    def flywheel_schedule(context: dg.ScheduleEvaluationContext, store: StoreResource, loop: LoopResource):
        free_dead_slots(context.instance, context.log)
        tick = evaluate_loop(context.instance, store.get(), loop, trigger="schedule", partitions=partitions)
        return tick.run_requests or dg.SkipReason(tick.summary())

    return flywheel_sensor, flywheel_schedule


def free_dead_slots(instance: dg.DagsterInstance, log) -> list[str]:
    """Every tick frees the pool slots of runs whose worker died (a SIGKILLed or OOM-killed SFT),
    so the next SFT waits at most one tick. Only with the default run launcher: its run workers
    are processes of this host, whose pids can be checked (other launchers have run monitoring)."""
    if not isinstance(instance.run_launcher, dg.DefaultRunLauncher):
        return []

    return release_dead_slots(instance, log=log.warning)


def iteration_run_tags(key: str, *, max_partition: int = DEFAULT_ITERATIONS) -> dict[str, str]:
    """Tags of every iteration_job run: the queue runs one iteration per benchmark at a time
    (`flywheel/benchmark` limit in dagster.yaml), lower k first (`dagster/priority` = -k)."""
    benchmark, k = parse_key(key)
    if k > max_partition:
        raise ValueError(f"iteration {k} is outside 0..{max_partition}")
    return {f"{TAG_PREFIX}benchmark": benchmark, f"{TAG_PREFIX}iteration": str(k), "dagster/priority": str(-k)}
