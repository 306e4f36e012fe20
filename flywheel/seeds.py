"""Expert (seed) trajectories: replay each task's expert actions through the real env."""

from __future__ import annotations

import logging
from collections.abc import Callable

from envs.base import BenchmarkSpec, Env, EnvError, Task
from flywheel.rollout import goal_of
from flywheel.trajectory import Step, Trajectory

log = logging.getLogger(__name__)


def replay(env: Env, task: Task, actions: list[str], *, source: str = "expert") -> Trajectory:
    """Play `actions` on `task` and record every observation; stops early when the env says done."""
    obs = env.reset(task)
    traj = Trajectory(benchmark=task.benchmark, split=task.split, task_id=task.task_id, source=source,
                      goal=goal_of(task, obs))
    last = None
    for action in actions:
        last = env.step(action)
        traj.steps.append(Step(observation=obs, elaborate="", plan="", action=action,
                               next_observation=last.observation, reward=last.reward, done=last.done,
                               invalid=bool(last.info.get("invalid", False))))
        obs = last.observation
        if last.done or last.success:
            break
    traj.success = bool(last and last.success)
    traj.reward = float(last.reward) if last else 0.0
    return traj


def collect_expert(
    spec: BenchmarkSpec,
    tasks: list[Task],
    *,
    make_env: Callable[[], Env] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Trajectory], list[tuple[str, str]]]:
    """Successful expert trajectories, plus (task_id, reason) for every task that failed."""
    env = (make_env or spec.make_env)()
    ok: list[Trajectory] = []
    failed: list[tuple[str, str]] = []
    try:
        for i, task in enumerate(tasks, 1):
            try:
                traj = replay(env, task, spec.expert_actions(task))
            except EnvError as exc:
                failed.append((task.task_id, f"env error: {exc}"))
                env.close()
                env = (make_env or spec.make_env)()
                continue
            if traj.success:
                ok.append(traj)
            else:
                failed.append((task.task_id, f"expert path ended without success (reward {traj.reward:.2f})"))
            if progress:
                progress(i, len(tasks))
    finally:
        env.close()
    return ok, failed
