"""Evaluation of checkpoint k on the seen and unseen splits (greedy by default)."""


import dagster as dg

from flywheel.assets._checkpoints import checkpoint_for
from flywheel.assets._common import progress_logger
from flywheel.assets.training import sft_checkpoint
from flywheel.evaluation import markdown_table, summarize
from flywheel.partitions import flywheel_partitions, keys_of
from flywheel.resources import EnvResource, PolicyResource, StoreResource
from flywheel.rollout import run_rollouts

EVAL_SPLITS = ("seen", "unseen")
COLUMNS = ["split", "episodes", "errored", "success_rate", "avg_reward", "mean_steps",
           "tokens_per_step", "prompt_tokens_per_step", "invalid_action_rate"]


@dg.asset(partitions_def=flywheel_partitions, group_name="flywheel", deps=[sft_checkpoint], kinds={"duckdb"})
def evaluation(
    context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource, store: StoreResource
) -> dg.MaterializeResult:
    benchmark, k = keys_of(context)
    db = store.get()
    ckpt = checkpoint_for(db, benchmark, k)
    spec = envs.spec(benchmark)
    generator = policy.generator(ckpt["path"], ckpt["checkpoint_id"])
    rows = []
    for split in EVAL_SPLITS:
        tasks = envs.tasks(benchmark, split)
        trajs = run_rollouts(
            [(t, 0) for t in tasks], make_env=lambda: envs.make_env(benchmark), generator=generator,
            instructions=spec.system_prompt(), normalize_action=spec.normalize_action, source="policy",
            iteration=k, cfg=policy.rollout_config(evaluation=True, max_steps=envs.max_steps),
            progress=progress_logger(context, f"evaluation {split}"),
        )
        db.write_trajectories(trajs, replace_scope={"benchmark": benchmark, "iteration": k, "source": "policy", "split": split})
        stats = summarize(trajs)
        db.write_evaluation({"benchmark": benchmark, "iteration": k, "split": split,
                             "checkpoint_id": ckpt["checkpoint_id"], **stats})
        rows.append({"split": split, **stats})
    metadata: dict[str, object] = {"checkpoint_id": ckpt["checkpoint_id"], "table": dg.MetadataValue.md(markdown_table(rows, COLUMNS))}
    for r in rows:
        metadata[f"{r['split']}_success_rate"] = float(r["success_rate"])
        metadata[f"{r['split']}_avg_reward"] = float(r["avg_reward"])
    return dg.MaterializeResult(metadata=metadata)
