"""The reward gate: sparse success is a poor gradient but a clean data filter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from flywheel.core.trajectory import Trajectory


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


def without_invalid_steps(tr: Trajectory) -> Trajectory:
    """The trajectory minus its invalid steps (an action the env rejected changes nothing): a success that
    wandered through `click[B0` or an empty answer teaches SFT to do so too. The step after a dropped one
    keeps the observation the dropped step saw, so each kept step's observation is still what the agent
    saw before acting, as far as the state goes (an invalid action leaves the state as it was).
    A trajectory without invalid steps is returned as it is."""
    if not any(s.invalid for s in tr.steps):
        return tr
    kept, carried = [], None
    for s in tr.steps:
        if s.invalid:
            carried = s.observation if carried is None else carried
            continue
        kept.append(replace(s, observation=carried) if carried is not None else s)
        carried = None
    return replace(tr, steps=kept)


EMPTY_PROBLEM = "dataset is empty"  # what `dataset_problems` says of a gate that admitted nothing


def dataset_problems(trajs: Sequence[Trajectory], *, needs_plans: bool = True) -> list[str]:
    """Why a training set is unusable: empty, failed/errored members, or malformed quaternions.
    `needs_plans=False` for a policy whose prompts carry no plan (ReAct: thought and action only)."""
    if not trajs:
        return [EMPTY_PROBLEM]
    problems = []
    for tr in trajs:
        if tr.status != "ok" or not tr.success:
            problems.append(f"{tr.traj_id}: not a successful trajectory")
        if not tr.steps:
            problems.append(f"{tr.traj_id}: no steps")
        for t, s in enumerate(tr.steps):
            if not s.action.strip():
                problems.append(f"{tr.traj_id} step {t}: empty action")
            if needs_plans and not s.plan.strip():
                problems.append(f"{tr.traj_id} step {t}: empty plan")
            if not s.thought.strip():
                problems.append(f"{tr.traj_id} step {t}: empty thought")
    return problems
