"""ScienceWorld splits from the ETO index files (the protocol the BPO paper compares against).

train/seen/unseen = ETO's train/dev/test indices: 1,483 / 194 / 211 `[task-name, variation]` pairs
over 24 task types. (Papers quote 241 unseen; the released index has 211, and we use that.)
Names in the files are ETO names ("task-3-find-non-living-thing"); the engine wants its own
("find-non-living-thing"). Loading a split needs no JVM.
"""

from __future__ import annotations

import json
import re
from functools import cache

from scienceworld.constants import ID2TASK

from envs.base import SPLITS, Task
from envs.data import require

BENCHMARK = "scienceworld"
ETO_DIR = "splits/eto"
SPLIT_FILES = {
    "train": "sciworld_train_indices.json",
    "seen": "sciworld_dev_indices.json",
    "unseen": "sciworld_test_indices.json",
}
MAX_STEPS_FILE = "sciworld_max_steps.json"
DEFAULT_MAX_STEPS = 30  # for tasks outside ETO's step table (e.g. measure-melting-point-unknown-substance)
DEFAULT_SIMPLIFICATION = "easy"  # what ETO and most published agents use

_ETO_PREFIX = re.compile(r"task-(\d|a|b)+-|[()]")


def task_names() -> tuple[str, ...]:
    """The engine's 30 task names, from the package's own table (no JVM needed)."""
    return tuple(ID2TASK.values())


def resolve_task_name(name: str) -> str:
    """ETO name, engine name, or paper id ("4-2") -> engine name; ValueError listing valid names.

    Mirrors `scienceworld.utils.infer_task` (prefix and parentheses dropped, "mendellian" typo
    fixed) but validates without a JVM.
    """
    raw = str(name).strip()
    short = ID2TASK.get(raw, raw)
    short = _ETO_PREFIX.sub("", short.replace("mendellian", "mendelian"))
    if short not in ID2TASK.values():
        raise ValueError(f"Unknown ScienceWorld task {name!r}. Valid task names: {', '.join(sorted(task_names()))}")
    return short


@cache
def _read_json(filename: str) -> object:
    return json.loads(require(f"{ETO_DIR}/{filename}").read_text())


def max_steps_table() -> dict[str, int]:
    """ETO step limit per task, keyed by engine name (10 to 120)."""
    table = _read_json(MAX_STEPS_FILE)
    assert isinstance(table, dict)
    return {resolve_task_name(k): int(v) for k, v in table.items()}


def make_task(task_name: str, variation: int, *, split: str = "custom", simplification: str = DEFAULT_SIMPLIFICATION) -> Task:
    """A Task for any engine task/variation (tests, benchmarks, ad-hoc runs)."""
    name = resolve_task_name(task_name)
    return Task(
        benchmark=BENCHMARK,
        split=split,
        task_id=f"{name}/{int(variation)}",
        max_steps=max_steps_table().get(name, DEFAULT_MAX_STEPS),
        meta={"task_name": name, "variation": int(variation), "simplification": simplification},
    )


def load_tasks(
    split: str,
    limit: int | None = None,
    task_types: tuple[str, ...] | list[str] | None = None,
    *,
    simplification: str = DEFAULT_SIMPLIFICATION,
) -> list[Task]:
    """Tasks of a split, in file order. `task_types` takes engine or ETO names.

    Task.goal stays "" (the engine writes the goal at reset); task_id is "<engine name>/<variation>".
    """
    if split not in SPLIT_FILES:
        raise ValueError(f"Unknown split {split!r} for scienceworld. Valid splits: {', '.join(SPLITS)}")
    wanted = {resolve_task_name(t) for t in task_types} if task_types else None
    pairs = _read_json(SPLIT_FILES[split])
    assert isinstance(pairs, list)
    tasks = []
    for eto_name, variation in pairs:
        name = resolve_task_name(eto_name)
        if wanted is not None and name not in wanted:
            continue
        task = make_task(name, variation, split=split, simplification=simplification)
        task.meta["eto_name"] = eto_name
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    return tasks
