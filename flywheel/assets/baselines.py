"""Baselines beside the flywheel's assets (group "baselines", run by `baselines_job`), and the paper's tables.

- `base_checkpoint(b, k)`: the base model itself recorded as checkpoint k (method "base": zero-shot, no SFT),
  so `evaluation(b, k)` evaluates it like any checkpoint.
- `preference_pairs(b, k)`: ETO pairs from checkpoint k-1's training rollouts: the expert (teacher)
  trajectory or a successful rollout of a task vs a failed rollout of the same task.
- `dpo_checkpoint(b, k)`: DPO (TRL's DPOTrainer, agent turns only) from checkpoint k-1 on those pairs.
- `grpo_checkpoint(b, k)`: checkpoint k-1 plays G episodes per training task; one multi-turn GRPO update
  with the group-normalised episode rewards gives checkpoint k.
- `paper_report`: the paper's tables and Fig. 2 for an experiment (`flywheel paper EXPERIMENT` writes the same).

Which method an arm runs is `MethodResource.name` (flywheel/orchestration/methods.py lists them and the stages each
runs); every trajectory and checkpoint the store writes carries it in its `method` column. The plain
cores are flywheel/policy/dpo.py and flywheel/policy/grpo.py.
"""

import base64
import time
from dataclasses import replace
from pathlib import Path

import dagster as dg

from flywheel.assets._checkpoints import checkpoint_for, new_checkpoint_id
from flywheel.assets._common import progress_logger
from flywheel.assets.refinement import rollouts
from flywheel.assets.training import sft_checkpoint
from flywheel.core.metrics import summarize
from flywheel.orchestration.partitions import DEFAULT as DEFAULT_PARTITIONS
from flywheel.orchestration.partitions import flywheel_partitions, keys_of
from flywheel.policy.dpo import Pair, make_pairs, train_dpo
from flywheel.policy.grpo import NoLearningSignal, train_grpo
from flywheel.reports.paper import default_dirs, write_paper
from flywheel.resources import EnvResource, MethodResource, PolicyResource, StoreResource
from flywheel.rollout.engine import resume_rollouts

# (b, k-1) upstream -> (b, k) downstream: what a baseline at k reads (rollouts or the checkpoint of k-1),
# over the placeholder partitions (build_defs swaps it for the profile's range).
previous_iteration = DEFAULT_PARTITIONS.previous_iteration


def _needs_previous(db, benchmark: str, k: int, what: str) -> dict:
    if k < 1:
        raise dg.Failure(f"{what} {benchmark}|{k}: k must be >= 1 (it starts from checkpoint k-1, the SFT at k=0)")
    return checkpoint_for(db, benchmark, k - 1)


@dg.asset(partitions_def=flywheel_partitions, group_name="baselines", kinds={"duckdb"})
def base_checkpoint(context: dg.AssetExecutionContext, policy: PolicyResource, store: StoreResource,
                    method: MethodResource) -> dg.MaterializeResult:
    """The base model, untrained, recorded as checkpoint k: the zero-shot row of the paper's tables."""
    benchmark, k = keys_of(context)
    db = store.get()
    checkpoint_id = f"{benchmark}-k{k}-base"
    db.record_checkpoint({"checkpoint_id": checkpoint_id, "benchmark": benchmark, "iteration": k,
                          "path": policy.base_model_path, "base_model": policy.base_model_path, "n_examples": 0,
                          "n_trajectories": 0, "train_loss": None,
                          "lineage": {"method": method.check(), "trained": False}})
    return dg.MaterializeResult(metadata={"checkpoint_id": checkpoint_id, "path": dg.MetadataValue.path(
        policy.base_model_path), "method": method.name, "trained": False})


@dg.asset(partitions_def=flywheel_partitions, group_name="baselines",
          deps=[dg.AssetDep(rollouts, partition_mapping=previous_iteration)], kinds={"duckdb"})
def preference_pairs(context: dg.AssetExecutionContext, store: StoreResource, method: MethodResource
                     ) -> dg.MaterializeResult:
    """(chosen, rejected) trajectories per task from the rollouts of checkpoint k-1: chosen = the expert
    (teacher) trajectory, else a successful rollout; rejected = a failed rollout of the same task."""
    benchmark, k = keys_of(context)
    db = store.get()
    _needs_previous(db, benchmark, k, "preference_pairs")
    played = db.load_trajectories(benchmark=benchmark, iteration=k - 1, source="policy", split="train")
    if not played:
        raise dg.Failure(f"no training rollouts of {benchmark}|{k - 1}: materialize rollouts {benchmark}|{k - 1} first")
    experts = db.load_trajectories(benchmark=benchmark, source="teacher")
    pairs = make_pairs(experts, played, max_per_task=method.dpo_max_pairs_per_task)
    db.write_preference_pairs(benchmark, k, [p.record(benchmark, k) for p in pairs])
    failed = sum(1 for t in played if t.status == "ok" and not t.success)
    return dg.MaterializeResult(metadata={
        "pairs": len(pairs), "tasks": len({p.task_id for p in pairs}), "rollouts": len(played),
        "failed_rollouts": failed, "chosen_from_expert": sum(p.chosen.source == "teacher" for p in pairs),
        "chosen_from_rollouts": sum(p.chosen.source == "policy" for p in pairs),
        "failed_without_a_chosen": failed - len(pairs) if failed >= len(pairs) else 0,
    })


@dg.asset(partitions_def=flywheel_partitions, group_name="baselines",
          deps=[preference_pairs, dg.AssetDep(sft_checkpoint, partition_mapping=previous_iteration)],
          kinds={"pytorch"}, pool="accelerator")
def dpo_checkpoint(context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource,
                   store: StoreResource, method: MethodResource) -> dg.MaterializeResult:
    """DPO from checkpoint k-1 (also the frozen reference) on preference_pairs(k), with TRL's DPOTrainer."""
    benchmark, k = keys_of(context)
    db = store.get()
    start = _needs_previous(db, benchmark, k, "dpo_checkpoint")
    rows = db.preference_pairs(benchmark, k)
    if not rows:
        raise dg.Failure(f"no preference pairs for {benchmark}|{k} (no task had both a chosen and a failed "
                         "trajectory): nothing for DPO to learn from", allow_retries=False)
    trajs = {t.traj_id: t for t in db.load_trajectories([r["chosen_id"] for r in rows] + [r["rejected_id"] for r in rows])}
    pairs = [Pair(r["task_id"], trajs[r["chosen_id"]], trajs[r["rejected_id"]]) for r in rows]
    cfg = method.dpo_settings(policy)
    checkpoint_id = new_checkpoint_id(benchmark, k)
    started = time.monotonic()
    result = train_dpo(start["path"], pairs, envs.spec(benchmark).system_prompt(),
                       Path(policy.checkpoints_dir) / benchmark / checkpoint_id, cfg, progress=context.log.info)
    lineage = {"method": method.check(), "starts_from": start["checkpoint_id"], "reference": start["checkpoint_id"],
               "pairs": result.n_pairs, "pairs_dropped_too_long": result.n_dropped, "beta": cfg.beta,
               "train_steps": result.steps, "batch_size": cfg.batch_size,
               "train_seconds": round(time.monotonic() - started, 1)}
    db.record_checkpoint({"checkpoint_id": checkpoint_id, "benchmark": benchmark, "iteration": k, "path": result.path,
                          "base_model": policy.base_model_path, "n_examples": result.n_pairs,
                          "n_trajectories": 2 * result.n_pairs, "train_loss": result.train_loss, "lineage": lineage})
    return dg.MaterializeResult(metadata={"checkpoint_id": checkpoint_id, "path": dg.MetadataValue.path(result.path),
                                          "train_loss": result.train_loss, **{k_: v for k_, v in lineage.items()
                                                                              if k_ != "method"}})


@dg.asset(partitions_def=flywheel_partitions, group_name="baselines",
          deps=[dg.AssetDep(sft_checkpoint, partition_mapping=previous_iteration)], kinds={"pytorch"},
          pool="accelerator", op_tags={"flywheel/resumable": "true"})
def grpo_checkpoint(context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource,
                    store: StoreResource, method: MethodResource) -> dg.MaterializeResult:
    """Checkpoint k-1 plays G episodes per training task (stored as its training rollouts, resumable), then one
    multi-turn GRPO update with group-normalised episode rewards gives checkpoint k."""
    benchmark, k = keys_of(context)
    db = store.get()
    start = _needs_previous(db, benchmark, k, "grpo_checkpoint")
    spec = envs.spec(benchmark)
    tasks = envs.tasks(benchmark, "train")
    tasks = tasks[: method.grpo_tasks] if method.grpo_tasks else tasks
    jobs = [(t, s) for t in tasks for s in range(method.grpo_group_size)]
    scope = {"benchmark": benchmark, "iteration": k - 1, "source": "policy", "split": "train"}
    cfg = policy.rollout_config(max_steps=envs.max_steps)
    plan = resume_rollouts(
        db, jobs, scope=scope, checkpoint_id=start["checkpoint_id"], make_env=envs.env_factory(benchmark),
        generator=policy.generator(start["path"], start["checkpoint_id"]), instructions=spec.system_prompt(),
        normalize_action=spec.normalize_action, source="policy", iteration=k - 1,
        cfg=replace(cfg, temperature=method.grpo_temperature), progress=progress_logger(context, "grpo rollouts"),
    )
    played = db.load_trajectories(**scope)
    stats = summarize(played)
    settings = method.grpo_settings(policy)
    checkpoint_id = new_checkpoint_id(benchmark, k)
    started = time.monotonic()
    lineage = {"method": method.check(), "starts_from": start["checkpoint_id"], "group_size": method.grpo_group_size,
               "tasks": len(tasks), "episodes": len(played), "episodes_resumed": plan.resumed,
               "mean_reward": stats["avg_reward"], "success_rate": stats["success_rate"]}
    try:
        result = train_grpo(start["path"], played, spec.system_prompt(),
                            Path(policy.checkpoints_dir) / benchmark / checkpoint_id, settings,
                            progress=context.log.info)
    except NoLearningSignal as exc:  # every group scored alike: the policy is unchanged (no copy of the weights)
        context.log.warning(f"grpo {benchmark}|{k}: {exc}; checkpoint {k} is checkpoint {k - 1} unchanged")
        lineage.update({"updated": False, "reason": str(exc)})
        db.record_checkpoint({"checkpoint_id": checkpoint_id, "benchmark": benchmark, "iteration": k,
                              "path": start["path"], "base_model": policy.base_model_path, "n_examples": 0,
                              "n_trajectories": 0, "train_loss": None, "lineage": lineage})
        return dg.MaterializeResult(metadata={"checkpoint_id": checkpoint_id, "updated": False,
                                              **{k_: float(v) if isinstance(v, float) else v
                                                 for k_, v in lineage.items() if k_ != "method"}})
    lineage.update({"updated": True, "trained_trajectories": result.n_trajectories, "groups_with_signal": result.n_groups,
                    "dropped_too_long": result.n_dropped, "train_steps": result.steps,
                    "batch_size": settings.batch_size, "train_seconds": round(time.monotonic() - started, 1)})
    db.record_checkpoint({"checkpoint_id": checkpoint_id, "benchmark": benchmark, "iteration": k, "path": result.path,
                          "base_model": policy.base_model_path, "n_examples": result.n_trajectories,
                          "n_trajectories": len(played), "train_loss": result.train_loss, "lineage": lineage})
    return dg.MaterializeResult(metadata={
        "checkpoint_id": checkpoint_id, "path": dg.MetadataValue.path(result.path), "train_loss": result.train_loss,
        **{k_: float(v) if isinstance(v, float) else v for k_, v in lineage.items() if k_ != "method"}})


class PaperConfig(dg.Config):
    experiment: str = "cpu-baselines-scienceworld"  # preset name (experiments/NAME.yaml) or path
    runs_dir: str = ""  # default: $FLYWHEEL_RUNS_DIR/experiments/NAME
    results_dir: str = ""  # default: experiments/results/NAME/paper


@dg.asset(group_name="reports", kinds={"duckdb"})
def paper_report(context: dg.AssetExecutionContext, config: PaperConfig) -> dg.MaterializeResult:
    """The paper's tables (1, 2, 4, 5) and Fig. 2 for an experiment's arms, every cell with n and a 95% interval;
    the same markdown, JSON and PNG as `flywheel paper EXPERIMENT`."""

    runs, results = default_dirs(config.experiment, config.runs_dir or None, config.results_dir or None)
    data = write_paper(config.experiment, runs=runs, results=results)
    md = (results / "paper.md").read_text()
    png = results / "fig2_success_by_complexity.png"
    if png.exists():
        md += f"\n\n![Fig. 2](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})\n"
    return dg.MaterializeResult(metadata={
        "tables": dg.MetadataValue.md(md), "results": dg.MetadataValue.path(str(results)),
        "methods": dg.MetadataValue.json(sorted(data["methods"])),
    })
