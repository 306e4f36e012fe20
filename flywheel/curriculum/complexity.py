"""Complexity of a training trajectory: named signals, and a pluggable score over them.

The paper grades its curriculum by trajectory length; that is the default score.
Every trajectory also gets a second signal (distinct locations visited, by default)
so both are recorded and either can drive the order:

- `length`: number of steps (the paper's choice).
- `locations`: distinct places the trajectory went to.
- `subgoals`: distinct sub-goals reached.

A signal is a function of a trajectory's steps. The generic ones here fit a text game
(`locations`: the start plus each target of a valid `go to X` / `teleport to X`;
`subgoals`: how often the reward rose, the env's own partial-progress accounting); a
benchmark whose places or sub-goals read differently defines its own under the same name
in its spec's `complexity_signals()` (envs/base.py), and that one is used for its
trajectories.

Add a signal with `register_signal(name, fn)`; a `ComplexityScorer` combines signals
with weights, e.g. `ComplexityScorer({"length": 1.0, "locations": 2.0})`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from envs.base import BenchmarkSpec, StepView
from flywheel.core.trajectory import Trajectory

Signal = Callable[[Sequence[StepView]], float]
SIGNALS: dict[str, Signal] = {}

_MOVE = re.compile(r"^(?:go to|teleport to)\s+(.+)$")


def register_signal(name: str, fn: Signal) -> Signal:
    """Make `fn(steps) -> float` available to scorers under `name`."""
    SIGNALS[name] = fn
    return fn


def trajectory_length(steps: Sequence[StepView]) -> float:
    return float(len(steps))


def distinct_locations(steps: Sequence[StepView]) -> float:
    """The start plus each distinct target of a valid move; 0 for an empty trajectory."""
    if not steps:
        return 0.0
    places = {"<start>"}
    for s in steps:
        m = _MOVE.match(s.action.strip().lower())
        if m and not s.invalid:
            places.add(m.group(1).strip())
    return float(len(places))


def reward_increases(steps: Sequence[StepView]) -> float:
    """How often the reward rose above its best so far."""
    increases, best = 0, 0.0
    for s in steps:
        if s.reward > best + 1e-9:
            increases, best = increases + 1, s.reward
    return float(increases)


register_signal("length", trajectory_length)
register_signal("locations", distinct_locations)
register_signal("subgoals", reward_increases)


def signals_for(spec: BenchmarkSpec) -> dict[str, Signal]:
    """The registered signals, with the benchmark's own versions (`spec.complexity_signals()`) in place."""
    own = getattr(spec, "complexity_signals", None)
    return {**SIGNALS, **(own() if own is not None else {})}


@dataclass(frozen=True)
class Complexity:
    """What the curriculum records for one trajectory."""

    traj_id: str
    source: str
    task_id: str
    length: int
    other_signal: float
    score: float
    bucket: str = ""


@dataclass(frozen=True)
class ComplexityScorer:
    """score = sum(weight * signal); `other` names the second signal recorded beside length."""

    weights: dict[str, float] = field(default_factory=lambda: {"length": 1.0})
    other: str = "locations"

    def __post_init__(self) -> None:
        unknown = [n for n in [*self.weights, self.other] if n not in SIGNALS]
        if unknown:
            raise ValueError(f"Unknown complexity signal(s) {unknown}. Known: {', '.join(sorted(SIGNALS))}")
        if not self.weights:
            raise ValueError("ComplexityScorer needs at least one weighted signal")

    @property
    def name(self) -> str:
        return "+".join(f"{w:g}*{n}" for n, w in self.weights.items())

    def score(self, traj: Trajectory, spec: BenchmarkSpec) -> Complexity:
        """Score one trajectory of `spec`'s benchmark (its own signals replace the generic ones)."""
        return self.score_all([traj], spec)[0]

    def score_all(self, trajs: Sequence[Trajectory], spec: BenchmarkSpec) -> list[Complexity]:
        """Score trajectories of `spec`'s benchmark; one of another benchmark is a ValueError."""
        signals = signals_for(spec)
        names = {*self.weights, self.other, "length"}
        scored = []
        for traj in trajs:
            if traj.benchmark != spec.name:
                raise ValueError(f"trajectory {traj.traj_id} is {traj.benchmark!r}, scored as {spec.name!r}")
            values = {n: signals[n](traj.steps) for n in names}
            total = sum(w * values[n] for n, w in self.weights.items())
            scored.append(Complexity(
                traj_id=traj.traj_id, source=traj.source, task_id=traj.task_id, length=int(values["length"]),
                other_signal=float(values[self.other]), score=float(total),
            ))
        return scored
