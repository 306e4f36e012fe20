"""Test doubles and data builders shared by the tests (integration tests use real envs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from envs.base import EnvError, StepResult, Task
from flywheel.core.store import Store
from flywheel.core.trajectory import Step, Trajectory
from flywheel.policy.inference import Generation
from flywheel.policy.sft import sft_examples

BENCH = "scienceworld"  # the benchmark of marked() and store_with_seeds()


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


def make_traj(task="t1", sample=0, iteration=0, source="policy", success=True, n=3) -> Trajectory:
    steps = [Step(observation=f"o{i}", thought=f"e{i}", plan=f"p{i}", action=f"a{i}",
                  next_observation=f"o{i + 1}", prompt_tokens=10 + i) for i in range(n)]
    return Trajectory(benchmark="b", split="train", task_id=task, source=source, iteration=iteration,
                      sample=sample, goal="g", steps=steps, success=success, reward=float(success))


def marked(i: int, n_steps: int = 1, source="teacher", iteration=0) -> Trajectory:
    steps = [Step(observation=f"task zq{i}q", thought="think", plan="plan", action=f"act {t}",
                  next_observation="ok") for t in range(n_steps)]
    return Trajectory(benchmark=BENCH, split="train", task_id=f"task{i}", source=source, iteration=iteration,
                      goal=f"zq{i}q", steps=steps, success=True, reward=1.0)


def store_with_seeds(path) -> Store:
    db = Store(path)
    lengths = {0: 6, 1: 2, 2: 9, 3: 4}
    db.write_trajectories([marked(i, n) for i, n in lengths.items()])
    db.write_trajectories([marked(10 + i, n, source="synthetic") for i, n in enumerate([12, 1, 7])])
    return db


@dataclasses.dataclass(frozen=True)
class BareSpec:
    """A spec with only the required protocol: every optional attribute takes flywheel's default."""

    name: str = "bare"

    def load_tasks(self, split: str, *, limit: int | None = None, task_types: tuple[str, ...] | None = None) -> list[Task]:
        return []

    def make_env(self, **options: Any):
        raise NotImplementedError

    def system_prompt(self) -> str:
        return ""

    def expert_actions(self, task: Task) -> list[str]:
        return ["a", "b", "c"]

    def normalize_action(self, raw: str) -> str:
        return raw

    def describe_action(self, action: str) -> str:
        return action


def filled_store(tmp_path: Path):
    """A store with three teacher seeds, six policy episodes (three gated), a k=0 checkpoint with its training
    examples (one not kept) and an evaluation: (runs folder, store, seeds, gated, examples)."""
    runs = tmp_path / "runs"
    db = Store(runs / "flywheel.duckdb")
    seeds = [make_traj(task=f"t{i}", source="teacher", n=2) for i in range(3)]
    policy = [make_traj(task=f"t{i}", sample=s, success=(i + s) % 2 == 0) for i in range(3) for s in range(2)]
    db.write_trajectories(seeds + policy)
    passed = [t for t in policy if t.success]
    db.write_gated("b", 0, [(t.traj_id, t.task_id) for t in passed], candidates=len(policy))
    examples = sft_examples(seeds, lambda _t: "You are an agent.")
    db.record_checkpoint({"checkpoint_id": "b-k0-x", "benchmark": "b", "iteration": 0, "path": "/nowhere",
                          "n_examples": len(examples) - 1, "train_loss": 1.0})
    traj_ids = [t.traj_id for t in seeds for _ in t.steps]
    db.write_training_examples("b-k0-x", "b", 0, [{**ex, "traj_id": tid, "kept": i != 1}
                                                   for i, (ex, tid) in enumerate(zip(examples, traj_ids, strict=True))])
    db.write_evaluation({"benchmark": "b", "iteration": 0, "split": "seen", "checkpoint_id": "b-k0-x", "episodes": 4,
                         "errored": 0, "success_rate": 0.5, "avg_reward": 0.5, "mean_steps": 3.0,
                         "tokens_per_step": 40.0, "prompt_tokens_per_step": 30.0, "invalid_action_rate": 0.0})
    return runs, db, seeds, passed, examples
