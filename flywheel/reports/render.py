"""An experiment's report: `results.json` (computed by flywheel.reports.results) rendered as `report.md` and
plots. Rendering reads nothing but the results and the preset."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from flywheel.config.presets import PROMOTED, Preset
from flywheel.core.metrics import md_table, promotion_counts, success_cell
from flywheel.core.provenance import (
    arm_file,
    write_arm,
)
from flywheel.reports.results import collect_results

log = logging.getLogger(__name__)

PLOTS = ("success_by_k.png", "gate_by_k.png", "rollout_pass_by_k.png")  # the order write_report lists them in


def _reward(split: dict[str, Any]) -> str:
    """A split's average reward with its bootstrap interval over episodes (older arm files have the mean only)."""
    r = split.get("reward")
    if not r or r.get("value") is None:
        return f"{split['avg_reward']:.3f}" if split.get("avg_reward") is not None else "-"
    return f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"


def _reward_delta(d: dict[str, Any] | None) -> str:
    if not d or not d.get("n"):
        return "-"
    return f"{d['delta']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def render_behaviour(res: dict[str, Any]) -> list[str]:
    """What the greedy evaluation did, beside whether it won: the share of its actions the env rejected
    (invalid: an observation, not an error) and its steps per episode (an episode that fails runs to the limit)."""
    splits = res["splits"]
    rows = [[r["k"], *[f"{100 * e['invalid_action_rate']:.1f}% / {e['mean_steps']:.1f}"
                       if (e := r["splits"].get(s)) and e.get("invalid_action_rate") is not None
                       and e.get("mean_steps") is not None else "-" for s in splits]]
            for r in res["per_k"] if r["splits"]]
    if not any(cell != "-" for row in rows for cell in row[1:]):
        return []
    return ["**Behaviour** of the greedy evaluation (invalid actions / steps per episode):", "",
            md_table(["k", *[f"{s} invalid / steps" for s in splits]], rows), ""]


def render_answer_lengths(res: dict[str, Any]) -> list[str]:
    """Answer lengths against the generation budget, for the arms that recorded them: the SFT answers each
    checkpoint learned, and the share of its evaluation steps whose answer reached `max_new_tokens` (cut)."""
    splits = res["splits"]
    rows, cap = [], None
    for r in res["per_k"]:
        trained = (r.get("checkpoint") or {}).get("answer_tokens")
        evals = {s: r["splits"][s]["answer_tokens"] for s in splits if "answer_tokens" in r["splits"].get(s, {})}
        if not trained and not evals:
            continue
        cap = (trained or next(iter(evals.values())))["cap"]
        rows.append([r["k"], f"{trained['median']} / {trained['p95']} / {trained['max']}" if trained else "-",
                     f"{trained['at_cap']}/{trained['n']}" if trained else "-",
                     *[f"{e['at_cap']}/{e['n']} ({100 * e['at_cap'] / e['n']:.1f}%)" if (e := evals.get(s)) and e["n"]
                       else "-" for s in splits]])
    if not rows:
        return []
    return [f"**Answer lengths** in tokens against `max_new_tokens` = {cap} (an answer that reaches it is cut, "
            "often before its action line):", "",
            md_table(["k", "SFT answers median / p95 / max", "SFT answers at the cap",
                 *[f"{s} eval steps at the cap" for s in splits]], rows), ""]


def render_success_by_k(res: dict[str, Any]) -> list[str]:
    """An arm's evaluated checkpoints: success and reward per split, and the promotion gate's decision on each k
    (a rejected k the arm did not evaluate, `method.evaluate_rejected: false`, keeps its row and says so)."""
    splits = res["splits"]
    header = ["k"] + [f"{s} success % [95% CI] (s/n)" for s in splits] + [f"{s} avg reward [95% CI]" for s in splits]
    gated = any(r.get("promotion") for r in res["per_k"])  # the promotion gate ran: a column for its decisions
    header += ["promotion gate (validation s/n vs predecessor)"] if gated else []
    rows = []
    for r in res["per_k"]:
        if r.get("evaluation_skipped"):
            cells = ["not evaluated (rejected)"] * (2 * len(splits))
        elif r["splits"]:
            cells = ([success_cell(r["splits"][s]) if s in r["splits"] else "-" for s in splits]
                     + [_reward(r["splits"][s]) if s in r["splits"] else "-" for s in splits])
        else:
            continue
        rows.append([r["k"], *cells] + ([_promotion(r)] if gated else []))
    parts = [md_table(header, rows) if rows else "No checkpoint evaluated yet.", ""]
    return parts + ([render_promoted(res), ""] if gated else [])


def render_markdown(results: dict[str, Any], preset: Preset) -> str:
    parts = [f"# Experiment `{preset.name}`: {preset.benchmark}, K={preset.iterations}, model {preset.model}", ""]
    if preset.description:
        parts += [preset.description.strip(), ""]
    parts += ["Success rates in percent with 95% Wilson intervals and (successes/n); average reward with a 95% "
              "bootstrap interval over episodes; greedy evaluation, the same tasks for every checkpoint. Differences "
              "are paired over tasks: mean difference with a 95% paired bootstrap interval (10,000 resamples for "
              "success, 2,000 for reward), tasks gained/lost and the exact McNemar p.", ""]
    parts += render_claims(results.get("claims") or [])
    parts += render_design(results, preset)
    parts += render_reproducibility(results)
    for arm, res in results["arms"].items():
        parts += [f"## Arm `{arm}`", ""]
        if res.get("status") == "not run":
            parts += ["Not run.", ""]
            continue
        prov = res.get("provenance") or {}
        mach = prov.get("machine") or {}
        if not prov:
            parts += ["Run provenance (commit, machine, weights) was not recorded for this arm.", ""]
        else:
            parts += [f"Run `{prov.get('run_id')}` from {res.get('origin', 'its store')}; commit(s) "
                      f"{', '.join(c[:12] for c in prov.get('commits') or []) or 'unknown'}; machine "
                      f"{mach.get('host', '?')} ({mach.get('cpu', '?')}, {mach.get('cores', '?')} cores, torch "
                      f"{mach.get('torch', '?')}); k=0 weights sha256 {str(prov.get('k0_weights_sha256'))[:12]}"
                      + (f" (trained in {prov['k0_compute_dtype']})" if prov.get("k0_compute_dtype") else "")
                      + ("" if prov.get("complete", True) else "; **not complete**")
                      + ("; **not reproducible from history** (commit(s) "
                         + ", ".join(c[:12] for c in res["reproducible"]["missing_commits"]) + " not in it)"
                         if (res.get("reproducible") or {}).get("missing_commits") else "")
                      + ("; ran with uncommitted edits to tracked files at " + ", ".join(
                          c[:12] for c in res["reproducible"]["dirty_commits"])
                         if (res.get("reproducible") or {}).get("dirty_commits") else "")
                      + (f"; **k=0 retrained here differs from arm `{prov['k0_drift']['retrained_for']}`'s**"
                         if prov.get("k0_drift") else "") + ".", ""]
        parts += render_success_by_k(res)
        if res["comparisons"]:
            parts += ["**Differences** (paired over the same tasks):", ""]
            parts += [md_table(["comparison", "split", "n", "delta (pts)", "95% CI (pts)", "gained", "lost", "McNemar p", "excludes 0",
                           "avg reward delta [95% CI]"],
                          [[f"k={c['new']} vs k={c['old']}" + (f" (arm `{c['old_arm']}`)" if c.get("old_arm") else ""),
                            c["split"], c["n"], f"{100 * c['delta']:+.1f}",
                            f"[{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}]", c["gained"], c["lost"],
                            f"{c['mcnemar_p']:.3g}", "yes" if c["significant"] else "no", _reward_delta(c.get("reward"))]
                           for c in res["comparisons"]]), ""]
        flow = []
        # Results computed before the gate's yield was recorded render as they were committed.
        yields = any("yield_per_100_episodes" in (r.get("gate") or {}) for r in res["per_k"])
        for r in res["per_k"]:
            ck, ro, g = r.get("checkpoint", {}), r.get("rollouts"), r.get("gate")
            flow.append([
                r["k"], ck.get("examples", "-"), ck.get("trajectories", "-"),
                f"{ck['train_loss']:.3f}" if ck.get("train_loss") is not None else "-",
                f"{ck['sft_examples_per_s']:.2f}" if ck.get("sft_examples_per_s") else "-",
                ck.get("train_steps") or "-", f"{ck['sft_tokens_per_s']:.0f}" if ck.get("sft_tokens_per_s") else "-",
                ro["episodes"] if ro else "-", success_cell(ro["pass_rate"]) if ro else "-",
                success_cell(ro["pass_at_n"]) if ro else "-",
                success_cell(ro["seed_tasks_pass_rate"]) if ro and ro["seed_tasks_pass_rate"]["n"] else "-",
                success_cell(ro["other_tasks_pass_rate"]) if ro and ro["other_tasks_pass_rate"]["n"] else "-",
                f"{ro['episodes_per_min']:.1f}" if ro and ro.get("episodes_per_min") else
                "played by " + ", ".join(f"`{a}`" for a in ro["shared_from"]) if ro and ro.get("shared_from") else "-",
                g["new_unique_successes"] if g else "-", g["distinct_tasks"] if g else "-",
                g["tasks_without_seed"] if g else "-", g["gated_total"] if g else "-",
            ] + ([f"{g['yield_per_100_episodes']:.1f}" if g and "yield_per_100_episodes" in g else "-",
                  _cleaned(g.get("cleaning") if g else None)] if yields else []))
        parts += ["**The flywheel per iteration** (SFT of checkpoint k; its rollouts on the training tasks; the gate):", ""]
        parts += [md_table(["k", "SFT examples", "SFT trajectories", "train loss", "SFT examples/s", "SFT steps",
                       "SFT tokens/s", "rollouts",
                       "rollout pass rate %", "train pass@n % (tasks)", "seed-task pass %", "non-seed-task pass %",
                       "episodes/min", "gated new", "gated tasks", "gated tasks w/o seed", "gated total"]
                      + (["gate yield (new per 100 episodes)", "gated steps before -> after cleaning"] if yields else []),
                      flow), ""]
        if any((r.get("rollouts") or {}).get("shared_from") for r in res["per_k"]):
            parts += ["Rollouts \"played by\" another arm: this arm took that arm's episodes of the k=0 checkpoint "
                      "they share (the same weights, tasks and sampling settings) instead of playing its own (at k > 0: "
                      "where both arms' promotion gates kept k=0), so the arms' next checkpoints differ only in what "
                      "this arm changes.", ""]
        parts += render_behaviour(res)
        parts += render_answer_lengths(res)
        parts += [f"Seed tasks (teacher trajectories): {res['seed_tasks']}.", ""]
        if res.get("by_task_type"):
            ks = sorted({r["k"] for r in res["by_task_type"]})
            cells = {(r["type"], r["split"], r["k"]): f"{r['successes']}/{r['n']}" for r in res["by_task_type"]}
            keys = sorted({(r["type"], r["split"]) for r in res["by_task_type"]},
                          key=lambda ts: (ts[0], ts[1] == "train", ts[1]))
            parts += ["**By task type** (successes/n: greedy evaluation per split; `train`: the training rollouts "
                      "of checkpoint k):", ""]
            parts += [md_table(["type", "split", *[f"k={k}" for k in ks]],
                          [[t, s, *[cells.get((t, s, k), "-") for k in ks]] for t, s in keys]), ""]
        if res.get("stopped"):
            parts += [f"**Stopped early:** {res['stopped']}", ""]
        if res.get("empty_gates"):  # the stages whose gate check blocked the next iteration
            failed = {r["k"]: r["gate"]["check"] for r in res["per_k"] if (r.get("gate") or {}).get("check")}
            why = [f"k={k}: {c['problems']} problem(s), first: `{c['first_problem']}`"
                   for k, c in failed.items() if not c["passed"]]
            parts += [f"**Gate check failed** (`gated_dataset_is_usable`, an empty or malformed gated set; continued "
                      f"anyway, `continue_on_empty_gate`): {', '.join(res['empty_gates'])}"
                      + (f" ({'; '.join(why)})" if why else ""), ""]
        # In the order they ran: committed arm files keep their keys sorted (sft:0 after evaluation:2).
        stages = dict(sorted(res.get("stages", {}).items(), key=lambda kv: kv[1].get("finished_at") or ""))
        if stages:
            total = sum(v.get("seconds", 0) for v in stages.values())
            parts += [f"Stage wall time: {total / 60:.1f} min in all; " + ", ".join(
                f"{k} {v.get('seconds', 0) / 60:.1f}" for k, v in stages.items()) + " (min).", ""]
        parts += ["Configuration:", "", "```json", json.dumps(res["config"], indent=1, sort_keys=True), "```", ""]
    ran = {a: sum(v.get("seconds", 0) for v in r.get("stages", {}).values()) for a, r in results["arms"].items()
           if r.get("stages")}
    if ran:
        parts += [f"**What it cost:** {sum(ran.values()) / 3600:.1f} h of stages over {len(ran)} arm(s) ("
                  + ", ".join(f"{a} {t / 60:.0f} min" for a, t in ran.items()) + "), as measured on each arm's machine.",
                  ""]
    if results.get("arm_comparisons"):
        parts += ["## Arms compared", "",
                  "Each arm against the first evaluated arm at the same k, paired over the same evaluation tasks.", ""]
        parts += [md_table(["arm vs reference", "k", "split", "n", "delta (pts)", "95% CI (pts)", "gained", "lost",
                       "McNemar p", "excludes 0"],
                      [[f"{c['arm']} vs {c['reference']}", c["k"], c["split"], c["n"], f"{100 * c['delta']:+.1f}",
                        f"[{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}]", c["gained"], c["lost"],
                        f"{c['mcnemar_p']:.3g}", "yes" if c["significant"] else "no"]
                       for c in results["arm_comparisons"]]), ""]
    if preset.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in preset.notes] + [""]
    plots = results.get("plots", [])
    parts += [f"Plots: {', '.join(f'`{p}`' for p in plots)} beside this file." if plots else "Plots: none yet (nothing evaluated)."]
    return "\n".join(parts)


def claim_name(r: dict[str, Any]) -> str:
    """A claim row's name: "`bpo`@2 vs `bpo-stage2`@0", with `@promoted (k=1)` where the preset asked for it."""
    asked = r.get("asked") or [r["k"], r["reference_k"]]
    return f"{_claim_side(r['arm'], asked[0], r['k'])} vs {_claim_side(r['reference'], asked[1], r['reference_k'])}"


def _claim_side(arm: str, asked: Any, k: int | None) -> str:
    """One side of a claim: `bpo`@2, `bpo`@last, or `bpo`@promoted (k=1) with the k the gate held."""
    if asked == PROMOTED:
        return f"`{arm}`@promoted" + (f" (k={k})" if isinstance(k, int) else "")
    return f"`{arm}`@{k if k is not None else 'last'}"


def render_claims(rows: list[dict[str, Any]]) -> list[str]:
    """The preset's claims first: each run's paired difference against its own reference, then the pooled one
    (per-run differences, their spread, the hierarchical interval and a t-interval), and the verdict."""
    if not rows:
        return []

    def diff(d: dict[str, Any]) -> str:
        return f"{100 * d['delta']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"

    def verdict(r: dict[str, Any]) -> str:
        p = r.get("power") or {}
        if r.get("verdict") != "underpowered":
            return r.get("verdict") or ("yes" if (r.get("pooled") or next(iter(r["replicates"].values())))["significant"] else "no")
        need = p.get("runs_needed")
        return (f"underpowered ({100 * p['power']:.0f}% power for {100 * p['effect']:+.0f} at {p['runs']} run(s); "
                + (f"{need} runs per arm for 80%)" if need else "more than 200 runs per arm for 80%)"))

    table = []
    for r in rows:
        asked = r.get("asked") or [r["k"], r["reference_k"]]
        name = claim_name(r)
        if r.get("status"):
            why = (f"not run yet (missing: {', '.join(r['missing'])})" if r["status"] == "not run yet"
                   else "; ".join(r["missing"]))  # a side was not evaluated at its k (method.evaluate_rejected)
            table.append([name, "-", "-", "-", "-", why, "-", "-", "-", "-"])
            continue
        pooled = r.get("pooled")
        for m, d in r["replicates"].items():
            paired = f"`{d['paired_with']}` ({d['pairing']})" if d.get("paired_with") else "-"
            w = r.get("with_run_variance")
            extra = f"; with run variance [{100 * w['ci_low']:+.1f}, {100 * w['ci_high']:+.1f}]" if w and not pooled else ""
            at = f" (k={d['k']})" if PROMOTED in asked and len(r["replicates"]) > 1 else ""  # resolved run by run
            going = f" (not complete: {', '.join(f'`{a}`' for a in d['in_progress'])})" if d.get("in_progress") else ""
            table.append([name, r["split"], f"`{m}`{at}{going}", paired, d.get("block", "-"), diff(d) + extra, f"{d['gained']}/{d['lost']}",
                          f"{d['mcnemar_p']:.3g}", ("yes" if d["significant"] else "no") if pooled else verdict(r),
                          _reward_delta(d.get("reward"))])
            if g := d.get("within_blocks"):  # other k=0 weights: each side's gain over its own k=0
                table.append([name, r["split"], f"`{m}`, block by block", f"`{d['paired_with']}`",
                              "gain over its own k=0 minus gain over its own k=0", diff(g), "-", "-",
                              "yes" if g["significant"] else "no", "-"])
        if p := pooled:
            runs = ", ".join(f"{100 * x:+.0f}" for x in p["per_run"])
            sd = f"sd {100 * p['sd']:.1f}, " if p.get("sd") is not None else ""
            t = (f"; t over runs [{100 * p['t_ci_low']:+.1f}, {100 * p['t_ci_high']:+.1f}]"
                 if p.get("t_ci_low") is not None else "")
            against = (f"; against the mean of {p['reference_runs']} reference runs, sd {100 * p['reference_sd']:.1f}"
                       if p.get("reference_runs") else "")  # two recipes, each replicated (two_group_difference)
            table.append([name, r["split"], f"pooled over {p['runs']} runs (per run {runs}; {sd}spread "
                          f"{100 * p['spread']:.0f} pts{against}" + (f"; left out: {', '.join(r['missing'])}" if r["missing"] else "")
                          + ")", ", ".join(f"`{a}`" for a in p["references"]), "-",
                          diff(p) + t, "-", "-", verdict(r), "-"])
    return ["## Claims", "",
            "Each claim paired over the same tasks (per split and pooled over splits, n in each arm's table). Every "
            "run is paired with its own reference: its own control (the control from its k=0 weights where it has "
            "none of its own) and its own k=0, never another run's (`paired with`); `k=0 block` checks by the k=0 "
            "weights' sha256 that a run and its control or k=0 share weights (a k=0 retrained on another machine or "
            "dtype is other weights: another block; `auto` resolves per CPU, and arms since issue 55 record the dtype their k=0 trained in). "
            "Where they do not, a `block by block` row compares the two sides' gains over their own k=0s (paired "
            "per task, 10,000 resamples), which the k=0s' difference does not enter. Per run: the mean difference with a 95% paired bootstrap "
            "interval over tasks (10,000 resamples), tasks gained/lost and the exact McNemar p; this interval "
            "leaves out the run-to-run variance. Pooled over replicate runs: the mean of the per-run differences "
            "with a 95% hierarchical bootstrap interval (runs with replacement, then the tasks with replacement, one "
            "resample shared by the drawn runs; 10,000 resamples), and a t-interval over the per-run differences "
            "beside it (R - 1 degrees of freedom); `excludes 0` asks both to exclude 0 (with few runs the bootstrap "
            "alone is too narrow: tests/core/test_pooled_intervals.py). Against another recipe replicated on its own "
            "(no run paired with one of its runs): the two groups' mean difference, both groups' runs resampled in "
            "the bootstrap and Welch's t-interval over the two sides' run means beside it. A claim of one run also gives its difference "
            "+- 1.96 times the standard deviation of one run's difference from the variance components (the design "
            "section): its interval with the run-to-run variance put back, which must exclude 0 too. A claim whose interval covers 0 is "
            "`underpowered` when its power for the preset's `minimal_effect` is under 80% (the design section).", "",
            md_table(["claim", "split", "run", "paired with", "k=0 block", "delta (pts) [95% CI]", "gained/lost",
                 "McNemar p", "excludes 0", "avg reward delta [95% CI]"], table), ""]


def render_design(results: dict[str, Any], preset: Preset) -> list[str]:
    """The design's power: variance components from the committed runs, each claim's power for the preset's
    minimal effect and the runs per arm it needs (flywheel.reports.results.design)."""
    des = results.get("design")
    if not des:
        return []
    names = {"evaluation": "evaluation of identical weights (the same k=0 sha256, evaluated twice)",
             "rollouts": "rollout sampling (replicate runs from the same k=0 weights)",
             "sft_order": "k > 0 SFT order (replicates of a method that samples nothing, the same k=0 weights)",
             "k0_training": "k=0 training (one recipe trained twice: other weights)"}
    rows = []
    for kind, c in des["components"].items():
        for p in c["pairs"]:
            rows.append([names[kind], " vs ".join(f"`{a}`" for a in p["arms"]), p["k"], p["n"],
                         f"{100 * p['delta']:+.0f}", f"{p['gained'] + p['lost']} ({100 * p['discordant']:.0f}%)",
                         f"{p['mcnemar_p']:.2g}"])
        if not c["pairs"]:
            rows.append([names[kind], "none committed", "-", "-", "-", "-", "-"])
    sds = ", ".join(f"{kind} {100 * math.sqrt(c['var']):.1f}" if c["var"] is not None else f"{kind} not measured"
                    for kind, c in des["components"].items())
    parts = ["## The design's power", "",
             "Variance components from the committed runs (success over every evaluated split; two evaluations paired "
             "over the same tasks: difference in points, tasks they disagree on, exact McNemar p):", "",
             md_table(["source", "pair", "k", "n", "difference (pts)", "discordant tasks", "McNemar p"], rows), "",
             f"Between-run standard deviation of one arm's success rate (points), from these pairs as "
             f"sqrt((mean d^2 - mean per-task variance / n) / 2), floored at 0: {sds}.", ""]
    eff = des.get("minimal_effect")
    if not eff:
        return parts + ["The preset names no `minimal_effect`: no claim's power is stated.", ""]
    claim_rows = []
    claims = [r for r in results.get("claims") or [] if not r.get("status")]
    with_all = {claim_name(r) for r in claims if r["split"] == "all"}
    for r in claims:  # one row per claim: its splits pooled where it has several
        p = r.get("power") or {}
        if r["split"] != "all" and claim_name(r) in with_all:
            continue
        claim_rows.append([claim_name(r), " + ".join(p["sources"]),
                           f"{100 * p['sd_components']:.1f}" if p.get("sd_components") else "-",
                           f"{100 * p['sd_spread']:.1f}" if p.get("sd_spread") else "-",
                           p["runs"], f"{100 * p['power']:.0f}%" if p.get("power") is not None else "-",
                           p.get("runs_needed") or ("> 200" if p.get("sd") else "-"),
                           p.get("runs_needed_many_tasks") or "-"])
    planned = des.get("runs")
    return parts + [
        f"Each claim's power to detect {100 * eff:+.0f} points (the preset's `minimal_effect`) with a two-sided "
        "t-test over per-run differences at 95%, from the noncentral t (flywheel.core.quality.t_power). The "
        "standard deviation of one run's difference is sqrt(s_new^2 + s_ref^2 + v / n): each side's between-run "
        "variance from the component that moves it (`sources`: rollouts for a run that samples rollouts, k=0 "
        "training for a k=0 not shared with the other side, evaluation for the rest) plus the task sample's part "
        "(v, the per-task variance of the claim's paired differences, over n tasks); where the claim pools runs, "
        "the spread of its per-run differences is a second estimate, and the larger is used. `runs for 80%`: runs "
        "per arm, each paired with its own control; `with many tasks`: the same with n unbounded (more tasks do "
        "not stand in for runs)." + (f" The preset plans {planned} run(s) per arm." if planned else ""), "",
        md_table(["claim (all splits)", "sources", "sd of a run's difference, components (pts)",
             "sd, spread of its runs (pts)", "runs", "power", "runs for 80%", "with many tasks"], claim_rows), ""]


def render_reproducibility(results: dict[str, Any]) -> list[str]:
    """The arms whose recorded code commit is not in the repository's history: they cannot be rerun from it."""
    bad = {a: r["reproducible"]["missing_commits"] for a, r in results["arms"].items()
           if (r.get("reproducible") or {}).get("missing_commits")}
    if not bad:
        return []
    return ["**Not reproducible from history:** " + "; ".join(
        f"`{a}` ran at commit(s) {', '.join(c[:12] for c in cs)}, not in this repository's history" for a, cs in bad.items())
        + ". Their results stand as measured; rerunning them needs that code, which the repository does not hold.", ""]


def _err(r: dict[str, Any], side: str) -> float:
    """Error-bar length in points (never negative: Wilson bounds can sit a rounding error off the rate)."""
    gap = r["rate"] - r["ci_low"] if side == "low" else r["ci_high"] - r["rate"]
    return max(0.0, 100 * gap)


def _finish(plt, fig, ax, path: Path, ylabel: str, title: str, iterations: int) -> str:
    """Label (x is the iteration k, integer ticks 0..K), save and close one plot; returns its file name."""
    ax.set_xticks(range(iterations + 1))
    ax.set_xlim(-0.5, iterations + 0.5)
    ax.set_xlabel("iteration k")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, never over the points
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def render_plots(results: dict[str, Any], out: Path) -> list[str]:
    """success_by_k, gate_by_k and rollout_pass_by_k, each written only when it has a point to show (an old
    file of a plot with nothing to show is removed); titles name the experiment, labels give n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, K = results["preset"], results["iterations"]
    arms = {a: r for a, r in results["arms"].items() if r.get("status") != "not run"}
    success = [(f"{arm} {s}", [(r["k"], r["splits"][s]) for r in res["per_k"] if s in r["splits"]])
               for arm, res in arms.items() for s in res["splits"]]
    gates = [(arm, [(r["k"], r["gate"]) for r in res["per_k"] if r.get("gate")]) for arm, res in arms.items()]
    rollouts = [(arm, [(r["k"], r["rollouts"]["pass_rate"]) for r in res["per_k"] if r.get("rollouts")])
                for arm, res in arms.items()]
    plots = dict(zip(PLOTS, ([x for x in success if x[1]], [x for x in gates if x[1]], [x for x in rollouts if x[1]]),
                     strict=True))
    written = []
    for file, series in plots.items():
        if not series:
            (out / file).unlink(missing_ok=True)
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(series)
        for i, (label, points) in enumerate(series):
            ks = [k for k, _ in points]
            if file == "gate_by_k.png":
                ns = "/".join(str(g["candidates"]) for _, g in points)
                ax.plot(ks, [g["gated_total"] for _, g in points], "o-", label=f"{label} gated total")
                ax.plot(ks, [g["new_unique_successes"] for _, g in points], "s--",
                        label=f"{label} new unique successes (of n={ns} candidates)")
                ax.plot(ks, [g["distinct_tasks"] for _, g in points], "^:", label=f"{label} gated tasks")
                continue
            xs = [k - 0.4 + width * (i + 0.5) for k in ks]  # arms side by side at each k
            ns = "/".join(str(r["n"]) for _, r in points)
            ax.errorbar(xs, [100 * r["rate"] for _, r in points], yerr=[[_err(r, "low") for _, r in points],
                        [_err(r, "high") for _, r in points]], fmt="o-", capsize=4, label=f"{label} (n={ns})")
        ylabel, title = {"success_by_k.png": ("success % (95% Wilson CI)", "success by iteration"),
                         "gate_by_k.png": ("trajectories / tasks", "reward gate by iteration"),
                         "rollout_pass_by_k.png": ("successful rollouts % (95% CI)", "training rollouts that pass the reward")}[file]
        written.append(_finish(plt, fig, ax, out / file, ylabel, f"{name}: {title}", K))
    return written


def write_report(preset: Preset, *, runs: Path, results: Path, keep_committed: bool = False) -> dict[str, Any]:
    """Rebuild every local arm's committed results (arms/ARM.json), then results.json, report.md and the PNG
    plots from all arms, local or committed (never writes a store). `keep_committed` (`--report-only`): an arm
    file already there is never rewritten (only a local arm without one gets its file)."""
    results.mkdir(parents=True, exist_ok=True)
    data = collect_results(preset, runs, results)
    records, local = data.pop("_records"), data.pop("_local")
    for arm in local:
        if keep_committed and arm_file(results, arm).exists():
            log.info("arm %s: kept its committed %s (a report never rewrites it; running the arm does)",
                     arm, arm_file(results, arm))
            continue
        write_arm(results, arm, {k: v for k, v in records[arm].items() if k != "origin"})
    data["runs_dir"] = str(runs)
    (results / "results.json").write_text(json.dumps(data, indent=2, default=str))
    data["plots"] = render_plots(data, results)
    (results / "report.md").write_text(render_markdown(data, preset) + "\n")
    return data


def render_committed(preset: Preset, results: Path) -> str:
    """report.md as `write_report` wrote it, from the committed results.json and plots in `results` alone
    (no store): each committed report is a rendering of its results, and a test checks that it still is."""
    data = json.loads((results / "results.json").read_text())
    data["plots"] = [p for p in PLOTS if (results / p).exists()]
    return render_markdown(data, preset) + "\n"


def _promotion(row: dict[str, Any]) -> str:
    """One k's promotion decision: "promoted (12/50 vs 11/50, +2.0 pts, lower bound -6.0)", or rejected and which
    checkpoint the loop went on from; "-" where the gate did not decide on validation tasks (k=0, gate off)."""
    p = row.get("promotion")
    if not p:
        return "-"
    numbers = f"{promotion_counts(p)}, {100 * p['delta']:+.1f} pts, lower bound {100 * p['ci_low']:+.1f}"
    return f"promoted ({numbers})" if p["promoted"] else f"**rejected** ({numbers}): k={p['kept_k']} goes on"


def render_promoted(res: dict[str, Any]) -> str:
    """Which checkpoint the arm's loop holds after its last k, and the ones the promotion gate rejected."""
    decided = [r for r in res["per_k"] if r.get("promotion")]
    last = decided[-1]["promotion"]
    held = decided[-1]["k"] if last["promoted"] else last["kept_k"]
    rejected = [r["k"] for r in decided if not r["promotion"]["promoted"]]
    return (f"**Promoted checkpoint:** k={held} (the promotion gate: one-sided {1 - last['alpha']:.0%} lower bound of "
            f"the paired validation difference above -{100 * last['margin']:g} points); rejected: "
            f"{', '.join(f'k={k}' for k in rejected) or 'none'}.")


def _cleaned(cleaning: dict[str, int] | None) -> str:
    """A gate's admitted steps before and after cleaning (loop.clean_successes), with the verified cuts."""
    if not cleaning:
        return "-"
    return f"{cleaning['steps_before']} -> {cleaning['steps_after']} ({cleaning['cut']} cut)"
