"""Shared by the loop tests: a small configuration of the test benchmark (tests/tinybench, pure
Python: no JVM) and an oracle *policy*.

The tiny random model never succeeds, so the gate would block every iteration. The oracle
policy (a test double for the policy only; env, store, gate, SFT and Dagster are real)
replays the teacher's quaternions for the training tasks after k+1 'look around' moves at
iteration k, so every iteration's successes are new action sequences and pass the gate.
The loop under test (sensor, schedule, backfills, run queue) does not depend on the benchmark;
the real-env end-to-end runs are tests/e2e/test_e2e_scienceworld.py and test_e2e_other_benchmarks.py.

`defs` at the bottom is a code location for the GraphQL/daemon test: it builds the same
resources from environment variables, in the code server and run worker processes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import dagster as dg
from dagster._core.launcher import LaunchRunContext, RunLauncher
from dagster._serdes import ConfigurableClass, ConfigurableClassData

from envs import get_benchmark
from flywheel.assets.curriculum import CurriculumResource
from flywheel.core.prompting import format_response
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import max_partition_for
from flywheel.policy.inference import Generation
from flywheel.profile import Profile
from flywheel.resources import EnvResource, LoopResource, PolicyResource, StoreResource
from tests.tinybench import NAME

BENCH = NAME
REFS = {BENCH: "tests.tinybench:SPEC"}  # named by reference, as a profile names it
REPO_ROOT = Path(__file__).resolve().parents[1]


def train_tasks(limit: int = 2) -> list[str]:
    """The training tasks `loop_resources` plays (the first `limit`)."""
    return [t.task_id for t in get_benchmark(BENCH, REFS).load_tasks("train", limit=limit)]


class OracleGenerator:
    def __init__(self, by_initial_obs, looks: int, model_id: str) -> None:
        self.by_initial_obs = by_initial_obs
        self.looks = looks
        self.model_id = model_id

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        out = []
        for messages in prompts:
            user = messages[-1]["content"]
            step = int(re.findall(r"\[Step (\d+)\] Respond", user)[-1]) - 1
            traj = next((t for obs, t in self.by_initial_obs.items() if user.startswith(obs)), None)
            i = step - self.looks
            if traj is None or i < 0 or i >= len(traj.steps):
                text = format_response("I should look first.", "Look around.", "look around")
            else:
                s = traj.steps[i]
                text = format_response(s.thought, s.plan, s.action)
            out.append(Generation(text, prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4))
        return out


class OraclePolicy(PolicyResource):
    """`fail_tasks`: training tasks the oracle never solves (it only looks around there)."""

    store_path: str
    benchmark: str = BENCH
    fail_tasks: list[str] = []
    extra_looks: int = 0  # looks on top of k+1: the second and later are no-progress steps the gate's cleaning cuts

    def generator(self, checkpoint_path, checkpoint_id):
        k = int(m.group(1)) if (m := re.search(r"-k(\d+)-", checkpoint_id)) else 0
        trajs = Store(self.store_path).load_trajectories(benchmark=self.benchmark, source="teacher")
        known = {t.initial_observation.strip(): t for t in trajs if t.task_id not in self.fail_tasks}
        return OracleGenerator(known, looks=k + 1 + self.extra_looks, model_id=checkpoint_id)


def loop_resources(root: str | Path, tiny: str, *, iterations: int = 1, fail_tasks=(), extra_looks: int = 0,
                   **loop) -> dict:
    root = Path(root)
    return {
        "store": StoreResource(path=str(root / "fw.duckdb")),
        "envs": EnvResource(benchmark_refs=REFS, train_limit=2, eval_limit=1, max_steps=13),
        "policy": OraclePolicy(store_path=str(root / "fw.duckdb"), base_model_path=tiny,
                               checkpoints_dir=str(root / "ck"), epochs=1, max_train_steps=1, batch_size=2,
                               history_window=2, max_observation_chars=300, samples_per_task=2, parallel_envs=1,
                               fail_tasks=list(fail_tasks), extra_looks=extra_looks),
        "curriculum": CurriculumResource(synthesize=False),
        # The oracle's k+1 looks are what makes each gate's successes new; cleaning would cut them (loop.clean_successes
        # is tested on its own: tests/e2e/test_tiny_benchmark.py, tests/rollout/test_replay.py).
        "loop": LoopResource(benchmarks=[BENCH], iterations=iterations, **{"clean_successes": False, **loop}),
    }


class RecordingRunLauncher(RunLauncher, ConfigurableClass):
    """A run launcher that only records which partition the run queue launched, in order."""

    launched: list[str] = []

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        self._inst_data = inst_data

    @property
    def inst_data(self):
        return self._inst_data

    @classmethod
    def config_type(cls):
        return {}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        RecordingRunLauncher.launched.append(context.dagster_run.tags["dagster/partition"])

    def terminate(self, run_id: str) -> bool:
        return False


ROOT_ENV = "FLYWHEEL_LOOP_TEST_ROOT"
MODEL_ENV = "FLYWHEEL_LOOP_TEST_MODEL"

def loop_profile(iterations: int = 1) -> Profile:
    """The partitions of the loop tests' definitions: the test benchmark, iterations 0..(at least the default)."""
    return Profile(benchmarks=(BENCH,), benchmark_refs=REFS, iterations=max_partition_for(iterations))


def loop_defs(root: str | Path, tiny: str, **kw) -> dg.Definitions:
    """`build_defs` over `loop_resources(root, tiny, **kw)` and `loop_profile`."""
    return build_defs(loop_resources(root, tiny, **kw), profile=loop_profile(kw.get("iterations", 1)))


defs = loop_defs(os.environ[ROOT_ENV], os.environ[MODEL_ENV]) if os.environ.get(ROOT_ENV) else None
