"""Faults in the rollout stage, on real ScienceWorld.

(a) A rollout process killed with SIGKILL mid-way: the episodes it wrote stay, the re-run
    plays only the missing (task, sample) pairs, nothing is duplicated, its JVMs die with it.
(b) A JVM that exits mid-episode: the adapter raises EnvError, the loop restarts the worker
    and replays the episode; after the retry limit the episode is *errored* (not failed),
    never passes the gate and is left out of success rates; the next task runs on a fresh JVM.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from envs import get_benchmark
from flywheel.core.gate import reward_gate
from flywheel.core.metrics import summarize
from flywheel.core.prompting import format_response
from flywheel.core.store import Store
from flywheel.policy.inference import Generation
from flywheel.rollout.engine import RolloutConfig, run_rollouts

REPO = Path(__file__).resolve().parents[2]
SCOPE = {"benchmark": "scienceworld", "iteration": 0, "source": "policy", "split": "train"}

CHILD = r'''
import json, sys, time
from envs import get_benchmark
from flywheel.policy.inference import Generation
from flywheel.core.prompting import format_response
from flywheel.rollout.engine import RolloutConfig, resume_rollouts
from flywheel.core.store import Store

db_path, out_dir, pace = sys.argv[1], sys.argv[2], float(sys.argv[3])
spec = get_benchmark("scienceworld")
tasks = spec.load_tasks("train", limit=3, task_types=("find-non-living-thing",))
jobs = [(t, s) for t in tasks for s in range(2)]
jvms = open(f"{out_dir}/jvms.txt", "a")

def make_env():
    env = spec.make_env()
    jvms.write(f"{env.pid}\n"); jvms.flush()
    return env

class Paced:  # looks around, slowly enough that the kill lands mid-run
    model_id = "paced"
    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        time.sleep(pace)
        return [Generation(format_response("Look first.", "Look.", "look around"), 5, 5) for _ in prompts]

db = Store(db_path)
scope = {"benchmark": "scienceworld", "iteration": 0, "source": "policy", "split": "train"}
plan_file = open(f"{out_dir}/plans.jsonl", "a")
def log_plan(todo):
    plan_file.write(json.dumps([[t.task_id, s] for t, s in todo]) + "\n"); plan_file.flush()

import flywheel.rollout.engine as rollout
original = rollout.run_rollouts
def recording(todo, **kw):
    log_plan(todo)
    return original(todo, **kw)
rollout.run_rollouts = recording
resume_rollouts(db, jobs, scope=scope, checkpoint_id="ck-0", make_env=make_env, generator=Paced(),
                instructions=spec.system_prompt(), normalize_action=spec.normalize_action, iteration=0,
                cfg=RolloutConfig(parallel_envs=2, max_steps=3))
'''


def start_child(tmp_path, pace):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "fw.duckdb"), str(tmp_path), str(pace)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def rows(db):
    return db.query("SELECT traj_id, task_id, sample, status, created_at FROM trajectories WHERE source = 'policy'")


def test_sigkilled_rollout_resumes_only_missing_pairs(tmp_path):
    db = Store(tmp_path / "fw.duckdb")
    child = start_child(tmp_path, pace=0.3)
    deadline = time.monotonic() + 240
    while rows(db).height < 2:  # let it write two finished episodes, then kill it mid-run
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no episode written in time"
        time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    assert child.returncode == -signal.SIGKILL
    before = rows(db)
    done = {(r["task_id"], r["sample"]) for r in before.iter_rows(named=True)}
    assert 2 <= len(done) < 6
    # Its JVMs do not outlive it (py4j's --die-on-broken-pipe).
    jvms = [int(p) for p in (tmp_path / "jvms.txt").read_text().split()]
    gone = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in jvms):
        assert time.monotonic() < gone, "a JVM outlived its killed rollout process"
        time.sleep(0.5)

    again = start_child(tmp_path, pace=0.0)
    assert again.wait(300) == 0, again.stderr.read().decode()[-2000:]
    plans = [json.loads(line) for line in (tmp_path / "plans.jsonl").read_text().splitlines()]
    assert len(plans[0]) == 6
    assert {tuple(p) for p in plans[1]} == {(t, s) for t in {p[0] for p in plans[0]} for s in range(2)} - done
    after = rows(db)
    assert after.height == 6 and after["traj_id"].n_unique() == 6  # all pairs, none twice
    kept = {r["traj_id"]: r["created_at"] for r in before.iter_rows(named=True)}
    assert all(r["created_at"] == kept[r["traj_id"]] for r in after.iter_rows(named=True) if r["traj_id"] in kept)
    assert db.query("SELECT count(*) FROM steps").item() == 6 * 3
    assert db.query("SELECT count(*) FROM steps WHERE traj_id NOT IN (SELECT traj_id FROM trajectories)").item() == 0


class JvmKiller:
    """Replays the expert path; kills the env's JVM at step 2 of the first two episodes."""

    model_id = "killer"

    def __init__(self, envs, expert):
        self.envs, self.expert = envs, expert
        self.episode, self.killed = -1, []

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        [messages] = prompts  # parallel_envs=1: one episode at a time
        step = int(re.findall(r"\[Step (\d+)\] Respond", messages[-1]["content"])[-1])
        if step == 1:
            self.episode += 1  # episodes: a (try 1), a (try 2), b
        if self.episode < 2 and step == 2:
            env = self.envs[-1]
            self.killed.append(env.pid)
            os.kill(env.pid, signal.SIGKILL)
            psutil.Process(env.pid).wait(10)
        action = self.expert[step - 1] if step - 1 < len(self.expert) else "look around"
        return [Generation(format_response("Think.", "Plan.", action), 5, 5)]


def test_jvm_crash_marks_episode_errored_and_restarts_worker():
    spec = get_benchmark("scienceworld")
    a, b = spec.load_tasks("train", limit=2, task_types=("find-non-living-thing",))
    envs = []

    def make_env():
        envs.append(spec.make_env())
        return envs[-1]

    gen = JvmKiller(envs, spec.expert_actions(b))
    try:
        trajs = run_rollouts([(a, 0), (b, 0)], make_env=make_env, generator=gen, instructions=spec.system_prompt(),
                             normalize_action=spec.normalize_action,
                             cfg=RolloutConfig(parallel_envs=1, max_env_retries=1, temperature=0.0))
    finally:
        for env in envs:
            env.close()
    crashed, fine = trajs
    assert crashed.status == "errored" and not crashed.success and "JVM" in crashed.error, crashed.error
    assert fine.status == "ok" and fine.success  # the next task ran on a restarted worker
    assert len(gen.killed) == 2 and len(envs) == 3  # first JVM, its replacement, a fresh one for task b
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in gen.killed)
    passed, stats = reward_gate(trajs)
    assert passed == [fine] and stats.errored == 1 and stats.failed == 0
    s = summarize(trajs)
    assert s["errored"] == 1 and s["episodes"] == 1 and s["success_rate"] == 1.0
