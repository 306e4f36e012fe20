"""ScienceWorld: ETO splits, a fast capped-heap adapter, prompt text and the gold-path expert."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.base import Task
from envs.scienceworld.adapter import ScienceWorldEnv, expert_actions_many, shared_expert_actions
from envs.scienceworld.prompts import PROMPTS, SYSTEM_PROMPT, describe_action, normalize_action
from envs.scienceworld.tasks import load_tasks, make_task, resolve_task_name


@dataclass(frozen=True)
class ScienceWorldSpec:
    """The `BenchmarkSpec` for ScienceWorld (see envs/base.py)."""

    name: str = "scienceworld"
    prompt: str = "full"  # "compact": the main rules in 146 tokens instead of 584, for small models

    def __post_init__(self) -> None:
        if self.prompt not in PROMPTS:
            raise ValueError(f"Unknown ScienceWorld prompt {self.prompt!r}. Valid: {', '.join(PROMPTS)}")

    def load_tasks(self, split: str, *, limit: int | None = None, task_types: tuple[str, ...] | None = None) -> list[Task]:
        return load_tasks(split, limit=limit, task_types=task_types)

    def make_env(self, **options: Any) -> ScienceWorldEnv:
        return ScienceWorldEnv(**options)

    def system_prompt(self) -> str:
        return PROMPTS[self.prompt]

    def expert_actions(self, task: Task) -> list[str]:
        """Gold path (task.expert_actions if already filled, else generated on a shared JVM).

        For many tasks prefer `expert_actions_many(tasks)`.
        """
        if task.expert_actions:
            return list(task.expert_actions)
        return shared_expert_actions(task)

    def normalize_action(self, raw: str) -> str:
        return normalize_action(raw)

    def describe_action(self, action: str) -> str:
        return describe_action(action)


SPEC = ScienceWorldSpec()

__all__ = [
    "SPEC",
    "ScienceWorldEnv",
    "ScienceWorldSpec",
    "SYSTEM_PROMPT",
    "describe_action",
    "expert_actions_many",
    "load_tasks",
    "make_task",
    "normalize_action",
    "resolve_task_name",
]
