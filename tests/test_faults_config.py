"""Bad configuration fails fast, before any expensive work, with a message that names the fix.

Each case runs the real job: the resources' `setup_for_execution` stops the run at its first
step (no JVM started, no model loaded, no row written).
"""

import time

import dagster as dg
import pytest
import yaml

from envs.scienceworld import tasks as sw_tasks
from flywheel.definitions import build_defs
from flywheel.partitions import partition_key
from flywheel.pipeline import run_flywheel
from flywheel.resources import EnvResource, LoopResource, StoreResource, TransformersPolicy
from flywheel.store import Store
from flywheel.validation import ConfigurationError, check_data
from tests.loop_support import REPO_ROOT

BENCH = "scienceworld"


def errors_of(result) -> str:
    """Every error message of a failed run, causes included."""
    texts = []
    for e in result.all_events:
        err = getattr(e.event_specific_data, "error", None)
        while err is not None:
            texts.append(err.message)
            err = err.cause
    return "\n".join(texts)


def run(resources, job, key, assets):
    started = time.monotonic()
    result = build_defs(resources).resolve_job_def(job).execute_in_process(
        partition_key=str(key), instance=dg.DagsterInstance.ephemeral(), raise_on_error=False,
        asset_selection=[dg.AssetKey(a) for a in assets],
    )
    assert not result.success
    assert not [e for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"]
    return errors_of(result), time.monotonic() - started


def test_unknown_benchmark(tmp_path):
    store = StoreResource(path=str(tmp_path / "fw.duckdb"))
    msg, seconds = run({"store": store, "envs": EnvResource(task_types={"sciworld": ["x"]})},
                       "bootstrap_job", BENCH, ["expert_trajectories"])
    assert "Unknown benchmark 'sciworld' in envs.task_types" in msg and "Known: alfworld, scienceworld, webshop" in msg
    assert Store(tmp_path / "fw.duckdb").trajectory_table().height == 0 and seconds < 30  # no JVM was started
    # The Python driver refuses before its first run.
    with pytest.raises(ConfigurationError, match="Unknown benchmark 'sciworld'.*register a new benchmark"):
        run_flywheel("sciworld", resources={"store": store}, iterations=1, instance=dg.DagsterInstance.ephemeral())


def test_negative_budget(tmp_path):
    msg, _ = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "loop": LoopResource(max_iterations=-1)},
                 "iteration_job", partition_key(BENCH, 0), ["gated_dataset"])
    assert "budget K must be >= 0, got -1" in msg and "set loop.max_iterations" in msg
    with pytest.raises(ConfigurationError, match="iterations must be in 0..3"):
        run_flywheel(BENCH, resources={}, iterations=-1, instance=dg.DagsterInstance.ephemeral())


def test_missing_model_path(tmp_path):
    policy = TransformersPolicy(base_model_path=str(tmp_path / "no-model"), checkpoints_dir=str(tmp_path / "ck"))
    msg, seconds = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "policy": policy},
                       "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint"])
    assert f"No Hugging Face model at {tmp_path / 'no-model'}" in msg and "make model" in msg
    assert not (tmp_path / "ck").exists() and seconds < 30  # nothing was trained


def test_missing_data(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "no-data"))
    msg, _ = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb"))}, "bootstrap_job", BENCH, ["expert_trajectories"])
    assert f"Data folder {tmp_path / 'no-data'} does not exist" in msg and "set FLYWHEEL_DATA_DIR" in msg
    (tmp_path / "no-data").mkdir()  # a folder without the benchmark's files
    sw_tasks._read_json.cache_clear()  # split files read earlier in this process are cached
    with pytest.raises(ConfigurationError, match="data missing for split 'train'.*set FLYWHEEL_DATA_DIR"):
        check_data(BENCH)
    sw_tasks._read_json.cache_clear()


def test_shipped_instance_config_retries_runs_and_orders_iterations():
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides=config) as instance:
        assert instance.run_retries_enabled and instance.run_retries_max_retries >= 1
        queue = instance.get_concurrency_config().run_queue_config
        assert {"key": "flywheel/benchmark", "limit": 1, "value": {"applyLimitPerUniqueValue": True}} in queue.tag_concurrency_limits


def test_unknown_spec_option(tmp_path):
    envs = EnvResource(spec_options={BENCH: {"promt": "compact"}})
    msg, seconds = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": envs},
                       "bootstrap_job", BENCH, ["expert_trajectories"])
    assert "Unknown option(s) ['promt'] for benchmark 'scienceworld'. Valid: prompt" in msg and seconds < 30
    bad_value = EnvResource(spec_options={BENCH: {"prompt": "tiny"}})
    msg, _ = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": bad_value},
                 "bootstrap_job", BENCH, ["expert_trajectories"])
    assert "Unknown ScienceWorld prompt 'tiny'. Valid: full, compact" in msg
