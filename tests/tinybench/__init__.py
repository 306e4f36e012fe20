"""A tiny deterministic text benchmark that exists only in the tests: keys and a locked door.

Why: it proves that a benchmark is a value. Nothing in `flywheel/` or `envs.REGISTRY` names
it; a profile names it by reference (`benchmarks: {tinybench: "tests.tinybench:SPEC"}`), and
the whole flywheel (bootstrap, curriculum, iterations, evaluation) runs on it through Dagster
in seconds, in pure Python (no JVM, no data files).

The world: rooms 1..5, the agent starts in room 1. A task hides one or more keys in rooms
and locks a door in one room; the door opens once every key is held. Actions:

    go to room N     take key     open door     look around

Anything else is an invalid action: an observation saying so, never an exception. The
expert is the known shortest path (`shortest_path`); a task's layout lives in `Task.meta`,
so synthesized tasks play in the same env.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from envs.base import StepResult, Task

NAME = "tinybench"
ROOMS = range(1, 6)
START = 1
MAX_KEYS = 3

# (keys' rooms, door's room) per split; train and seen have one key, unseen two.
LAYOUTS: dict[str, list[tuple[tuple[int, ...], int]]] = {
    "train": [((2,), 3), ((4,), 2), ((1,), 5), ((3,), 4)],
    "seen": [((5,), 3), ((2,), 4)],
    "unseen": [((3, 5), 2), ((4, 2), 5)],
}

SYSTEM_PROMPT = """You are in a small house of rooms 1 to 5. Keys lie in some rooms; a locked door is in one room.
Open the door: it opens once you hold every key.
Actions (one per step, exactly as written):
  go to room N   (N is 1 to 5)
  take key       (takes the key in your room)
  open door      (in the door's room, holding every key)
  look around"""


def task_type(keys: Sequence[int]) -> str:
    return f"keys-{len(keys)}"


def goal_text(keys: Sequence[int], door: int) -> str:
    where = ", ".join(f"room {k}" for k in keys)
    return f"Open the door in room {door}. Keys: {where}."


def make_task(split: str, task_id: str, keys: Sequence[int], door: int, **meta: Any) -> Task:
    keys = tuple(keys)
    return Task(benchmark=NAME, split=split, task_id=task_id, goal=goal_text(keys, door), max_steps=4 * len(keys) + 4,
                meta={"keys": list(keys), "door": door, "type": task_type(keys), **meta})


def shortest_path(keys: Sequence[int], door: int) -> list[str]:
    """Every room is one move from any other, so the shortest path visits each key's room once: the
    start room's key first, the door room's key last, then opens the door."""
    actions, here = [], START
    for room in sorted(keys, key=lambda k: (k != START, k == door)):
        if room != here:
            actions.append(f"go to room {room}")
            here = room
        actions.append("take key")
    if door != here:
        actions.append(f"go to room {door}")
    return [*actions, "open door"]


def normalize_action(raw: str) -> str:
    text = " ".join(raw.strip().strip("`'\".").lower().split())
    text = re.sub(r"^(go|goto|walk|move)( to)?( room)? *(\d+)$", r"go to room \4", text)
    return text


def describe_action(action: str) -> str:
    if m := re.fullmatch(r"go to room (\d+)", action):
        return f"walk to room {m.group(1)}"
    return {"take key": "pick up the key in this room", "open door": "unlock and open the door",
            "look around": "look around this room"}.get(action, f"try '{action}'")


class TinyEnv:
    """The `Env` of the keys-and-door world; the layout comes from the task (`meta["keys"]`, `meta["door"]`)."""

    def __init__(self, invalid_feedback: bool = True) -> None:
        self.invalid_feedback = invalid_feedback
        self.task: Task | None = None

    def reset(self, task: Task) -> str:
        try:
            keys, door = [int(k) for k in task.meta["keys"]], int(task.meta["door"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"task {task.task_id} has no keys/door layout: {exc}") from None
        self.task, self.keys, self.door = task, keys, door
        self.room, self.held, self.opened = START, set(), False
        return f"{task.goal} You are in room {self.room}. {self._here()}"

    def _here(self) -> str:
        things = []
        if self.room in self.keys and self.room not in self.held:
            things.append("a key lies here")
        if self.room == self.door:
            things.append("the locked door is here")
        return (", ".join(things).capitalize() + ".") if things else "The room is empty."

    def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        action = normalize_action(action)
        if m := re.fullmatch(r"go to room (\d+)", action):
            room = int(m.group(1))
            if room not in ROOMS:
                return self._invalid(f"There is no room {room}.")
            self.room = room
            return self._ok(f"You are in room {room}. {self._here()}")
        if action == "take key":
            if self.room not in self.keys or self.room in self.held:
                return self._invalid("There is no key here.")
            self.held.add(self.room)
            return self._ok(f"You take the key. You hold {len(self.held)} of {len(self.keys)} keys.")
        if action == "open door":
            if self.room != self.door:
                return self._invalid("There is no door here.")
            if len(self.held) < len(self.keys):
                return self._invalid(f"The door is locked: you hold {len(self.held)} of {len(self.keys)} keys.")
            self.opened = True
            return StepResult("The door opens. Task complete.", reward=1.0, done=True, success=True)
        if action == "look around":
            return self._ok(f"You are in room {self.room}. {self._here()}")
        return self._invalid(f"Unknown action '{action}'." if self.invalid_feedback else "Nothing happens.")

    def _ok(self, text: str) -> StepResult:
        return StepResult(text, reward=0.0, done=False, success=False)

    def _invalid(self, text: str) -> StepResult:
        return StepResult(text, reward=0.0, done=False, success=False, info={"invalid": True})

    def close(self) -> None:
        self.task = None


@dataclass(frozen=True)
class TinySpec:
    """The `BenchmarkSpec` of the tiny benchmark (see envs/base.py)."""

    name: str = NAME
    eval_bucket_edges: ClassVar[tuple[float, ...]] = (3, 5)  # gold lengths are 2..8
    needs_data_dir: ClassVar[bool] = False  # tasks in code: runs need no data folder

    def load_tasks(self, split: str, *, limit: int | None = None, task_types: tuple[str, ...] | None = None) -> list[Task]:
        if split not in LAYOUTS:
            raise ValueError(f"Unknown {NAME} split {split!r}; use {', '.join(LAYOUTS)}")
        tasks = [make_task(split, f"{split}-{i}", keys, door) for i, (keys, door) in enumerate(LAYOUTS[split])]
        tasks = [t for t in tasks if not task_types or t.meta["type"] in task_types]
        return tasks[:limit] if limit is not None else tasks

    def make_env(self, **options: Any) -> TinyEnv:
        return TinyEnv(**options)

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def expert_actions(self, task: Task) -> list[str]:
        return list(task.expert_actions) if task.expert_actions else shortest_path(task.meta["keys"], task.meta["door"])

    def normalize_action(self, raw: str) -> str:
        return normalize_action(raw)

    def describe_action(self, action: str) -> str:
        return describe_action(action)

    def synthesizer(self) -> TinySynthesizer:
        return TinySynthesizer()


class TinySynthesizer:
    """Stage 2: layouts near the seeds, harder on purpose (one more key), none a seed's or an evaluation task's."""

    benchmark = NAME

    def proposal_schema(self) -> str:
        return ('params: {"keys": [room numbers 1-5 holding a key, 1-3 distinct], "door": the door\'s room 1-5}')

    def candidates(self, seeds: Sequence[Task], *, holdout: Sequence[Task], limit: int, seed: int = 0) -> list[dict[str, Any]]:
        taken = {_layout(t.meta["keys"], t.meta["door"]) for t in [*seeds, *holdout]}
        rng = random.Random(f"{NAME}:{seed}")
        out = []
        for t in seeds:
            keys, door = list(t.meta["keys"]), int(t.meta["door"])
            for extra in ROOMS:
                if extra in keys or len(keys) >= MAX_KEYS or _layout([*keys, extra], door) in taken:
                    continue
                taken.add(_layout([*keys, extra], door))
                out.append({"kind": "more_keys", "params": {"keys": [*keys, extra], "door": door},
                            "expected_length": len(shortest_path([*keys, extra], door)),
                            "note": f"seed {t.task_id} with a key in room {extra} too"})
        rng.shuffle(out)
        return sorted(out, key=lambda c: -c["expected_length"])[:limit]

    def instantiate(self, params: dict[str, Any], *, seeds: Sequence[Task], holdout: Sequence[Task]) -> Task:
        unknown = sorted(set(params) - {"keys", "door"})
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; expected keys, door")
        keys, door = params.get("keys"), params.get("door")
        if not isinstance(keys, list) or not 1 <= len(keys) <= MAX_KEYS or len(set(keys)) != len(keys) \
                or not all(isinstance(k, int) and k in ROOMS for k in keys):
            raise ValueError(f"keys must be 1-{MAX_KEYS} distinct rooms in 1-5, got {keys!r}")
        if not isinstance(door, int) or door not in ROOMS:
            raise ValueError(f"door must be a room in 1-5, got {door!r}")
        layout = _layout(keys, door)
        if layout in {_layout(t.meta["keys"], t.meta["door"]) for t in holdout}:
            raise ValueError(f"{layout} is an evaluation task's layout")
        if layout in {_layout(t.meta["keys"], t.meta["door"]) for t in seeds}:
            raise ValueError(f"{layout} is a seed's layout")
        keys = sorted(keys)  # one layout, one task id
        return make_task("train", f"syn-k{'.'.join(map(str, keys))}-d{door}", keys, door, synthetic=True)

    def make_env(self, **options: Any) -> TinyEnv:
        return TinyEnv(**options)

    def solve(self, task: Task, env: TinyEnv) -> list[str]:
        return shortest_path(task.meta["keys"], task.meta["door"])


def _layout(keys: Sequence[int], door: int) -> tuple[tuple[int, ...], int]:
    return tuple(sorted(int(k) for k in keys)), int(door)


SPEC = TinySpec()

__all__ = ["SPEC", "TinyEnv", "TinySpec", "TinySynthesizer", "shortest_path"]
