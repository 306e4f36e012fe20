"""`AlfWorldEnv`: the flywheel's `Env` over ALFWorld's TextWorld games.

The engine runs in a recycled worker process (see worker.py) so memory stays
bounded over hundreds of episodes. Observations are ALFWorld's own; the only
change is dropping the constant "-= Welcome to TextWorld, ALFRED! =-" banner
from the first one, as ETO/ReAct do (`strip_banner=False` keeps it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envs.alfworld.data import alfworld_root, game_file
from envs.alfworld.prompts import normalize_action
from envs.alfworld.tasks import split_folder
from envs.alfworld.worker import WorkerClient
from envs.base import StepResult, Task

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
INVALID_FEEDBACK = "Nothing happens."


def strip_banner(observation: str) -> str:
    return observation.removeprefix(BANNER).lstrip("\n")


class AlfWorldEnv:
    """One ALFWorld game at a time; `reset(task)` may be called again for the next game.

    Options: `admissible_commands` (list them in `StepResult.info`), `recycle_every`
    (episodes per worker process, None = never), `max_rss_mb` (recycle above this
    worker RSS), `step_timeout_s`, `strip_banner`, `root` (data folder).
    """

    def __init__(
        self,
        *,
        root: str | Path | None = None,
        admissible_commands: bool = False,
        recycle_every: int | None = 50,
        max_rss_mb: float | None = 1024.0,
        step_timeout_s: float = 120.0,
        strip_banner: bool = True,
    ) -> None:
        self.root = alfworld_root(root)
        self.admissible_commands = admissible_commands
        self.strip_banner = strip_banner
        self.worker = WorkerClient(recycle_every=recycle_every, max_rss_mb=max_rss_mb, timeout_s=step_timeout_s)
        self._task: Task | None = None
        self._steps = 0
        self._done = True
        self._last: dict[str, Any] = {}

    def reset(self, task: Task) -> str:
        """Start `task`; ValueError for an unknown game id, EnvError if the engine fails."""
        path = game_file(self.root, split_folder(task.split), task.task_id)
        self.worker.begin_episode()
        self._task, self._steps, self._done = task, 0, False
        self._last = self.worker.call("reset", game_file=str(path))
        observation = self._last["observation"]
        return strip_banner(observation) if self.strip_banner else observation

    def step(self, action: str) -> StepResult:
        """Apply one action; an action the game rejects gives "Nothing happens." with info["invalid"]."""
        if self._task is None or self._done:
            raise RuntimeError("step() needs a running episode: call reset(task) first (and again after done)")
        command = normalize_action(action)
        self._last = self.worker.call("step", action=command)
        self._steps += 1
        won = self._last["won"]
        truncated = not won and self._steps >= self._task.max_steps
        self._done = won or truncated
        observation = self._last["observation"]
        info: dict[str, Any] = {
            "action": command,
            "invalid": observation.strip() == INVALID_FEEDBACK,
            "won": won,
            "steps": self._steps,
            "truncated": truncated,
        }
        if self.admissible_commands:
            info["admissible_commands"] = list(self._last["admissible_commands"])
        return StepResult(observation=observation, reward=1.0 if won else 0.0, done=self._done, success=won, info=info)

    def admissible(self) -> list[str]:
        """Commands the game accepts in the current state."""
        return list(self._last.get("admissible_commands", []))

    def close(self) -> None:
        """Stop the worker process; safe to call twice."""
        self.worker.stop()
        self._task, self._done = None, True

    def __enter__(self) -> AlfWorldEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
