"""Rollouts through the Ray backend on a real local Ray cluster (2 CPUs), real envs.

(a) For a deterministic policy (greedy tiny model; a scripted expert that plays real actions),
    the Ray backend writes exactly the DuckDB rows the local backend writes, on ScienceWorld
    and WebShop.
(b) An env actor killed with `ray.kill` mid-run: its in-flight episodes are replayed on another
    actor, every (task, sample) is written exactly once, and the rows equal an undisturbed run;
    with no retries left they are recorded as errored (once), the others stay ok.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from dataclasses import replace

import pytest

from envs import get_benchmark
from flywheel.core.prompting import PromptShape
from flywheel.core.validation import ConfigurationError
from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.ray_session import RayOptions
from flywheel.resources import TransformersPolicy
from flywheel.resources.ray_cluster import RayConfig
from flywheel.rollout.engine import RolloutConfig, run_rollouts
from flywheel.rollout.ray_pool import RayGenerator
from tests.helpers import ExpertGenerator, expected_pairs, play, rows, tasks_of

ray = pytest.importorskip("ray", reason="the Ray backend needs the `ray` extra (make test installs it)")

OPTS = RayOptions(env_actor_cpus=0.5, envs_per_actor=2, max_actor_replacements=2)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, namespace="flywheel-test",
             log_to_driver=False)
    yield ray
    ray.shutdown()














# WebShop envs start in milliseconds: the default suite. ScienceWorld starts a JVM per env: slow tier.
BENCHMARKS = ["webshop", pytest.param("scienceworld", marks=pytest.mark.slow)]
MAX_STEPS = {"webshop": 6, "scienceworld": 10}  # room for the expert paths (ScienceWorld: 9 and 3 steps)


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_ray_backend_writes_the_same_rows_as_local(cluster, tiny, tmp_path, benchmark):
    spec = get_benchmark(benchmark)
    tasks = tasks_of(benchmark, 3)
    jobs = [(t, s) for t in tasks for s in range(2)]
    base = RolloutConfig(temperature=0.0, max_new_tokens=24, parallel_envs=4, max_steps=MAX_STEPS[benchmark],
                         prompt=PromptShape(max_observation_chars=300))
    ray_cfg = replace(base, backend="ray", ray=OPTS)
    policies = {"tiny": lambda: TransformersGenerator(tiny, max_batch_size=4, model_id="tiny"),
                "expert": lambda: ExpertGenerator(tasks, spec)}
    # WebShop's expert policy is compared with the local backend in the kill test below.
    for name in ["tiny"] if benchmark == "webshop" else ["tiny", "expert"]:
        make_gen = policies[name]
        local = rows(play(tmp_path / f"{name}-local.duckdb", benchmark, jobs, make_gen(), base))
        remote = rows(play(tmp_path / f"{name}-ray.duckdb", benchmark, jobs, make_gen(), ray_cfg))
        assert sorted((r["task_id"], r["sample"]) for r in remote[0]) == expected_pairs(jobs)
        assert remote == local, name
        if name == "expert":  # the envs really stepped: valid actions, real rewards, successes
            assert sum(r["success"] for r in remote[0]) >= 2 and all(r["status"] == "ok" for r in remote[0])
            assert not any(s["invalid"] for s in remote[1] if s["action"] != "look around")
    assert not [n for n in ray.util.list_named_actors() if n.startswith("flywheel-env-")], "env actors left behind"


@pytest.mark.slow  # ~20 s: keeps the default suite's Ray tests near a minute
def test_generation_in_a_ray_actor_writes_the_same_rows(cluster, tiny, tmp_path):
    """`ray.generation_actor`: the model is loaded in a Ray actor; the engine and the writes stay here."""
    tasks = tasks_of("webshop", 2)
    jobs = [(t, s) for t in tasks for s in range(2)]
    policy = TransformersPolicy(rollout_backend="ray", max_new_tokens=24, parallel_envs=4, eval_temperature=0.0,
                                max_observation_chars=300, max_batch_size=4,
                                ray=RayConfig(env_actor_cpus=0.5, envs_per_actor=2, generation_actor=True))
    cfg = policy.rollout_config(evaluation=True, max_steps=4)
    gen = policy.generator(tiny, "tiny")
    assert isinstance(gen, RayGenerator)
    remote = rows(play(tmp_path / "actor.duckdb", "webshop", jobs, gen, cfg))
    local = rows(play(tmp_path / "local.duckdb", "webshop", jobs,
                      TransformersGenerator(tiny, max_batch_size=4, model_id="tiny"), replace(cfg, backend="local")))
    assert remote == local and len(remote[0]) == 4
    with pytest.raises(RuntimeError, match="backend='ray'"):  # outside a Ray rollout call: a clear error
        gen.generate([[{"role": "user", "content": "hi"}]], temperature=0.0, max_new_tokens=2)


def kill_first_actor_at(call: int):
    killed = []

    def on_call(n: int) -> None:
        if n == call and not killed:
            name = sorted(a for a in ray.util.list_named_actors() if a.startswith("flywheel-env-"))[0]
            ray.kill(ray.get_actor(name))
            killed.append(name)
    return on_call, killed


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_killed_env_actor_replays_its_episodes_on_another_actor(cluster, tmp_path, caplog, benchmark):
    spec = get_benchmark(benchmark)
    tasks = tasks_of(benchmark, 3)
    jobs = [(t, s) for t in tasks for s in range(2)]
    cfg = RolloutConfig(temperature=0.0, parallel_envs=4, max_steps=MAX_STEPS[benchmark], backend="ray", ray=OPTS)
    on_call, killed = kill_first_actor_at(1)  # every slot (2 actors x 2 envs) is mid-episode
    with caplog.at_level(logging.WARNING, logger="flywheel.rollout.ray_pool"):
        db = play(tmp_path / "killed.duckdb", benchmark, jobs, ExpertGenerator(tasks, spec, on_call), cfg)
    assert killed and sum("lost" in r.message and killed[0] in r.message for r in caplog.records) == 1
    got = rows(db)
    assert sorted((r["task_id"], r["sample"]) for r in got[0]) == expected_pairs(jobs)  # once each
    assert all(r["status"] == "ok" for r in got[0])
    undisturbed = rows(play(tmp_path / "calm.duckdb", benchmark, jobs, ExpertGenerator(tasks, spec),
                            replace(cfg, backend="local")))
    assert got == undisturbed  # replayed from the start: no step recorded twice, nothing lost


@pytest.mark.slow  # ~30 s; the replay-on-another-actor kill test stays in the default suite
def test_killed_env_actor_without_retries_marks_its_episodes_errored_once(cluster, tmp_path):
    spec = get_benchmark("webshop")
    tasks = tasks_of("webshop", 2)
    jobs = [(t, s) for t in tasks for s in range(2)]
    cfg = RolloutConfig(temperature=0.0, parallel_envs=4, max_steps=6, max_env_retries=0, backend="ray", ray=OPTS)
    on_call, killed = kill_first_actor_at(1)
    db = play(tmp_path / "fw.duckdb", "webshop", jobs, ExpertGenerator(tasks, spec, on_call), cfg)
    trajs, _ = rows(db)
    assert killed and sorted((r["task_id"], r["sample"]) for r in trajs) == expected_pairs(jobs)
    errored = [r for r in trajs if r["status"] == "errored"]
    assert len(errored) == 2  # the killed actor's two in-flight episodes, nothing else
    assert all("env actor" in r["error"] and not r["success"] for r in errored)
    # A re-run (the asset's retry) keeps the finished episodes and plays the errored pairs again.
    again = rows(play(tmp_path / "fw.duckdb", "webshop", jobs, ExpertGenerator(tasks, spec),
                      replace(cfg, max_env_retries=2)))
    assert sorted((r["task_id"], r["sample"]) for r in again[0]) == expected_pairs(jobs)
    assert all(r["status"] == "ok" for r in again[0])


class HangingEnv:
    """A WebShop env whose every step after the first hangs (an engine stuck in a native call)."""

    def __init__(self) -> None:
        self.env, self.steps = get_benchmark("webshop").make_env(), 0

    def reset(self, task):
        return self.env.reset(task)

    def step(self, action):
        self.steps += 1
        if self.steps > 1:
            time.sleep(120)
        return self.env.step(action)

    def close(self):
        self.env.close()


@pytest.mark.slow  # ~15 s
def test_an_env_actor_that_stops_answering_is_taken_as_lost(cluster, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors import no test module
    spec = get_benchmark("webshop")
    tasks = tasks_of("webshop", 1)
    cfg = RolloutConfig(temperature=0.0, parallel_envs=1, max_steps=6, max_env_retries=1, backend="ray",
                        ray=replace(OPTS, call_timeout_s=10.0, envs_per_actor=1))
    started = time.monotonic()
    [traj] = run_rollouts([(tasks[0], 0)], make_env=HangingEnv, generator=ExpertGenerator(tasks, spec),
                          instructions=spec.system_prompt(), normalize_action=spec.normalize_action, cfg=cfg)
    assert time.monotonic() - started < 100  # two attempts cut at 10 s each, not two 120 s hangs
    # The replay's reset may also time out on a busy machine (a fresh actor starts its env first).
    assert traj.status == "errored" and re.search(r"did not answer (step|reset) within 10 s", traj.error)
    assert not [n for n in ray.util.list_named_actors() if n.startswith("flywheel-env-")]


def test_backend_is_chosen_by_resource_config():
    policy = TransformersPolicy(rollout_backend="ray", ray=RayConfig(address="ray://head:10001", env_actor_cpus=2,
                                                                     envs_per_actor=3), checkpoints_dir="/shared/ck")
    cfg = policy.rollout_config()
    assert cfg.backend == "ray" and cfg.ray is not None
    assert (cfg.ray.address, cfg.ray.env_actor_cpus, cfg.ray.envs_per_actor) == ("ray://head:10001", 2, 3)
    assert cfg.ray.storage_path == "/shared/ck/ray"
    assert TransformersPolicy().rollout_config().backend == "local"
    with pytest.raises(ConfigurationError, match="rollout_backend"):
        TransformersPolicy(rollout_backend="spark").rollout_config()
    with pytest.raises(ConfigurationError, match="envs_per_actor"):
        TransformersPolicy(rollout_backend="ray", ray=RayConfig(envs_per_actor=0)).rollout_config()
