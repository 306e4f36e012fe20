"""Planning quaternions and trajectories: the unit of data the flywheel moves around."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Source = Literal["expert", "teacher", "synthetic", "policy"]
Status = Literal["ok", "errored"]


@dataclass
class Step:
    """One planning quaternion (o_t, e_t, p_t, a_t) plus what the env answered."""

    observation: str  # o_t: what the agent saw before acting
    thought: str  # e_t: long chain of thought
    plan: str  # p_t: short distilled plan, the only thought kept in later history
    action: str  # a_t
    next_observation: str = ""
    reward: float = 0.0
    done: bool = False
    invalid: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Trajectory:
    benchmark: str
    split: str
    task_id: str
    source: Source
    iteration: int = 0
    sample: int = 0
    goal: str = ""
    steps: list[Step] = field(default_factory=list)
    success: bool = False
    reward: float = 0.0
    status: Status = "ok"
    error: str = ""
    model_id: str = ""

    @property
    def traj_id(self) -> str:
        """Natural key: re-running the same partition overwrites, never duplicates."""
        return "|".join(
            [self.benchmark, self.split, str(self.iteration), self.source, self.task_id, str(self.sample)]
        )

    @property
    def initial_observation(self) -> str:
        return self.steps[0].observation if self.steps else ""

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(s.action for s in self.steps)
