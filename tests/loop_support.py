"""Shared by the loop tests: a small real-ScienceWorld configuration and an oracle *policy*.

The tiny random model never succeeds, so the gate would block every iteration. The oracle
policy (a test double for the policy only; env, store, gate, SFT and Dagster are real)
replays the teacher's quaternions for the training tasks after k+1 'look around' moves at
iteration k, so every iteration's successes are new action sequences and pass the gate.

`defs` at the bottom is a code location for the GraphQL/daemon test: it builds the same
resources from environment variables, in the code server and run worker processes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from flywheel.assets.curriculum import CurriculumResource
from flywheel.definitions import build_defs
from flywheel.policy.inference import Generation
from flywheel.prompting import format_response
from flywheel.resources import EnvResource, LoopResource, PolicyResource, StoreResource
from flywheel.store import Store

BENCH = "scienceworld"
TASK_TYPES = {BENCH: ["find-non-living-thing"]}


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
                text = format_response(s.elaborate, s.plan, s.action)
            out.append(Generation(text, prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4))
        return out


class OraclePolicy(PolicyResource):
    store_path: str

    def generator(self, checkpoint_path, checkpoint_id):
        k = int(m.group(1)) if (m := re.search(r"-k(\d+)-", checkpoint_id)) else 0
        trajs = Store(self.store_path).load_trajectories(benchmark=BENCH, source="teacher")
        return OracleGenerator({t.initial_observation.strip(): t for t in trajs}, looks=k + 1, model_id=checkpoint_id)


def loop_resources(root: str | Path, tiny: str, *, max_iterations: int = 1, **loop) -> dict:
    root = Path(root)
    return {
        "store": StoreResource(path=str(root / "fw.duckdb")),
        "envs": EnvResource(task_types=TASK_TYPES, train_limit=2, eval_limit=1, max_steps=13),
        "policy": OraclePolicy(store_path=str(root / "fw.duckdb"), base_model_path=tiny,
                               checkpoints_dir=str(root / "ck"), epochs=1, max_train_steps=1, batch_size=2,
                               history_window=2, max_observation_chars=300, samples_per_task=2, parallel_envs=2),
        "curriculum": CurriculumResource(synthesize=False),
        "loop": LoopResource(benchmarks=[BENCH], max_iterations=max_iterations, **loop),
    }


ROOT_ENV = "FLYWHEEL_LOOP_TEST_ROOT"
MODEL_ENV = "FLYWHEEL_LOOP_TEST_MODEL"

defs = build_defs(loop_resources(os.environ[ROOT_ENV], os.environ[MODEL_ENV])) if os.environ.get(ROOT_ENV) else None
