"""Stage 2 synthesis: propose, instantiate in the real env, solve, annotate, keep the successes.

    proposals = teacher.propose_tasks(...)            # the scripted teacher: the offline heuristic
    for each: synthesizer.instantiate(params)         # ValueError -> rejected(reason)
              env.reset(task)                         # the env must load it -> else rejected
              synthesizer.solve(task, env)            # expert / gold path / oracle
              replay(env, task, actions)              # the env itself judges success
              teacher.annotate(trajectory)            # quaternions, source="synthetic"

Nothing here raises for a bad proposal: each ends with a status and a reason. Only an
unreachable teacher endpoint (after its retries) stops the run, as in stage 1.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from envs.base import Env, EnvError, Task
from flywheel.core.trajectory import Trajectory
from flywheel.curriculum.proposals import Proposal, TaskSynthesizer, read_proposal
from flywheel.rollout.seeds import replay
from flywheel.teacher.base import Teacher, TeacherError, apply_annotations

log = logging.getLogger(__name__)

STATUSES = ("rejected", "unsolved", "annotation_failed", "solved")


@dataclass
class SynthesisResult:
    proposals: list[Proposal]
    trajectories: list[Trajectory]
    tasks: list[Task] = field(default_factory=list)
    candidates: int = 0

    def counts(self) -> dict[str, int]:
        by = {s: sum(p.status == s for p in self.proposals) for s in STATUSES}
        return {
            "proposals": len(self.proposals),
            "valid": by["unsolved"] + by["annotation_failed"] + by["solved"],  # the env instantiated it
            "solved": by["annotation_failed"] + by["solved"],  # the expert succeeded in the env
            "kept": len(self.trajectories),
            "rejected": by["rejected"],
            "unsolved": by["unsolved"],
            "annotation_failed": by["annotation_failed"],
        }


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    if not lengths:
        return {"n": 0, "mean": 0.0, "median": 0.0, "p90": 0.0, "max": 0.0}
    data = sorted(lengths)
    return {"n": len(data), "mean": round(statistics.fmean(data), 2), "median": float(statistics.median(data)),
            "p90": float(data[min(len(data) - 1, int(0.9 * len(data)))]), "max": float(data[-1])}


def propose(teacher: Teacher, *, benchmark: str, instructions: str, schema: str, seeds: list[dict[str, Any]],
            candidates: list[dict[str, Any]], n: int) -> tuple[list[Any], str]:
    """Raw proposals from the teacher (the scripted teacher's are the offline heuristic's) and its name."""
    raw = teacher.propose_tasks(benchmark=benchmark, instructions=instructions, schema=schema, seeds=seeds,
                                candidates=candidates, n=n)
    return list(raw), teacher.name


def synthesize(
    *,
    benchmark: str,
    synthesizer: TaskSynthesizer,
    teacher: Teacher,
    seed_tasks: Sequence[Task],
    seed_trajs: Sequence[Trajectory],
    holdout: Sequence[Task],
    instructions: str,
    n_proposals: int,
    candidate_limit: int = 64,
    seed: int = 0,
    env_options: dict[str, Any] | None = None,
    max_steps: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SynthesisResult:
    """Run stage-2 synthesis for one benchmark (see module doc). `max_steps`: the episode cap rollouts play
    under (the envs resource's), on top of each task's own limit: a synthesized task keeps the lower of the two,
    and an expert path longer than that is rejected (a policy could not finish it in an episode)."""
    candidates = synthesizer.candidates(seed_tasks, holdout=holdout, limit=candidate_limit, seed=seed)
    seed_rows = [{"task_id": t.task_id, "goal": t.goal, "length": len(t.steps)} for t in seed_trajs]
    raw, proposer = propose(teacher, benchmark=benchmark, instructions=instructions,
                            schema=synthesizer.proposal_schema(), seeds=seed_rows, candidates=candidates, n=n_proposals)
    proposals = [read_proposal(r, i, proposer) for i, r in enumerate(raw)]
    result = SynthesisResult(proposals=proposals, trajectories=[], candidates=len(candidates))
    env: Env | None = None
    seen_ids: dict[str, str] = {}
    try:
        for i, prop in enumerate(proposals, 1):
            if prop.status == "proposed":
                env = _attempt(prop, synthesizer, teacher, seed_tasks, holdout, instructions, env, env_options or {},
                               seen_ids, result, max_steps)
            if progress:
                progress(i, len(proposals))
    finally:
        if env is not None:
            env.close()
    return result


def _attempt(prop: Proposal, synth: TaskSynthesizer, teacher: Teacher, seed_tasks: Sequence[Task], holdout: Sequence[Task],
             instructions: str, env: Env | None, env_options: dict[str, Any], seen_ids: dict[str, str],
             result: SynthesisResult, max_steps: int | None = None) -> Env | None:
    """One proposal through instantiate -> load -> solve -> judge -> annotate. Returns the (maybe new) env."""
    try:
        task = synth.instantiate(dict(prop.params), seeds=seed_tasks, holdout=holdout)
    except (ValueError, KeyError, TypeError) as exc:
        prop.reject("rejected", f"invalid: {_msg(exc)}")
        return env
    if max_steps is not None and task.max_steps > max_steps:
        task = replace(task, max_steps=max_steps)  # the limit its episodes will be played with
    prop.task_id = task.task_id
    if task.task_id in seen_ids:
        prop.reject("rejected", f"duplicate of proposal {seen_ids[task.task_id]}")
        return env
    seen_ids[task.task_id] = prop.proposal_id
    env = env or synth.make_env(**env_options)
    try:
        env.reset(task)
    except (ValueError, KeyError) as exc:
        prop.reject("rejected", f"the environment cannot instantiate it: {_msg(exc)}")
        return env
    except EnvError as exc:
        prop.reject("rejected", f"the environment failed loading it: {_msg(exc)}")
        return _restart(env)
    try:
        actions = synth.solve(task, env)
        traj = replay(env, task, actions, source="synthetic")
    except (ValueError, KeyError) as exc:
        prop.reject("unsolved", f"no expert solution: {_msg(exc)}")
        return env
    except EnvError as exc:
        prop.reject("unsolved", f"env error while solving: {_msg(exc)}")
        return _restart(env)
    prop.length = len(traj.steps)
    if not traj.success:
        prop.reject("unsolved", f"expert path ended without success (reward {traj.reward:.2f}, {len(traj.steps)} steps)")
        return env
    if len(traj.steps) > task.max_steps:
        prop.reject("unsolved", f"expert path needs {len(traj.steps)} steps, over the task's limit of {task.max_steps}")
        return env
    try:
        annotated = apply_annotations(traj, teacher.annotate(traj, instructions), source="synthetic")
    except TeacherError as exc:
        if "endpoint failed" in str(exc):  # the teacher is unreachable: stop, as stage 1 does
            raise
        prop.reject("annotation_failed", f"teacher annotation failed: {_msg(exc)}")
        return env
    prop.status, prop.reason = "solved", ""
    result.trajectories.append(annotated)
    result.tasks.append(task)
    return env


def _restart(env: Env) -> None:
    """Close a broken env; the next proposal gets a fresh one."""
    try:
        env.close()
    except Exception:  # noqa: BLE001 - a broken env may fail to close; a fresh one is made on demand
        pass
    return None


def _msg(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split())[:400] or type(exc).__name__
