"""The Dagster definitions load, and the graph is what docs/assets.md says."""

import re

import dagster as dg
import pytest

from envs import REGISTRY
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import (
    DEFAULT_ITERATIONS,
    benchmark_of,
    flywheel_partitions,
    parse_key,
    partition_key,
)
from flywheel.sensors import iteration_run_tags

defs = build_defs()  # the defaults (no profile): every benchmark, iterations 0..3

EXPECTED_DEPS = {
    "expert_trajectories": set(),
    "teacher_quaternions": {"expert_trajectories"},
    "synthetic_curriculum": {"teacher_quaternions"},
    "sft_checkpoint": {"synthetic_curriculum"},
    "rollouts": {"sft_checkpoint"},
    "gated_dataset": {"rollouts"},
    "evaluation": {"sft_checkpoint"},
    # the dashboard (docs/dashboard.md)
    "flywheel_summary": {"evaluation"},
    # baselines (docs/method.md "Methods and baselines")
    "base_checkpoint": set(),
    "preference_pairs": {"rollouts"},
    "dpo_checkpoint": {"preference_pairs", "sft_checkpoint"},
    "grpo_checkpoint": {"sft_checkpoint"},
    "paper_report": set(),
}


def test_asset_graph_matches_the_docs():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == set(EXPECTED_DEPS)
    for asset, deps in EXPECTED_DEPS.items():
        parents = {p.to_user_string() for p in graph.get(dg.AssetKey(asset)).parent_keys}
        assert parents == deps, asset


def test_partitions_are_benchmark_by_iteration():
    graph = defs.resolve_asset_graph()
    stage12 = graph.get(dg.AssetKey("teacher_quaternions")).partitions_def
    assert set(stage12.get_partition_keys()) == set(REGISTRY) == {"alfworld", "scienceworld", "webshop"}
    for name in ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"]:
        assert graph.get(dg.AssetKey(name)).partitions_def == flywheel_partitions
    dims = {d.name: d.partitions_def.get_partition_keys() for d in flywheel_partitions.partitions_defs}
    assert dims["iteration"] == [str(k) for k in range(DEFAULT_ITERATIONS + 1)]
    assert "scienceworld|0" in flywheel_partitions.get_partition_keys()


def test_partition_keys_are_read_by_the_partitions_definition():
    assert parse_key("webshop|2") == ("webshop", 2) and parse_key(partition_key("alfworld", 3)) == ("alfworld", 3)
    assert parse_key("from-a-profile|7") == ("from-a-profile", 7)  # parsed, not checked against a range
    for bad in ["webshop", "a|b|c", "webshop|x", "webshop|-1", "|1", ""]:
        with pytest.raises(ValueError, match=re.escape(f"{bad!r} is not a flywheel partition key")):
            parse_key(bad)
    # Either kind of run partition names its benchmark (the env resource checks that benchmark's data).
    assert benchmark_of("webshop") == "webshop" and benchmark_of("tinybench|4") == "tinybench"
    assert benchmark_of(str(partition_key("alfworld", 0))) == "alfworld"
    assert iteration_run_tags("webshop|2", max_partition=3) == {
        "flywheel/benchmark": "webshop", "flywheel/iteration": "2", "dagster/priority": "-2"}
    with pytest.raises(ValueError, match="iteration 4 is outside 0..3"):
        iteration_run_tags("webshop|4", max_partition=3)
    with pytest.raises(ValueError, match="'webshop' is not a flywheel partition key"):
        iteration_run_tags("webshop", max_partition=3)


def test_gate_check_and_jobs_exist():
    check_keys = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert "gated_dataset_is_usable" in check_keys
    assert defs.resolve_job_def("iteration_job") and defs.resolve_job_def("bootstrap_job")


def test_resources_are_typed_and_swappable():
    from flywheel.resources import PolicyResource, StoreResource, TeacherResource

    res = defs.resources
    assert isinstance(res["teacher"], TeacherResource) and isinstance(res["policy"], PolicyResource)
    assert isinstance(res["store"], StoreResource)


def test_building_the_definitions_prints_no_warning_for_the_beta_apis_used_on_purpose():
    """Dagster's BetaWarning/PreviewWarning for the partition mappings and partitioned checks the project chose:
    silenced where the definitions are imported (flywheel/orchestration/__init__.py); shown once per place
    under -W default, so a fresh interpreter is the test."""
    import subprocess
    import sys

    code = "from flywheel.definitions import build_defs; build_defs().get_repository_def().get_all_jobs()"
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "BetaWarning" not in done.stderr and "PreviewWarning" not in done.stderr, done.stderr[-2000:]
