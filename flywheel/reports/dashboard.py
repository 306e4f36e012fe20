"""The flywheel dashboard of one benchmark: a row per iteration k and a chart, from the store.

Plain code (no Dagster), reading the store only: `flywheel.assets.summary.flywheel_summary` shows it in the UI
and `python -m flywheel.cli report` prints the same rows (`report_table`; `all_benchmarks_table`, every benchmark
side by side, for `report --all-benchmarks`).
Per k: success on each evaluation split in percent with its 95% Wilson interval and successes/n (n =
episodes, errored ones excluded, as in `evaluations`; nothing over 0 episodes), average reward and prompt
tokens per step per split, what the reward gate saw, admitted and decided, the gated total, the checkpoint's
train loss and steps, and the loop's decision.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flywheel.core.metrics import markdown_table, md_table, promotion_counts, result_columns
from flywheel.core.quality import wilson_interval
from flywheel.core.store import Store

SPLIT_ORDER = ("seen", "unseen")


def _splits(evals: list[dict[str, Any]]) -> list[str]:
    present = {r["split"] for r in evals}
    return [s for s in SPLIT_ORDER if s in present] + sorted(present - set(SPLIT_ORDER))


def _lineage(ck: dict[str, Any] | None) -> dict[str, Any]:
    raw = (ck or {}).get("lineage") or {}
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def gate_verdict(gate: dict[str, Any] | None, check: dict[str, Any] | None) -> str | None:
    """What gate k decided, in words: "passed", "empty (admitted 0 of N)", or the check's first problem."""
    if gate is None:
        return None
    if not int(gate["new_unique_successes"] or 0):
        return f"empty: admitted 0 of {int(gate['candidates'] or 0)} rollouts"
    if check is None:
        return "not checked"
    return "passed" if check["passed"] else f"failed: {check['first_problem']}"


def promotion_cell(decision: dict[str, Any] | None, ckpts: dict[int, dict[str, Any]]) -> str | None:
    """The promotion gate's decision on checkpoint k, in words: "promoted", "promoted (3/50 vs 2/50)", or
    "rejected (0/50 vs 2/50): k=0 kept"."""
    if decision is None:
        return None
    if decision["validation_n"] is None:  # k=0, or the gate off
        return "promoted"
    numbers = promotion_counts(decision)
    if decision["promoted"]:
        return f"promoted ({numbers})"
    kept = next((k for k, c in ckpts.items() if c["checkpoint_id"] == decision["promoted_id"]), "?")
    return f"rejected ({numbers}): k={kept} kept"


def summary_rows(db: Store, benchmark: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, splits): one row per iteration that has an evaluation, a checkpoint or a gate. Rates are fractions
    here (the chart's); `table_rows` shows them in percent."""
    evals = db.evaluation_rows(benchmark)
    splits = _splits(evals)
    gates = {r["iteration"]: r for r in db.gated_growth(benchmark)}
    checks = db.gate_check_rows(benchmark)
    ckpts = {r["iteration"]: r for r in db.checkpoint_rows(benchmark)}
    decisions = {r["iteration"]: r for r in db.iterations(benchmark).iter_rows(named=True)}
    promotions = {r["iteration"]: r for r in db.promotions(benchmark)}
    ks = sorted({r["iteration"] for r in evals} | set(gates) | set(ckpts))
    rows = []
    for k in ks:
        row: dict[str, Any] = {"k": k}
        by_split = {r["split"]: r for r in evals if r["iteration"] == k}
        for s in splits:
            ev = by_split.get(s)
            n = int(ev["episodes"] or 0) if ev else 0
            if not n:  # nothing measured: NULL, not 0
                row.update({f"{s}_success": None, f"{s}_ci_low": None, f"{s}_ci_high": None, f"{s}_n": n if ev else None,
                            f"{s}_successes": None, f"{s}_avg_reward": None, f"{s}_prompt_tokens_per_step": None})
                continue
            wins = round(float(ev["success_rate"] or 0.0) * n)
            low, high = wilson_interval(wins, n)
            row.update({f"{s}_success": wins / n, f"{s}_ci_low": low, f"{s}_ci_high": high, f"{s}_n": n,
                        f"{s}_successes": wins, f"{s}_avg_reward": _float(ev["avg_reward"]),
                        f"{s}_prompt_tokens_per_step": _float(ev["prompt_tokens_per_step"])})
        first = next((by_split[s] for s in splits if s in by_split), None)
        row["tokens_per_step"] = _float(first["tokens_per_step"]) if first else None
        gate = gates.get(k)
        row["gate_candidates"] = int(gate["candidates"] or 0) if gate else None
        row["new_unique_successes"] = int(gate["new_unique_successes"] or 0) if gate else None
        row["gated_total"] = int(gate["gated_total"] or 0) if gate else None
        row["gate_verdict"] = gate_verdict(gate, checks.get(k))
        ck = ckpts.get(k)
        row["train_loss"] = _float(ck["train_loss"]) if ck else None
        row["train_steps"] = _lineage(ck).get("train_steps") if ck else None
        row["checkpoint_id"] = ck["checkpoint_id"] if ck else None
        row["decision"] = (decisions.get(k) or {}).get("decision")
        row["promotion"] = promotion_cell(promotions.get(k), ckpts)
        rows.append(row)
    return rows, splits


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def success_cell(rate: float | None, n: int | None) -> str:
    """"50.0 [23.7, 76.3] (5/10)": success % with its 95% Wilson interval and (successes/n); "-" for no episode."""
    n = int(n or 0)
    if not n:
        return "- (0/0)"
    wins = round((rate or 0.0) * n)
    lo, hi = wilson_interval(wins, n)
    return f"{100 * wins / n:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] ({wins}/{n})"


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def table_rows(rows: list[dict[str, Any]], splits: list[str]) -> list[dict[str, Any]]:
    """The dashboard's rows as a person reads them: success in percent with its 95% Wilson interval and
    successes/n, what the gate saw, admitted and decided, the train loss and steps (columns: `columns`)."""
    out = []
    for r in rows:
        row: dict[str, Any] = {"k": r["k"]}
        for s in splits:
            n = r.get(f"{s}_n")
            measured = bool(n)
            row[f"{s}_success_pct"] = _pct(r[f"{s}_success"]) if measured else None
            row[f"{s}_ci95_pct"] = (f"[{100 * r[f'{s}_ci_low']:.1f}, {100 * r[f'{s}_ci_high']:.1f}]"
                                    if measured else None)
            row[f"{s}_successes_n"] = f"{r[f'{s}_successes']}/{n}" if measured else None
        row.update({key: r[key] for key in ("gate_candidates", "new_unique_successes", "gated_total", "gate_verdict",
                                            "train_loss", "train_steps", "checkpoint_id", "promotion", "decision")})
        out.append(row)
    return out


def columns(splits: list[str]) -> list[str]:
    cols = ["k"]
    for s in splits:
        cols += [f"{s}_success_pct", f"{s}_ci95_pct", f"{s}_successes_n"]
    return cols + ["gate_candidates", "new_unique_successes", "gated_total", "gate_verdict", "train_loss",
                   "train_steps", "checkpoint_id", "promotion", "decision"]


def report_table(db: Store, benchmark: str) -> str:
    """`report`'s table: the dashboard's row per iteration, success on each split as % [95% CI] (successes/n),
    average reward and prompt tokens per step per split, then the gate and the training."""
    rows, splits = summary_rows(db, benchmark)
    splits = splits or ["seen", "unseen"]
    out = []
    for r in rows:
        row: dict[str, Any] = {"checkpoint": f"k={r['k']}"}
        for s in splits:
            row[f"{s} success % [95% CI] (s/n)"] = success_cell(r.get(f"{s}_success"), r.get(f"{s}_n"))
            row[f"{s} reward"] = _round(r.get(f"{s}_avg_reward"), 4)
            row[f"{s} prompt tok/step"] = _round(r.get(f"{s}_prompt_tokens_per_step"), 1)
        gate = r["gate_candidates"]
        row["gate admitted/candidates"] = "-" if gate is None else f"{r['new_unique_successes']}/{gate}"
        row["gate verdict"] = r["gate_verdict"] or "-"
        row["train loss"] = _round(r["train_loss"], 4)
        row["train steps"] = "-" if r["train_steps"] is None else r["train_steps"]
        row["promotion"] = r["promotion"] or "-"
        out.append(row)
    cols = (["checkpoint"] + [f"{s} {what}" for s in splits for what in ("success % [95% CI] (s/n)", "reward",
                                                                         "prompt tok/step")]
            + ["gate admitted/candidates", "gate verdict", "train loss", "train steps", "promotion"])
    return markdown_table(out, cols)


def _round(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def key_metrics(rows: list[dict[str, Any]], splits: list[str]) -> dict[str, float]:
    """A few floats for Dagster's own metadata plots, in percent: the latest evaluated k's success per split and
    the best so far, and the gate's running total. A split with no episode gets no entry (not a 0)."""
    out: dict[str, float] = {}
    evaluated = [r for r in rows if any(r.get(f"{s}_n") for s in splits)]
    if evaluated:
        last = evaluated[-1]
        out["latest_iteration"] = float(last["k"])
        for s in splits:
            if last.get(f"{s}_n"):
                out[f"latest_{s}_success_pct"] = _pct(last[f"{s}_success"])
                out[f"best_{s}_success_pct"] = max(_pct(r[f"{s}_success"]) for r in evaluated if r.get(f"{s}_n"))
    gated = [r for r in rows if r.get("gated_total") is not None]
    if gated:
        out["gated_total"] = float(gated[-1]["gated_total"])
    return out


def render_chart(rows: list[dict[str, Any]], splits: list[str], out: Path, *, title: str) -> Path:
    """Success by iteration (95% Wilson intervals as error bars) and the gated dataset's growth; a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for i, s in enumerate(splits):
        pts = [r for r in rows if r.get(f"{s}_n")]
        xs = [r["k"] + (i - (len(splits) - 1) / 2) * 0.08 for r in pts]
        ys = [100 * r[f"{s}_success"] for r in pts]
        lo = [max(0.0, 100 * (r[f"{s}_success"] - r[f"{s}_ci_low"])) for r in pts]
        hi = [max(0.0, 100 * (r[f"{s}_ci_high"] - r[f"{s}_success"])) for r in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", capsize=4, label=f"{s} (n={pts[-1][f'{s}_n'] if pts else 0})")
    ks = [r["k"] for r in rows]
    ax.set_xticks(ks or [0])
    ax.set_ylim(-3, 103)
    ax.set_xlabel("iteration k")
    ax.set_ylabel("success % (95% Wilson CI)")
    ax.set_title(f"{title}: success by iteration", fontsize=10)
    if splits:
        ax.legend(fontsize=8)
    gated = [r for r in rows if r.get("gated_total") is not None]
    ax2.bar([r["k"] for r in gated], [r["gated_total"] for r in gated], color="#9ecae1", label="gated total")
    ax2.plot([r["k"] for r in gated], [r["new_unique_successes"] for r in gated], "o-", color="#08519c",
             label="new unique successes")
    ax2.set_xticks(ks or [0])
    ax2.set_ylim(0, max([1] + [r["gated_total"] for r in gated]) * 1.15)  # an empty gate: a flat 0, not a bare axis
    ax2.set_xlabel("iteration k")
    ax2.set_ylabel("trajectories")
    ax2.set_title("reward gate", fontsize=10)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    tmp = out.with_name(out.name + ".partial.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out


def all_benchmarks_table(store: Store, *, iteration: int | None = None, metric: str = "success_rate") -> str:
    """Paper Table 1 layout: a column per evaluation split of every registered benchmark (in name
    order, titled by the specs: `flywheel.core.metrics.result_columns`), then their average.

    One row per iteration k (or only `iteration`), in percent. A benchmark with one test set has
    one column. A benchmark not yet evaluated at k shows "-" and is left out of the average,
    which then says how many columns it covers.
    """
    if metric not in {"success_rate", "avg_reward"}:
        raise ValueError("metric must be success_rate or avg_reward")
    values = store.evaluation_values(metric)
    iterations = sorted({k for (_, _, k) in values}) if iteration is None else [iteration]
    columns = result_columns()
    header = ["k"] + [c.title for c in columns] + ["average"]
    rows = []
    for k in iterations:
        cells = [values.get((c.benchmark, c.split, k)) for c in columns]
        have = [c for c in cells if c is not None]
        avg = f"{100 * sum(have) / len(have):.1f}" + ("" if len(have) == len(cells) else f" ({len(have)}/{len(cells)} cols)") if have else "-"
        rows.append([str(k)] + [f"{100 * c:.1f}" if c is not None else "-" for c in cells] + [avg])
    return md_table(header, rows)
