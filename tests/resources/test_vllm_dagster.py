"""Rollouts and evaluation assets on the managed vLLM policy (stub server), real ScienceWorld, through Dagster.

The trainer is real (the tiny model); generation goes to the stub server that `ManagedVLLMPolicy`
launches on each checkpoint. Checked in DuckDB: the per-step token counts; and on the machine: no
server left after each run, or, with `keep_server`, one server swapping checkpoints by weight reload.
"""

import json
import sys
from pathlib import Path

import dagster as dg
import pytest

from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.vllm_server import ServerPool, group_alive
from flywheel.resources import EnvResource, LoopResource, ManagedVLLMPolicy, StoreResource

BENCH = "scienceworld"
STUB = str(Path(__file__).resolve().parents[1] / "vllm_stub_server.py")


def stub_events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run(defs, job, key, assets, instance):
    return defs.resolve_job_def(job).execute_in_process(
        partition_key=str(key), instance=instance, raise_on_error=False,
        asset_selection=[dg.AssetKey(a) for a in assets],
    )


@pytest.mark.parametrize("keep_server", [pytest.param(False, marks=pytest.mark.slow), True])  # one server per run: slow tier
def test_rollouts_and_evaluation_on_the_managed_server(tmp_path, tiny, keep_server):
    log = tmp_path / "stub.jsonl"
    pool = ServerPool()  # the driver's: keep_server keeps its server warm across the two runs
    policy = ManagedVLLMPolicy(
        base_model_path=tiny, checkpoints_dir=str(tmp_path / "ck"), epochs=1, max_new_tokens=24, samples_per_task=1,
        parallel_envs=2, batch_size=4, server_command=[sys.executable, STUB], server_env={"STUB_EVENTS": str(log)},
        compile_cache_dir=str(tmp_path / "cache"), start_timeout_s=30, keep_server=keep_server,
        server_pool=pool,
    )
    defs = build_defs({
        "store": StoreResource(path=str(tmp_path / "fw.duckdb")),
        "envs": EnvResource(task_types={BENCH: ["find-non-living-thing"]}, train_limit=2, eval_limit=1, max_steps=3),
        "policy": policy,
        # The tiny model solves nothing: train k=1 past the empty gate (what an experiment opts into).
        # No promotion gate: its validation episodes would swap the server's checkpoint more often than once per k.
        "loop": LoopResource(continue_on_empty_gate=True, promotion_gate=False),
    })
    instance = dg.DagsterInstance.ephemeral()
    try:
        assert run(defs, "bootstrap_job", BENCH, ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"],
                   instance).success
        # (the tiny model solves nothing, so the empty gate's blocking check fails this run by design)
        run(defs, "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"],
            instance)
        it1 = run(defs, "iteration_job", partition_key(BENCH, 1), ["sft_checkpoint", "evaluation"], instance)
        assert it1.success, [str(e.event_specific_data.error) for e in it1.all_events if e.is_step_failure]
        ev = stub_events(log)
        starts = [e for e in ev if e["kind"] == "start"]
        reloads = [e for e in ev if e["kind"] == "reload"]
        if keep_server:  # one server for both runs; k=1 swapped in by weight reload
            assert len(starts) == 1 and len(reloads) == 1 and "-k1" in Path(reloads[0]["model"]).name
            assert group_alive(starts[0]["pid"])
        else:  # a server per run, each gone when its run's resources were torn down
            assert len(starts) == 2 and not reloads
            assert not any(group_alive(s["pid"]) for s in starts)
    finally:
        pool.stop_all()
    assert not any(group_alive(s["pid"]) for s in starts)

    db = Store(tmp_path / "fw.duckdb")
    steps = db.query("SELECT s.prompt_tokens, s.completion_tokens, t.split, t.iteration FROM steps s "
                     "JOIN trajectories t USING (traj_id) WHERE t.source = 'policy'")
    # train rollouts of k=0, seen+unseen evaluation of k=0 and k=1; all through the server
    assert set(steps["split"]) == {"train", "seen", "unseen"} and set(steps["iteration"]) == {0, 1}
    # The stub's default reply up to its action line is 6 tokens; the prompt counts are the server's.
    assert set(steps["completion_tokens"]) == {6} and all(steps["prompt_tokens"] > 50)
    assert sum(e["kind"] == "request" for e in ev) == steps.height
