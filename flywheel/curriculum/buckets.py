"""Complexity buckets (easy / medium / hard): edges, assignment and success by bucket.

Edges are upper bounds, inclusive: edges (10, 17) mean easy <= 10 < medium <= 17 < hard.
Evaluation buckets use the gold (expert) path length of each task, with edges from the
benchmark's spec (`eval_bucket_edges`, default `DEFAULT_EVAL_EDGES`). All edges are configurable.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envs.base import BenchmarkSpec

BUCKETS = ("easy", "medium", "hard")
UNKNOWN = "unknown"

# Gold-path length edges for a benchmark whose spec names none.
DEFAULT_EVAL_EDGES: tuple[float, ...] = (5, 10)


@dataclass(frozen=True)
class Buckets:
    """Named buckets by inclusive upper edges; the last bucket is unbounded."""

    edges: tuple[float, ...]
    names: tuple[str, ...] = BUCKETS

    def __post_init__(self) -> None:
        if len(self.names) != len(self.edges) + 1:
            raise ValueError(f"{len(self.names)} bucket names need {len(self.names) - 1} edges, got {list(self.edges)}")
        if list(self.edges) != sorted(self.edges):
            raise ValueError(f"bucket edges must be increasing, got {list(self.edges)}")

    def of(self, value: float | None) -> str:
        if value is None:
            return UNKNOWN
        for name, edge in zip(self.names, self.edges, strict=False):
            if value <= edge:
                return name
        return self.names[-1]

    def rank(self, name: str) -> int:
        return self.names.index(name) if name in self.names else len(self.names)

    def bounds(self, name: str) -> tuple[float | None, float | None]:
        """(exclusive low, inclusive high) of a bucket; None = unbounded."""
        i = self.names.index(name)
        lo = self.edges[i - 1] if i > 0 else None
        hi = self.edges[i] if i < len(self.edges) else None
        return lo, hi

    def describe(self) -> str:
        parts = []
        for name in self.names:
            lo, hi = self.bounds(name)
            if lo is None:
                parts.append(f"{name} <= {hi:g}")
            elif hi is None:
                parts.append(f"{name} > {lo:g}")
            else:
                parts.append(f"{lo:g} < {name} <= {hi:g}")
        return ", ".join(parts)


def eval_buckets(spec: BenchmarkSpec, override: Sequence[float] | None = None) -> Buckets:
    """Evaluation buckets of `spec`'s benchmark: `override` edges if given, else the spec's `eval_bucket_edges`."""
    edges = tuple(override) if override else tuple(getattr(spec, "eval_bucket_edges", DEFAULT_EVAL_EDGES))
    return Buckets(tuple(float(e) for e in edges))


def quantile_buckets(values: Sequence[float], names: tuple[str, ...] = BUCKETS) -> Buckets:
    """Edges at the 1/3 and 2/3 quantiles of `values` (training stages when no edges are given).

    With few distinct values some stages may be empty; edges stay increasing.
    """
    if not values:
        return Buckets(tuple(float(i) for i in range(len(names) - 1)), names)
    data = sorted(values)
    k = len(names)
    edges = []
    for i in range(1, k):
        q = data[min(len(data) - 1, max(0, int(round(i * len(data) / k)) - 1))]
        edges.append(float(max(q, edges[-1]) if edges else q))
    return Buckets(tuple(edges), names)


def success_by_bucket(
    outcomes: Sequence[tuple[float | None, bool]], buckets: Buckets
) -> list[dict[str, Any]]:
    """One row per bucket (plus `unknown` if any task had no gold length): episodes, successes, rate (None over
    no episode)."""
    rows = []
    for name in [*buckets.names, UNKNOWN]:
        hits = [ok for value, ok in outcomes if buckets.of(value) == name]
        if name == UNKNOWN and not hits:
            continue
        lo, hi = buckets.bounds(name) if name != UNKNOWN else (None, None)
        lengths = [v for v, _ in outcomes if buckets.of(v) == name and v is not None]
        rows.append({
            "bucket": name, "lo": lo, "hi": hi, "episodes": len(hits), "successes": int(sum(hits)),
            # A bucket no task fell in measured nothing: None (NULL in `eval_buckets`), not a rate of 0.
            "success_rate": (sum(hits) / len(hits)) if hits else None,
            "mean_gold_length": statistics.fmean(lengths) if lengths else None,
        })
    return rows
