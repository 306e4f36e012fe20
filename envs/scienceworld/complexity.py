"""ScienceWorld's complexity signal for the curriculum (`ScienceWorldSpec.complexity_signals`).

`locations`: the rooms a trajectory was in: the start room (named by the first observation)
plus each room a valid `go to` / `teleport to` reached. `subgoals` is the flywheel's generic
one, which on ScienceWorld is the engine's own sub-goal accounting: how often the partial
score rose.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.base import StepView
from envs.scienceworld.adapter import INVALID_PREFIXES

_ROOM = re.compile(r"This room is called the ([^.]+)\.")
_MOVE = re.compile(r"^(?:go to|teleport to)\s+(.+)$")


def _valid(step: StepView) -> bool:
    # The text check too: trajectories stored before the env flagged invalid actions.
    return not step.invalid and not step.next_observation.lstrip().startswith(INVALID_PREFIXES)


def rooms_visited(steps: Sequence[StepView]) -> float:
    """Distinct rooms: the start room plus each valid move's target; 0 for an empty trajectory."""
    if not steps:
        return 0.0
    rooms: set[str] = set()
    if start := _ROOM.search(steps[0].observation):
        rooms.add(start.group(1).strip().lower())
    for s in steps:
        if (m := _MOVE.match(s.action.strip().lower())) and _valid(s):
            rooms.add(re.sub(r"^(the )?door to ", "", m.group(1)).strip())
    return float(len(rooms))
