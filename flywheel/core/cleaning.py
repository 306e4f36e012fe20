"""Cleaned successes: cut the steps of a success that made no progress, keep the shortest per task.

Pure logic (no env): which steps to cut is decided here; whether the cut trajectory still wins is
decided by replaying its actions in the real env (`flywheel.rollout.replay`), and a cut that does not
replay to the same observations and the same success is rejected (the original is kept).

A state is the observation the agent sees before a step (the first one for step 0, the previous
step's answer after). Two rules, one pass:
- a loop: the observation after step j was already seen before step i <= j, so steps i..j went
  round in a circle; they are cut and the episode goes on from the earlier state;
- a repeat (the one-step loop): an action whose answer is the observation it was taken in.
The last step is never cut (it is the one that wins). An invalid step is no special case: the
gate's `without_invalid_steps` runs first when the loop drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from flywheel.core.trajectory import Trajectory


@dataclass(frozen=True)
class Cut:
    """Which steps of a trajectory to keep (indices into its steps), and how many each rule cut."""

    kept: tuple[int, ...]
    steps_before: int
    repeats: int = 0  # steps cut by one-step loops
    loops: int = 0  # steps cut by longer loops

    @property
    def steps_after(self) -> int:
        return len(self.kept)

    @property
    def changed(self) -> bool:
        return self.steps_after < self.steps_before


def no_progress_cut(tr: Trajectory) -> Cut:
    """The steps of `tr` that remain once every return to an earlier observation is cut out."""
    steps = tr.steps
    kept: list[int] = []
    seen = {tr.initial_observation.strip(): 0}  # observation -> how many kept steps led to it
    repeats = loops = 0
    for i, step in enumerate(steps):
        kept.append(i)
        if i == len(steps) - 1:
            break
        state = step.next_observation.strip()
        at = seen.get(state)
        if at is None:
            seen[state] = len(kept)
            continue
        cut = len(kept) - at
        if cut == 1:
            repeats += 1
        else:
            loops += cut
        del kept[at:]
        seen = {obs: n for obs, n in seen.items() if n <= at}
    return Cut(tuple(kept), len(steps), repeats, loops)


def apply_cut(tr: Trajectory, kept: Sequence[int]) -> Trajectory:
    """`tr` with only the steps `kept`; each kept step's observation is the state it is now taken in
    (the same text, by the cut's rule: a loop returns to an observation already seen)."""
    steps = [tr.steps[i] for i in kept]
    rebuilt, before = [], tr.initial_observation
    for s in steps:
        rebuilt.append(replace(s, observation=before) if s.observation != before else s)
        before = s.next_observation
    return replace(tr, steps=rebuilt)


def shortest_per_task(trajs: Sequence[Trajectory]) -> tuple[list[Trajectory], int]:
    """The successes of each task that are as short as that task's shortest (ties all kept), in input
    order; and how many longer ones were dropped."""
    best: dict[str, int] = {}
    for t in trajs:
        best[t.task_id] = min(best.get(t.task_id, len(t.steps)), len(t.steps))
    kept = [t for t in trajs if len(t.steps) == best[t.task_id]]
    return kept, len(trajs) - len(kept)
