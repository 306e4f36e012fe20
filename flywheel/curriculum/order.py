"""Training order: easy to hard, replacing the default shuffle.

Modes:
- "curriculum": an ordered sampler: every trajectory sorted by complexity score
  (ties in a seeded random order), so complexity never decreases.
- "staged": staged buckets: all easy trajectories (shuffled among themselves), then
  medium, then hard; complexity never decreases from one stage to the next.
- "shuffle": the usual random order (curriculum off, for the ablation).

`CurriculumSampler` yields indices in that order; `order_trajectories` applies it to
trajectories, and the SFT examples built from them keep it (one example per step,
trajectory by trajectory), trained with `TrainConfig(order="given")`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Literal, TypeVar

from flywheel.curriculum.buckets import Buckets, quantile_buckets
from flywheel.curriculum.complexity import Complexity

Mode = Literal["curriculum", "staged", "shuffle"]
MODES = ("curriculum", "staged", "shuffle")
T = TypeVar("T")


class CurriculumSampler:
    """Index sampler over items with complexity scores and buckets (see module doc).

    Iterating yields every index once. `stages()` gives the same order split into
    stages (one per bucket in "staged" mode, one stage otherwise).
    """

    def __init__(self, scores: Sequence[float], buckets: Sequence[str], bucket_names: Sequence[str],
                 mode: Mode = "curriculum", seed: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"Unknown curriculum order {mode!r}; use one of {', '.join(MODES)}")
        if len(scores) != len(buckets):
            raise ValueError("scores and buckets must have the same length")
        self.scores, self.buckets, self.names = list(scores), list(buckets), list(bucket_names)
        self.mode, self.seed = mode, seed

    def __len__(self) -> int:
        return len(self.scores)

    def _rank(self, bucket: str) -> int:
        return self.names.index(bucket) if bucket in self.names else len(self.names)

    def stages(self) -> list[list[int]]:
        rng = random.Random(self.seed)
        idx = list(range(len(self.scores)))
        rng.shuffle(idx)  # the tie order (and the whole order when shuffling)
        if self.mode == "shuffle":
            return [idx]
        if self.mode == "curriculum":
            return [sorted(idx, key=lambda i: self.scores[i])]  # stable: ties keep the seeded order
        groups: dict[int, list[int]] = {}
        for i in idx:
            groups.setdefault(self._rank(self.buckets[i]), []).append(i)
        return [groups[r] for r in sorted(groups)]

    def __iter__(self) -> Iterator[int]:
        for stage in self.stages():
            yield from stage


def assign_buckets(scored: Sequence[Complexity], edges: Sequence[float] | None = None) -> tuple[list[Complexity], Buckets]:
    """Bucket every trajectory by score: the given edges, else terciles of the scores."""
    buckets = Buckets(tuple(float(e) for e in edges)) if edges else quantile_buckets([c.score for c in scored])
    return [replace(c, bucket=buckets.of(c.score)) for c in scored], buckets


def order_trajectories(items: Sequence[T], scored: Sequence[Complexity], buckets: Buckets,
                       mode: Mode = "curriculum", seed: int = 0) -> tuple[list[T], list[Complexity]]:
    """`items` (parallel to `scored`) in training order, with their complexity rows in the same order."""
    if len(items) != len(scored):
        raise ValueError("items and scores must be parallel")
    sampler = CurriculumSampler([c.score for c in scored], [c.bucket for c in scored], buckets.names, mode, seed)
    order = list(sampler)
    return [items[i] for i in order], [scored[i] for i in order]


def grade(items: Sequence[T], scored: Sequence[Complexity], *, edges: Sequence[float] | None = None,
          mode: Mode = "curriculum", seed: int = 0) -> tuple[list[T], list[Complexity], Buckets]:
    """Bucket, then order: the whole curriculum step in one call."""
    bucketed, buckets = assign_buckets(scored, edges)
    ordered_items, ordered = order_trajectories(items, bucketed, buckets, mode, seed)
    return ordered_items, ordered, buckets
