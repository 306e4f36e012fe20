"""Evaluation metrics for a checkpoint on a split, and their tables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import envs
from envs import BenchmarkSpec
from flywheel.core.trajectory import Trajectory

DEFAULT_EVAL_SPLITS = ("seen", "unseen")
# The metrics a spec may name as its `primary_metric`, and what a column adds to the benchmark's
# title for it (success is the unmarked default).
PRIMARY_METRICS = {"success_rate": "", "avg_reward": "avg reward"}


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Success rate etc. Errored episodes (env crashes) are excluded from rates, and counted."""
    done = [t for t in trajs if t.status == "ok"]
    steps = [s for t in done for s in t.steps]
    n_steps = len(steps) or 1
    n = len(done) or 1
    return {
        "episodes": len(done),
        "errored": len(trajs) - len(done),
        "success_rate": sum(t.success for t in done) / n,
        "avg_reward": sum(t.reward for t in done) / n,
        "mean_steps": len(steps) / n,
        "tokens_per_step": sum(s.prompt_tokens + s.completion_tokens for s in steps) / n_steps,
        "prompt_tokens_per_step": sum(s.prompt_tokens for s in steps) / n_steps,
        "invalid_action_rate": sum(s.invalid for s in steps) / n_steps,
    }


def answer_lengths(tokens: Sequence[int], cap: int) -> dict[str, Any]:
    """How long answers are, in tokens, against the generation budget `cap` (`max_new_tokens`): n, median,
    95th percentile, longest, and how many reach the cap (an answer of `cap` tokens or more is cut there, often
    before its action line). Nearest-rank percentiles; all None for no answers."""
    ordered = sorted(int(n) for n in tokens)
    if not ordered:
        return {"n": 0, "median": None, "p95": None, "max": None, "cap": cap, "at_cap": 0}

    def rank(q: float) -> int:
        return ordered[max(0, math.ceil(len(ordered) * q) - 1)]

    return {"n": len(ordered), "median": rank(0.5), "p95": rank(0.95), "max": ordered[-1], "cap": cap,
            "at_cap": sum(n >= cap for n in ordered)}


def pct(x: float | None) -> str:
    """A rate in percent with one decimal (`0.543` -> `54.3`); "-" for none."""
    return "-" if x is None else f"{100 * x:.1f}"


def success_cell(r: dict[str, Any] | None, *, counts: bool = True) -> str:
    """A success rate as every table writes it: percent [95% interval] (successes/n), `54.3 [44.1, 64.2] (57/105)`;
    `counts=False` writes (n=105) instead and "-" where nothing was measured. `r` has n, rate, ci_low, ci_high
    (and successes), as `flywheel.core.quality.rate` returns."""
    if not counts:
        return "-" if not r or not r["n"] else f"{pct(r['rate'])} [{pct(r['ci_low'])}, {pct(r['ci_high'])}] (n={r['n']})"
    return f"{pct(r['rate'])} [{pct(r['ci_low'])}, {pct(r['ci_high'])}] ({r['successes']}/{r['n']})"


def promotion_counts(p: dict[str, Any]) -> str:
    """A promotion decision's validation successes, checkpoint k's then its predecessor's: `3/50 vs 2/50`. `p`
    has successes, predecessor_successes and validation_n, as the store's `promotions` rows do."""
    n = p["validation_n"]
    return f"{p['successes']}/{n} vs {p['predecessor_successes']}/{n}"


def md_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table: a header row, its rule, then one row per list of cells (each written with str)."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """`md_table` over dicts: one column per key in `columns`, floats with three decimals."""
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    return md_table(columns, [[fmt(r.get(c, "")) for c in columns] for r in rows])


def display_name(spec: BenchmarkSpec) -> str:
    """How tables title a benchmark: the spec's `display_name`, else its name."""
    return str(getattr(spec, "display_name", spec.name))


def primary_metric(spec: BenchmarkSpec) -> str:
    """What the paper's main table reports for a benchmark: the spec's `primary_metric`, else success."""
    metric = getattr(spec, "primary_metric", "success_rate")
    if metric not in PRIMARY_METRICS:
        raise ValueError(f"benchmark {spec.name!r} has primary_metric {metric!r}; use one of {', '.join(PRIMARY_METRICS)}")
    return metric


@dataclass(frozen=True)
class ResultColumn:
    """One column of a table across benchmarks (the paper's Table 1): one evaluation split of one benchmark."""

    benchmark: str
    split: str
    title: str  # the display name, followed by the split when the benchmark evaluates more than one
    metric: str  # the benchmark's primary metric


def result_columns() -> list[ResultColumn]:
    """One column per evaluation split of every registered benchmark, benchmarks in name order.

    Built from the specs (`display_name`, `eval_splits`, `primary_metric`), so a new benchmark
    gets its columns by registering; a benchmark with one test set gets one column.
    """
    columns = []
    for name in sorted(envs.REGISTRY):
        spec = envs.get_benchmark(name)
        splits = tuple(getattr(spec, "eval_splits", DEFAULT_EVAL_SPLITS))
        for split in splits:
            title = display_name(spec) + (f" {split}" if len(splits) > 1 else "")
            columns.append(ResultColumn(name, split, title, primary_metric(spec)))
    return columns
