"""Expert (seed) trajectories: replay each task's expert actions through the real env."""

from __future__ import annotations

import logging
from collections.abc import Callable

from envs.base import BenchmarkSpec, Env, EnvError, Task
from flywheel.core.trajectory import Step, Trajectory
from flywheel.rollout.engine import goal_of

log = logging.getLogger(__name__)


def replay(env: Env, task: Task, actions: list[str], *, source: str = "expert") -> Trajectory:
    """Play `actions` on `task` and record every observation; stops early when the env says done."""
    obs = env.reset(task)
    traj = Trajectory(benchmark=task.benchmark, split=task.split, task_id=task.task_id, source=source,
                      goal=goal_of(task, obs))
    last = None
    for action in actions:
        last = env.step(action)
        traj.steps.append(Step(observation=obs, thought="", plan="", action=action,
                               next_observation=last.observation, reward=last.reward, done=last.done,
                               invalid=bool(last.info.get("invalid", False))))
        obs = last.observation
        if last.done or last.success:
            break
    traj.success = bool(last and last.success)
    traj.reward = float(last.reward) if last else 0.0
    return traj


def expert_for(spec: BenchmarkSpec, env: Env, task: Task) -> list[str]:
    """The task's own expert path, else the env's (an env that can compute its expert on its own
    engine, with its own options, e.g. ScienceWorld's `expert_path`), else the spec's."""
    if task.expert_actions:
        return list(task.expert_actions)
    own = getattr(env, "expert_actions", None)
    return own(task) if callable(own) else spec.expert_actions(task)


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
                traj = replay(env, task, expert_for(spec, env, task))
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
