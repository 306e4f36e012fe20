"""The asset checks on the policy: the promotion gate on `sft_checkpoint`, and k vs k-1 on `evaluation`.

`checkpoint_is_promoted` (blocking, WARN when it rejects): after each k > 0 SFT, checkpoint k and the
promoted predecessor play the validation tasks (`EnvResource.validation_set`: training tasks no seed,
curriculum task or rollout uses) greedily, once each, paired; k is promoted unless it may be worse by more
than `loop.promotion_margin` (`flywheel.core.quality.non_inferior`, error rate `loop.promotion_alpha`). The
decision goes to the store's `promotions`; rollouts of k and SFT k+1 (`refine_from: previous`) go on from the
promoted checkpoint (`promoted_checkpoint`). Blocking, so that rollouts k in the same run wait for the
decision; a rejection is a WARN, not an ERROR, so they still run (from the predecessor) and the gated data
still accumulates. k=0 is promoted by definition. Episodes are stored (split "validation") under each
checkpoint's own iteration, so a predecessor's are played once.

`seen_success_vs_previous` (non-blocking, WARN): seen-split success of policy k vs k-1; it never stops the
loop (the loop's own stop rules do), it flags a regression in the UI. Statistics: `flywheel.core.quality`.
"""


from typing import Any

import dagster as dg

from flywheel.assets._checkpoints import checkpoint_for, promoted_checkpoint
from flywheel.assets._common import progress_logger, rounded
from flywheel.assets.evaluation import eval_tag, evaluation
from flywheel.assets.training import sft_checkpoint
from flywheel.core.metrics import promotion_counts
from flywheel.core.quality import compare_iterations, non_inferior
from flywheel.core.store import Store
from flywheel.orchestration.failures import NotRetryable
from flywheel.orchestration.partitions import keys_of
from flywheel.resources import EnvResource, LoopResource, PolicyResource, StoreResource
from flywheel.rollout.engine import resume_partitions

VALIDATION = "validation"  # the trajectories' split of the promotion gate's episodes


def seen_success_check(partitions_def: dg.PartitionsDefinition) -> dg.AssetChecksDefinition:
    """The check over `partitions_def` (a check's partitions must be its asset's: build_defs passes the
    profile's)."""
    return dg.asset_check(
        asset=evaluation,
        name="seen_success_vs_previous",
        partitions_def=partitions_def,
        blocking=False,
        description="Seen-split success of policy k vs k-1: delta with a 95% confidence interval "
        "(paired bootstrap over the same tasks, Newcombe's interval as well); warns when k is significantly worse.",
    )(check_seen_success)


def check_seen_success(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    benchmark, k = keys_of(context)
    result = compare_iterations(store.get(), benchmark, k, split="seen")
    metadata = {key: (float(v) if isinstance(v, float) else v) for key, v in result.metadata.items()}
    metadata["verdict"] = result.verdict
    return dg.AssetCheckResult(passed=result.passed, severity=dg.AssetCheckSeverity.WARN, metadata=metadata)


def promotion_check(partitions_def: dg.PartitionsDefinition) -> dg.AssetChecksDefinition:
    """The promotion gate over `partitions_def` (build_defs passes the profile's)."""
    return dg.asset_check(
        asset=sft_checkpoint, name="checkpoint_is_promoted", partitions_def=partitions_def, blocking=True,
        description="Promotion gate: checkpoint k and the promoted predecessor play the validation tasks (training "
        "tasks set aside), greedy, paired; k is promoted unless the one-sided lower bound of the paired difference "
        "is at or below -loop.promotion_margin (error rate loop.promotion_alpha). A rejection is a WARN: the loop "
        "goes on from the predecessor.",
    )(check_promotion)


def check_promotion(context: dg.AssetCheckExecutionContext, envs: EnvResource, policy: PolicyResource,
                    store: StoreResource, loop: LoopResource) -> dg.AssetCheckResult:
    benchmark, k = keys_of(context)
    db = store.get()
    ckpt = checkpoint_for(db, benchmark, k)
    if k == 0 or not loop.promotion_gate:
        why = "k=0 is promoted by definition" if k == 0 else "loop.promotion_gate is off: every checkpoint is promoted"
        db.record_promotion({"benchmark": benchmark, "iteration": k, "checkpoint_id": ckpt["checkpoint_id"],
                             "promoted_id": ckpt["checkpoint_id"], "promoted": True, "verdict": why})
        return dg.AssetCheckResult(passed=True, metadata={"verdict": why, "promoted": ckpt["checkpoint_id"]})
    tasks = envs.validation_set(benchmark)
    if not tasks:
        raise NotRetryable(f"the promotion gate of {benchmark}|{k} has no validation tasks: set envs.validation_tasks "
                           "above 0 (and leave the training split room for them), or loop.promotion_gate: false")
    before = promoted_checkpoint(db, benchmark, k - 1)
    new = validation_outcomes(context, db, envs, policy, benchmark, ckpt, tasks)
    old = validation_outcomes(context, db, envs, policy, benchmark, before, tasks)
    rule = non_inferior(new, old, margin=loop.promotion_margin, alpha=loop.promotion_alpha)
    decision = promotion_row(benchmark, k, ckpt, before, new, old, rule, steers=loop.promotion_steers)
    db.record_promotion(decision)
    context.log.info(f"promotion gate {benchmark}|{k}: {decision['verdict']}")
    return dg.AssetCheckResult(passed=rule["promote"], severity=dg.AssetCheckSeverity.WARN,
                               metadata=rounded(promotion_metadata(decision, rule)))


def validation_outcomes(context: dg.AssetCheckExecutionContext, db: Store, envs: EnvResource,
                        policy: PolicyResource, benchmark: str, ckpt: dict[str, Any], tasks: list) -> dict[str, bool]:
    """Task -> success of `ckpt` on the validation tasks, greedy, once each; played only where the store lacks
    this checkpoint's episodes with these settings (kept under the checkpoint's own iteration)."""
    spec = envs.spec(benchmark)
    cfg = policy.rollout_config(evaluation=True, max_steps=envs.max_steps)
    scope = {"benchmark": benchmark, "iteration": ckpt["iteration"], "source": "policy", "split": VALIDATION}
    resume_partitions(
        db, [([(t, 0) for t in tasks], scope)], checkpoint_id=eval_tag(ckpt["checkpoint_id"], cfg),
        make_env=envs.env_factory(benchmark), generator=policy.generator(ckpt["path"], ckpt["checkpoint_id"]),
        instructions=spec.system_prompt(), normalize_action=spec.normalize_action, source="policy",
        iteration=ckpt["iteration"], cfg=cfg, progress=progress_logger(context, f"validation k={ckpt['iteration']}"),
    )
    wanted = {t.task_id for t in tasks}
    return {task: ok for task, (ok, _) in db.policy_outcomes(benchmark, ckpt["iteration"], VALIDATION).items()
            if task in wanted}


def promotion_row(benchmark: str, k: int, ckpt: dict[str, Any], before: dict[str, Any], new: dict[str, bool],
                  old: dict[str, bool], rule: dict[str, Any], *, steers: bool = True) -> dict[str, Any]:
    """The store's `promotions` row of the decision on checkpoint k against the promoted `before`; `steers`
    (loop.promotion_steers) false: the verdict says the loop goes on from k whatever it decided."""
    common = set(new) & set(old)
    kept = ckpt if rule["promote"] else before
    row = {"benchmark": benchmark, "iteration": k, "checkpoint_id": ckpt["checkpoint_id"],
           "predecessor_id": before["checkpoint_id"], "promoted_id": kept["checkpoint_id"],
           "promoted": rule["promote"], "validation_n": rule["n"],
           "successes": sum(new[t] for t in common), "predecessor_successes": sum(old[t] for t in common),
           "delta": rule["delta"], "ci_low": rule["ci_low"], "ci_high": rule["ci_high"],
           "margin": rule["margin"], "alpha": rule["alpha"]}
    level = f"{1 - rule['alpha']:.0%} lower bound"
    row["verdict"] = (f"{'promoted' if rule['promote'] else 'rejected'} k={k}: validation {promotion_counts(row)} "
                      f"for k={before['iteration']}, paired difference {rule['delta']:+.3f} ({level} "
                      f"{rule['ci_low']:+.3f}) {'above' if rule['promote'] else 'not above'} -{rule['margin']:g}; "
                      + (f"the loop goes on from k={kept['iteration']}" if steers else
                         f"k={kept['iteration']} is the promoted checkpoint; the loop goes on from k={k} "
                         "(loop.promotion_steers: false)"))
    return row


def promotion_metadata(row: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    """What the UI shows of a decision (the check's metadata)."""
    return {"verdict": row["verdict"], "promoted": row["promoted_id"], "checkpoint": row["checkpoint_id"],
            "predecessor": row["predecessor_id"], "validation_n": row["validation_n"],
            "successes": row["successes"], "predecessor_successes": row["predecessor_successes"],
            "paired_difference": row["delta"], "lower_bound": row["ci_low"], "interval_high": row["ci_high"],
            "tasks_gained": rule["gained"], "tasks_lost": rule["lost"], "margin": row["margin"], "alpha": row["alpha"],
            "rule": f"promote iff the one-sided {1 - row['alpha']:.0%} lower bound of the paired difference (paired "
                    f"bootstrap over the validation tasks) is above -{row['margin']:g}"}
