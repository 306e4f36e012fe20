"""Bad configuration fails fast, before any expensive work, with a message that names the fix.

Each case runs the real job: the resources' `setup_for_execution` stops the run at its first
step (no JVM started, no model loaded, no row written).
"""

import time

import dagster as dg
import pytest
import yaml

from envs.scienceworld import tasks as sw_tasks
from flywheel.core.store import Store
from flywheel.core.validation import ConfigurationError, check_data
from flywheel.definitions import build_defs
from flywheel.drivers.pipeline import run_flywheel
from flywheel.orchestration.partitions import partition_key
from flywheel.resources import EnvResource, LoopResource, StoreResource, TransformersPolicy
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


def test_unknown_replay(tmp_path):
    policy = TransformersPolicy(base_model_path=str(tmp_path), refine_from="previous", replay="everything")
    msg, seconds = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "policy": policy},
                       "iteration_job", partition_key(BENCH, 1), ["sft_checkpoint"])
    assert "policy.replay must be 'matched', 'all' or 'none', got 'everything'" in msg and seconds < 30


def test_micro_batch_not_a_divisor(tmp_path):
    policy = TransformersPolicy(base_model_path=str(tmp_path), batch_size=8, micro_batch_size=3)
    msg, seconds = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "policy": policy},
                       "iteration_job", partition_key(BENCH, 1), ["sft_checkpoint"])
    assert "micro_batch_size=3 must divide batch_size=8" in msg and "set policy.micro_batch_size" in msg
    assert seconds < 30


def test_negative_budget(tmp_path):
    msg, _ = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "loop": LoopResource(iterations=-1)},
                 "iteration_job", partition_key(BENCH, 0), ["gated_dataset"])
    assert "budget K must be >= 0, got -1" in msg and "set loop.iterations" in msg
    with pytest.raises(ConfigurationError, match="iterations must be >= 0, got -1"):
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


# -- numeric options: validated before any work, one line naming the fix, exit 2 ------------------------------

@pytest.mark.parametrize("flags, named", [
    (["--train-tasks", "0"], "--train-tasks must be an integer in 1..100000"),
    (["--train-tasks", "-5"], "--train-tasks must be an integer in 1..100000"),
    (["--max-steps", "0"], "--max-steps must be an integer in 1..1000"),
    (["--max-steps", "-1"], "--max-steps must be an integer in 1..1000"),
    (["--samples", "1000000"], "--samples must be an integer in 1..256"),
    (["--samples", "0"], "--samples must be an integer in 1..256"),
    (["--samples", "200", "--train-tasks", "500"], "--train-tasks x --samples = 500 x 200 = 100,000 rollout episodes"),
    (["--parallel-envs", "0"], "--parallel-envs must be an integer in 1..256"),
    (["--batch-size", "0"], "--batch-size must be an integer in 1..1024"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer in 1..8192"),
    (["--dtype", "float99"], "--dtype must be one of auto, float32, bfloat16, float16, got 'float99'"),
    (["--lr", "0"], "--lr must be a number > 0 and <= 1"),
    (["--max-train-steps", "0"], "--max-train-steps must be an integer in 1..1000000 or -1 (use epochs)"),
])
def test_demo_numbers_are_checked_before_any_work(tmp_path, capsys, flags, named):
    from flywheel.cli import main

    runs = tmp_path / "runs"
    code = main(["demo", "--runs-dir", str(runs), "--model", str(tmp_path / "no-model"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and named in err, err
    assert err.count("\n") == 1 and "Traceback" not in err and ("set --" in err or "lower --" in err)
    assert not runs.exists()  # nothing written: not even the store


def test_config_error_exits_2_in_one_line_from_the_shell(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "flywheel.cli", "demo", "--runs-dir", str(tmp_path / "r"),
                           "--samples", "0"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "flywheel: error: --samples must be an integer in 1..256 (rollouts per training task), got 0: "
        "set --samples within that range."]


def test_demo_task_types_are_per_benchmark():
    from envs import get_benchmark
    from flywheel.cli import build_parser
    from flywheel.drivers.demo import demo_resources

    def types(*argv):
        return demo_resources(build_parser().parse_args(["demo", *argv]))["envs"].task_types

    assert types() == {"scienceworld": list(get_benchmark("scienceworld").demo_task_types)}
    assert types("--benchmark", "webshop") == {} and types("--benchmark", "alfworld") == {}
    assert types("--benchmark", "alfworld", "--task-types", "pick_and_place_simple") == {"alfworld": ["pick_and_place_simple"]}


def test_resources_use_the_same_bounds(tmp_path):
    policy = TransformersPolicy(base_model_path=str(tmp_path / "no-model"), checkpoints_dir=str(tmp_path / "ck"),
                                samples_per_task=0)
    msg, seconds = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "policy": policy},
                       "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint"])
    assert "policy.samples_per_task must be an integer in 1..256" in msg and seconds < 30
    bad_dtype = TransformersPolicy(base_model_path=str(tmp_path / "no-model"), dtype="float99")
    msg, _ = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "policy": bad_dtype},
                 "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint"])
    assert "policy.dtype must be one of auto, float32, bfloat16, float16" in msg
    msg, _ = run({"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": EnvResource(max_steps=0)},
                 "bootstrap_job", BENCH, ["expert_trajectories"])
    assert "envs.max_steps must be an integer in 1..1000" in msg
