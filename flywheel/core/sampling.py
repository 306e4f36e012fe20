"""Adaptive sampling budget for rollouts, and the per-task cap of gated successes.

Hard tasks get more attempts: a task the policy rarely solved in earlier iterations gets
more rollouts, one it always solved gets fewer, and the total stays fixed (so an
iteration costs the same). Weights are the posterior failure probability under a Beta
prior, `1 - (successes + a) / (attempts + a + b)`; a task never tried has weight 0.5 with
the default prior, so iteration 0 (no history) is exactly uniform.

`teaching_weights` (the default rule, `loop.sampling_rule`) spends attempts where they teach instead:
a task sometimes solved gets the most, one always solved the fewest, one never solved the uniform
share at most (a bounded budget: its attempts rarely pay off).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def failure_weight(attempts: int, successes: int, prior: tuple[float, float] = (1.0, 1.0)) -> float:
    a, b = prior
    return 1.0 - (successes + a) / (attempts + a + b)


def allocate_attempts(
    task_ids: Sequence[str],
    history: Mapping[str, tuple[int, int]],
    total: int,
    *,
    min_per_task: int = 1,
    max_per_task: int | None = None,
    prior: tuple[float, float] = (1.0, 1.0),
    weights: Mapping[str, float] | None = None,
    caps: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Split `total` attempts over `task_ids`, more to the tasks `history` says are rarely solved.

    `history[task_id] = (attempts, successes)` from earlier iterations (missing = never tried).
    Every task gets at least `min_per_task` and at most `max_per_task`; the rest goes by weight,
    rounded by largest remainder (ties by task order), so the sum is exactly `total` unless the
    caps make that impossible (then it is the sum of the caps). `weights` replaces the failure weights;
    `caps` bounds single tasks below `max_per_task`. Deterministic.
    """
    ids = list(dict.fromkeys(task_ids))
    if not ids:
        return {}
    if min_per_task < 0 or total < 0:
        raise ValueError("total and min_per_task must be >= 0")
    if max_per_task is not None and max_per_task < min_per_task:
        raise ValueError(f"max_per_task ({max_per_task}) < min_per_task ({min_per_task})")
    if total < min_per_task * len(ids):
        raise ValueError(f"total {total} cannot give {len(ids)} tasks {min_per_task} attempt(s) each")
    top = max_per_task if max_per_task is not None else total
    cap = {t: max(min_per_task, min(top, (caps or {}).get(t, top))) for t in ids}
    total = min(total, sum(cap.values()))
    alloc = {t: min_per_task for t in ids}
    weights = dict(weights) if weights is not None else \
        {t: failure_weight(*history.get(t, (0, 0)), prior=prior) for t in ids}
    remaining = total - sum(alloc.values())
    while remaining > 0:
        open_ids = [t for t in ids if alloc[t] < cap[t]]
        w_sum = sum(weights[t] for t in open_ids)
        if w_sum <= 0:  # all open tasks are certain successes under the prior: spread evenly
            shares = {t: remaining / len(open_ids) for t in open_ids}
        else:
            shares = {t: remaining * weights[t] / w_sum for t in open_ids}
        # Give floors, clipped at the cap; then hand out the leftovers by largest remainder.
        given = 0
        for t in open_ids:
            add = min(math.floor(shares[t]), cap[t] - alloc[t])
            alloc[t] += add
            given += add
        left = remaining - given
        order = sorted(
            (t for t in open_ids if alloc[t] < cap[t]),
            key=lambda t: (-(shares[t] - math.floor(shares[t])), -weights[t], ids.index(t)),
        )
        for t in order[:left]:
            alloc[t] += 1
            given += 1
        remaining -= given
        if given == 0:  # every task is at its cap
            break
    return alloc


# The teaching rule's weights: a task never tried weighs as one never solved (both 1: iteration 0 is uniform).
SOMETIMES_SOLVED, ALWAYS_SOLVED, NEVER_SOLVED = 2.0, 0.25, 1.0


def teaching_weights(task_ids: Sequence[str], history: Mapping[str, tuple[int, int]],
                     per_task: int) -> tuple[dict[str, float], dict[str, int]]:
    """(weights, caps) for `allocate_attempts` under the teaching rule: tasks sometimes solved weigh
    SOMETIMES_SOLVED, always solved ALWAYS_SOLVED, never solved (or never tried) NEVER_SOLVED and get
    at most `per_task` attempts (the uniform share)."""
    weights, caps = {}, {}
    for t in task_ids:
        attempts, successes = history.get(t, (0, 0))
        if successes <= 0:
            weights[t], caps[t] = NEVER_SOLVED, per_task
        else:
            weights[t] = ALWAYS_SOLVED if successes >= attempts else SOMETIMES_SOLVED
    return weights, caps


def history_from_rows(
    rows: Iterable[Mapping[str, object]], *, before_iteration: int, decay: float = 1.0
) -> dict[str, tuple[int, int]]:
    """Aggregate task_stats rows of iterations < `before_iteration` into (attempts, successes).

    Errored episodes are not attempts. `decay` < 1 discounts older iterations (weight
    decay ** age, age 0 = the latest); counts are rounded to ints.
    """
    acc: dict[str, list[float]] = {}
    for r in rows:
        it = int(r["iteration"])  # type: ignore[arg-type]
        if it >= before_iteration:
            continue
        w = decay ** (before_iteration - 1 - it)
        a = int(r["attempts"]) - int(r.get("errored", 0) or 0)  # type: ignore[arg-type]
        s = int(r["successes"])  # type: ignore[arg-type]
        cur = acc.setdefault(str(r["task_id"]), [0.0, 0.0])
        cur[0] += w * max(a, 0)
        cur[1] += w * s
    return {t: (round(a), round(s)) for t, (a, s) in acc.items()}


def jobs_from_allocation(tasks: Sequence[T], allocation: Mapping[str, int], *, key=lambda t: t.task_id) -> list[tuple[T, int]]:
    """(task, sample) pairs, samples numbered 0..n-1 per task, in task order."""
    return [(t, s) for t in tasks for s in range(allocation.get(key(t), 0))]


def cap_per_task(candidates: Sequence[T], existing: Mapping[str, int], cap: int | None, *, key=lambda t: t.task_id) -> tuple[list[T], int]:
    """Keep candidates in order while a task has fewer than `cap` kept (counting `existing`).

    Returns (kept, dropped count). `cap=None` keeps everything.
    """
    if cap is None:
        return list(candidates), 0
    counts = dict(existing)
    kept: list[T] = []
    for c in candidates:
        k = key(c)
        if counts.get(k, 0) >= cap:
            continue
        counts[k] = counts.get(k, 0) + 1
        kept.append(c)
    return kept, len(candidates) - len(kept)


def task_stats_rows(trajectory_rows: Iterable[Mapping[str, object]], task_ids: Sequence[str]) -> list[dict[str, object]]:
    """Per task: attempts (episodes played, errored included), successes, errored."""
    stats = {t: {"task_id": t, "attempts": 0, "successes": 0, "errored": 0} for t in task_ids}
    for r in trajectory_rows:
        row = stats.setdefault(str(r["task_id"]), {"task_id": str(r["task_id"]), "attempts": 0, "successes": 0, "errored": 0})
        row["attempts"] += 1  # type: ignore[operator]
        if r["status"] != "ok":
            row["errored"] += 1  # type: ignore[operator]
        elif r["success"]:
            row["successes"] += 1  # type: ignore[operator]
    return list(stats.values())
