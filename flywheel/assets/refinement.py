"""Stage 3 (self-refinement): policy rollouts on training tasks and the reward gate."""


import dagster as dg

from flywheel.assets._checkpoints import checkpoint_for
from flywheel.assets._common import progress_logger
from flywheel.assets.training import sft_checkpoint
from flywheel.evaluation import summarize
from flywheel.gate import dataset_problems, reward_gate
from flywheel.partitions import flywheel_partitions, keys_of
from flywheel.resources import EnvResource, PolicyResource, StoreResource
from flywheel.rollout import run_rollouts


@dg.asset(partitions_def=flywheel_partitions, group_name="flywheel", deps=[sft_checkpoint], kinds={"duckdb"})
def rollouts(
    context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource, store: StoreResource
) -> dg.MaterializeResult:
    """Checkpoint k plays n samples per training task at temperature > 0.

    Finished episodes are written as they complete; a re-run after a crash skips
    (task, sample) pairs already played by this same checkpoint.
    """
    benchmark, k = keys_of(context)
    db = store.get()
    ckpt = checkpoint_for(db, benchmark, k)
    spec = envs.spec(benchmark)
    tasks = envs.tasks(benchmark, "train")
    jobs = [(t, s) for t in tasks for s in range(policy.samples_per_task)]
    scope = {"benchmark": benchmark, "iteration": k, "source": "policy", "split": "train"}
    existing = db.trajectory_table(**scope)
    done_keys = {
        (r["task_id"], r["sample"]) for r in existing.iter_rows(named=True)
        if r["model_id"] == ckpt["checkpoint_id"] and r["status"] == "ok"
    }
    stale = existing.filter(existing["model_id"] != ckpt["checkpoint_id"]) if existing.height else existing
    if stale.height:  # rows from an older checkpoint of this iteration are replaced, not mixed
        db.delete_trajectories(**scope)
        done_keys = set()
    todo = [(t, s) for t, s in jobs if (t.task_id, s) not in done_keys]
    context.log.info(f"rollouts {benchmark}|{k}: {len(todo)} of {len(jobs)} episodes to play with {ckpt['checkpoint_id']}")
    generator = policy.generator(ckpt["path"], ckpt["checkpoint_id"])
    run_rollouts(
        todo, make_env=lambda: envs.make_env(benchmark), generator=generator,
        instructions=spec.system_prompt(), normalize_action=spec.normalize_action, source="policy",
        iteration=k, cfg=policy.rollout_config(max_steps=envs.max_steps),
        on_finished=lambda trajs: db.write_trajectories(trajs),
        progress=progress_logger(context, "rollouts"),
    )
    stats = summarize(db.load_trajectories(**scope))
    return dg.MaterializeResult(metadata={
        "checkpoint_id": ckpt["checkpoint_id"], "episodes_total": len(jobs), "episodes_resumed": len(jobs) - len(todo),
        **{k_: float(v) if isinstance(v, float) else v for k_, v in stats.items()},
    })


@dg.asset(partitions_def=flywheel_partitions, group_name="flywheel", deps=[rollouts], kinds={"duckdb"})
def gated_dataset(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
    """Only successful, non-errored, new (task, action sequence) trajectories pass."""
    benchmark, k = keys_of(context)
    db = store.get()
    candidates = db.load_trajectories(benchmark=benchmark, iteration=k, source="policy", split="train")
    earlier = db.load_trajectories(db.gated_ids(benchmark, up_to_iteration=k - 1)) if k > 0 else []
    seeds = db.load_trajectories(benchmark=benchmark, source="teacher")
    already = [(t.task_id, t.actions) for t in earlier + seeds]
    passed, stats = reward_gate(candidates, already=already)
    db.write_gated(benchmark, k, [(t.traj_id, t.task_id) for t in passed], candidates=stats.candidates)
    return dg.MaterializeResult(metadata={
        "candidates": stats.candidates, "passed": stats.passed, "failed": stats.failed,
        "errored": stats.errored, "duplicates_dropped": stats.duplicates,
        "pass_rate": stats.passed / max(stats.candidates, 1),
        "tasks_with_a_success": len({t.task_id for t in passed}),
        "training_set_next_iteration": f"sft_checkpoint {benchmark}|{k + 1} reads these rows from the store",
    })


@dg.asset_check(asset=gated_dataset, partitions_def=flywheel_partitions, blocking=True, description="Gated dataset is non-empty and well-formed")
def gated_dataset_is_usable(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    benchmark, k = keys_of(context)
    db = store.get()
    trajs = db.load_trajectories(
        [i for i in db.gated_ids(benchmark, up_to_iteration=k) if f"|{k}|policy|" in i]
    )
    problems = dataset_problems(trajs)
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"trajectories": len(trajs), "problems": len(problems),
                  "first_problems": "\n".join(problems[:10]) or "none"},
    )
