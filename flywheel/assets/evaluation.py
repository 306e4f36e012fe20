"""Evaluation of checkpoint k on the seen and unseen splits (greedy by default).

Besides the overall numbers, success is reported by complexity bucket (easy / medium /
hard by each task's gold path length, edges in `CurriculumResource.eval_bucket_edges`),
written to `eval_buckets` and shown in the metadata; gold lengths are cached in
`gold_lengths`.
"""


import dataclasses
import hashlib

import dagster as dg

from flywheel.assets._checkpoints import checkpoint_for
from flywheel.assets._common import metadata_table, progress_logger, rounded
from flywheel.assets.training import sft_checkpoint
from flywheel.core.metrics import summarize
from flywheel.core.options import option_default
from flywheel.curriculum.buckets import success_by_bucket
from flywheel.curriculum.gold import gold_lengths
from flywheel.curriculum.tables import write_eval_buckets
from flywheel.orchestration.failures import fails_once
from flywheel.orchestration.partitions import flywheel_partitions, keys_of
from flywheel.resources import CurriculumResource, EnvResource, PolicyResource, StoreResource
from flywheel.rollout.engine import resume_partitions

COLUMNS = ["split", "episodes", "errored", "success_rate", "avg_reward", "mean_steps",
           "tokens_per_step", "prompt_tokens_per_step", "invalid_action_rate"]
BUCKET_COLUMNS = ["split", "bucket", "gold_length", "episodes", "successes", "success_rate"]


@dg.asset(partitions_def=flywheel_partitions, group_name="flywheel", deps=[sft_checkpoint], kinds={"duckdb"})
@fails_once
def evaluation(
    context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource, store: StoreResource,
    curriculum: CurriculumResource,
) -> dg.MaterializeResult:
    """Checkpoint k plays the benchmark's evaluation splits (seen / unseen) greedily, once per task:
    success rate, average reward, steps, tokens per step and invalid actions per split, and success
    by complexity bucket. Rows in the store's `evaluations` and `eval_buckets` tables."""
    benchmark, k = keys_of(context)
    db = store.get()
    ckpt = checkpoint_for(db, benchmark, k)
    spec = envs.spec(benchmark)
    generator = policy.generator(ckpt["path"], ckpt["checkpoint_id"])
    buckets = curriculum.eval_buckets(spec)
    rows, bucket_rows = [], []
    splits = envs.eval_splits(benchmark)
    tasks_by_split = {split: envs.tasks(benchmark, split) for split in splits}
    cfg = policy.rollout_config(evaluation=True, max_steps=envs.max_steps)
    # Each finished episode is written at once, tagged with the checkpoint and the evaluation's settings, so an
    # evaluation cut short (a sitting that ends, a kill) resumes from its episodes, as rollouts do; episodes of
    # another checkpoint or other settings are replaced, never mixed.
    scopes = {split: {"benchmark": benchmark, "iteration": k, "source": "policy", "split": split} for split in splits}
    # Both splits in one rollout call, so all their episodes share the generation batch.
    plans = resume_partitions(
        db, [([(t, 0) for t in tasks_by_split[split]], scopes[split]) for split in splits],
        checkpoint_id=eval_tag(ckpt["checkpoint_id"], cfg), make_env=envs.env_factory(benchmark), generator=generator,
        instructions=spec.system_prompt(), normalize_action=spec.normalize_action, source="policy",
        iteration=k, cfg=cfg, progress=progress_logger(context, "evaluation"),
    )
    kept = sum(plan.resumed for plan in plans)
    if kept:
        context.log.info(f"evaluation {benchmark}|{k}: {kept} episode(s) kept from an earlier attempt")
    for split in splits:
        tasks = tasks_by_split[split]
        trajs = db.load_trajectories(**scopes[split])
        stats = summarize(trajs)
        db.write_evaluation({"benchmark": benchmark, "iteration": k, "split": split,
                             "checkpoint_id": ckpt["checkpoint_id"], **stats})
        rows.append({"split": split, **stats})
        gold = gold_lengths(db, spec, benchmark, split, tasks, progress=progress_logger(context, f"gold lengths {split}"))
        outcomes = [(gold.get(t.task_id), t.success) for t in trajs if t.status == "ok"]
        by_bucket = success_by_bucket(outcomes, buckets)
        write_eval_buckets(db, benchmark, k, split, by_bucket, ckpt["checkpoint_id"])
        bucket_rows += [{"split": split, "gold_length": _range(r["lo"], r["hi"]), **r} for r in by_bucket]
    metadata: dict[str, object] = {"checkpoint_id": ckpt["checkpoint_id"], "table": metadata_table(rows, COLUMNS),
                                   "buckets": buckets.describe(),
                                   "success_by_bucket": metadata_table(bucket_rows, BUCKET_COLUMNS),
                                   **rate_entries(rows, bucket_rows)}
    return dg.MaterializeResult(metadata=rounded(metadata))


def rate_entries(rows: list[dict], bucket_rows: list[dict]) -> dict[str, float | int]:
    """The floats Dagster plots per materialization: success and reward per split, success per complexity bucket,
    with each split's and bucket's episodes (and a split's successes). A rate over 0 episodes is left out (Dagster would plot it as a real 0)."""
    out: dict[str, float | int] = {}
    for r in rows:
        out[f"{r['split']}_episodes"] = int(r.get("episodes") or 0)
        if r.get("episodes"):
            out[f"{r['split']}_successes"] = round(float(r["success_rate"]) * int(r["episodes"]))
            out[f"{r['split']}_success_rate"] = float(r["success_rate"])
            out[f"{r['split']}_avg_reward"] = float(r["avg_reward"])
    for r in bucket_rows:
        if r["episodes"]:
            out[f"{r['split']}_{r['bucket']}_success_rate"] = float(r["success_rate"])
        out[f"{r['split']}_{r['bucket']}_episodes"] = int(r["episodes"])
    return out


def eval_tag(checkpoint_id: str, cfg: object) -> str:
    """What an evaluation episode's `model_id` records: the checkpoint, and a hash of the settings it was played
    with (a re-evaluation with other settings replays every task instead of keeping these). A greedy one
    (temperature 0) is hashed with the fields that act only through sampling (declared `greedy=False`: the
    seed) at their defaults: replicates that differ only in their rollouts' seed play the same greedy episodes
    and keep each other's (flywheel.drivers.experiment.share_k0_episodes)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) and getattr(cfg, "temperature", None) == 0:
        cfg = dataclasses.replace(cfg, **{f.name: option_default(f) for f in dataclasses.fields(cfg)
                                          if f.metadata.get("greedy") is False})
    return f"{checkpoint_id}#{hashlib.sha256(repr(cfg).encode()).hexdigest()[:8]}"


def _range(lo: float | None, hi: float | None) -> str:
    if lo is None and hi is None:
        return "no gold path"
    if lo is None:
        return f"<= {hi:g}"
    if hi is None:
        return f"> {lo:g}"
    return f"{lo:g} < n <= {hi:g}"
