"""SFT checkpoints. Iteration k trains on seeds + curriculum + gated successes of 0..k-1.

Order: with the curriculum on (`CurriculumResource.order` "curriculum" or "staged"),
every trajectory, gated successes included, is scored by complexity and trained easy to
hard (`TrainConfig(order="given")`); the order used is written to `training_order`.
With "shuffle" (the ablation) the trainer shuffles as usual.

The k-1 -> k back-edge is not a declared dependency: Dagster refuses cycles
between asset keys even across partitions. `sft_checkpoint(k)` therefore reads
`gated_dataset` of earlier iterations through the store, refuses to run until
gated_dataset(k-1) exists, and records which gated iterations it used in its
metadata (visible in the UI).
"""


import random
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import dagster as dg

from flywheel.assets._checkpoints import (
    begin_checkpoint,
    continued_checkpoint,
    new_checkpoint_id,
    packing_mismatch,
    reusable_checkpoint,
)
from flywheel.assets.curriculum import synthetic_curriculum
from flywheel.core.cleaning import apply_cut
from flywheel.core.decisions import gate_allows_next, gate_refusal
from flywheel.core.gate import without_invalid_steps
from flywheel.core.metrics import answer_lengths
from flywheel.core.provenance import weights_sha256
from flywheel.core.store import Store
from flywheel.core.trajectory import Trajectory
from flywheel.curriculum.order import assign_buckets, grade
from flywheel.curriculum.tables import write_training_order
from flywheel.orchestration.failures import fail_once, fails_once
from flywheel.orchestration.partitions import by_benchmark, flywheel_partitions, keys_of
from flywheel.policy.logging_targets import LOGS_DIR
from flywheel.policy.sft import (
    examples_never_trained,
    examples_sha256,
    sft_examples,
    train_sft,
    training_fingerprint,
)
from flywheel.resources import CurriculumResource, EnvResource, LoopResource, PolicyResource, StoreResource


def _weights_hash(path: str) -> str | None:
    """The checkpoint's weights hash (flywheel.core.provenance.weights_sha256); None for a folder without weight files."""
    try:
        return weights_sha256(path)
    except FileNotFoundError:
        return None


def gated_trajectories(db: Store, ids: list[str], *, drop_invalid_steps: bool) -> list[Trajectory]:
    """The gated trajectories `ids`, as the gate compared them and SFT trains on them: without the steps the
    env rejected when `drop_invalid_steps` (`LoopResource.gate_drops_invalid_steps`, whose default is the one
    default: callers pass the loop's value, so this takes none)."""
    trajs = db.load_trajectories(ids) if ids else []
    trajs = [without_invalid_steps(t) for t in trajs] if drop_invalid_steps else trajs
    cuts = db.kept_steps(ids)  # the gate's verified cuts (flywheel.core.cleaning), on the trajectory as it compared it
    for t in trajs:
        if t.traj_id in cuts and cuts[t.traj_id][0] != len(t.steps):
            raise ValueError(f"{t.traj_id}: the gate cut it as a trajectory of {cuts[t.traj_id][0]} steps, here it has "
                             f"{len(t.steps)}: loop.gate_drops_invalid_steps changed since gated_dataset ran; set it "
                             "back, or materialize gated_dataset again")
    return [apply_cut(t, cuts[t.traj_id][1]) if t.traj_id in cuts else t for t in trajs]


def training_set(
    db: Store, benchmark: str, iteration: int, *, include_synthetic: bool = True, refine_from: str = "base",
    seed: int = 0, replay: str = "all", drop_invalid_steps: bool,
) -> tuple[list[Trajectory], dict[str, int]]:
    """Seeds and curriculum, then the gated successes of iterations < k (through the store).

    `refine_from="previous"` (k > 0, training continues from checkpoint k-1) with `replay="matched"`:
    only gate k-1's successes, plus as many seed/curriculum trajectories replayed (a fixed random
    draw), so that k-1's skills are rehearsed without training on everything again. A small draw can
    leave a task type out, and a small set is seen for several epochs: cpu-scienceworld's k=2 (8 new
    + 8 replayed) lost a whole type. `replay="all"` keeps the warm start but trains on everything,
    as `refine_from="base"` does: seeds, curriculum and every gated success so far. `replay="none"`: seeds
    and curriculum only at every k (the equal-compute control: more steps, none of the flywheel's data).
    `drop_invalid_steps`: see `gated_trajectories`.
    """
    base = db.load_trajectories(benchmark=benchmark, source="teacher")
    if include_synthetic:
        base += db.load_trajectories(benchmark=benchmark, source="synthetic")
    if replay == "none":
        return base, {"seed_or_curriculum": len(base), "gated": 0}
    if refine_from == "previous" and replay == "matched" and iteration > 0:
        new = gated_trajectories(db, db.traj_ids_gated_at(benchmark, iteration - 1), drop_invalid_steps=drop_invalid_steps)
        replayed = random.Random(seed + iteration).sample(base, min(len(base), len(new)))
        return replayed + new, {"seed_or_curriculum": len(replayed), "gated": len(new)}
    gated = gated_trajectories(db, db.traj_ids_gated_up_to(benchmark, iteration - 1),
                               drop_invalid_steps=drop_invalid_steps) if iteration > 0 else []
    return base + gated, {"seed_or_curriculum": len(base), "gated": len(gated)}


@dg.asset(
    partitions_def=flywheel_partitions,
    group_name="flywheel",
    deps=[dg.AssetDep(synthetic_curriculum, partition_mapping=by_benchmark)],
    kinds={"pytorch"},
    pool="accelerator",
    description="SFT checkpoint k: the base model fine-tuned (TRL) on seeds + curriculum + the gated successes "
    "of iterations < k, easy to hard. Refuses (once, not retried) before gate k-1 ran or when its blocking check "
    "failed. The exact training pairs are kept in the store's training_examples table.",
)
@fails_once
def sft_checkpoint(
    context: dg.AssetExecutionContext, envs: EnvResource, policy: PolicyResource, store: StoreResource,
    curriculum: CurriculumResource, loop: LoopResource,
) -> dg.MaterializeResult:
    """Fine-tune the base model on the fused quaternions available at iteration k."""
    benchmark, k = keys_of(context)
    db = store.get()
    if k > 0 and policy.replay != "none":  # "none" (the equal-compute control) reads no gate
        gate = db.gate_run(benchmark, k - 1)
        if gate is None:
            fail_once(context, f"sft_checkpoint {benchmark}|{k} needs gated_dataset {benchmark}|{k - 1}: materialize "
                      f"iteration {k - 1} first (rollouts, gated_dataset), or let the iteration sensor do it.")
        passed = db.gate_check_passed(benchmark, k - 1)  # the check's verdict, as the sensor reads it
        if not gate_allows_next(passed, gated_new=int(gate["passed"] or 0),
                                continue_on_empty_gate=loop.continue_on_empty_gate):
            fail_once(context, gate_refusal(benchmark, k - 1, passed, int(gate["passed"] or 0)))
    trajs, counts = training_set(db, benchmark, k, include_synthetic=curriculum.synthesize,
                                 refine_from=policy.refine_from, seed=policy.sft_seed(k),
                                 replay=policy.replay, drop_invalid_steps=loop.gate_drops_invalid_steps)
    start_model = policy.base_model_path
    if policy.refine_from == "previous" and k > 0:  # continue from checkpoint k-1, or the one the gate kept instead
        start_model = continued_checkpoint(db, benchmark, k - 1, steers=loop.promotion_steers)["path"]
    spec = envs.spec(benchmark)
    instructions = spec.system_prompt()
    cfg = policy.train_config(k)
    if k > 0 and (mixed := packing_mismatch(db, benchmark, k, cfg.packing)):
        fail_once(context, mixed)
    mode, scorer = curriculum.mode(), curriculum.scorer()
    scored = scorer.score_all(trajs, spec)
    if mode == "shuffle":  # recorded as loaded; the trainer shuffles
        ordered, _ = assign_buckets(scored, curriculum.train_edges(benchmark))
    else:  # easy to hard: the examples keep this order and the trainer walks them in order
        trajs, ordered, _ = grade(trajs, scored, edges=curriculum.train_edges(benchmark), mode=mode, seed=cfg.seed)
        cfg = replace(cfg, order="given")
    write_training_order(db, benchmark, k, ordered, mode=mode)
    examples = sft_examples(trajs, lambda _t: instructions, cfg.prompt)
    fingerprint = training_fingerprint(start_model, examples, cfg)
    if (reused := reusable_checkpoint(db, benchmark, k, fingerprint)) is not None:
        context.log.info(f"sft_checkpoint {benchmark}|{k}: reusing {reused['checkpoint_id']} at {reused['path']} "
                         "(same base model, training data and config; e.g. a re-run after a kill)")
        return dg.MaterializeResult(metadata={
            "checkpoint_id": reused["checkpoint_id"], "path": dg.MetadataValue.path(reused["path"]),
            "reused": True, "train_loss": round(float(reused["train_loss"] or 0.0), 4), "examples": reused["n_examples"],
            "trajectories": len(trajs), "fingerprint": fingerprint,
        })
    # One directory per checkpoint id, published atomically: a recorded checkpoint is never overwritten.
    out = Path(policy.checkpoints_dir) / benchmark / new_checkpoint_id(benchmark, k)
    # Cleans a killed run's leftovers, or hands back the folder of a killed SFT of this same training to resume.
    marker = begin_checkpoint(db, out, benchmark, k, log=context.log.warning,
                              resume=fingerprint if policy.sft_backend == "local" and cfg.save_minutes else None)
    out = marker.with_suffix("")
    checkpoint_id = out.name
    started = time.monotonic()
    # sft_backend "ray": the same train_sft as a Ray Train job on the cluster (README "Scaling out on Ray").
    train = train_sft if policy.sft_backend == "local" else policy.train
    result = train(start_model, examples, out, cfg, progress=context.log.info)
    lineage = {"fingerprint": fingerprint, "examples_sha256": examples_sha256(examples),
               "base_model": start_model, "refine_from": policy.refine_from,
               "replay": policy.replay,
               "iteration": k, "dataset": counts,
               "gated_iterations": list(range(k)), "examples": result.n_examples, "train_steps": result.steps,
               "batch_size": cfg.batch_size, "micro_batch_size": cfg.micro_batch_size, "whole_passes": cfg.whole_passes,
               "packing": cfg.packing, "compute_dtype": result.compute_dtype,
               # Tokens trained: one pass's tokens x the passes the steps made (steps x batch / examples).
               "tokens_per_pass": result.tokens_per_pass,
               # ... and what the forward passes computed of them (fewer packed: each shared prefix once per pack).
               "computed_tokens_per_pass": result.computed_tokens_per_pass,
               "tokens_trained": round(result.tokens_per_pass * result.steps * cfg.batch_size * cfg.grad_accum
                                       * result.world_size / max(result.n_examples, 1)),
               # This attempt's: an SFT resumed after a kill (from its state at step resumed_at_step) is timed
               # over the steps it trained.
               "train_seconds": round(time.monotonic() - started, 1), "resumed_at_step": result.resumed_at,
               # Equal weights, equal hash: arms that share this k=0 across machines check it (flywheel.core.provenance).
               "weights_sha256": _weights_hash(result.path),
               "examples_never_trained": examples_never_trained(result.n_examples, cfg, result.world_size),
               # The trained answers' token lengths against the generation budget the policy rolls out with.
               "answer_tokens": answer_lengths(result.answer_tokens, policy.max_new_tokens)}
    # The exact pairs this checkpoint trained on, in order (dropped ones flagged): `flywheel export`.
    traj_ids = [tr.traj_id for tr in trajs for _ in tr.steps]
    dropped = set(result.dropped)
    db.record_checkpoint({  # the checkpoint and its pairs in one transaction: both or neither
        "checkpoint_id": checkpoint_id, "benchmark": benchmark, "iteration": k, "path": result.path,
        "base_model": start_model, "n_examples": result.n_examples, "n_trajectories": len(trajs),
        "train_loss": result.train_loss, "lineage": lineage,
    }, training_examples=[{**ex, "traj_id": tid, "kept": i not in dropped}
                          for i, (ex, tid) in enumerate(zip(examples, traj_ids, strict=True))])
    marker.unlink()
    never = lineage["examples_never_trained"]
    if never:
        context.log.warning(
            f"sft_checkpoint {benchmark}|{k}: the curriculum walks the {result.n_examples} examples easy to hard and "
            f"max_train_steps={cfg.max_steps} stops it before the end: the {never} hardest are never trained; set "
            "policy.whole_passes: true, raise policy.max_train_steps or set curriculum.order: shuffle")
    answers = lineage["answer_tokens"]
    if answers["at_cap"]:
        context.log.warning(
            f"sft_checkpoint {benchmark}|{k}: {answers['at_cap']} of {answers['n']} trained answers are "
            f"max_new_tokens={answers['cap']} tokens or longer (median {answers['median']}, 95th percentile "
            f"{answers['p95']}, longest {answers['max']}): generation cuts them, often before the action line; set "
            f"policy.max_new_tokens above {answers['max']}")
    if result.n_dropped:
        context.log.warning(
            f"sft_checkpoint {benchmark}|{k}: dropped {result.n_dropped} of {len(examples)} SFT examples longer than "
            f"max_length={cfg.max_length} tokens (never truncated); raise policy.max_length or lower "
            "history_window / max_observation_chars to keep them")
    return dg.MaterializeResult(metadata={
        "checkpoint_id": checkpoint_id,
        "path": dg.MetadataValue.path(result.path),
        "train_loss": round(float(result.train_loss), 4),
        "train_steps": result.steps,
        "examples": result.n_examples,
        "examples_dropped_too_long": result.n_dropped,
        "dropped_fraction": round(result.n_dropped / max(len(examples), 1), 4),
        **({"warning": dg.MetadataValue.md(
            f"**{result.n_dropped} of {len(examples)} examples dropped** as longer than max_length={cfg.max_length} "
            "tokens (see the run log)")} if result.n_dropped else {}),
        "trajectories": len(trajs),
        "examples_never_trained": never,  # the hardest end, cut by a step cap below one pass (given order)
        "answer_tokens": dg.MetadataValue.json(answers),  # vs policy.max_new_tokens
        "seed_or_curriculum_trajectories": counts["seed_or_curriculum"],
        "gated_trajectories": counts["gated"],
        "order": mode if mode == "shuffle" else f"{mode} (easy to hard, {scorer.name}; see training_order)",
        "trajectories_by_bucket": dg.MetadataValue.json(dict(Counter(c.bucket for c in ordered))),
        "back_edge": back_edge(db, benchmark, k),
        # The loss curve (policy.report_to: tensorboard): `make tensorboard`, or tensorboard --logdir on this folder.
        **({"training_logs": dg.MetadataValue.path(str(logs))} if (logs := Path(result.path) / LOGS_DIR).is_dir() else {}),
        "train_seconds": round(time.monotonic() - started, 1),
        "reused": False,
        "fingerprint": fingerprint,
    })


def back_edge(db: Store, benchmark: str, k: int) -> str:
    """What checkpoint k read from the loop's back edge, saying which gates were empty."""
    if not k:
        return "iteration 0: seeds and curriculum only"
    gates = {g["iteration"]: g for g in db.gated_growth(benchmark)}
    empty = [j for j in range(k) if j in gates and not int(gates[j]["new_unique_successes"] or 0)]
    note = f"; gate(s) {empty} admitted nothing (empty)" if empty else ""
    return f"trained on gated_dataset iterations {list(range(k))} of {benchmark}, read from the store{note}"
