"""Stage 3 (self-refinement): policy rollouts on training tasks and the reward gate.

`rollouts(b,k)` spends a fixed budget (`samples_per_task` x tasks) adaptively: tasks the
policy rarely solved in earlier iterations get more attempts (`flywheel.core.sampling`); the
per-task attempts/successes go to `task_stats`. Episodes are written as they finish and a
re-run (op retry, run retry, manual) plays only the missing (task, sample) pairs.

`gated_dataset(b,k)` keeps successful, non-errored trajectories whose action sequence is
new for the task (vs seeds and earlier gates), optionally capped per task, and records
what the iteration added in the `iterations` table (the loop's decision comes later). With
`loop.clean_successes` each success first loses its no-progress steps where a replay in the env
verifies the cut (`flywheel.rollout.replay`), and only each task's shortest successes pass; what was
cut is in the store's `gate_cleaning` table.
"""


import dagster as dg

from envs.base import Task
from flywheel.assets._checkpoints import continued_checkpoint
from flywheel.assets._common import metadata_table, progress_logger, rounded
from flywheel.assets.training import gated_trajectories, sft_checkpoint
from flywheel.core.cleaning import shortest_per_task
from flywheel.core.gate import EMPTY_PROBLEM, dataset_problems, reward_gate, without_invalid_steps
from flywheel.core.metrics import summarize
from flywheel.core.prompting import writes_plans
from flywheel.core.sampling import (
    allocate_attempts,
    cap_per_task,
    history_from_rows,
    jobs_from_allocation,
    task_stats_rows,
    teaching_weights,
)
from flywheel.core.trajectory import Trajectory
from flywheel.core.validation import check_options
from flywheel.orchestration.failures import fail_once, fails_once, mark_run_not_retryable
from flywheel.orchestration.partitions import flywheel_partitions, keys_of
from flywheel.resources import EnvResource, LoopResource, PolicyResource, StoreResource
from flywheel.resources.fields import bounds_of
from flywheel.rollout.engine import resume_rollouts
from flywheel.rollout.replay import Cleaned, clean_successes

# A failed rollouts step (generator OOM, a JVM that will not start, a killed worker thread)
# is retried in the same run; it resumes from the episodes already in DuckDB.
ROLLOUT_RETRY = dg.RetryPolicy(max_retries=2, delay=10, backoff=dg.Backoff.EXPONENTIAL)  # 10 s, 20 s; then run retries


@dg.asset(
    partitions_def=flywheel_partitions, group_name="flywheel", deps=[sft_checkpoint], kinds={"duckdb"},
    retry_policy=ROLLOUT_RETRY, op_tags={"flywheel/resumable": "true"},
)
@fails_once
def rollouts(
    context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource, store: StoreResource,
    loop: LoopResource,
) -> dg.MaterializeResult:
    """Checkpoint k plays the training tasks at temperature > 0, hard tasks more often.

    Finished episodes are written as they complete; a re-run after a crash skips
    (task, sample) pairs already played by this same checkpoint.
    """
    benchmark, k = keys_of(context)
    db = store.get()
    tasks = envs.tasks(benchmark, "train")
    # The CLI's budget rule, on the tasks the run really has (train_limit may be unset): before any work.
    check_options({"train_limit": len(tasks), "samples_per_task": policy.samples_per_task},
                  bounds=bounds_of(type(envs), type(policy)), names={"train_limit": f"the {len(tasks)} training tasks (envs.train_limit)",
                         "samples_per_task": "policy.samples_per_task"})
    if db.latest_checkpoint(benchmark, k) is None:
        fail_once(context, f"no sft_checkpoint recorded for {benchmark}|{k}: materialize sft_checkpoint {benchmark}|{k} "
                  "first (iteration_job runs it before rollouts)")
    ckpt = continued_checkpoint(db, benchmark, k, steers=loop.promotion_steers)  # k, or the predecessor the gate kept
    spec = envs.spec(benchmark)
    ids = [t.task_id for t in tasks]
    total = policy.samples_per_task * len(tasks)
    history = {}
    if loop.adaptive_sampling and k > 0:
        history = history_from_rows(db.task_stats(benchmark, before_iteration=k).iter_rows(named=True),
                                    before_iteration=k, decay=loop.history_decay)
    weights, caps = (teaching_weights(ids, history, policy.samples_per_task) if loop.sampling_rule == "teaching"
                     else (None, None))
    allocation = (
        allocate_attempts(ids, history, total, min_per_task=min(loop.min_samples_per_task, policy.samples_per_task),
                          max_per_task=loop.max_samples_per_task, weights=weights, caps=caps)
        if loop.adaptive_sampling else dict.fromkeys(ids, policy.samples_per_task)
    )
    jobs = jobs_from_allocation(tasks, allocation)
    scope = {"benchmark": benchmark, "iteration": k, "source": "policy", "split": "train"}
    generator = policy.generator(ckpt["path"], ckpt["checkpoint_id"])
    plan = resume_rollouts(
        db, jobs, scope=scope, checkpoint_id=ckpt["checkpoint_id"], make_env=envs.env_factory(benchmark),
        generator=generator, instructions=spec.system_prompt(), normalize_action=spec.normalize_action,
        source="policy", iteration=k, cfg=policy.rollout_config(max_steps=envs.max_steps),
        progress=progress_logger(context, "rollouts"),
    )
    context.log.info(f"rollouts {benchmark}|{k}: played {len(plan.todo)} of {len(jobs)} episodes with "
                     f"{ckpt['checkpoint_id']} ({plan.resumed} kept from an earlier attempt)")
    table = db.trajectory_table(**scope)
    per_task = task_stats_rows(table.iter_rows(named=True), ids)
    db.write_task_stats(benchmark, k, per_task)
    stats = summarize(db.load_trajectories(**scope))
    hardest = sorted(ids, key=lambda t: (-allocation[t], ids.index(t)))[:10]
    prior = {t: history.get(t, (0, 0)) for t in ids}
    return dg.MaterializeResult(metadata=rounded({
        "checkpoint_id": ckpt["checkpoint_id"], "checkpoint_iteration": ckpt["iteration"], "episodes_total": len(jobs), "episodes_resumed": plan.resumed,
        "episodes_played": len(plan.todo),
        "sampling": "adaptive" if loop.adaptive_sampling and history else "uniform",
        "sampling_rule": loop.sampling_rule if loop.adaptive_sampling else "none",
        "attempts_min": min(allocation.values(), default=0), "attempts_max": max(allocation.values(), default=0),
        "tasks_with_a_success": sum(1 for r in per_task if r["successes"]),
        "attempts_by_task": metadata_table(
            [{"task_id": t, "attempts": allocation[t], "earlier_successes": f"{prior[t][1]}/{prior[t][0]}",
              "successes_now": next(r["successes"] for r in per_task if r["task_id"] == t)} for t in hardest],
            ["task_id", "attempts", "earlier_successes", "successes_now"]),
        **{k_: float(v) if isinstance(v, float) else v for k_, v in stats.items()},
    }))


@dg.asset(partitions_def=flywheel_partitions, group_name="flywheel", deps=[rollouts], kinds={"duckdb"})
@fails_once
def gated_dataset(context: dg.AssetExecutionContext, store: StoreResource, loop: LoopResource,
                  envs: EnvResource) -> dg.MaterializeResult:
    """Only successful, non-errored, new (task, action sequence) trajectories pass; with
    `loop.clean_successes`, each without its no-progress steps (verified by replay), the shortest per task."""
    benchmark, k = keys_of(context)
    db = store.get()
    # This run evaluates the check too (a run that names no checks runs those of its assets): its verdict
    # on the old rows reads as "not evaluated" until it runs, as Dagster's record says "planned".
    checks = context.run.asset_check_selection
    if checks is None or GATE_CHECK in checks:
        db.clear_gate_check(benchmark, k)
    candidates = db.load_trajectories(benchmark=benchmark, iteration=k, source="policy", split="train")
    drop = loop.gate_drops_invalid_steps  # compare (and later train on) the successes without their rejected actions
    earlier = gated_trajectories(db, db.traj_ids_gated_up_to(benchmark, k - 1), drop_invalid_steps=drop) if k > 0 else []
    if drop:
        candidates = [without_invalid_steps(t) for t in candidates]
    seeds = db.load_trajectories(benchmark=benchmark, source="teacher") if loop.gate_drops_seed_repeats else []
    already = [(t.task_id, t.actions) for t in earlier + seeds]
    cleaned = clean(candidates, envs, benchmark) if loop.clean_successes else {}
    candidates = [cleaned[t.traj_id].trajectory if t.traj_id in cleaned else t for t in candidates]
    passed, stats = reward_gate(candidates, already=already)
    shortest, _ = shortest_per_task([c.trajectory for c in cleaned.values()])
    keep = {t.traj_id for t in shortest} if loop.clean_successes else {t.traj_id for t in passed}
    longer = sum(t.traj_id not in keep for t in passed)
    passed = [t for t in passed if t.traj_id in keep]
    earlier_by_task = db.gated_counts_by_task(benchmark, up_to_iteration=k - 1) if k > 0 else {}
    passed, capped = cap_per_task(passed, earlier_by_task, loop.max_gated_per_task)
    db.write_gated(benchmark, k, [(t.traj_id, t.task_id) for t in passed], candidates=stats.candidates)
    admitted = {t.traj_id for t in passed}
    db.write_gate_cleaning(benchmark, k, [
        {"traj_id": i, "task_id": c.trajectory.task_id, "steps_before": c.steps_before, "steps_after": c.steps_after,
         "kept": c.kept, "outcome": c.outcome, "admitted": i in admitted} for i, c in cleaned.items()])
    before = sum(cleaned[t.traj_id].steps_before for t in passed if t.traj_id in cleaned)
    after = sum(cleaned[t.traj_id].steps_after for t in passed if t.traj_id in cleaned)
    outcomes = [c.outcome for c in cleaned.values()]
    gated_total = len(earlier) + len(passed)
    db.record_gate_stats(benchmark, k, candidates=stats.candidates, new_unique_successes=len(passed),
                         gated_total=gated_total, capped_dropped=capped)
    empty = {} if passed else {"warning": f"empty: admitted 0 of {stats.candidates} rollouts"}
    return dg.MaterializeResult(metadata=rounded({**empty,
        "candidates": stats.candidates, "passed": len(passed), "failed": stats.failed,
        "errored": stats.errored, "duplicates_dropped": stats.duplicates,
        "capped_dropped": capped, "max_gated_per_task": loop.max_gated_per_task or "none",
        "new_unique_successes": len(passed), "gated_total": gated_total,
        "pass_rate": len(passed) / max(stats.candidates, 1),
        "yield_per_100_episodes": 100 * len(passed) / max(stats.candidates, 1),
        "cleaning": "on" if loop.clean_successes else "off",
        "steps_before_cleaning": before, "steps_after_cleaning": after,
        "cuts_verified": outcomes.count("cut"), "cuts_rejected_by_replay": outcomes.count("rejected"),
        "longer_than_shortest_dropped": longer,
        "tasks_with_a_success": len({t.task_id for t in passed}),
        "training_set_next_iteration": f"sft_checkpoint {benchmark}|{k + 1} reads these rows from the store",
    }))


def clean(candidates: list[Trajectory], envs: EnvResource, benchmark: str) -> dict[str, Cleaned]:
    """traj_id -> `Cleaned` for each ok success of `candidates` (its cut replayed in the benchmark's env)."""
    successes = [t for t in candidates if t.status == "ok" and t.success]
    if not successes:
        return {}
    tasks: dict[str, Task] = {}

    def task_of(task_id: str) -> Task:  # the training tasks are loaded once, and only if a cut needs a replay
        if not tasks:
            tasks.update((t.task_id, t) for t in envs.tasks(benchmark, "train"))
        return tasks[task_id]

    return {c.trajectory.traj_id: c for c in clean_successes(successes, task_of, envs.env_factory(benchmark))}


# The blocking check's key, the same over any partitions (build_defs builds the check over the profile's).
GATE_CHECK = dg.AssetCheckKey(gated_dataset.key, "gated_dataset_is_usable")


def gated_dataset_check(partitions_def: dg.PartitionsDefinition) -> dg.AssetChecksDefinition:
    """The blocking gate check over `partitions_def` (a check's partitions must be its asset's: build_defs
    passes the profile's)."""
    return dg.asset_check(asset=gated_dataset, name=GATE_CHECK.name, partitions_def=partitions_def,
                          blocking=True, description="Gated dataset is non-empty and well-formed (an empty one is a "
                          "WARN when loop.continue_on_empty_gate lets the loop go on)")(check_gated_dataset)


def check_gated_dataset(context: dg.AssetCheckExecutionContext, store: StoreResource,
                        loop: LoopResource, policy: PolicyResource) -> dg.AssetCheckResult:
    """Checks gate k's own trajectories; the verdict also goes to the store (`gate_checks`), where the
    loop and `sft_checkpoint(b, k+1)` read it. A check that raises is recorded as failed, as Dagster
    records it."""
    benchmark, k = keys_of(context)
    db = store.get()
    try:
        # What sft_checkpoint will train on.
        trajs = gated_trajectories(db, db.traj_ids_gated_at(benchmark, k), drop_invalid_steps=loop.gate_drops_invalid_steps)
        problems = dataset_problems(trajs, needs_plans=writes_plans(policy.history_mode))
    except Exception as exc:
        db.record_gate_check(benchmark, k, passed=False, trajectories=0, problems=[f"the check raised: {exc!r}"])
        raise
    db.record_gate_check(benchmark, k, passed=not problems, trajectories=len(trajs), problems=problems)
    # An empty gate the loop was told to go on past (loop.continue_on_empty_gate, the demo's) is an expected result:
    # a labelled WARN, not a failed run with a stack trace. Malformed data, or an empty gate that stops the loop,
    # fails the check (ERROR: blocking) and the run, once.
    warn = problems == [EMPTY_PROBLEM] and loop.continue_on_empty_gate
    if problems and not warn:  # the same data fails the same way on a retry (flywheel.orchestration.failures)
        mark_run_not_retryable(context, f"gated_dataset_is_usable failed for {benchmark}|{k}: {problems[0]}")
    metadata = {"trajectories": len(trajs), "problems": len(problems), "first_problems": "\n".join(problems[:10]) or "none"}
    if warn:
        metadata["warning"] = empty_gate_warning(benchmark, k)
        context.log.warning(metadata["warning"])
    return dg.AssetCheckResult(passed=not problems, metadata=metadata,
                               severity=dg.AssetCheckSeverity.WARN if warn else dg.AssetCheckSeverity.ERROR)


def empty_gate_warning(benchmark: str, k: int) -> str:
    return (f"empty reward gate {benchmark}|{k}: no new successful trajectory passed, so checkpoint k={k + 1} trains on "
            f"the data of k={k} again (loop.continue_on_empty_gate); more rollouts (policy.samples_per_task), easier "
            "tasks or a better checkpoint give the gate something to admit")

