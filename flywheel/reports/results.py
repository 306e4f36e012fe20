"""An experiment's results, computed from its arms' stores (read-only) and committed arm files: per-arm rates with
n and a 95% interval, paired k-vs-k' differences, claims, and success by task type. `render` turns them into a
report."""

from __future__ import annotations

import json
import logging
import math
import subprocess
from pathlib import Path
from typing import Any

from flywheel.config.presets import PROMOTED, Preset, arm_config, arm_order
from flywheel.core.metrics import answer_lengths
from flywheel.core.provenance import (
    arm_file,
    fingerprint,
    lineage_of,
    read_arm,
    weights_sha256,
)
from flywheel.core.quality import (
    Z95,
    arm_checkpoints,
    bootstrap_ratio,
    discordance,
    hierarchical_difference,
    paired_bootstrap,
    paired_difference,
    reward_difference,
    run_variance,
    runs_needed,
    t_power,
    two_group_difference,
    wilson_interval,
)
from flywheel.core.settings import REPO_ROOT
from flywheel.core.store import Store
from flywheel.orchestration.methods import METHODS, method_stages
from flywheel.resources import EnvResource
from flywheel.rollout.engine import RolloutConfig

log = logging.getLogger(__name__)


def _rate(successes: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(successes, n)
    return {"n": n, "successes": successes, "rate": successes / n if n else 0.0, "ci_low": lo, "ci_high": hi}


def arm_results(store: Store, benchmark: str, iterations: int, progress: dict[str, Any],
                splits: tuple[str, ...], types_of: dict[str, dict[str, str]] | None = None,
                k0_from: tuple[str, dict[str, dict[str, tuple[bool, float]]]] | None = None,
                max_new_tokens: int | None = None) -> dict[str, Any]:
    """Everything the report shows for one arm, read from its store (and its stage timings).

    `k0_from` (ARM, its k=0 outcomes per split): this arm took its k=0 checkpoint from ARM (`method.start_from`) and did not
    evaluate it again; its k-vs-0 comparisons then use ARM's k=0 evaluation of the same weights, marked
    `old_arm`, and its by-type table shows them as k=0 (the per-k table keeps only this arm's own evaluations).
    `max_new_tokens` (the arm's generation budget): each evaluated split also counts the answers that reached it."""
    done = progress.get("done", {})
    evals = {(r["iteration"], r["split"]): r for r in store.evaluation_rows(benchmark)}
    outcomes = {(k, s): store.policy_outcomes(benchmark, k, s) for k in range(iterations + 1) for s in splits}
    k0_arm = None
    if k0_from is not None and not any((0, s) in evals for s in splits) and all(s in k0_from[1] for s in splits):
        k0_arm = k0_from[0]
        outcomes.update({(0, s): k0_from[1][s] for s in splits})
    checkpoints = {r["iteration"]: r for r in store.checkpoint_rows(benchmark)}
    gates = {r["iteration"]: r for r in store.iterations(benchmark).iter_rows(named=True)}
    checks = store.gate_check_rows(benchmark)
    promotions = {r["iteration"]: r for r in store.promotions(benchmark)}  # the promotion gate's decisions
    rollouts = {r["iteration"]: r for r in store.rollout_summary(benchmark)}
    seeds = set(store.seed_task_ids(benchmark))
    # (attempts, successes) per task for every (k, split) read below; split "train" = checkpoint k's rollouts.
    per_task_counts = {key: {t: (1, int(ok)) for t, (ok, _) in out.items()} for key, out in outcomes.items()}
    per_k: list[dict[str, Any]] = []
    for k in range(iterations + 1):
        row: dict[str, Any] = {"k": k, "splits": {}}
        for s in splits:
            out = outcomes[(k, s)]
            if (k, s) not in evals:
                continue
            ev = evals[(k, s)]
            succ = sum(ok for ok, _ in out.values())
            rewards = [float(r) for _, r in out.values()]
            row["splits"][s] = {**_rate(succ, len(out)), "avg_reward": ev["avg_reward"], "errored": ev["errored"],
                                "reward": bootstrap_ratio(rewards, [1.0] * len(rewards)),
                                "mean_steps": ev["mean_steps"], "invalid_action_rate": ev["invalid_action_rate"],
                                "prompt_tokens_per_step": ev["prompt_tokens_per_step"]}
            if max_new_tokens:
                row["splits"][s]["answer_tokens"] = answer_lengths(
                    store.policy_answer_tokens(benchmark, k, s), max_new_tokens)
        if skipped := done.get(f"evaluation:{k}", {}).get("skipped"):  # method.evaluate_rejected: false
            row["evaluation_skipped"] = skipped
        if k in checkpoints:
            c = checkpoints[k]
            sft = done.get(f"sft:{k}", {})
            secs = sft.get("seconds")
            examples = int(c["n_examples"] or 0)
            lineage = lineage_of(c)
            steps, train_s = lineage.get("train_steps"), lineage.get("train_seconds")
            row["checkpoint"] = {"checkpoint_id": c["checkpoint_id"], "train_loss": c["train_loss"],
                                 "examples": examples, "trajectories": c["n_trajectories"],
                                 "sft_stage_seconds": secs, "train_seconds": train_s, "train_steps": steps}
            # The steps the timed attempt trained (an SFT resumed after a kill is timed from its resume).
            timed = (steps or 0) - int(lineage.get("resumed_at_step") or 0)
            if train_s and timed > 0:  # examples seen per second of training (steps x batch)
                row["checkpoint"]["sft_examples_per_s"] = timed * int(lineage.get("batch_size", 8)) / train_s
            if lineage.get("answer_tokens"):  # the trained answers' lengths vs the budget (recorded since it was)
                row["checkpoint"]["answer_tokens"] = lineage["answer_tokens"]
            if train_s and timed > 0 and lineage.get("tokens_trained"):
                row["checkpoint"]["sft_tokens_per_s"] = lineage["tokens_trained"] * timed / steps / train_s
        if (p := promotions.get(k)) is not None and p["validation_n"] is not None:  # decided on validation tasks
            kept = next((i for i, c in checkpoints.items() if c["checkpoint_id"] == p["promoted_id"]), None)
            row["promotion"] = {**{f: p[f] for f in ("promoted", "validation_n", "successes", "predecessor_successes",
                                                     "delta", "ci_low", "margin", "alpha")}, "kept_k": kept}
        if k in rollouts:
            r = rollouts[k]
            secs = done.get(f"rollouts:{k}", {}).get("seconds")
            shared = done.get(f"rollouts:{k}", {}).get("shared_episodes")  # played by other arms (share_k0_episodes)
            per_task = per_task_counts[(k, "train")] = store.rollout_task_outcomes(benchmark, k)
            seed_tasks = [t for t in per_task if t in seeds]
            new_tasks = [t for t in per_task if t not in seeds]
            row["rollouts"] = {
                "episodes": r["episodes"], "successes": r["successes"], "errored": r["errored"],
                "pass_rate": _rate(int(r["successes"]), int(r["episodes"] - r["errored"])),
                "pass_at_n": _rate(int(r["tasks_solved"]), int(r["tasks"])),
                "seed_tasks_pass_rate": _rate(sum(per_task[t][1] for t in seed_tasks), sum(per_task[t][0] for t in seed_tasks)),
                "other_tasks_pass_rate": _rate(sum(per_task[t][1] for t in new_tasks), sum(per_task[t][0] for t in new_tasks)),
                "seconds": secs, "episodes_per_min": (60 * r["episodes"] / secs) if secs and not shared else None,
            }
            if shared:
                row["rollouts"]["shared_from"] = shared
        if k in gates:
            g = gates[k]
            gated_tasks = store.task_ids_gated_at(benchmark, k)
            row["gate"] = {"candidates": g["candidates"], "new_unique_successes": g["new_unique_successes"],
                           "gated_total": g["gated_total"], "capped_dropped": g["capped_dropped"],
                           "distinct_tasks": len(gated_tasks),
                           "tasks_without_seed": len([t for t in gated_tasks if t not in seeds]),
                           "yield_per_100_episodes": 100 * int(g["new_unique_successes"] or 0) / max(int(g["candidates"] or 0), 1)}
            if cleaning := [c for c in store.gate_cleaning(benchmark, k) if c["admitted"]]:  # loop.clean_successes
                row["gate"]["cleaning"] = {"steps_before": sum(c["steps_before"] for c in cleaning),
                                           "steps_after": sum(c["steps_after"] for c in cleaning),
                                           "cut": sum(c["outcome"] == "cut" for c in cleaning)}
            if k in checks:  # the blocking gated_dataset_is_usable check's verdict on this gate
                row["gate"]["check"] = {f: checks[k][f] for f in ("passed", "problems", "first_problem")}
        per_k.append(row)
    evaluated = [k for k in range(iterations + 1) if all((k, s) in evals for s in splits) or (k == 0 and k0_arm)]
    comparisons: list[dict[str, Any]] = []
    pairs = [(k, k - 1) for k in evaluated if k - 1 in evaluated]
    if evaluated and evaluated[-1] != 0 and 0 in evaluated and (evaluated[-1], 0) not in pairs:
        pairs.append((evaluated[-1], 0))
    for new, old in pairs:
        for s in (*splits, "all") if len(splits) > 1 else splits:
            pick = splits if s == "all" else [s]
            a = {f"{sp}/{t}": v for sp in pick for t, v in outcomes[(new, sp)].items()}
            b = {f"{sp}/{t}": v for sp in pick for t, v in outcomes[(old, sp)].items()}
            comparisons.append({"new": new, "old": old, "split": s,
                                **paired_difference({t: v[0] for t, v in a.items()}, {t: v[0] for t, v in b.items()}),
                                "reward": reward_difference({t: v[1] for t, v in a.items()}, {t: v[1] for t, v in b.items()}),
                                **({"old_arm": k0_arm} if old == 0 and k0_arm else {})})
    return {"per_k": per_k, "comparisons": comparisons, "seed_tasks": len(seeds),
            "by_task_type": success_by_type(per_task_counts, types_of or {}),
            "stages": done, "stopped": progress.get("stopped"), "empty_gates": progress.get("empty_gates", [])}


def collect_results(preset: Preset, runs: Path, results: Path | None = None) -> dict[str, Any]:
    """Every arm's results: from its store in `runs` when it has one, else from its committed results
    (`results`/arms/ARM.json: an arm run in another sitting, runs folder or machine), else "not run". The
    arms are then compared with each other over the same tasks, whatever run each came from."""
    out: dict[str, Any] = {"preset": preset.name, "benchmark": preset.benchmark, "iterations": preset.iterations,
                           "model": preset.model, "description": preset.description, "arms": {}}
    records, local = {}, []
    for arm in arm_order(preset, list(preset.arms)):
        committed = read_arm(results, arm)
        record = local_arm_record(preset, arm, runs / arm, records) if (runs / arm / "flywheel.duckdb").exists() else None
        if record is not None and committed is not None and not supersedes(record, committed):
            log.warning("arm %s: keeping its committed results (run %s, %d stages) over this runs folder's run %s "
                        "(%d stages); delete %s to replace them", arm, committed["provenance"].get("run_id"),
                        len(committed["results"]["stages"]), record["provenance"]["run_id"],
                        len(record["results"]["stages"]), arm_file(results, arm))
            record = None
        if record is not None:
            local.append(arm)
        elif committed is not None:
            record = {**committed, "origin": f"committed {arm_file(results, arm).relative_to(results.parent)}"}
        else:
            out["arms"][arm] = {"status": "not run"}
            continue
        records[arm] = record
        out["arms"][arm] = {**record["results"], "config": record["config"], "splits": record["splits"],
                            "provenance": record["provenance"], "origin": record["origin"]}
    out["arms"] = {a: out["arms"][a] for a in preset.arms}  # the preset's order
    for arm, record in records.items():  # can this arm be rerun from the repository's history?
        out["arms"][arm]["reproducible"] = commits_in_history(record["provenance"].get("commits") or [])
    out["arm_comparisons"] = compare_arms({a: outcomes_of(records[a]) for a in preset.arms if a in records})
    out["claims"] = claims(preset, records)
    out["design"] = design(preset, records, out["claims"])
    out["_records"], out["_local"] = records, local
    return out


def claim_outcomes(preset: Preset, records: dict[str, dict[str, Any]], arm: str, k: int | None,
                   *, reward: bool = False) -> tuple[int, dict[str, dict[str, Any]]] | None:
    """(k, {split: {task: success}}) of an arm at k (None: its last evaluated k; PROMOTED: `promoted_k`); a k=0 that the arm took from
    its start arm without evaluating it again is that arm's evaluation of the same weights. `reward`: task ->
    reward instead of success."""
    if arm not in records:
        return None
    if k == PROMOTED:
        k = promoted_k(records[arm])
    own = outcomes_of(records[arm], reward=reward)
    source = preset.arm_sections(arm).get("method", {}).get("start_from")
    if k == 0 and not any(kk == 0 for kk, _ in own) and source in records:
        own = {key: v for key, v in outcomes_of(records[source], reward=reward).items() if key[0] == 0}
    ks = sorted({kk for kk, _ in own})
    k = ks[-1] if k is None and ks else k
    splits = {s: v for (kk, s), v in own.items() if kk == k}
    return (k, splits) if splits else None


def promoted_k(record: dict[str, Any]) -> int | None:
    """The k whose checkpoint an arm's loop holds after its last iteration: the last decided k when the promotion
    gate promoted it, else the predecessor it kept; None (the last evaluated k) where no gate decided."""
    decided = [r for r in (record.get("results") or {}).get("per_k", []) if r.get("promotion")]
    if not decided:
        return None
    last = decided[-1]
    return last["k"] if last["promotion"]["promoted"] else last["promotion"]["kept_k"]


def start_chain(preset: Preset, arm: str) -> list[str]:
    """The arms `arm`'s k=0 came from, nearest first (`method.start_from`, followed; load_preset refuses cycles)."""
    chain, a = [], arm
    while (src := preset.arm_sections(a).get("method", {}).get("start_from")) in preset.arms and src not in chain:
        chain.append(src)
        a = src
    return chain


def k0_hash(records: dict[str, dict[str, Any]], arm: str) -> str | None:
    return (records.get(arm, {}).get("provenance") or {}).get("k0_weights_sha256")


def k0_evaluator(preset: Preset, records: dict[str, dict[str, Any]], arm: str) -> str:
    """The arm whose k=0 evaluation is `arm`'s k=0 (its own, else its start_from arm's: the same weights)."""
    if any(key.startswith("0|") for key in records.get(arm, {}).get("outcomes", {})):
        return arm
    source = preset.arm_sections(arm).get("method", {}).get("start_from")
    return source if source in records else arm


def reference_for(preset: Preset, records: dict[str, dict[str, Any]], head: str, member: str, ref: str,
                  kref: int | None) -> tuple[str, str]:
    """(the arm that plays the claim's reference for replicate `member` of `head`'s group, how it was chosen).
    Every run is paired with its own reference, never with another run's: when the claim's reference is
    `head`'s control, `member`'s control (`method.controls: member`), else the control of the same method
    from `member`'s k=0 weights (its block); when it is the k=0 `head` started from, `member`'s own k=0 (the
    arm that evaluated it); any other reference (another recipe) is shared by every run."""
    method = preset.arm_sections(ref).get("method", {})
    if method.get("controls") == head:
        if member == head:
            return ref, "its own control"
        own = [a for a in preset.arms if a in records and preset.arm_sections(a).get("method", {}).get("controls") == member]
        if own:
            return own[0], "its own control"
        block = [a for a in preset.arms if a in records and preset.method(a) == preset.method(ref)
                 and k0_hash(records, a) and k0_hash(records, a) == k0_hash(records, member)]
        if block:
            return block[0], "the control from its k=0"
        return ref, "another run's control (none from its k=0)"
    if kref == 0 and ref in start_chain(preset, head):
        return k0_evaluator(preset, records, member), "its own k=0"
    return ref, "as stated"


def block_check(records: dict[str, dict[str, Any]], member: str, reference: str, how: str) -> str:
    """Whether a run and the reference it must share a k=0 with do share one, by the k=0 weights' sha256 (a k=0
    retrained on another machine or dtype is other weights: another block). "-" where no k=0 is shared."""
    if how == "as stated":
        return "-"
    a, b = k0_hash(records, member), k0_hash(records, reference)
    if not a or not b:
        return "k=0 weights not recorded"
    return f"same k=0 ({a[:12]})" if a == b else f"**other blocks**: k=0 {a[:12]} vs {b[:12]}"


def _unpaired(records: dict[str, dict[str, Any]], side: str, at: int | None) -> str:
    """Why a claim's side has nothing to pair: not run (its name), or run but not evaluated at its k."""
    return side if side not in records else f"{side}@{at if at is not None else 'last'} not evaluated"


def claims(preset: Preset, records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The preset's `compare` claims, paired over the same tasks per split and pooled; a claim whose arm heads a
    `replicates` group is reported for each replicate that has run, each paired with its own reference
    (`reference_for`), and pooled over them (`flywheel.core.quality.hierarchical_difference`: runs, then
    tasks; a t-interval over the per-run differences beside it). Where the reference is another recipe that
    heads a `replicates` group of its own (no run is paired with one of its runs), the pooled difference is
    between the two groups' means with both groups' runs resampled (`two_group_difference`, Welch's t beside
    it); each run's own row stays paired with the group's head."""

    rows = []
    for arm, k, ref, kref in preset.compare:
        members = preset.replicates.get(arm, [arm])
        pairing = {m: reference_for(preset, records, arm, m, ref, kref) for m in members}
        evaluated = {m: got for m in members if (got := claim_outcomes(preset, records, m, k)) is not None}
        olds = {m: got for m in evaluated if (got := claim_outcomes(preset, records, pairing[m][0], kref)) is not None}
        news = {m: n for m, n in evaluated.items() if m in olds}
        unpaired = {m: _unpaired(records, *((m, k) if m not in evaluated else (pairing[m][0], kref))) for m in members}
        if not news:
            missing = [m for m in members if m not in records] + ([ref] if ref not in records else [])
            rows.append({"arm": arm, "k": k, "reference": ref, "reference_k": kref,
                         "status": "not run yet" if missing else "not evaluated",
                         "missing": missing or list(dict.fromkeys(unpaired.values()))})
            continue
        kk = next(iter(news.values()))[0]
        old_k = next(iter(olds.values()))[0]
        # The reference is another recipe run several times (a `replicates` group no run is paired with): the
        # pooled difference is between the two groups' means, with both groups' runs resampled.
        ref_runs = {}
        if all(how == "as stated" for _, how in pairing.values()):
            ref_runs = {o: got for o in preset.replicates.get(ref, [])
                        if (got := claim_outcomes(preset, records, o, kref)) is not None}
        rewards = {m: claim_outcomes(preset, records, m, k, reward=True) for m in news}
        old_rewards = {m: claim_outcomes(preset, records, pairing[m][0], kref, reward=True) for m in news}
        splits = [s for s in next(iter(olds.values()))[1]
                  if all(s in n[1] for n in news.values()) and all(s in o[1] for o in olds.values())]
        for s in (*splits, "all") if len(splits) > 1 else splits:
            pick = splits if s == "all" else [s]

            def flat(by_split: dict[str, dict[str, Any]]) -> dict[str, Any]:
                return {f"{sp}/{t}": v for sp in pick for t, v in by_split[sp].items()}  # noqa: B023

            per = {m: paired_difference(flat(n[1]), flat(olds[m][1])) for m, n in news.items()}
            for m, d in per.items():  # the same pairs in average reward, and who the run was paired with
                d["reward"] = reward_difference(flat(rewards[m][1]), flat(old_rewards[m][1]))
                d["paired_with"], d["pairing"] = pairing[m]
                d["k"], d["reference_k"] = news[m][0], olds[m][0]  # @promoted resolves run by run
                d["block"] = block_check(records, m, pairing[m][0], pairing[m][1])
                d["in_progress"] = [a for a in dict.fromkeys((m, pairing[m][0]))  # @promoted may still change
                                    if not records[a].get("provenance", {}).get("complete", True)]
                if d["block"].startswith("**other") and kk and old_k:  # each side's gain over its own k=0
                    k0_new = claim_outcomes(preset, records, m, 0)
                    k0_old = claim_outcomes(preset, records, pairing[m][0], 0)
                    if k0_new and k0_old and all(sp in k0_new[1] and sp in k0_old[1] for sp in pick):
                        d["within_blocks"] = gain_difference(flat(news[m][1]), flat(k0_new[1]),
                                                             flat(olds[m][1]), flat(k0_old[1]))
            row = {"arm": arm, "k": kk, "reference": ref, "reference_k": old_k, "split": s, "replicates": per,
                   "asked": [k, kref]}
            if len(members) > 1:
                others = {o: got for o, got in ref_runs.items() if all(sp in got[1] for sp in pick)}
                if len(news) > 1 and len(others) > 1:  # two recipes, each run several times: both variances
                    row["pooled"] = two_group_difference([flat(n[1]) for n in news.values()],
                                                         [flat(o[1]) for o in others.values()])
                    row["pooled"]["references"] = list(others)
                else:
                    row["pooled"] = hierarchical_difference([(flat(n[1]), flat(olds[m][1])) for m, n in news.items()])
                    row["pooled"]["references"] = sorted({pairing[m][0] for m in news})
                row["missing"] = [unpaired[m] for m in members if m not in news]
            rows.append(row)
    return rows


def gain_difference(new: dict[str, bool], new_k0: dict[str, bool], old: dict[str, bool],
                    old_k0: dict[str, bool]) -> dict[str, Any]:
    """Two runs in other blocks (other k=0 weights) compared block by block: (new - its k=0) - (old - its k=0)
    per task, the mean with a 95% paired bootstrap interval over the tasks all four evaluated. The k=0s'
    difference drops out; what is left is whether one run gained more over its own start than the other."""
    common = sorted(set(new) & set(new_k0) & set(old) & set(old_k0))
    pairs = [(float(new[t]) - float(new_k0[t]), float(old[t]) - float(old_k0[t])) for t in common]
    d, lo, hi = paired_bootstrap(pairs, n_boot=10000)
    return {"n": len(common), "delta": d, "ci_low": lo, "ci_high": hi, "significant": bool(common) and (lo > 0 or hi < 0)}


# -- the design's power: variance components from the committed runs ---------------------------------
def own_k0(record: dict[str, Any]) -> dict[str, bool] | None:
    """An arm's own k=0 evaluation over every split (task -> success), None when it took another arm's."""
    keys = [key for key in record.get("outcomes", {}) if key.startswith("0|")]
    if not keys:
        return None
    return {f"{key.split('|')[1]}/{t}": bool(v[0]) for key in keys for t, v in record["outcomes"][key].items()}


def at_k(record: dict[str, Any], k: int) -> dict[str, bool]:
    return {f"{key.split('|')[1]}/{t}": bool(v[0]) for key, tasks in record.get("outcomes", {}).items()
            if key.split("|")[0] == str(k) for t, v in tasks.items()}


def variance_pairs(preset: Preset, records: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The committed pairs of evaluations that measure one source of variance each (success, every split):
    - evaluation: one set of k=0 weights (the same sha256) evaluated twice, by two arms;
    - rollouts: two replicate runs of a method that samples rollouts, from the same k=0 weights, at each k > 0
      both evaluated (the rollouts' samples, their own k > 0 SFT seeds and what follows from them);
    - sft_order: the same for a method that samples nothing (the equal-compute control): replicates that differ
      only in their k > 0 SFT seed (policy.refine_seed: data order), the control's own run-to-run variance;
    - k0_training: one k=0 recipe trained twice into other weights (the same examples' sha256, a recorded
      `k0_drift`, or the same configuration's fingerprint), both evaluated."""
    prov = {a: r.get("provenance") or {} for a, r in records.items()}
    k0s = {a: o for a, r in records.items() if (o := own_k0(r)) is not None}
    out: dict[str, list[dict[str, Any]]] = {"evaluation": [], "rollouts": [], "sft_order": [], "k0_training": []}
    seen: set[tuple[str, ...]] = set()
    names = [a for a in preset.arms if a in k0s]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ha, hb = prov[a].get("k0_weights_sha256"), prov[b].get("k0_weights_sha256")
            if not ha or not hb:
                continue
            ea, eb = prov[a].get("k0_examples_sha256"), prov[b].get("k0_examples_sha256")
            drift = {(prov[a].get("k0_drift") or {}).get("retrained_for"), (prov[b].get("k0_drift") or {}).get("retrained_for")}
            fp = prov[a].get("config_fingerprint") and prov[a].get("config_fingerprint") == prov[b].get("config_fingerprint")
            kind = "evaluation" if ha == hb else "k0_training" if (ea and ea == eb) or a in drift or b in drift or fp else None
            key = (kind or "", *sorted((ha, hb)))
            if kind and (kind == "evaluation" or key not in seen):
                seen.add(key)
                out[kind].append({"arms": [a, b], "k": 0, **discordance(k0s[a], k0s[b])})
    for head, members in preset.replicates.items():
        kind = "rollouts" if METHODS[preset.method(head)].samples else "sft_order"
        runs = [m for m in members if m in records]
        for i, a in enumerate(runs):
            for b in runs[i + 1:]:
                if not k0_hash(records, a) or k0_hash(records, a) != k0_hash(records, b) or (a, b) in seen:
                    continue
                seen.add((a, b))
                for k in range(1, preset.iterations + 1):
                    if (ya := at_k(records[a], k)) and (yb := at_k(records[b], k)):
                        out[kind].append({"arms": [a, b], "k": k, **discordance(ya, yb)})
    return out


def run_source(preset: Preset, arm: str, k: int, shares_k0: bool, sft_order: bool = False) -> str:
    """Which component moves `arm`'s run at k: its rollouts (k > 0 of a method that samples), its k > 0 SFT
    order (k > 0 of a method that trains without sampling, where `sft_order` replicates measured it: another
    refine_seed is another run), its k=0 training (a k=0 not shared with the other side), else evaluation alone
    (the same weights, or deterministic SFT from them: on one machine a k=0 retrained from the same examples is
    the same weights bit for bit, and a control without replicates is one seed's training)."""
    method = METHODS[preset.method(arm)]
    if k > 0 and method.samples:
        return "rollouts"
    if k > 0 and method.trains and sft_order:
        return "sft_order"
    return "evaluation" if shares_k0 or k > 0 or not method.trains else "k0_training"


def design(preset: Preset, records: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Variance components from the committed runs and, for each claim, its power to detect the preset's
    `minimal_effect` at the runs it has and the runs per arm that 80% power needs (the preset's `runs`: how
    many it plans). A claim's per-run difference D has variance s_new^2 + s_ref^2 + v / n: each side's between-run
    variance (`run_variance` of the pairs that measure its source, `run_source`) plus the task sample's part
    (v: the mean per-task variance of the claim's per-run paired differences, n tasks). The spread of the
    claim's own per-run differences (R - 1 degrees of freedom) plus v / n, which the spread of runs over the
    same tasks leaves out, is a second estimate; the larger of the two is used. A one-run claim also gets delta +- 1.96 sd (`with_run_variance`: its interval with the run-to-run
    variance put back), and excludes 0 only when that does too. A verdict that does not exclude 0 is
    "underpowered" when the power is under 80%."""
    pairs = variance_pairs(preset, records)
    comp = {kind: {"pairs": ps, "var": run_variance(ps) if ps else None} for kind, ps in pairs.items()}
    effect = preset.minimal_effect
    for row in rows:
        if row.get("status"):
            continue
        per = list(row["replicates"].values())
        runs = len(per)
        n = per[0]["n"]
        v = sum(d["gained"] + d["lost"] - (d["gained"] - d["lost"]) ** 2 / d["n"] for d in per) / sum(d["n"] for d in per)
        head = row["arm"]
        shares = any(d["pairing"] != "as stated" for d in per)
        order = bool(pairs["sft_order"])
        sources = [run_source(preset, head, row["k"], shares, order),
                   run_source(preset, row["reference"], row["reference_k"] or 0, shares, order)]
        parts = [comp[src]["var"] for src in sources]
        sd_components = math.sqrt(sum(parts) + v / n) if None not in parts and n else None
        pooled = row.get("pooled") or {}
        sd_spread = pooled.get("sd")
        if pooled.get("reference_sd") is not None:  # two groups of runs: var(delta) = sd^2 / R + sd_ref^2 / R_ref
            sd_spread = math.sqrt(sd_spread ** 2 + pooled["reference_sd"] ** 2 * runs / pooled["reference_runs"])
        # The runs share their tasks, so the spread of their differences leaves the task sample's part out: put
        # it back (v / n) before comparing it with the components' estimate.
        sd_runs = math.sqrt(sd_spread ** 2 + v / n) if sd_spread is not None and n else None
        sd = max(x for x in (sd_components, sd_runs) if x is not None) if (sd_components or sd_runs) else None
        power: dict[str, Any] = {"sources": sources, "task_variance": v, "n": n, "sd_components": sd_components,
                                 "sd_spread": sd_spread, "sd": sd, "effect": effect, "runs": runs}
        if effect and sd:
            power.update({"power": t_power(effect, sd, runs), "runs_needed": runs_needed(effect, sd),
                          "runs_needed_many_tasks": runs_needed(effect, math.sqrt(sum(parts)))
                          if None not in parts and sum(parts) > 0 else None})
        row["power"] = power
        target = row.get("pooled") or per[0]
        significant = target["significant"]
        if not row.get("pooled") and sd_components:  # one run: its interval leaves the run-to-run variance out
            # delta +- z * sd_components: the z-interval at the components' standard deviation of one run's difference
            half = Z95 * sd_components
            row["with_run_variance"] = {"ci_low": target["delta"] - half, "ci_high": target["delta"] + half}
            significant = significant and (target["delta"] - half > 0 or target["delta"] + half < 0)
        if significant:
            row["verdict"] = "yes"
        elif effect and power.get("power") is not None and power["power"] < 0.8:
            row["verdict"] = "underpowered"
        else:
            row["verdict"] = "no"
    return {"components": comp, "minimal_effect": effect, "runs": preset.runs}


def commits_in_history(commits: list[str]) -> dict[str, Any]:
    """Which of an arm's recorded code commits this checkout's history holds (`git merge-base --is-ancestor
    COMMIT HEAD`): an arm ran at a commit that is not there cannot be rerun from the repository. `checked` is
    False where git cannot answer (no git, not a checkout)."""
    missing = []
    try:  # a shallow clone lacks old commits that the repository has: no answer there
        shallow = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {"checked": False, "missing_commits": []}
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        return {"checked": False, "missing_commits": []}
    for c in commits:
        try:  # "+dirty" (provenance.code_commit): the commit plus uncommitted edits, said apart below
            rc = subprocess.run(["git", "-C", str(REPO_ROOT), "merge-base", "--is-ancestor", c.removesuffix("+dirty"),
                                 "HEAD"], capture_output=True, timeout=30).returncode
        except (OSError, subprocess.SubprocessError):
            return {"checked": False, "missing_commits": []}
        if rc != 0:
            missing.append(c)
    return {"checked": True, "missing_commits": missing,
            "dirty_commits": sorted({c for c in commits if c.endswith("+dirty")})}


def supersedes(record: dict[str, Any], committed: dict[str, Any]) -> bool:
    """Whether this runs folder's record of an arm may replace its committed one: the same run going on,
    or a run that has done at least as many stages."""
    same = record["provenance"]["run_id"] == committed.get("provenance", {}).get("run_id")
    return same or len(record["results"]["stages"]) >= len(committed["results"]["stages"])


def outcomes_of(record: dict[str, Any], *, reward: bool = False) -> dict[tuple[int, str], dict[str, Any]]:
    """{(k, split): {task: success}} of an arm's own evaluations ({task: reward} with `reward`)."""
    return {(int(key.split("|")[0]), key.split("|")[1]):
            {t: float(v[1]) if reward else bool(v[0]) for t, v in tasks.items()}
            for key, tasks in record["outcomes"].items()}


def local_arm_record(preset: Preset, arm: str, arm_dir: Path, records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One arm's results as committed (arms/ARM.json), read from its store: the report's numbers, the per-task
    outcomes every paired comparison needs, the paper's per-checkpoint cells, and where it ran."""

    sections = preset.arm_sections(arm)
    splits = EnvResource(**sections.get("envs", {})).eval_splits(preset.benchmark)
    progress = json.loads((arm_dir / "progress.json").read_text()) if (arm_dir / "progress.json").exists() else {}
    store = Store.reader(arm_dir / "flywheel.duckdb")
    method = sections.get("method", {})
    source = method.get("start_from") if not method.get("evaluate_start", True) else None
    k0_from = None
    if source in records and all(f"0|{s}" in records[source]["outcomes"] for s in splits):
        k0_from = (source, {s: {t: (bool(v[0]), float(v[1])) for t, v in records[source]["outcomes"][f"0|{s}"].items()}
                            for s in splits})
    res = arm_results(store, preset.benchmark, preset.iterations, progress, splits,
                      types_of=task_types_of(preset, sections.get("envs", {}), splits), k0_from=k0_from,
                      max_new_tokens=sections.get("policy", {}).get("max_new_tokens", RolloutConfig().max_new_tokens))
    evaluated = sorted({(r["iteration"], r["split"]) for r in store.evaluation_rows(preset.benchmark)})
    outcomes = {f"{k}|{s}": {t: [ok, reward] for t, (ok, reward) in store.policy_outcomes(preset.benchmark, k, s).items()}
                for k, s in evaluated if s in splits}
    k0 = store.latest_checkpoint(preset.benchmark, 0)
    lineage = lineage_of(k0) if k0 else {}
    k0_hash = lineage.get("weights_sha256")
    if k0 is not None and not k0_hash and Path(k0["path"]).is_dir():
        k0_hash = weights_sha256(k0["path"])
    done = progress.get("done", {})
    config = arm_config(preset, arm, json.loads((arm_dir / "config.json").read_text())["model"]
                        if (arm_dir / "config.json").exists() else preset.model)
    provenance = {"run_id": progress.get("run_id"), "machine": progress.get("machine"),
                  "commits": sorted({v["commit"] for v in done.values() if v.get("commit")}),
                  "hosts": sorted({v["host"] for v in done.values() if v.get("host")}),
                  "config_fingerprint": fingerprint(config["sections"]), "k0_weights_sha256": k0_hash,
                  "k0_checkpoint_id": k0["checkpoint_id"] if k0 else None, "k0_drift": progress.get("k0_drift"),
                  "k0_examples_sha256": lineage.get("examples_sha256"),
                  # bfloat16 autocast or float32 (recorded since issue 55; None before): part of a block's identity.
                  "k0_compute_dtype": lineage.get("compute_dtype"),
                  "complete": all(stage in done for stage, _, _ in method_stages(preset.benchmark, preset.iterations,
                                                                               preset.method(arm), evaluate_start=False)
                                  if stage != "evaluation:0") and not progress.get("stopped")}
    return {"arm": arm, "preset": preset.name, "config": sections, "splits": list(splits), "results": res,
            "outcomes": outcomes, "paper": arm_checkpoints(store, preset.benchmark), "provenance": provenance,
            "origin": f"store {arm_dir / 'flywheel.duckdb'}"}


def task_types_of(preset: Preset, envs_section: dict[str, Any], splits: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """{split: {task_id: type}} for the preset's `envs.task_types`, asked of the benchmark's spec one type
    at a time (the spec knows what a type is: a ScienceWorld task name, a WebShop category), never parsed
    from ids. Empty when the preset names no types."""

    types = envs_section.get("task_types", {}).get(preset.benchmark) or []
    out: dict[str, dict[str, str]] = {}
    for kind in types:
        env = EnvResource(**{**envs_section, "task_types": {preset.benchmark: [kind]},
                             "train_limit": None, "eval_limit": None, "seed_limit": None})
        try:
            for split in ("train", *splits):
                for task in env.tasks(preset.benchmark, split):
                    out.setdefault(split, {})[task.task_id] = kind
        finally:
            env.close()  # a spec may hold helpers (a search index, a JVM)
    return out


def success_by_type(per_task: dict[tuple[int, str], dict[str, tuple[int, int]]],
                    types_of: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Per task type, k and split: successes with n and a Wilson interval, from (attempts, successes) per
    task at each (k, split) (evaluation splits: greedy episodes; "train": checkpoint k's rollouts). Shows
    what a pooled rate hides: the gate can only add data on types the policy already solves sometimes,
    and k+1 can forget a type outright."""
    rows: list[dict[str, Any]] = []
    for (k, split), tasks in sorted(per_task.items()):
        counts: dict[str, list[int]] = {}
        for task, (attempts, passed) in tasks.items():
            if (kind := types_of.get(split, {}).get(task)) is not None:
                c = counts.setdefault(kind, [0, 0])
                c[0], c[1] = c[0] + attempts, c[1] + passed
        rows += [{"k": k, "split": split, "type": kind, **_rate(x, n)} for kind, (n, x) in sorted(counts.items())]
    return rows


def compare_arms(outcomes: dict[str, dict[tuple[int, str], dict[str, bool]]]) -> list[dict[str, Any]]:
    """Each arm against the first arm that has evaluations, at every (k, split) both evaluated, paired
    over the tasks both played (arms evaluate the same tasks), plus the splits pooled per k."""
    arms = [a for a, o in outcomes.items() if o]
    if len(arms) < 2:
        return []
    ref, rows = arms[0], []
    for arm in arms[1:]:
        common = sorted(set(outcomes[arm]) & set(outcomes[ref]))
        for k in sorted({k for k, _ in common}):
            splits = [s for kk, s in common if kk == k]
            for s in (*splits, "all") if len(splits) > 1 else splits:
                pick = splits if s == "all" else [s]
                a = {f"{sp}/{t}": v for sp in pick for t, v in outcomes[arm][(k, sp)].items()}
                b = {f"{sp}/{t}": v for sp in pick for t, v in outcomes[ref][(k, sp)].items()}
                rows.append({"arm": arm, "reference": ref, "k": k, "split": s, **paired_difference(a, b)})
    return rows


# -- the report ------------------------------------------------------------------------------
