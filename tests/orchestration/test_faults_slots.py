"""A SIGKILLed `sft_checkpoint` no longer deadlocks every later SFT on the instance.

A real run of `sft_checkpoint` (pool `accelerator`, limit 1 in dagster.yaml) on a persistent
instance is killed with SIGKILL mid-training, the way the OOM killer does it: the run stays
STARTED and keeps the pool's only slot. Before, the next SFT waited for that slot forever,
without a word. Now:
- while the holder is alive, the demo's start (`check_pool_free`) fails at once naming the run,
  its pid and the command that frees the slot;
- once it is dead, the next demo start marks it failed, frees its slot, and the next SFT runs.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest

from flywheel.orchestration.slots import PoolBusyError, check_pool_free
from flywheel.policy.models import build_tiny_model
from tests.fakes import store_with_seeds
from tests.loop_support import REPO_ROOT

CHILD = r'''
import os, sys, time
from pathlib import Path
import dagster as dg
import flywheel.assets.training as training_assets
from flywheel.orchestration import slots
from flywheel.assets.curriculum import CurriculumResource
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.sft import TrainResult
from flywheel.resources import EnvResource, StoreResource, TransformersPolicy

db, ck, mode, marker, model = sys.argv[1:6]

def fake_train(base, examples, out, cfg, progress=None):  # stands in for TRL: the pool and the kill are real
    Path(marker).write_text(str(os.getpid()))
    if mode == "slow":
        time.sleep(600)
    Path(out).mkdir(parents=True)
    (Path(out) / "config.json").write_text("{}")
    return TrainResult(path=str(out), n_examples=len(examples), n_dropped=0, train_loss=1.0, steps=1)

training_assets.train_sft = fake_train
instance = slots.ready_instance() if mode == "demo-start" else slots.command_instance()
job = build_defs({"store": StoreResource(path=db), "envs": EnvResource(), "curriculum": CurriculumResource(),
                  "policy": TransformersPolicy(base_model_path=model, checkpoints_dir=ck)}).resolve_job_def("iteration_job")
result = job.execute_in_process(partition_key=str(partition_key("scienceworld", 0)), instance=instance,
                                asset_selection=[dg.AssetKey("sft_checkpoint")], raise_on_error=False)
print("RUN", result.run_id, result.success, flush=True)
'''


def child(tmp_path, mode, marker):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "fw.duckdb"), str(tmp_path / "ck"), mode,
                             str(marker), str(tmp_path / "tiny")], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


@pytest.mark.slow
@pytest.mark.parametrize("freed_by", ["demo-start", "sensor-tick"])
def test_sft_after_a_sigkilled_sft_proceeds(tmp_path, freed_by):
    (tmp_path / "home").mkdir()
    shutil.copyfile(REPO_ROOT / "dagster.yaml", tmp_path / "home" / "dagster.yaml")
    store_with_seeds(tmp_path / "fw.duckdb")
    build_tiny_model(tmp_path / "tiny", vocab_size=300)  # only checked for: training is stood in for
    first = child(tmp_path, "slow", tmp_path / "training-1")
    deadline = time.monotonic() + 180
    while not (tmp_path / "training-1").exists():  # the SFT step holds the slot and is training
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the first SFT never started training"
        time.sleep(0.2)

    instance = dg.DagsterInstance.from_config(str(tmp_path / "home"))
    [held] = list(instance.event_log_storage.get_concurrency_info("accelerator").claimed_slots)
    started = time.monotonic()
    with pytest.raises(PoolBusyError) as err:  # alive: refuse at once, naming it
        check_pool_free(instance)
    assert time.monotonic() - started < 10
    msg = str(err.value)
    assert f"run {held.run_id}" in msg and f"pid {first.pid}" in msg and "python -m flywheel.cli free-slots" in msg

    os.kill(first.pid, signal.SIGKILL)  # what the OOM killer does
    first.wait(30)
    assert instance.get_run_by_id(held.run_id).status == dg.DagsterRunStatus.STARTED  # Dagster cannot tell

    if freed_by == "sensor-tick":  # under the daemon: the loop's next tick frees it
        from flywheel.resources import LoopResource, StoreResource
        from flywheel.sensors import loop_automation

        flywheel_sensor, _ = loop_automation()  # the defaults' sensor (every benchmark partition)

        with dg.build_sensor_context(instance=instance, last_sensor_start_time=time.time(), resources={
                "store": StoreResource(path=str(tmp_path / "fw.duckdb")), "loop": LoopResource()}) as ctx:
            flywheel_sensor(ctx)
        assert instance.event_log_storage.get_concurrency_info("accelerator").claimed_slots == []
    second = child(tmp_path, "demo-start" if freed_by == "demo-start" else "plain", tmp_path / "training-2")
    try:
        out, _ = second.communicate(timeout=180)  # before the fix: waits for the slot forever
    except subprocess.TimeoutExpired:
        second.kill()
        pytest.fail("the SFT after a killed SFT is still waiting for the pool slot after 180 s")
    assert second.returncode == 0 and "True" in out.splitlines()[-1], out[-3000:]
    if freed_by == "demo-start":
        assert f"freed pool slot(s) ['accelerator'] of run {held.run_id}" in out
    dead = instance.get_run_by_id(held.run_id)
    assert dead.status == dg.DagsterRunStatus.FAILURE
    assert instance.event_log_storage.get_concurrency_info("accelerator").claimed_slots == []
    failure = instance.all_logs(held.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)[-1]
    assert f"pid {first.pid} no longer running" in failure.message
