"""Complexity of a training trajectory: named signals, and a pluggable score over them.

The paper grades its curriculum by trajectory length; that is the default score.
Every trajectory also gets a second signal (distinct locations visited, by default)
so both are recorded and either can drive the order:

- `length`: number of steps (the paper's choice).
- `locations`: distinct places the trajectory went to: rooms in ScienceWorld (`go to`,
  `teleport to`, plus the start room), receptacles in ALFWorld (`go to X`), pages in
  WebShop (each distinct search and product page).
- `subgoals`: distinct sub-goals reached: ScienceWorld's partial-score increases (the
  engine's own sub-goal accounting); elsewhere distinct state-changing actions
  (take/move/heat/clean/cool/use/open, option clicks, buy).

Add a signal with `register_signal(name, fn)`; a `ComplexityScorer` combines signals
with weights, e.g. `ComplexityScorer({"length": 1.0, "locations": 2.0})`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flywheel.trajectory import Trajectory

Signal = Callable[[Trajectory], float]
SIGNALS: dict[str, Signal] = {}

_INVALID_OBS = ("No known action matches that input.", "Unknown action.", "Nothing happens.", "Invalid action!")
_SW_ROOM = re.compile(r"This room is called the ([^.]+)\.")
_MOVE = re.compile(r"^(?:go to|teleport to)\s+(.+)$")
_ALF_STATE = re.compile(r"^(take|move|put|heat|cool|clean|use|open|close|toggle|slice)\b")


def register_signal(name: str, fn: Signal) -> Signal:
    """Make `fn(traj) -> float` available to scorers under `name`."""
    SIGNALS[name] = fn
    return fn


def _valid(step) -> bool:
    return not step.invalid and not step.next_observation.lstrip().startswith(_INVALID_OBS)


def trajectory_length(traj: Trajectory) -> float:
    return float(len(traj.steps))


def distinct_locations(traj: Trajectory) -> float:
    """Distinct places visited (see module doc); 0 for an empty trajectory."""
    if not traj.steps:
        return 0.0
    places: set[str] = set()
    if traj.benchmark == "webshop":
        for s in traj.steps:
            a = s.action.strip().lower()
            if _valid(s) and (a.startswith("search[") or re.match(r"click\[b0[0-9a-z]{8}\]", a)):
                places.add(a)
        return float(len(places))
    if traj.benchmark == "scienceworld":
        start = _SW_ROOM.search(traj.steps[0].observation)
        if start:
            places.add(start.group(1).strip().lower())
    else:
        places.add("<start>")
    for s in traj.steps:
        m = _MOVE.match(s.action.strip().lower())
        if m and _valid(s):
            places.add(re.sub(r"^(the )?door to ", "", m.group(1)).strip())
    return float(len(places))


def distinct_subgoals(traj: Trajectory) -> float:
    """Distinct sub-goals reached (see module doc)."""
    if traj.benchmark == "scienceworld":
        increases, best = 0, 0.0
        for s in traj.steps:
            if s.reward > best + 1e-9:
                increases, best = increases + 1, s.reward
        return float(increases)
    done: set[str] = set()
    for s in traj.steps:
        a = s.action.strip().lower()
        if not _valid(s):
            continue
        if traj.benchmark == "webshop":
            if a.startswith("click[") and not re.match(r"click\[(b0[0-9a-z]{8}|next >|< prev|back to search)\]", a):
                done.add(a)
        elif _ALF_STATE.match(a) or a.startswith(("pick up", "put down", "pour", "mix", "activate", "connect", "focus on")):
            done.add(a)
    return float(len(done))


register_signal("length", trajectory_length)
register_signal("locations", distinct_locations)
register_signal("subgoals", distinct_subgoals)


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

    def score(self, traj: Trajectory) -> Complexity:
        values = {n: SIGNALS[n](traj) for n in {*self.weights, self.other, "length"}}
        total = sum(w * values[n] for n, w in self.weights.items())
        return Complexity(
            traj_id=traj.traj_id, source=traj.source, task_id=traj.task_id, length=int(values["length"]),
            other_signal=float(values[self.other]), score=float(total),
        )

    def score_all(self, trajs: Sequence[Trajectory]) -> list[Complexity]:
        return [self.score(t) for t in trajs]
