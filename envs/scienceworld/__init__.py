"""ScienceWorld: ETO splits, a fast capped-heap adapter, prompt text and the gold-path expert."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from envs.base import StepView, Task
from envs.owned import OwnedProcess
from envs.scienceworld.adapter import ScienceWorldEnv, expert_actions_many, expert_jvm
from envs.scienceworld.prompts import PROMPTS, SYSTEM_PROMPT, describe_action, normalize_action
from envs.scienceworld.tasks import load_tasks, make_task, resolve_task_name

if TYPE_CHECKING:
    from envs.scienceworld.synthesis import ScienceWorldSynthesizer


@dataclass(frozen=True)
class ScienceWorldSpec:
    """The `BenchmarkSpec` for ScienceWorld (see envs/base.py)."""

    name: str = "scienceworld"
    display_name: ClassVar[str] = "ScienceWorld"
    paper_notes: ClassVar[tuple[str, ...]] = (
        "ScienceWorld unseen is the 211-task test index released with ETO (the paper prints 241 tasks).",)
    prompt: str = "full"  # "compact": the main rules in 146 tokens instead of 584, for small models

    # Evaluation buckets by gold length: the paper's Fig. 2 calls more than 17 gold steps "hard"
    # (the easy/medium edge at 10 is this project's choice).
    eval_bucket_edges: ClassVar[tuple[float, ...]] = (10, 17)
    # `flywheel demo`: three short task types, and a small model's settings (the compact prompt,
    # and seeds whose walks are collapsed into teleports).
    demo_task_types: ClassVar[tuple[str, ...]] = (
        "find-non-living-thing", "lifespan-longest-lived", "lifespan-shortest-lived")
    demo_spec_options: ClassVar[dict[str, Any]] = {"prompt": "compact"}
    demo_env_options: ClassVar[dict[str, Any]] = {"expert_path": "shortcut"}
    # The JVM that computes gold paths: this spec's own, started on first use, ended by `close()`.
    _expert: OwnedProcess[ScienceWorldEnv] = field(default_factory=expert_jvm, init=False, repr=False, compare=False)

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
        """Gold path (task.expert_actions if already filled, else generated on this spec's JVM)."""
        if task.expert_actions:
            return list(task.expert_actions)
        with self._expert.use() as jvm:
            return jvm.expert_actions(task)

    def close(self) -> None:
        """End this spec's gold-path JVM, if one was started (the next gold path starts another)."""
        self._expert.close()

    def normalize_action(self, raw: str) -> str:
        return normalize_action(raw)

    def describe_action(self, action: str) -> str:
        return describe_action(action)

    def complexity_signals(self) -> dict[str, Callable[[Sequence[StepView]], float]]:
        """`locations` = rooms visited; `subgoals` stays the generic score-increase count."""
        from envs.scienceworld.complexity import rooms_visited

        return {"locations": rooms_visited}

    def synthesizer(self) -> ScienceWorldSynthesizer:
        """Stage 2's task synthesizer, imported on first use (only the curriculum needs it)."""
        from envs.scienceworld.synthesis import SYNTHESIZER

        return SYNTHESIZER


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
