"""Batched multi-environment rollouts.

N environments run side by side. With a local batching backend (transformers), at every
tick the prompts of all live episodes go to the generator as one batch and the env steps
run in parallel threads (the JVM / engine calls release the GIL). With a server that
batches concurrent requests itself (vLLM), every env slot plays its own episodes in its
own thread and no episode waits for another's answer (`RolloutConfig.scheduling`).
`parallel_envs=1` is the one-episode-at-a-time loop other harnesses use, kept for comparison.

`RolloutConfig.backend="ray"` puts the env slots in Ray actors (`flywheel.rollout.ray_pool`); the
engine, the batched generation and the writes stay here, in the driver.

History lives here, not in the env. An env crash (`EnvError`) marks the episode
errored after `max_env_retries` restarts; errored is not failed.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from envs.base import Env, EnvError, StepResult, Task
from flywheel.core.options import Bound, option
from flywheel.core.prompting import INVALID_FORMAT_OBSERVATION, HistoryItem, PromptShape, parse_response
from flywheel.core.store import Store
from flywheel.core.trajectory import Source, Step, Trajectory
from flywheel.policy.inference import Generator, clip_answer
from flywheel.policy.ray_session import RayOptions
from flywheel.rollout.ray_pool import generator_started, ray_env_slots

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutConfig:
    temperature: float = option(0.7, help="sampling temperature of training rollouts", sft0=False,
                                bound=Bound(0, 5, integer=False))
    max_new_tokens: int = option(256, help="tokens generated per step at most (generation also stops at the "
                                           "action line)", sft0=False,
                                 bound=Bound(1, 8_192, why="tokens generated per step"))
    parallel_envs: int = option(8, help="envs played side by side (one generation batch)", sft0=False,
                                play=False,
                                bound=Bound(1, 256, why="envs played side by side"))
    max_steps: int | None = option(None, help="env steps per episode at most, on top of each task's own limit (the "
                                              "envs resource's max_steps; null: the task's)", sft0=False,
                                   bound=Bound(1, 1_000))
    prompt: PromptShape = option(PromptShape(), help="history mode, window and clipping of each step's prompt "
                                                     "(flywheel.core.prompting)")
    max_env_retries: int = option(2, help="an episode whose env fails (EnvError) is restarted on a fresh env up to "
                                          "this many times before it is recorded as errored", sft0=False,
                                  play=False,
                                  bound=Bound(0, 100))
    seed: int = option(0, help="the rollouts' sampling seed (policy.rollout_seed, else policy.seed)", sft0=False,
                       greedy=False, bound=Bound(0, 2**32 - 1))
    backend: Literal["local", "ray"] = option("local", help='where env slots live: "local" (this process) or "ray" '
                                                            '(Ray actors; flywheel.rollout.ray_pool)', sft0=False,
                                       play=False)
    ray: RayOptions | None = option(None, help='the cluster and per-actor resources of backend "ray"', sft0=False,
                                  play=False)
    scheduling: Literal["auto", "ticks", "per_episode"] = option(
        "auto", help='"ticks": one batched generate per env step of every slot; "per_episode": a thread per slot, '
                     'one prompt per call (servers that batch concurrent requests); "auto": by the generator',
        sft0=False, play=False)


@dataclass
class _Episode:
    task: Task
    sample: int
    initial_observation: str
    history: list[HistoryItem] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    attempts: int = 1
    last: StepResult | None = None


@dataclass
class _Slot:
    env: Env | None = None
    episode: _Episode | None = None


@dataclass(frozen=True)
class ResumePlan:
    """What a (re-)run of a rollout partition must play, given what the store already holds."""

    todo: list[tuple[Task, int]]
    done: set[tuple[str, int]]
    stale_ids: list[str]  # rows to delete first: another checkpoint's, or pairs no longer planned

    @property
    def resumed(self) -> int:
        return len(self.done)


def plan_resume(jobs: list[tuple[Task, int]], existing: Iterable[Mapping[str, object]], model_id: str) -> ResumePlan:
    """Keep finished episodes of *this* checkpoint; replay only the missing (task, sample) pairs.

    `existing` are the partition's trajectory rows (task_id, sample, model_id, status, traj_id).
    Errored episodes are played again. Rows of another checkpoint of the same iteration are
    stale (the partition is replaced, never mixed), as are pairs the plan no longer contains.
    """
    rows = list(existing)
    planned = {(t.task_id, s) for t, s in jobs}
    if any(r["model_id"] != model_id for r in rows):
        return ResumePlan(list(jobs), set(), [str(r["traj_id"]) for r in rows])
    done = {(str(r["task_id"]), int(r["sample"])) for r in rows if r["status"] == "ok"} & planned  # type: ignore[call-overload]
    stale = [str(r["traj_id"]) for r in rows if (r["task_id"], r["sample"]) not in planned]
    return ResumePlan([(t, s) for t, s in jobs if (t.task_id, s) not in done], done, stale)


def resume_rollouts(
    db: Store,
    jobs: list[tuple[Task, int]],
    *,
    scope: dict[str, object],
    checkpoint_id: str,
    **run_kwargs: object,
) -> ResumePlan:
    """Play the (task, sample) pairs of a store partition that are not finished yet.

    Each finished episode is written at once (tagged with `checkpoint_id`), so a run killed
    at any point (SIGKILL included) loses at most the episodes in flight; the next call
    keeps everything written and plays only the missing pairs. This is what the `rollouts`
    asset runs; `run_kwargs` go to `run_rollouts`.
    """
    [plan] = resume_partitions(db, [(jobs, scope)], checkpoint_id=checkpoint_id, **run_kwargs)
    return plan


def resume_partitions(
    db: Store,
    partitions: list[tuple[list[tuple[Task, int]], dict[str, object]]],
    *,
    checkpoint_id: str,
    **run_kwargs: object,
) -> list[ResumePlan]:
    """`resume_rollouts` for several store partitions (jobs, scope) at once, in one rollout call so that all
    their episodes share the generation batch (an evaluation's seen and unseen splits); a plan per partition."""
    plans = [plan_resume(jobs, db.trajectory_table(**scope).iter_rows(named=True), checkpoint_id)
             for jobs, scope in partitions]
    db.delete_trajectory_ids([i for plan in plans for i in plan.stale_ids])
    # An episode is stored under its partition's split: the task's own, except where a partition plays tasks of
    # one split as another (the promotion gate's validation tasks are training tasks, stored as "validation").
    splits = {(task.task_id, sample): scope["split"] for jobs, scope in partitions if "split" in scope
              for task, sample in jobs}

    def write(trajs: list[Trajectory]) -> None:
        for t in trajs:
            t.model_id = checkpoint_id
            t.split = str(splits.get((t.task_id, t.sample), t.split))
        db.write_trajectories(trajs)

    run_rollouts([job for plan in plans for job in plan.todo], on_finished=write, **run_kwargs)  # type: ignore[arg-type]
    return plans


def goal_of(task: Task, initial_observation: str) -> str:
    return task.goal or initial_observation.strip().split("\n", 1)[0][:300]


def run_rollouts(
    jobs: list[tuple[Task, int]],
    *,
    make_env: Callable[[], Env],
    cfg: RolloutConfig = RolloutConfig(),
    **kwargs: Any,
) -> list[Trajectory]:
    """Play every (task, sample) job; return trajectories in job order.

    `cfg.backend` picks where the env slots live; the engine (`_play`: batched generation
    here, episodes handed to `on_finished` here as they finish) is the same for both. With
    "ray", `make_env` is shipped to Ray actors, each owning `cfg.ray.envs_per_actor` envs.
    Other keyword arguments: see `_play`.
    """
    if cfg.backend == "local" or not jobs:
        return _play(jobs, make_env=make_env, cfg=cfg, **kwargs)
    if cfg.backend != "ray":
        raise ValueError(f"unknown rollout backend {cfg.backend!r}: use 'local' or 'ray'")

    n_slots = max(1, min(cfg.parallel_envs, len(jobs)))
    with ray_env_slots(make_env, cfg.ray or RayOptions(), n_slots) as pool, generator_started(kwargs.get("generator")):
        return _play(jobs, make_env=pool.make_env, cfg=cfg, **kwargs)


def _play(
    jobs: list[tuple[Task, int]],
    *,
    make_env: Callable[[], Env],
    generator: Generator,
    instructions: str,
    normalize_action: Callable[[str], str],
    source: Source = "policy",
    iteration: int = 0,
    cfg: RolloutConfig = RolloutConfig(),
    on_finished: Callable[[list[Trajectory]], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """The engine behind `run_rollouts`, in one of two schedules (`RolloutConfig.scheduling`).

    "ticks": one batched generate call per tick over all live episodes, then every env steps;
    a tick lasts as long as its longest answer, and envs reset between ticks. What a local
    batching backend (transformers) needs.
    "per_episode": every slot is a thread that plays its episodes on its own (prompt, answer,
    step, next prompt), each generate call carrying one prompt; a server that batches
    concurrent requests continuously (vLLM) then never waits for a tick's straggler, and env
    steps and resets overlap other episodes' generation. "auto" picks it for generators that
    declare `concurrent = True`.
    """
    return _Rollout(jobs, make_env=make_env, generator=generator, instructions=instructions,
                    normalize_action=normalize_action, source=source, iteration=iteration, cfg=cfg,
                    on_finished=on_finished, progress=progress).run(resolve_scheduling(cfg, generator))


class _Rollout:
    """One `_play` call: the job queue, the env slots, the results, and the lock and stop flag that the slot
    threads share; its methods are an episode's steps (start, prompt, act, record, finish) and the two
    schedules' loops (`play_slot` per episode, `fill` and the tick loop in `run`)."""

    def __init__(self, jobs: list[tuple[Task, int]], *, make_env: Callable[[], Env], generator: Generator,
                 instructions: str, normalize_action: Callable[[str], str], source: Source, iteration: int,
                 cfg: RolloutConfig, on_finished: Callable[[list[Trajectory]], None] | None,
                 progress: Callable[[int, int], None] | None) -> None:
        self.jobs = jobs
        self.make_env = make_env
        self.generator = generator
        self.instructions = instructions
        self.normalize_action = normalize_action
        self.source = source
        self.iteration = iteration
        self.cfg = cfg
        self.on_finished = on_finished
        self.progress = progress
        self.queue: deque[tuple[int, Task, int]] = deque((i, t, s) for i, (t, s) in enumerate(jobs))
        self.slots = [_Slot() for _ in range(max(1, min(cfg.parallel_envs, len(jobs))))]
        self.order: dict[int, int] = {}
        self.results: dict[int, Trajectory] = {}
        self.lock = threading.Lock()  # guards queue/order/results and the callbacks (store writes) across slot threads
        # Set when the caller is interrupted (KeyboardInterrupt, SIGTERM through the CLI): slots take no new job and
        # hand on no more episodes, so the caller's cleanup (the vLLM server's stop) runs now, not after the queue.
        self.stopped = threading.Event()

    def finish(self, slot: _Slot, status: str = "ok", error: str = "") -> None:
        ep = slot.episode
        assert ep is not None
        last = ep.last
        traj = Trajectory(
            benchmark=ep.task.benchmark, split=ep.task.split, task_id=ep.task.task_id, source=self.source,
            iteration=self.iteration, sample=ep.sample, goal=goal_of(ep.task, ep.initial_observation),
            steps=ep.steps, success=bool(last and last.success) and status == "ok",
            reward=float(last.reward) if last and status == "ok" else 0.0,
            status=status, error=error, model_id=self.generator.model_id,
        )
        slot.episode = None
        with self.lock:
            if self.stopped.is_set():  # the caller is gone: an episode cut by the interrupt is not a result
                return
            self.results[self.order.pop(id(slot))] = traj
            if self.on_finished:
                self.on_finished([traj])
            if self.progress:
                self.progress(len(self.results), len(self.jobs))

    def restart_env(self, slot: _Slot) -> None:
        if slot.env is not None:
            try:
                slot.env.close()
            except Exception:  # noqa: BLE001 - a dead env may fail to close; we replace it anyway
                log.debug("closing a broken env failed", exc_info=True)
        slot.env = None  # `start` makes the next one, so a failing make_env() counts as an attempt

    def start(self, slot: _Slot, task: Task, sample: int, attempts: int = 1) -> str | None:
        """Reset the slot's env on a task; a crashing env is restarted up to the retry limit.

        Runs in a worker thread (JVM starts and task loads overlap); returns the error that
        made the episode errored, for the caller to record.
        """
        while True:
            try:
                if slot.env is None:
                    slot.env = self.make_env()
                obs = slot.env.reset(task)
                slot.episode = _Episode(task=task, sample=sample, initial_observation=obs, attempts=attempts)
                return None
            except EnvError as exc:
                if attempts > self.cfg.max_env_retries:
                    slot.episode = _Episode(task=task, sample=sample, initial_observation="", attempts=attempts)
                    return f"reset failed: {exc}"
                attempts += 1
                self.restart_env(slot)

    def take(self, slot: _Slot) -> tuple[int, Task, int] | None:
        with self.lock:
            if not self.queue or self.stopped.is_set():
                return None
            job = self.queue.popleft()
            self.order[id(slot)] = job[0]
            return job

    def step_one(self, slot: _Slot, action: str) -> StepResult | EnvError:
        try:
            assert slot.env is not None
            return slot.env.step(action)
        except EnvError as exc:
            return exc

    def prompt_of(self, slot: _Slot) -> list:
        ep = slot.episode
        assert ep is not None
        return self.cfg.prompt.messages(self.instructions, ep.initial_observation, ep.history)

    def record(self, slot: _Slot, gen, resp, action: str, res: StepResult | EnvError | None) -> None:
        """Apply one answer and its env step to the slot's episode: finish it, replay it on a
        fresh env after a crash, or leave it live for its next step."""
        ep = slot.episode
        assert ep is not None
        if gen.context_full:  # the history outgrew the policy's context: the episode ends here, failed
            self.finish(slot, "ok", f"ended at step {len(ep.steps) + 1}: the prompt no longer fits the policy's "
                        f"context ({gen.error})")
            return
        if gen.error:  # no answer even after the policy server's restarts: errored, as env crashes are
            self.finish(slot, "errored", f"generation failed: {gen.error}")
            return
        obs_before = ep.history[-1].observation if ep.history else ep.initial_observation
        if res is None:
            res = StepResult(INVALID_FORMAT_OBSERVATION, 0.0, False, False, {"invalid": True})
        if isinstance(res, EnvError):
            if ep.attempts > self.cfg.max_env_retries:
                self.finish(slot, "errored", f"env crashed: {res}")
                return
            self.restart_env(slot)  # replay from scratch on a fresh env
            task, sample, attempts = ep.task, ep.sample, ep.attempts + 1
            slot.episode = None
            error = self.start(slot, task, sample, attempts)
            if error:
                self.finish(slot, "errored", error)
            return
        ep.last = res
        ep.steps.append(
            Step(
                observation=obs_before, thought=resp.thought, plan=resp.plan,
                action=action if resp.well_formed else resp.action, next_observation=res.observation,
                reward=res.reward, done=res.done, invalid=bool(res.info.get("invalid", False)),
                prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens,
            )
        )
        ep.history.append(HistoryItem(plan=resp.plan, action=action, observation=res.observation, thought=resp.thought))
        limit = min(ep.task.max_steps, self.cfg.max_steps or ep.task.max_steps)
        if res.done or res.success or len(ep.steps) >= limit:
            self.finish(slot)

    def act(self, gen) -> tuple[Any, str]:
        resp = parse_response(clip_answer(gen.text, self.cfg.max_new_tokens))  # no backend answers more than its budget
        return resp, self.normalize_action(resp.action) if resp.well_formed else ""

    def play_slot(self, slot: _Slot) -> None:
        """per_episode: this slot's thread plays jobs from the shared queue until it is empty."""
        while (job := self.take(slot)) is not None:
            idx, task, sample = job
            error = self.start(slot, task, sample)
            if error:
                self.finish(slot, "errored", error)
                continue
            while slot.episode is not None and not self.stopped.is_set():
                ep = slot.episode
                # One seed per (job, step, attempt): reproducible whatever order the threads run in.
                seed = self.cfg.seed + (idx * 1_009 + len(ep.steps)) * 8 + ep.attempts
                [gen] = self.generator.generate([self.prompt_of(slot)], temperature=self.cfg.temperature,
                                                max_new_tokens=self.cfg.max_new_tokens, seed=seed)
                if self.stopped.is_set():  # the answer came after the interrupt (or failed because of it)
                    return
                resp, action = self.act(gen)
                res = self.step_one(slot, action) if resp.well_formed and not gen.error else None
                self.record(slot, gen, resp, action, res)

    def fill(self, pool: ThreadPoolExecutor) -> None:
        """ticks: give every idle slot the next job; envs start and reset side by side."""
        while True:
            batch = []
            for slot in self.slots:
                if slot.episode is None and (job := self.take(slot)) is not None:
                    batch.append((slot, job[1], job[2]))
            if not batch:
                return
            errors = list(pool.map(lambda job: self.start(*job), batch))
            for (slot, _, _), error in zip(batch, errors, strict=True):
                if error:  # the slot is idle again and takes the next job
                    self.finish(slot, "errored", error)

    def play_ticks(self, pool: ThreadPoolExecutor) -> None:
        """ticks: one batched generate call over every live episode, then every env steps (on `pool`)."""
        self.fill(pool)
        tick = 0
        while any(s.episode for s in self.slots):
            live = [s for s in self.slots if s.episode]
            gens = self.generator.generate(
                [self.prompt_of(s) for s in live], temperature=self.cfg.temperature,
                max_new_tokens=self.cfg.max_new_tokens, seed=self.cfg.seed + tick,
            )
            tick += 1
            acted = [self.act(g) for g in gens]
            futures = [
                pool.submit(self.step_one, s, a) if r.well_formed and not g.error else None
                for s, g, (r, a) in zip(live, gens, acted, strict=True)
            ]
            for slot, gen, (resp, action), fut in zip(live, gens, acted, futures, strict=True):
                self.record(slot, gen, resp, action, fut.result() if fut is not None else None)
            self.fill(pool)

    def run(self, scheduling: str) -> list[Trajectory]:
        """Play every job in `scheduling` ("ticks" or "per_episode"); the trajectories in job order."""
        pool = ThreadPoolExecutor(max_workers=len(self.slots))
        try:
            if scheduling == "per_episode":
                pending = {pool.submit(self.play_slot, slot) for slot in self.slots}
                while pending:  # waits of at most 1 s: a signal that another thread caught still reaches this one
                    done, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                    for fut in done:
                        fut.result()
            else:
                self.play_ticks(pool)
        except BaseException:
            # Not `with pool:`, whose exit joins the slot threads, and they played on through the rest of the queue
            # (a `kill` during an evaluation waited minutes, the vLLM server generating all the while). A slot thread
            # ends after the answer it waits for, which the server's stop cuts short.
            self.stopped.set()
            pool.shutdown(wait=False, cancel_futures=True)
            if (abandon := getattr(self.generator, "abandon", None)) is not None:
                abandon()  # an OpenAI-compatible generator: the slot threads stop waiting on requests in flight
            raise
        pool.shutdown()
        for slot in self.slots:
            if slot.env is not None:
                slot.env.close()
        return [self.results[i] for i in range(len(self.jobs))]


def resolve_scheduling(cfg: RolloutConfig, generator: Generator) -> str:
    if cfg.scheduling == "auto":
        return "per_episode" if getattr(generator, "concurrent", False) else "ticks"
    if cfg.scheduling not in ("ticks", "per_episode"):
        raise ValueError(f"unknown rollout scheduling {cfg.scheduling!r}: use 'auto', 'ticks' or 'per_episode'")
    return cfg.scheduling
