"""ALFWorld behind the flywheel's `BenchmarkSpec`: `SPEC` and `AlfWorldEnv`.

Data comes from the shared tar.xz (unpacked once, lazily) or an official
`alfworld-download` folder named by `$FLYWHEEL_ALFWORLD_DIR`. TextWorld is only
imported in the worker process, so importing this package stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from envs.alfworld import prompts
from envs.alfworld.data import alfworld_root, game_file, load_index, load_traj_data
from envs.alfworld.env import AlfWorldEnv
from envs.alfworld.expert import EXPERT_MAX_STEPS, choose, expert_limit
from envs.alfworld.tasks import (
    ALIASES,
    DEFAULT_MAX_STEPS,
    TASK_TYPES,
    eto_unseen_ids,
    load_tasks,
    split_folder,
)
from envs.alfworld.worker import WorkerClient
from envs.base import StepView, Task
from envs.data import cache_dir
from envs.owned import OwnedProcess

if TYPE_CHECKING:
    from envs.alfworld.synthesis import AlfWorldSynthesizer

EXPERT_CACHE_VERSION = 2  # bump when the expert's behaviour changes (2: paths without `look`)


def expert_worker() -> OwnedProcess[WorkerClient]:
    """A worker process for the handcoded expert, started on first use by its owner (a spec)."""
    return OwnedProcess(lambda: WorkerClient(recycle_every=50, max_rss_mb=1024.0, timeout_s=600.0),
                        close=WorkerClient.stop)


@dataclass(frozen=True)
class AlfWorldSpec:
    """The ALFWorld benchmark: ETO splits, 40-step limit, `move X to Y` vocabulary."""

    name: str = "alfworld"
    display_name: ClassVar[str] = "ALFWorld"
    root: str | None = None
    max_steps: int = DEFAULT_MAX_STEPS
    expert_seed: int = 0
    # The longest searching-expert path a seed or a synthesized task takes (None: the episode's limit). Past it a
    # seed takes the game's PDDL walkthrough (the planner's shortest path) and a synthesized task is unsolved:
    # at 36 steps the searching paths of 9 of cpu-alfworld's 36 seed games were 13-36 steps long, so the step cap
    # also changed the seeds; 12 keeps cpu-alfworld's seeds under a longer episode limit.
    expert_path_steps: int | None = None
    # The expert's worker process: this spec's own, started on first use, ended by `close()`.
    _expert: OwnedProcess[WorkerClient] = field(default_factory=expert_worker, init=False, repr=False, compare=False)

    # Evaluation buckets by gold (PDDL walkthrough) length: 3-10 steps in the splits.
    eval_bucket_edges: ClassVar[tuple[float, ...]] = (4, 6)

    def load_tasks(self, split: str, *, limit: int | None = None, task_types: tuple[str, ...] | None = None) -> list[Task]:
        return load_tasks(split, limit=limit, task_types=task_types, root=self.root, max_steps=self.max_steps)

    def make_env(self, **options: Any) -> AlfWorldEnv:
        options.setdefault("root", self.root)
        return AlfWorldEnv(**options)

    def system_prompt(self) -> str:
        return prompts.system_prompt()

    def expert_actions(self, task: Task) -> list[str]:
        """The handcoded expert's winning path, else the verified walkthrough (cached on disk)."""
        if task.expert_actions is not None:
            return list(task.expert_actions)
        return list(self.expert_result(task)["actions"])

    def gold_length(self, task: Task) -> int:
        """The game's PDDL walkthrough: the planner's shortest path, shipped with every game.

        The handcoded expert's own paths search receptacles and are longer; grading a task
        needs neither them nor a worker process.
        """
        walkthrough = task.meta.get("walkthrough")
        return len(walkthrough) if walkthrough else len(self.expert_actions(task))

    def expert_result(self, task: Task) -> dict[str, Any]:
        """{"actions", "source", "handcoded": {...}, "walkthrough_won"} for `task`."""
        folder = split_folder(task.split)
        limit = expert_limit(task.max_steps, self.expert_path_steps)
        key = f"{folder}/{task.task_id}|{self.expert_seed}|{limit}|{EXPERT_CACHE_VERSION}"
        path = cache_dir() / "alfworld_expert" / f"{hashlib.sha1(key.encode()).hexdigest()}.json"
        if path.exists():
            return json.loads(path.read_text())
        root = alfworld_root(self.root)
        with self._expert.use() as worker:
            result = solve_in_worker(worker, root, folder, task.task_id, seed=self.expert_seed)
        walkthrough = load_index(root)[folder][task.task_id]["walkthrough"]
        actions, source = choose(result, walkthrough, limit)
        record = {"task_id": task.task_id, "split": folder, "actions": actions, "source": source, **result}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
        return record

    def close(self) -> None:
        """End this spec's expert worker, if one was started (the next expert path starts another)."""
        self._expert.close()

    def normalize_action(self, raw: str) -> str:
        return prompts.normalize_action(raw)

    def describe_action(self, action: str) -> str:
        return prompts.describe_action(action)

    def complexity_signals(self) -> dict[str, Callable[[Sequence[StepView]], float]]:
        """`subgoals` = distinct state changes (reward is 0/1); `locations` stays the generic one."""
        from envs.alfworld.complexity import state_changes

        return {"subgoals": state_changes}

    def synthesizer(self) -> AlfWorldSynthesizer:
        """Stage 2's task synthesizer, imported on first use (only the curriculum needs it); its tasks get this
        spec's step limit, as the seeds do."""
        from envs.alfworld.synthesis import AlfWorldSynthesizer

        return AlfWorldSynthesizer(root=self.root, expert_seed=self.expert_seed, max_steps=self.max_steps,
                                   expert_path_steps=self.expert_path_steps)


def solve_in_worker(
    worker: WorkerClient, root: Path, folder: str, game_id: str, *, seed: int = 0, max_steps: int = EXPERT_MAX_STEPS,
    fix_move_tracking: bool = True
) -> dict[str, Any]:
    """Run `expert.solve` for one game in `worker` (recycled every 50 episodes or 1 GB)."""
    path = game_file(root, folder, game_id)
    walkthrough = load_index(root)[folder][game_id]["walkthrough"]
    options = {"seed": seed, "max_steps": max_steps, "fix_move_tracking": fix_move_tracking}
    worker.begin_episode()
    return worker.call(
        "expert", game_file=str(path), traj_data=load_traj_data(path), walkthrough=walkthrough, options=options
    )


SPEC = AlfWorldSpec()

__all__ = [
    "ALIASES",
    "SPEC",
    "TASK_TYPES",
    "AlfWorldEnv",
    "AlfWorldSpec",
    "eto_unseen_ids",
    "solve_in_worker",
]
