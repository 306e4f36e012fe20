"""ALFWorld's complexity signal for the curriculum (`AlfWorldSpec.complexity_signals`).

`subgoals`: distinct state-changing actions that worked (take, move, heat, cool, clean, use,
open, ...): ALFWorld's reward is 0/1, so partial progress is read off the actions. `locations`
is the flywheel's generic one (the start plus each receptacle gone to), which fits ALFWorld's
`go to <receptacle>`; the env flags "Nothing happens." as an invalid step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.alfworld.env import INVALID_FEEDBACK
from envs.base import StepView

_STATE_CHANGE = re.compile(r"^(take|move|put|heat|cool|clean|use|open|close|toggle|slice)\b")


def state_changes(steps: Sequence[StepView]) -> float:
    """Distinct valid state-changing actions."""
    done = {
        a for s in steps
        if _STATE_CHANGE.match(a := s.action.strip().lower())
        and not s.invalid and not s.next_observation.lstrip().startswith(INVALID_FEEDBACK)
    }
    return float(len(done))
