"""The reward gate: sparse success is a poor gradient but a clean data filter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flywheel.trajectory import Trajectory


@dataclass(frozen=True)
class GateStats:
    candidates: int
    errored: int
    failed: int
    passed: int
    duplicates: int


def reward_gate(trajs: Sequence[Trajectory], *, already: Iterable[tuple[str, tuple[str, ...]]] = ()) -> tuple[list[Trajectory], GateStats]:
    """Keep successful, non-errored trajectories; drop action sequences already kept for the same task.

    `already` holds (task_id, actions) pairs from earlier iterations/seeds, so the
    training set grows only by new unique successes.
    """
    seen = set(already)
    passed: list[Trajectory] = []
    errored = failed = dup = 0
    for tr in trajs:
        if tr.status != "ok":
            errored += 1
            continue
        if not tr.success:
            failed += 1
            continue
        key = (tr.task_id, tr.actions)
        if key in seen:
            dup += 1
            continue
        seen.add(key)
        passed.append(tr)
    return passed, GateStats(len(trajs), errored, failed, len(passed), dup)


def dataset_problems(trajs: Sequence[Trajectory]) -> list[str]:
    """Why a training set is unusable: empty, failed/errored members, or malformed quaternions."""
    if not trajs:
        return ["dataset is empty"]
    problems = []
    for tr in trajs:
        if tr.status != "ok" or not tr.success:
            problems.append(f"{tr.traj_id}: not a successful trajectory")
        if not tr.steps:
            problems.append(f"{tr.traj_id}: no steps")
        for t, s in enumerate(tr.steps):
            if not s.action.strip():
                problems.append(f"{tr.traj_id} step {t}: empty action")
            if not s.plan.strip():
                problems.append(f"{tr.traj_id} step {t}: empty plan")
            if not s.thought.strip():
                problems.append(f"{tr.traj_id} step {t}: empty thought")
    return problems
