"""One configuration: a profile configures the definitions (partitions, resources, schedule), the CLI
and experiments; nothing in flywheel/ reads the environment at import time."""

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from envs import REGISTRY
from flywheel.core.validation import ConfigurationError
from flywheel.definitions import build_defs
from flywheel.profile import Profile, load_profile
from flywheel.resources import (
    ManagedVLLMPolicy,
    OpenAITeacherResource,
    ScriptedTeacherResource,
    TransformersPolicy,
)
from tests.helpers import assert_profile_refused

REPO = Path(__file__).resolve().parents[2]

PROFILE = """
benchmarks: [webshop]
iterations: 5
runs_dir: {runs}
model: {model}
policy_backend: vllm
loop_cron: "0 * * * *"
envs: {{train_limit: 7, spec_options: {{webshop: {{prompt: compact}}}}}}
policy: {{history_window: 2, samples_per_task: 3}}
loop: {{iterations: 4, patience: 3}}
teacher: {{base_url: "http://127.0.0.1:9/v1", model: some-teacher}}
"""


def write_profile(tmp_path, text=PROFILE, **fields) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text.format(runs=tmp_path / "runs", model=tmp_path / "model", **fields))
    return path


def test_defaults_are_every_benchmark_and_iterations_0_to_3():
    p = Profile()
    assert p.benchmarks == tuple(sorted(REGISTRY)) and p.iterations == 3
    res = p.resources()
    assert isinstance(res["policy"], TransformersPolicy) and isinstance(res["teacher"], ScriptedTeacherResource)
    assert res["loop"].iterations == 3 and res["store"].path == str(p.runs_path / "flywheel.duckdb")
    assert load_profile(None) == p and load_profile("") == p


def test_a_profile_configures_partitions_resources_and_schedule(tmp_path):
    profile = load_profile(write_profile(tmp_path))
    defs = build_defs(profile=profile)
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("teacher_quaternions")).partitions_def.get_partition_keys() == ["webshop"]
    keys = graph.get(dg.AssetKey("sft_checkpoint")).partitions_def.get_partition_keys()
    assert keys == [f"webshop|{k}" for k in range(6)]
    # the baselines' (b, k-1) -> (b, k) mapping follows the range too
    assert graph.get(dg.AssetKey("grpo_checkpoint")).partitions_def.get_partition_keys() == keys
    job = defs.resolve_job_def("iteration_job")
    assert job.partitions_def.get_partition_keys()[-1] == "webshop|5"
    dg.Definitions.validate_loadable(defs)  # what `dagster definitions validate` runs: checks share the partitions
    checks = {k.name for k in graph.asset_check_keys}
    assert checks == {"gated_dataset_is_usable", "seen_success_vs_previous", "checkpoint_is_promoted"}
    assert defs.resolve_schedule_def("flywheel_schedule").cron_schedule == "0 * * * *"
    res = defs.resources
    assert isinstance(res["policy"], ManagedVLLMPolicy) and res["policy"].history_window == 2
    assert res["policy"].base_model_path == str(tmp_path / "model")
    assert res["policy"].checkpoints_dir == str(tmp_path / "runs" / "checkpoints")
    assert res["store"].path == str(tmp_path / "runs" / "flywheel.duckdb")
    assert res["envs"].train_limit == 7 and res["loop"].iterations == 4 and res["loop"].patience == 3
    assert isinstance(res["teacher"], OpenAITeacherResource) and res["teacher"].model == "some-teacher"


def test_the_launchpad_accepts_the_profiles_teacher(tmp_path, monkeypatch):
    """The run config schema follows the profile's teacher class: `{base_url, model}` is valid config."""
    monkeypatch.setenv("FLYWHEEL_TEACHER_API_KEY", "sk-test")  # the key only ever comes from the environment
    defs = build_defs(profile=load_profile(write_profile(tmp_path)))
    job = defs.resolve_job_def("bootstrap_job")
    config = {"resources": {"teacher": {"config": {"base_url": "http://127.0.0.1:8000/v1", "model": "m"}}}}
    assert dg.validate_run_config(job, config)
    with pytest.raises(dg.DagsterInvalidConfigError):  # the scripted teacher (the default) has no base_url
        dg.validate_run_config(build_defs().resolve_job_def("bootstrap_job"), config)


@pytest.mark.parametrize("text, message", [
    ("benchmarks: [nosuch]\n", "Unknown benchmark 'nosuch'"),
    ("iterations: -1\n", "iterations must be an integer in 0..1000 (K: iterations 0..K), got -1"),
    ("policy_backend: tgi\n", "policy_backend must be one of"),
    ("polcy: {}\n", "unknown field(s) ['polcy']"),
    ("policy: {histroy_window: 2}\n", "unknown policy field(s) ['histroy_window']"),
    ("iterations: 2\nloop: {iterations: 3}\n", "raise the profile's iterations to at least 3"),
    ("iterations: 2\nmax_iteration: 2\n", "max_iteration is the old name of iterations and both are set"),
    ("loop: {iterations: 2, max_iterations: 2}\n", "loop.max_iterations is the old name of loop.iterations"),
    ("envs: [1, 2]\n", "section 'envs' must be a mapping"),
    ("- a\n- b\n", "must be a mapping of fields"),
])
def test_a_bad_profile_fails_before_any_work_naming_the_fix(tmp_path, text, message):
    assert_profile_refused(tmp_path, text, message)




def test_missing_profile_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigurationError, match="no such file"):
        load_profile(tmp_path / "nope.yaml")


def test_the_code_location_reads_flywheel_profile(tmp_path):
    """`workspace.yaml` loads flywheel.definitions:defs, which reads $FLYWHEEL_PROFILE when it loads."""
    path = write_profile(tmp_path)
    code = ("import dagster as dg; from flywheel.definitions import defs; "
            "d = defs() if callable(defs) else defs; "
            "print(d.resolve_job_def('iteration_job').partitions_def.get_partition_keys()[-1])")
    env = {"PATH": "/usr/bin:/bin", "FLYWHEEL_PROFILE": str(path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "webshop|5"


def test_cli_commands_read_the_profile(tmp_path, capsys):
    from flywheel.cli import build_parser, main
    from flywheel.drivers.demo import demo_profile, demo_resources

    path = write_profile(tmp_path)
    args = build_parser().parse_args(["--profile", str(path), "demo", "--benchmark", "webshop"])
    demo_profile(args)
    assert args.runs_dir == str(tmp_path / "runs" / "demo") and args.model == str(tmp_path / "model")
    res = demo_resources(args)
    assert isinstance(res["policy"], ManagedVLLMPolicy) and isinstance(res["teacher"], OpenAITeacherResource)
    assert res["policy"].samples_per_task == 3  # the profile's: the demo's --samples was not given
    assert res["store"].path == str(tmp_path / "runs" / "demo" / "flywheel.duckdb")
    assert main(["--profile", str(path), "report"]) == 2  # no store yet under the profile's runs_dir
    assert str(tmp_path / "runs" / "demo") in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("iterations: x\n")
    assert main(["--profile", str(tmp_path / "bad.yaml"), "report"]) == 2
    assert "iterations must be an integer in 0..1000" in capsys.readouterr().err


def _module_level_env_reads(path: Path) -> list[str]:
    """`os.environ` / `os.getenv` outside any function body: what runs when the module is imported."""
    tree = ast.parse(path.read_text())
    found: list[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if not in_function and isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(tree, False)
    return found


def test_nothing_in_flywheel_reads_the_environment_at_import_time():
    offenders = [hit for p in sorted((REPO / "flywheel").rglob("*.py")) for hit in _module_level_env_reads(p)]
    assert offenders == []
    # and the resources' defaults are constants: the same whatever the environment says
    code = ("from flywheel.resources import StoreResource, TransformersPolicy, LoopResource; "
            "print(StoreResource().path, TransformersPolicy().base_model_path, LoopResource().iterations)")
    outs = []
    for extra in ({}, {"FLYWHEEL_RUNS_DIR": "/elsewhere", "FLYWHEEL_BASE_MODEL": "/m", "FLYWHEEL_ITERATION_BUDGET": "1"}):
        env = {"PATH": "/usr/bin:/bin", **extra}
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        outs.append(out.stdout.strip().splitlines()[-1])
    assert outs[0] == outs[1] and outs[0].endswith(" 3")


def test_the_shipped_example_profile_loads():
    profile = load_profile(REPO / "profiles" / "example.yaml")
    assert profile.benchmarks == ("webshop", "scienceworld") and profile.iterations == 3
    res = profile.resources()
    assert res["loop"].iterations == 3 and res["envs"].spec_options["webshop"] == {"prompt": "compact"}


def test_each_policy_knob_is_declared_once_with_its_configs_default():
    """The policy resource exposes the knobs of TrainConfig, RolloutConfig and PromptShape under
    their own names and defaults, and hands every one of them on (no second default, no drop)."""
    import dataclasses

    from flywheel.core.prompting import PromptShape
    from flywheel.policy.sft import TrainConfig
    from flywheel.resources.policy import PolicyResource
    from flywheel.rollout.engine import RolloutConfig

    resource_fields = PolicyResource.model_fields
    shared = 0
    for config in (TrainConfig, RolloutConfig, PromptShape):
        for f in dataclasses.fields(config):
            if f.name in resource_fields and f.name != "ray":  # `ray` is the cluster config, turned into options
                shared += 1
                assert resource_fields[f.name].default == f.default, (config.__name__, f.name)
    assert resource_fields["max_train_steps"].default == TrainConfig.max_steps
    assert shared >= 14

    changed = PolicyResource(epochs=1.5, learning_rate=1e-3, batch_size=3, max_length=99, max_train_steps=7, lora=True,
                             lora_r=4, gradient_checkpointing=True, seed=5, temperature=0.3, max_new_tokens=17,
                             parallel_envs=3, history_mode="react", history_window=2, max_observation_chars=50)
    shape = PromptShape(history_mode="react", history_window=2, max_observation_chars=50)
    assert changed.train_config() == TrainConfig(epochs=1.5, learning_rate=1e-3, batch_size=3, max_length=99, max_steps=7,
                                                 lora=True, lora_r=4, lora_alpha=8, seed=5, gradient_checkpointing=True,
                                                 prompt=shape)
    rollout = changed.rollout_config(max_steps=4)
    assert rollout == RolloutConfig(temperature=0.3, max_new_tokens=17, parallel_envs=3, max_steps=4, prompt=shape, seed=5)
    assert changed.rollout_config(evaluation=True).temperature == 0.0
    with pytest.raises(ValueError, match="history_mode must be one of fused, react"):
        PolicyResource(history_mode="chat").prompt_shape()


def test_k_is_called_iterations_and_the_old_spellings_load_for_one_release_with_a_warning(tmp_path, caplog):
    """Issue 56: K is `iterations` in presets, profiles, the loop resource, the stop rules and the demo's flag; a
    profile's `max_iteration` and `loop.max_iterations` still load, warning with the new name."""
    import dataclasses

    from flywheel.cli import build_parser
    from flywheel.core.decisions import StopRules
    from flywheel.resources import LoopResource

    assert "iterations" in LoopResource.model_fields and "max_iterations" not in LoopResource.model_fields
    assert [f.name for f in dataclasses.fields(StopRules)][0] == "iterations"
    assert build_parser().parse_args(["demo", "--iterations", "2"]).iterations == 2
    old = write_profile(tmp_path, text="benchmarks: [webshop]\nmax_iteration: 4\nloop: {{max_iterations: 2}}\n")
    with pytest.warns(DeprecationWarning) as warned:
        profile = load_profile(old)
    assert profile.iterations == 4 and profile.resources()["loop"].iterations == 2
    texts = [str(w.message) for w in warned]
    assert any("max_iteration is deprecated" in t and "rename it to iterations" in t for t in texts)
    assert any("loop.max_iterations is deprecated" in t and "rename it to loop.iterations" in t for t in texts)
    assert "rename it to iterations" in caplog.text  # the log says it too, where warnings are not shown


def test_a_profile_written_by_to_yaml_loads_back_the_same(tmp_path):
    """`Profile.to_yaml` (the demo writes its own profile with it, for `make ui`) loses nothing: references,
    K, paths, backend, cadence and every section field come back equal."""
    profile = Profile(benchmarks=("tinybench", "webshop"), benchmark_refs={"tinybench": "tests.tinybench:SPEC"},
                      iterations=4, runs_dir=str(tmp_path / "runs"), model="tiny", loop_cron="0 * * * *",
                      sections={"envs": {"train_limit": 3, "spec_options": {"webshop": {"prompt": "compact"}}},
                                "loop": {"iterations": 2, "continue_on_empty_gate": True},
                                "teacher": {"base_url": "http://127.0.0.1:8000/v1", "model": "teacher"}})
    path = tmp_path / "written.yaml"
    path.write_text(profile.to_yaml())
    back = load_profile(path)
    assert dataclasses.replace(back, source="") == profile
    assert type(back.resources()["teacher"]).__name__ == "OpenAITeacherResource"
