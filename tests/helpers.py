"""Helpers shared by several test modules: running jobs, playing rollouts, checking refusals, the teacher
fault fixtures. Test doubles are in tests/fakes.py; no test module imports another test module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from envs import get_benchmark
from envs.alfworld import data as alf
from flywheel.core import quality
from flywheel.core.prompting import format_response
from flywheel.core.store import Store
from flywheel.core.trajectory import Step, Trajectory
from flywheel.core.validation import ConfigurationError
from flywheel.definitions import build_defs
from flywheel.policy.inference import Generation
from flywheel.profile import load_profile
from flywheel.resources import (
    OpenAITeacherResource,
    StoreResource,
)
from flywheel.rollout.engine import resume_rollouts
from tests.loop_support import REPO_ROOT

BENCH = "scienceworld"  # the teacher fault tests' benchmark


class ExpertGenerator:
    """Deterministic policy: the task's expert actions on even tasks, 'look around' on odd ones.

    `on_call(n)` runs in the driver before the n-th generate call (used to kill an actor).
    """

    model_id = "expert"

    def __init__(self, tasks, spec, on_call=None) -> None:
        keys = [t.goal for t in tasks]
        if not all(keys):  # ScienceWorld tasks have no goal text: key on the initial observation
            env = spec.make_env()
            keys = [env.reset(t).strip() for t in tasks]
            env.close()
        self.plays = [(k, spec.expert_actions(t) if i % 2 == 0 else []) for i, (k, t) in enumerate(zip(keys, tasks, strict=True))]
        self.on_call = on_call
        self.calls = 0

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        if self.on_call:
            self.on_call(self.calls)
        self.calls += 1
        out = []
        for messages in prompts:
            user = messages[-1]["content"]
            step = int(re.findall(r"\[Step (\d+)\] Respond", user)[-1]) - 1
            actions = next((a for key, a in self.plays if key in user), [])
            action = actions[step] if step < len(actions) else "look around"
            text = format_response(f"Step {step}.", "Follow the plan.", action)
            out.append(Generation(text, prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4))
        return out


def play(path, benchmark, jobs, generator, cfg):
    spec = get_benchmark(benchmark)
    db = Store(path)
    resume_rollouts(db, jobs, scope={"benchmark": benchmark, **SCOPE}, checkpoint_id="ck", make_env=spec.make_env,
                    generator=generator, instructions=spec.system_prompt(), normalize_action=spec.normalize_action,
                    cfg=cfg)
    return db


def rows(db: Store):
    trajs = db.query("SELECT * EXCLUDE (created_at) FROM trajectories ORDER BY traj_id").to_dicts()
    steps = db.query("SELECT * FROM steps ORDER BY traj_id, t").to_dicts()
    return trajs, steps


def expected_pairs(jobs):
    return sorted((t.task_id, s) for t, s in jobs)


def tasks_of(benchmark: str, n: int):
    types = ("find-non-living-thing",) if benchmark == "scienceworld" else None
    return get_benchmark(benchmark).load_tasks("train", limit=n, task_types=types)


def run(defs, job, key, assets, instance):
    return defs.resolve_job_def(job).execute_in_process(
        partition_key=str(key), instance=instance, raise_on_error=False,
        asset_selection=[dg.AssetKey(a) for a in assets],
    )


def check_results(result):
    return {e.event_specific_data.check_name: e.event_specific_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def assert_profile_refused(tmp_path, text: str, message: str) -> None:
    """Loading a profile of `text` fails with a ConfigurationError naming the file and `message`."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as err:
        load_profile(path)
    assert message in str(err.value) and str(path) in str(err.value)


ARCHIVE = REPO_ROOT.parent / "shared" / "data" / alf.ARCHIVE


def answer(n: int) -> str:
    return json.dumps({"steps": [{"thought": f"Thought {i}. Because.", "plan": f"plan {i}"} for i in range(n)]})


def experts(n_trajs: int = 3, n_steps: int = 2) -> list[Trajectory]:
    return [Trajectory(benchmark=BENCH, split="train", task_id=f"find-non-living-thing/{i}", source="expert",
                       goal="find a non-living thing", success=True, reward=1.0,
                       steps=[Step(observation=f"room {i}.{t}", thought="", plan="", action=f"go {t}",
                                   next_observation=f"room {i}.{t + 1}") for t in range(n_steps)])
            for i in range(n_trajs)]


def materialize_teacher(tmp_path, base_url, instance):
    teacher = OpenAITeacherResource(base_url=base_url, model="stub-model", max_retries=2, backoff_s=0.0)
    defs = build_defs({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "teacher": teacher})
    return defs.resolve_job_def("bootstrap_job").execute_in_process(
        partition_key=BENCH, instance=instance, raise_on_error=False,
        asset_selection=[dg.AssetKey("teacher_quaternions")],
    )


def failure_message(result) -> str:
    """The step failure as the UI shows it: Dagster's wrapper, then the cause chain."""
    [failure] = [e for e in result.all_events if e.is_step_failure]
    err, texts = failure.event_specific_data.error, []
    while err is not None:
        texts.append(err.message)
        err = err.cause
    return "\n".join(texts)


def files_containing(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]




SCOPE = {"iteration": 0, "source": "policy", "split": "train"}


def paper_checkpoint(k: int, wins: int, n: int = 10) -> dict:
    """An evaluated checkpoint for the paper's tables that solved tasks t0..t(wins-1) of n (so any two pair up
    exactly)."""
    return {"k": k, "splits": {"unseen": {"success": quality.rate(wins, n),
                                          "outcomes": {f"t{i}": i < wins for i in range(n)}}}}


def paper_arm(arm: str, method: str, checkpoints: dict, start_from: str | None = None) -> dict:
    """An arm as `flywheel.reports.paper.collect` lists it, on ScienceWorld."""
    return {"preset": "p", "arm": arm, "benchmark": "scienceworld", "method": method, "history_mode": "fused",
            "start_from": start_from, "checkpoints": checkpoints}


# A two-arm experiment on a tiny model (tests/drivers: arms across sittings, shared k=0 episodes).
TWO_ARMS = {
    "name": "two-sittings",
    "benchmark": "webshop",
    "iterations": 1,
    "model": "tiny",
    "envs": {"seed_limit": 2, "train_limit": 2, "eval_limit": 3, "max_steps": 3, "validation_tasks": 3},
    "policy": {"epochs": 1, "max_new_tokens": 16, "samples_per_task": 1, "parallel_envs": 3, "batch_size": 4},
    "curriculum": {"synthesize": False},
    "loop": {"adaptive_sampling": False},
    "continue_on_empty_gate": True,
    "arms": {"a": {}, "b": {"policy": {"rollout_seed": 7}, "method": {"start_from": "a", "evaluate_start": False}}},
    "compare": ["b@1 vs a@0", "a@last vs b@1"],
    "replicates": {"a": ["a"]},
}


def experiment_process(preset: Path, runs: Path, results: Path, *args: str) -> subprocess.CompletedProcess:
    """`flywheel experiment` in a process of its own (another sitting), with its own runs folder."""
    env = {**os.environ, "DAGSTER_HOME": str(runs.parent / "dagster_home"), "OMP_NUM_THREADS": "1"}
    (runs.parent / "dagster_home").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "flywheel.cli", "experiment", str(preset), "--runs-dir", str(runs),
                           "--results-dir", str(results), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
