"""Test doubles for unit tests of the loop only (integration tests use real envs)."""

from __future__ import annotations

from envs.base import EnvError, StepResult, Task
from flywheel.policy.inference import Generation


class CounterEnv:
    """Reach `target` by sending 'inc'; anything else is an invalid action (an observation)."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.value = 0
        self.target = 3
        self.crash_at = crash_at
        self.steps = 0
        self.closed = False

    def reset(self, task: Task) -> str:
        self.value, self.steps = 0, 0
        self.target = int(task.meta.get("target", 3))
        return f"Your task is to count to {self.target}. Value is 0."

    def step(self, action: str) -> StepResult:
        self.steps += 1
        if self.crash_at is not None and self.steps == self.crash_at:
            raise EnvError("simulated engine crash")
        if action != "inc":
            return StepResult("Nothing happens.", 0.0, False, False, {"invalid": True})
        self.value += 1
        won = self.value >= self.target
        return StepResult(f"Value is {self.value}.", 1.0 if won else 0.0, won, won, {})

    def close(self) -> None:
        self.closed = True


class ScriptGenerator:
    """Answers every prompt with the same scripted text; records batch sizes."""

    model_id = "script"

    def __init__(self, text: str = "Thought: count up.\nPlan: increment.\nAction: inc") -> None:
        self.text = text
        self.batches: list[int] = []

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        self.batches.append(len(prompts))
        return [Generation(self.text, prompt_tokens=10, completion_tokens=5) for _ in prompts]


class ServerLikeGenerator(ScriptGenerator):
    """A `concurrent` generator (what a server backend is): called from many threads at once, one
    prompt per call; answers for prompts containing a key in `slow` take that many seconds."""

    concurrent = True

    def __init__(self, text: str = ScriptGenerator().text, *, slow: dict[str, float] | None = None) -> None:
        import threading

        super().__init__(text)
        self.slow = slow or {}
        self.seeds: list[tuple[str, int | None]] = []  # (first user message, seed) per call
        self._lock = threading.Lock()

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        import time

        text = " ".join(m["content"] for m in prompts[0])
        time.sleep(max((d for key, d in self.slow.items() if key in text), default=0.0))
        with self._lock:
            self.seeds.append((text, seed))
        return super().generate(prompts, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)


def counter_task(i: int, target: int = 3, split: str = "train") -> Task:
    return Task(benchmark="counter", split=split, task_id=f"c{i}", max_steps=6, meta={"target": target})
