"""Rollouts on Ray: env slots live in Ray actors, generation stays in the driver.

The rollout engine (`flywheel.rollout.engine.run_rollouts`) is the same for both backends: it asks a
`make_env()` for env slots, batches the prompts of all live episodes into one `generate` call,
and writes each finished episode through `on_finished` in the driver (one DuckDB writer). With
`RolloutConfig(backend="ray")` the slots it gets are `RemoteEnv` handles: each is one env inside
an `EnvPoolActor`, a Ray actor that owns a pool of envs of one benchmark and survives many
episodes (a ScienceWorld JVM is started once per slot, not per episode).

Faults: an actor that dies (killed, OOM, lost node) makes every call on its slots raise
`EnvError`, which the engine already handles: it closes the slot, asks `make_env()` for a new
one, and replays the episode from its start; after `max_env_retries` the episode is recorded
as errored. `make_env()` never returns a slot on a dead actor: it picks a live actor with room
or starts a replacement (at most `max_actor_replacements` per pool). An episode is written only
once it finishes, so a replay can never count twice.

Replacements prefer other nodes than those lost actors ran on: the driver sees a lost node's actors
fail at once, but the GCS declares the node dead only after its health checks (~10 s), and in that
window plain SPREAD placed the first replacement on the dead node, which died too (two attempts per
episode, two replacements). The preference is soft, so on a one-machine cluster, where an actor was
merely killed, the replacement still starts on that machine.

No dagster here (the env code and this module run on Ray workers). `ray` is imported lazily,
so the local backend works without the `ray` extra installed.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from envs.base import Env, EnvError, StepResult, Task
from flywheel.policy.ray_session import RayOptions, import_ray, ray_session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvFactory:
    """A picklable `make_env`: what a Ray actor needs to build envs of one benchmark.

    (A closure over a Dagster resource does not pickle; this holds only plain options.)
    """

    benchmark: str
    spec_options: dict[str, Any] = field(default_factory=dict, hash=False)
    env_options: dict[str, Any] = field(default_factory=dict, hash=False)
    refs: dict[str, str] = field(default_factory=dict, hash=False)  # the benchmark's reference, if not registered

    def __call__(self) -> Env:
        from envs import configure_spec, get_benchmark

        spec = get_benchmark(self.benchmark, self.refs)
        return configure_spec(spec, self.spec_options).make_env(**self.env_options)


class EnvPoolActor:
    """A Ray actor holding envs of one benchmark, keyed by slot; envs live across episodes.

    Threaded (`max_concurrency` = slots + 1): the driver steps several slots of one actor at
    once, and the JVM / engine calls release the GIL as they do in the local backend.
    """

    def __init__(self, make_env: Callable[[], Env]) -> None:
        self._make_env = make_env
        self._envs: dict[int, Env] = {}

    def _env(self, slot: int) -> Env:
        env = self._envs.get(slot)
        if env is None:
            env = self._envs[slot] = self._make_env()
        return env

    def reset(self, slot: int, task: Task) -> str:
        return self._env(slot).reset(task)

    def step(self, slot: int, action: str) -> StepResult:
        return self._env(slot).step(action)

    def close(self, slot: int) -> None:
        env = self._envs.pop(slot, None)
        if env is not None:
            env.close()

    def close_all(self) -> None:
        for slot in list(self._envs):
            try:
                self.close(slot)
            except Exception:  # noqa: BLE001 - closing is best effort; the actor is killed next
                log.debug("closing env slot %s failed", slot, exc_info=True)

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return import_ray().get_runtime_context().get_node_id()


@dataclass
class _Actor:
    handle: Any
    name: str
    # `handle.node_id.remote()`, asked once at start: the small answer is kept in the driver, so
    # `lost()` can still read where the actor ran after its node is gone, with no call per step.
    node_ref: Any
    open_slots: int = 0
    alive: bool = True


class RemoteEnv:
    """One env slot inside an `EnvPoolActor`, behind the `Env` protocol.

    A dead actor (or an `EnvError` raised by the env inside it) surfaces as `EnvError`, so
    the engine's restart-and-replay path handles both the same way.
    """

    def __init__(self, pool: RayEnvPool, actor: _Actor, slot: int) -> None:
        self.pool, self.actor, self.slot = pool, actor, slot
        self.closed = False

    def _call(self, method: str, *args: Any) -> Any:
        ray = self.pool.ray
        if not self.actor.alive:
            raise EnvError(f"env actor {self.actor.name} is gone")
        try:
            return ray.get(getattr(self.actor.handle, method).remote(self.slot, *args),
                           timeout=self.pool.opts.call_timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self.pool.lost(self.actor, exc)
            raise EnvError(f"env actor {self.actor.name} lost: {type(exc).__name__}") from exc
        except ray.exceptions.GetTimeoutError as exc:
            self.pool.lost(self.actor, exc, kill=True)
            raise EnvError(f"env actor {self.actor.name} did not answer {method} within "
                           f"{self.pool.opts.call_timeout_s:g} s; taken as lost") from exc
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, EnvError):
                raise EnvError(str(cause)) from exc
            raise cause if isinstance(cause, BaseException) else exc from None

    def reset(self, task: Task) -> str:
        return self._call("reset", task)

    def step(self, action: str) -> StepResult:
        return self._call("step", action)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.release(self.actor)
        if self.actor.alive:
            try:
                self._call("close")
            except EnvError:  # a dying actor or env; the slot is given up either way
                log.debug("closing env slot %s failed", self.slot, exc_info=True)


class RayEnvPool:
    """Hands out env slots on live actors; starts actors on demand and replaces dead ones."""

    def __init__(self, make_env: Callable[[], Env], opts: RayOptions, n_slots: int) -> None:
        self.ray = import_ray()
        self.opts = opts
        self.per_actor = max(1, opts.envs_per_actor)
        self.planned_actors = max(1, math.ceil(n_slots / self.per_actor))
        self.max_actors = self.planned_actors + max(0, opts.max_actor_replacements)
        self.actors: list[_Actor] = []
        self.actors_lost = 0
        self.avoid_nodes: set[str] = set()  # nodes lost actors ran on; replacements prefer others
        self._next_slot = 0
        self._lock = threading.Lock()
        self._run = uuid.uuid4().hex[:8]
        self._cls = self.ray.remote(EnvPoolActor)
        try:
            self._factory_ref = self.ray.put(make_env)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises many types
            raise TypeError(
                f"the Ray backend ships make_env to its actors, and {make_env!r} does not pickle "
                f"({type(exc).__name__}: {exc}); pass a plain callable such as EnvResource.env_factory(benchmark)"
            ) from exc

    def _scheduling_strategy(self) -> Any:
        """SPREAD; once actors were lost, a soft preference for nodes none of them ran on."""
        if not self.avoid_nodes:
            return "SPREAD"
        from ray.util.scheduling_strategies import NodeLabelSchedulingStrategy, NotIn

        return NodeLabelSchedulingStrategy(hard={}, soft={"ray.io/node-id": NotIn(*sorted(self.avoid_nodes))})

    def _start_actor(self) -> _Actor:
        name = f"flywheel-env-{self._run}-{len(self.actors)}"
        options: dict[str, Any] = {
            "name": name, "num_cpus": self.opts.env_actor_cpus, "max_concurrency": self.per_actor + 1,
            "max_restarts": 0, "scheduling_strategy": self._scheduling_strategy(),
        }
        if self.opts.env_actor_memory_mb:
            options["memory"] = self.opts.env_actor_memory_mb * 2**20
        handle = self._cls.options(**options).remote(self._factory_ref)
        actor = _Actor(handle, name, handle.node_id.remote())
        self.actors.append(actor)
        return actor

    def _node_of(self, actor: _Actor) -> str | None:
        """Where the actor ran, if it said so before it was lost (never waits)."""
        ray = self.ray
        try:
            ready, _ = ray.wait([actor.node_ref], timeout=0)
            return ray.get(ready[0], timeout=0) if ready else None
        except Exception:  # noqa: BLE001 - it died before answering: the node stays unknown
            return None

    def make_env(self) -> RemoteEnv:
        """A slot on the least-loaded live actor with room; a new actor if none has room."""
        with self._lock:
            live = [a for a in self.actors if a.alive]
            roomy = [a for a in live if a.open_slots < self.per_actor]
            if roomy:
                actor = min(roomy, key=lambda a: a.open_slots)
            elif len(self.actors) < self.max_actors:
                actor = self._start_actor()
            elif live:  # replacements used up: crowd the live actors rather than fail
                actor = min(live, key=lambda a: a.open_slots)
            else:
                raise EnvError(f"no live env actor left ({len(self.actors)} started, all lost)")
            actor.open_slots += 1
            self._next_slot += 1
            return RemoteEnv(self, actor, self._next_slot)

    def release(self, actor: _Actor) -> None:
        with self._lock:
            actor.open_slots = max(0, actor.open_slots - 1)

    def lost(self, actor: _Actor, exc: BaseException, *, kill: bool = False) -> None:
        with self._lock:  # the node is noted before any thread can see the actor dead and replace it
            if not actor.alive:
                return
            node = self._node_of(actor)
            if node is not None:
                self.avoid_nodes.add(node)
            actor.alive = False
            self.actors_lost += 1
        if kill:
            try:
                self.ray.kill(actor.handle)
            except Exception:  # noqa: BLE001 - already gone
                log.debug("killing env actor %s failed", actor.name, exc_info=True)
        log.warning("env actor %s lost (%s) on node %s; its episodes are replayed on another actor",
                    actor.name, type(exc).__name__, node or "unknown")

    def shutdown(self) -> None:
        ray = self.ray
        live = [a for a in self.actors if a.alive]
        try:
            ray.get([a.handle.close_all.remote() for a in live], timeout=60)
        except Exception:  # noqa: BLE001 - the actors are killed below anyway
            log.debug("closing env actors failed", exc_info=True)
        for a in self.actors:
            try:
                ray.kill(a.handle)
            except Exception:  # noqa: BLE001 - already dead
                pass
            a.alive = False


class GeneratorActor:
    """Holds one generator (model loaded once) and answers the driver's batched `generate` calls."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.generator = factory()

    def generate(self, prompts: list, kwargs: dict[str, Any]) -> list:
        return self.generator.generate(prompts, **kwargs)


class RayGenerator:
    """A `Generator` whose model lives in a Ray actor with its own CPUs/GPUs.

    The engine stays in the driver and still sends one batch per tick; only the forward passes
    move. The actor exists while `run_rollouts` (backend "ray") runs, inside its cluster session
    (`started()`); the checkpoint path must be readable where the actor lands (shared storage).
    """

    def __init__(self, factory: Callable[[], Any], opts: RayOptions, model_id: str) -> None:
        self.factory, self.opts, self.model_id = factory, opts, model_id
        self._actor: Any = None

    @contextmanager
    def started(self) -> Iterator[RayGenerator]:
        ray = import_ray()
        resources: dict[str, Any] = {"num_cpus": self.opts.generation_cpus, "max_restarts": 0}
        if self.opts.generation_gpus:
            resources["num_gpus"] = self.opts.generation_gpus
        self._actor = ray.remote(GeneratorActor).options(**resources).remote(self.factory)
        try:
            yield self
        finally:
            ray.kill(self._actor)
            self._actor = None

    def generate(self, prompts, *, temperature: float, max_new_tokens: int, seed: int | None = None):
        if self._actor is None:
            raise RuntimeError("RayGenerator runs inside run_rollouts with RolloutConfig(backend='ray')")
        ray = import_ray()
        kwargs = {"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}
        return ray.get(self._actor.generate.remote(prompts, kwargs))


@contextmanager
def generator_started(generator: Any) -> Iterator[None]:
    """Start a `RayGenerator`'s actor for one rollout call; any other generator runs as is."""
    if isinstance(generator, RayGenerator):
        with generator.started():
            yield
    else:
        yield


@contextmanager
def ray_env_slots(make_env: Callable[[], Env], opts: RayOptions, n_slots: int) -> Iterator[RayEnvPool]:
    """A `RayEnvPool` on the configured cluster for the length of one rollout call."""
    with ray_session(opts):
        pool = RayEnvPool(make_env, opts, n_slots)
        try:
            yield pool
        finally:
            pool.shutdown()
            log.info("rollouts on Ray: %d env actor(s) used (%d lost), %d env(s) each, %s CPU(s) each",
                     len(pool.actors), pool.actors_lost, pool.per_actor, opts.env_actor_cpus)
