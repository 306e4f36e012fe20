"""The teacher interface shared by the scripted and the OpenAI-compatible teacher."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from flywheel.core.trajectory import Trajectory


@dataclass(frozen=True)
class Annotation:
    thought: str  # e_t: multi-sentence analysis
    plan: str  # p_t: one or two sentences


class TeacherError(RuntimeError):
    """The teacher could not produce a usable annotation (after retries)."""


class TeacherRefused(TeacherError):
    """The endpoint refused the request (a 4xx other than 408/429: a wrong key, model or request): no retry helps."""


class Teacher(Protocol):
    name: str  # recorded in metadata, e.g. "scripted" or "openai:gpt-4o"

    def annotate(self, traj: Trajectory, instructions: str) -> list[Annotation]:
        """One (e_t, p_t) per step of an expert trajectory whose actions and observations are filled."""
        ...

    def propose_tasks(self, *, benchmark: str, instructions: str, schema: str, seeds: list[dict],
                      candidates: list[dict], n: int) -> list[Any]:
        """Stage 2: up to n harder tasks, raw (each a candidate's params or the model's item; the caller validates
        them: flywheel.curriculum.proposals.read_proposal). `seeds`: {"goal", "length"} of each seed; `candidates`:
        the concrete tasks the env can build."""
        ...


def apply_annotations(traj: Trajectory, notes: list[Annotation], source: str = "teacher") -> Trajectory:
    if len(notes) != len(traj.steps):
        raise TeacherError(f"teacher returned {len(notes)} annotations for {len(traj.steps)} steps")
    steps = [replace(s, thought=n.thought, plan=n.plan) for s, n in zip(traj.steps, notes, strict=True)]
    return replace(traj, steps=steps, source=source)
