"""The flywheel dashboard of one benchmark: a row per iteration k and a chart, from the store.

Plain code (no Dagster): `flywheel.assets.summary.flywheel_summary` shows it in the UI;
the rows are what `python -m flywheel.cli report` would need too. Per k:
success on each evaluation split with its 95% Wilson interval (n = episodes, errored ones
excluded, as in `evaluations`), average reward, tokens per step, what the reward gate added
(new unique successes) and holds in total, and the checkpoint's train loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.core.quality import wilson_interval
from flywheel.core.store import Store

SPLIT_ORDER = ("seen", "unseen")


def _splits(evals: list[dict[str, Any]]) -> list[str]:
    present = {r["split"] for r in evals}
    return [s for s in SPLIT_ORDER if s in present] + sorted(present - set(SPLIT_ORDER))


def summary_rows(db: Store, benchmark: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, splits): one row per iteration that has an evaluation, a checkpoint or a gate."""
    evals = db.evaluation_rows(benchmark)
    splits = _splits(evals)
    gates = {r["iteration"]: r for r in db.gated_growth(benchmark)}
    ckpts = {r["iteration"]: r for r in db.checkpoint_rows(benchmark)}
    ks = sorted({r["iteration"] for r in evals} | set(gates) | set(ckpts))
    rows = []
    for k in ks:
        row: dict[str, Any] = {"k": k}
        by_split = {r["split"]: r for r in evals if r["iteration"] == k}
        for s in splits:
            ev = by_split.get(s)
            if ev is None:
                row.update({f"{s}_success": None, f"{s}_ci_low": None, f"{s}_ci_high": None, f"{s}_n": None,
                            f"{s}_avg_reward": None})
                continue
            n = int(ev["episodes"] or 0)
            wins = round(float(ev["success_rate"] or 0.0) * n)
            low, high = wilson_interval(wins, n)
            row.update({f"{s}_success": wins / n if n else 0.0, f"{s}_ci_low": low, f"{s}_ci_high": high,
                        f"{s}_n": n, f"{s}_avg_reward": float(ev["avg_reward"] or 0.0)})
        first = next((by_split[s] for s in splits if s in by_split), None)
        row["tokens_per_step"] = float(first["tokens_per_step"]) if first and first["tokens_per_step"] is not None else None
        gate = gates.get(k)
        row["new_unique_successes"] = int(gate["new_unique_successes"]) if gate else None
        row["gated_total"] = int(gate["gated_total"]) if gate else None
        ck = ckpts.get(k)
        row["train_loss"] = float(ck["train_loss"]) if ck and ck["train_loss"] is not None else None
        row["checkpoint_id"] = ck["checkpoint_id"] if ck else None
        rows.append(row)
    return rows, splits


def columns(splits: list[str]) -> list[str]:
    cols = ["k"]
    for s in splits:
        cols += [f"{s}_success", f"{s}_ci_low", f"{s}_ci_high", f"{s}_n", f"{s}_avg_reward"]
    return cols + ["tokens_per_step", "new_unique_successes", "gated_total", "train_loss", "checkpoint_id"]


def key_metrics(rows: list[dict[str, Any]], splits: list[str]) -> dict[str, float]:
    """A few floats for Dagster's own metadata plots: the latest evaluated k, and the gate."""
    out: dict[str, float] = {}
    evaluated = [r for r in rows if any(r.get(f"{s}_n") for s in splits)]
    if evaluated:
        last = evaluated[-1]
        out["latest_iteration"] = float(last["k"])
        for s in splits:
            if last.get(f"{s}_n"):
                out[f"latest_{s}_success"] = float(last[f"{s}_success"])
                best = max(float(r[f"{s}_success"]) for r in evaluated if r.get(f"{s}_n"))
                out[f"best_{s}_success"] = best
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
