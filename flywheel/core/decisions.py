"""The living flywheel's decision: after iteration k, start k+1 or stop, and why.

Plain code (no Dagster): `flywheel.sensors` gathers the facts of each finished iteration
(from the Dagster instance and the store), calls `decide`, records the decision in the
store's `iterations` table and, on "continue", requests iteration k+1.

Rules, in order, for the latest finished iteration k:
1. the gate check failed (empty or malformed gated dataset) -> stop;
2. k == K (the iteration budget)                              -> stop;
3. the gated dataset stopped growing: fewer than `min_new_successes` new unique
   successes in each of the last `patience` iterations        -> stop;
4. seen-split success stopped improving: the best of the last `patience` iterations is
   not above the best before them by more than `min_improvement` -> stop;
5. otherwise continue with k+1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from flywheel.core.options import Bound, check_bounds, option

Action = Literal["continue", "stop"]


@dataclass(frozen=True)
class StopRules:
    """When the loop stops: at K, or when the gated set or seen success stop growing (not the LLM policy)."""

    # K, declared once: the loop resource mirrors it, profiles and presets check their `iterations` against it.
    iterations: int = option(help="K: the loop runs iterations 0..K per benchmark",
                             bound=Bound(0, 1_000, why="K: iterations 0..K"))
    patience: int = option(2, help="iterations in a row without progress before the loop stops",
                           bound=Bound(1, 1_000))
    min_new_successes: int = option(1, help="an iteration that gates fewer new successes made no progress",
                                    bound=Bound(0, 1_000_000))
    min_improvement: float = option(0.0, help="seen-split success must improve by more than this to count as "
                                              "progress", bound=Bound(0, 1, integer=False, why="a success rate"))

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class IterationFacts:
    iteration: int
    gate_check_passed: bool
    new_unique_successes: int
    gated_total: int
    seen_success: float | None = None
    unseen_success: float | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    next_iteration: int | None = None

    @property
    def code(self) -> str:
        """Short machine-readable reason (a tag value)."""
        return self.reason.split(":", 1)[0]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def decide(history: Sequence[IterationFacts], rules: StopRules) -> Decision:
    """Decide after the last iteration in `history` (iterations 0..k, in order)."""
    if not history:
        raise ValueError("decide() needs at least one finished iteration")
    hist = sorted(history, key=lambda h: h.iteration)
    cur = hist[-1]
    k = cur.iteration
    if not cur.gate_check_passed:
        return Decision("stop", f"gate_check_failed: gated_dataset_is_usable failed for iteration {k} "
                                f"({cur.new_unique_successes} new unique successes); nothing new to train on. "
                                "Re-run rollouts and the gate (more samples, a better checkpoint) to resume.")
    if k >= rules.iterations:
        return Decision("stop", f"budget: reached the iteration budget K={rules.iterations} "
                                f"(iteration {k}: +{cur.new_unique_successes} new, seen success {_fmt(cur.seen_success)})")
    window = hist[-rules.patience:]
    if len(window) == rules.patience and all(h.new_unique_successes < rules.min_new_successes for h in window):
        counts = [h.new_unique_successes for h in window]
        return Decision("stop", f"dataset_stalled: the gated dataset stopped growing: new unique successes {counts} "
                                f"in the last {rules.patience} iteration(s), each below {rules.min_new_successes}")
    before = [h.seen_success for h in hist[: -rules.patience] if h.seen_success is not None]
    recent = [h.seen_success for h in window if h.seen_success is not None]
    if before and recent and max(recent) <= max(before) + rules.min_improvement:
        return Decision("stop", f"seen_stalled: seen-split success stopped improving: best {max(recent):.3f} in the "
                                f"last {rules.patience} iteration(s) vs {max(before):.3f} before "
                                f"(needs > +{rules.min_improvement:g})")
    return Decision("continue", f"continue: iteration {k} added {cur.new_unique_successes} new unique successes "
                                f"(gated total {cur.gated_total}), seen success {_fmt(cur.seen_success)}; "
                                f"starting iteration {k + 1} of K={rules.iterations}", next_iteration=k + 1)


def gate_allows_next(check_passed: bool | None, *, gated_new: int, continue_on_empty_gate: bool = False) -> bool:
    """THE gate rule, applied by the sensor (before deciding k+1) and by `sft_checkpoint(b, k+1)`
    (in any run: a backfill, a manual launch): may iteration k+1 train after gate k?

    `check_passed` is the result of the blocking check `gated_dataset_is_usable` on
    `gated_dataset(b, k)`, as the store records it (None: not evaluated since the gate last ran,
    e.g. the gate was materialized without its checks; then the store's record of the gate
    decides: at least one new gated trajectory).
    `continue_on_empty_gate` is the explicit opt-out (`LoopResource.continue_on_empty_gate`).
    """
    if continue_on_empty_gate:
        return True
    if check_passed is None:
        return gated_new > 0
    return bool(check_passed)


def gate_refusal(benchmark: str, k: int, check_passed: bool | None, gated_new: int) -> str:
    """Why k+1 may not train after gate k, with the fix (the message of the failed run / the stop)."""
    why = ("its blocking check gated_dataset_is_usable failed" if check_passed is False
           else f"it let no new trajectory through ({gated_new} new)")
    return (f"gate_check_failed: gated_dataset {benchmark}|{k}: {why}; iteration {k + 1} would train on "
            f"nothing new. Fix: re-run rollouts and gated_dataset {benchmark}|{k} (more samples_per_task, a "
            "better checkpoint) until the check passes, or set LoopResource.continue_on_empty_gate=true to "
            "train k+1 anyway.")
