"""Replaying a trajectory's actions in the real env: how a cleaned success is verified.

The three benchmarks are deterministic under a fixed task (tests/envs/test_replay_determinism.py), so
the same actions from the same reset give the same observations and the same outcome. A cut trajectory
(`flywheel.core.cleaning`) is kept only if its replay wins, as the original did, and every replayed
observation is the one the cut trajectory records (so SFT trains on what the agent would really see).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envs.base import Env, EnvError, Task
from flywheel.core.cleaning import apply_cut, no_progress_cut
from flywheel.core.prompting import INVALID_FORMAT_OBSERVATION
from flywheel.core.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cleaned:
    """One success after cleaning: what SFT trains on, and what the cut and its replay did."""

    trajectory: Trajectory  # the cut one if its replay verified it, else the original
    steps_before: int
    kept: tuple[int, ...]  # indices of the original's steps that `trajectory` keeps
    outcome: str  # "unchanged" (nothing to cut), "cut" (replay verified), "rejected" (replay did not win the same way)

    @property
    def steps_after(self) -> int:
        return len(self.kept)


def replays_the_same(env: Env, task: Task, tr: Trajectory) -> bool:
    """Whether `tr`'s actions, from a fresh reset of `task`, give its observations and its success.
    A step the policy never sent (its answer had no action: the invalid-format observation) is skipped."""
    if env.reset(task).strip() != tr.initial_observation.strip():
        return False
    result = None
    for step in tr.steps:
        if step.next_observation == INVALID_FORMAT_OBSERVATION:
            continue
        result = env.step(step.action)
        if result.observation.strip() != step.next_observation.strip():
            return False
    return result is not None and bool(result.success) == tr.success and tr.success


def clean_successes(trajs: Sequence[Trajectory], task_of: Callable[[str], Task],
                    make_env: Callable[[], Env]) -> list[Cleaned]:
    """Each success with its no-progress steps cut, where replaying the cut in one env (reset per
    trajectory) reproduces it; otherwise as it was. `task_of(task_id)` is asked (and the env made) only
    for a trajectory with something to cut. An env that breaks, or a task it does not know, rejects the
    cut, never the success."""
    out: list[Cleaned] = []
    env: Env | None = None
    try:
        for tr in trajs:
            cut = no_progress_cut(tr)
            everything = tuple(range(len(tr.steps)))
            if not cut.changed:
                out.append(Cleaned(tr, cut.steps_before, everything, "unchanged"))
                continue
            shorter = apply_cut(tr, cut.kept)
            try:
                env = env or make_env()
                ok = replays_the_same(env, task_of(tr.task_id), shorter)
            except (EnvError, KeyError) as exc:
                log.warning("replay of %s failed (%r): keeping it uncut", tr.traj_id, exc)
                if env is not None:
                    env.close()
                env, ok = None, False
            out.append(Cleaned(shorter, cut.steps_before, cut.kept, "cut") if ok
                       else Cleaned(tr, cut.steps_before, everything, "rejected"))
    finally:
        if env is not None:
            env.close()
    return out
