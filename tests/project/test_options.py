"""Each option is declared once (flywheel/core/options.py): its default, help text, bound and k=0 role live on
one field, and the launchpad, the CLI, the bounds checks and the k=0-sharing rule read them from there."""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from flywheel.config.reference import CLASSES
from flywheel.core.decisions import StopRules
from flywheel.core.prompting import PromptShape
from flywheel.policy.dpo import DPOSettings
from flywheel.policy.grpo import GRPOSettings
from flywheel.policy.ray_session import RayOptions
from flywheel.policy.sft import TrainConfig
from flywheel.policy.vllm_server import ServerPool, VLLMServerConfig
from flywheel.resources import (
    EnvResource,
    LoopResource,
    ManagedVLLMPolicy,
    MethodResource,
    TransformersPolicy,
)
from flywheel.resources.fields import bounds_of, help_of
from flywheel.rollout.engine import RolloutConfig

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = tuple(cls for cls, _ in CLASSES.values())  # every configurable class, as docs/configuration.md lists
PLAIN = (TrainConfig, RolloutConfig, PromptShape, DPOSettings, GRPOSettings, VLLMServerConfig, RayOptions, StopRules)


def _schema_fields(config_type, prefix=""):
    """(dotted name, description) of every field of a Dagster config type, nested configs included."""
    for name, f in config_type.fields.items():
        yield prefix + name, f.description
        if getattr(f.config_type, "fields", None):
            yield from _schema_fields(f.config_type, f"{prefix}{name}.")


@pytest.mark.parametrize("cls", RESOURCES, ids=lambda c: c.__name__)
def test_every_field_the_launchpad_shows_has_its_help_text(cls):
    fields = dict(_schema_fields(cls.to_config_schema().as_field().config_type))
    assert len(fields) >= 2
    assert not [name for name, text in fields.items() if not (text or "").strip()]


def test_resource_fields_are_declared_only_through_setting_or_same_as():
    """A class-level default written as a bare literal in a resource would be a second, unchecked declaration."""
    bare = []
    for path in sorted((ROOT / "flywheel" / "resources").glob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None):
                    continue
                call = st.value.func.id if isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Name) else ""
                if call not in ("setting", "same_as", "PrivateAttr") and st.target.id != "server_pool":
                    bare.append(f"{path.name}:{cls.name}.{st.target.id}")
    assert not bare


def test_an_option_s_default_is_written_once():
    """No two classes of flywheel/ declare a field of the same name with the same literal default (a copy):
    the resources mirror a plain config's field with `same_as`, which copies default and help."""
    seen: dict[tuple[str, str], list[str]] = {}
    for path in sorted((ROOT / "flywheel").rglob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None):
                    continue
                v = st.value
                if isinstance(v, ast.Call) and getattr(v.func, "id", "") in ("option", "setting") and v.args:
                    v = v.args[0]
                if isinstance(v, ast.Constant) and v.value not in (None, "", 0, False):
                    seen.setdefault((st.target.id, repr(v.value)), []).append(f"{path.name}:{cls.name}")
    # Options of different trainers that happen to agree (TRL too gives each trainer's config its own), and the
    # in-process model's dtype beside the vLLM server's (`vllm_dtype`).
    distinct = {"max_length", "seed", "batch_size", "epochs", "learning_rate", "dtype"}
    copies = {k: v for k, v in seen.items() if len(v) > 1 and k[0] not in distinct}
    assert not copies


def test_mirrored_fields_carry_the_plain_config_s_default_help_and_bound():
    mirrored = 0
    for cls in RESOURCES:
        for name, info in cls.model_fields.items():
            for config in PLAIN:
                plain = {f.name: f for f in dataclasses.fields(config)}
                key = "max_steps" if (config is TrainConfig and name == "max_train_steps") else name
                key = key.removeprefix("dpo_") if config is DPOSettings else key.removeprefix("grpo_") \
                    if config is GRPOSettings else key
                f = plain.get(key)
                if f is None or info.description != f.metadata.get("help"):
                    continue
                mirrored += 1
                assert (info.json_schema_extra or {}).get("bound") == f.metadata["bound"], (cls.__name__, name)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    continue  # required in the plain config (StopRules.iterations): the resource gives the default
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                assert info.default in (default, list(default) if isinstance(default, tuple) else default, "") \
                    or info.default_factory is not None, (cls.__name__, name)
    assert mirrored >= 30


def test_bounds_are_read_from_the_fields_that_declare_them():
    bounds = bounds_of(TransformersPolicy, EnvResource, LoopResource)
    assert bounds["max_new_tokens"] is dataclasses.fields(RolloutConfig)[1].metadata["bound"]
    assert bounds["max_train_steps"].allows(-1) and not bounds["max_train_steps"].allows(0)
    assert not bounds["train_limit"].allows(0) and bounds["iterations"].allows(0)
    from flywheel.core.validation import ConfigurationError, check_options
    with pytest.raises(ConfigurationError, match=r"policy\.max_new_tokens must be an integer in 1\.\.8192"):
        check_options({"max_new_tokens": 0}, bounds=bounds, where="policy.")


def test_the_fields_that_cannot_change_a_k0_sft_are_read_from_their_declarations():
    from flywheel.drivers.experiment import NOT_IN_SFT0

    policy, envs = set(NOT_IN_SFT0["policy"]), set(NOT_IN_SFT0["envs"])
    assert {"samples_per_task", "temperature", "eval_temperature", "max_new_tokens", "parallel_envs", "keep_server",
            "refine_from", "refine_train_steps", "replay", "rollout_seed", "stop_on_loop"} <= policy
    assert not policy & {"learning_rate", "batch_size", "max_train_steps", "max_length", "history_mode",
                         "history_window", "seed", "base_model_path", "whole_passes", "micro_batch_size"}
    assert envs == {"train_limit", "eval_limit"}  # seed_limit, task_types change the seeds; max_steps, the curriculum


def test_demo_help_shows_each_flag_s_field_help(capsys):
    from flywheel.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for field, cls in (("samples_per_task", TransformersPolicy), ("train_limit", EnvResource),
                       ("continue_on_empty_gate", LoopResource)):
        text = " ".join(help_of(cls, field).split())
        assert text and text in shown, field
    assert re.search(r"--max-new-tokens MAX_NEW_TOKENS\s+tokens generated per step", shown)


def test_dpo_and_grpo_settings_are_built_from_their_declarations():
    policy = TransformersPolicy(max_length=512, seed=7)
    dpo = MethodResource(dpo_beta=0.3, dpo_max_steps=5).dpo_settings(policy)
    assert dpo == DPOSettings(beta=0.3, max_steps=5, max_length=512, seed=7)
    grpo = MethodResource(grpo_clip=0.1, grpo_scale_rewards=False).grpo_settings(policy)
    assert grpo == GRPOSettings(clip=0.1, scale_rewards=False, max_length=512, seed=7)


def test_warm_servers_belong_to_the_driver_s_pool(tmp_path):
    """keep_server takes its server from the pool the driver passed in and leaves it running at teardown;
    without a pool the server is the run's own, stopped with it."""
    stopped = []

    class FakeServer:
        def __init__(self, cfg):
            self.cfg = cfg

        def stop(self):
            stopped.append(self)

    pool = ServerPool()
    common = dict(server_command=["true"], checkpoints_dir=str(tmp_path / "ck"))
    kept = ManagedVLLMPolicy(keep_server=True, server_pool=pool, **common)
    server = pool.get(kept.server_config(), FakeServer)
    assert kept.server() is server
    kept.shutdown()
    assert not stopped and list(pool.servers.values()) == [server]
    pool.stop_all()
    assert stopped == [server] and not pool.servers
    alone = ManagedVLLMPolicy(keep_server=True, **common)  # no driver: nothing keeps it past the run
    own = alone.server()
    assert own not in pool.servers.values()
    alone.shutdown()


def test_the_configuration_page_s_tables_are_the_declarations():
    """docs/configuration.md's option tables are rendered from the fields (python -m flywheel.config.reference)."""
    from flywheel.config.reference import CLASSES, DOC, render

    text = DOC.read_text()
    assert render(text) == text, "docs/configuration.md is stale: run python -m flywheel.config.reference"
    assert {name for name in CLASSES if f"<!-- options: {name} -->" in text} == set(CLASSES)


# -- issue 56: every numeric knob bounded in its declaration, checked where the config is built ---------------
def _numeric(config) -> list[str]:
    """The int / float fields of a plain config (bools and strings aside)."""
    return [f.name for f in dataclasses.fields(config)
            if str(f.type).replace(" | None", "") in ("int", "float") and f.name != "lora_alpha"]


def test_loop_and_ray_bounds_are_declared_on_their_fields_not_written_as_ifs():
    from flywheel.core.validation import ConfigurationError
    from flywheel.resources.ray_cluster import RayConfig

    assert {"patience", "min_samples_per_task", "max_samples_per_task", "history_decay",
            "max_gated_per_task"} <= set(bounds_of(LoopResource))
    assert {"envs_per_actor", "sft_workers", "env_actor_cpus", "sft_cpus_per_worker", "sft_gpus_per_worker",
            "call_timeout_s"} <= set(bounds_of(RayConfig))
    with pytest.raises(ConfigurationError, match=r"^loop\.history_decay must be a number > 0 and <= 1, got 0"):
        LoopResource(history_decay=0).validate()
    with pytest.raises(ConfigurationError, match=r"^policy\.ray\.call_timeout_s must be a number > 0 and <= 86400"):
        RayConfig(call_timeout_s=0).options()
    with pytest.raises(ValueError, match=r"^policy\.ray\.envs_per_actor must be an integer in 1\.\.1024"):
        RayOptions(envs_per_actor=0)


@pytest.mark.parametrize("config", [DPOSettings, GRPOSettings, RayOptions, StopRules], ids=lambda c: c.__name__)
def test_every_numeric_field_of_the_trainers_and_ray_is_bounded(config):
    unbounded = [n for n in _numeric(config) if option_bound(config, n) is None]
    assert not unbounded


def option_bound(config, name):
    return next(f.metadata.get("bound") for f in dataclasses.fields(config) if f.name == name)


def test_an_out_of_range_dpo_learning_rate_is_refused_in_one_line_naming_the_field_and_range():
    from flywheel.core.validation import ConfigurationError
    from flywheel.profile import profile_from_mapping

    with pytest.raises(ConfigurationError) as exc:
        profile_from_mapping({"method": {"dpo_learning_rate": 2.0}})
    assert "\n" not in str(exc.value) and "method.dpo_learning_rate must be a number > 0 and <= 1, got 2.0" \
        in str(exc.value)
    with pytest.raises(ValueError, match=r"^DPOSettings\.learning_rate must be a number > 0 and <= 1, got 2\.0"):
        DPOSettings(learning_rate=2.0)
    with pytest.raises(ValueError, match=r"^GRPOSettings\.clip must be a number > 0 and <= 1, got 0"):
        GRPOSettings(clip=0)
    with pytest.raises(ConfigurationError, match=r"^method\.grpo_learning_rate must be"):
        from flywheel.resources.fields import check_fields
        check_fields(MethodResource(grpo_learning_rate=0.0), where="method.")


def test_every_rollout_config_field_has_help():
    assert not [f.name for f in dataclasses.fields(RolloutConfig) if not f.metadata.get("help", "").strip()]


def test_the_gate_s_drop_invalid_steps_flag_has_one_default():
    """LoopResource.gate_drops_invalid_steps declares it; the functions that take it take no default of their own."""
    import inspect

    from flywheel.assets import refinement, training

    assert LoopResource().gate_drops_invalid_steps is True
    for module in (training, refinement):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            param = inspect.signature(fn).parameters.get("drop_invalid_steps")
            assert param is None or param.default is inspect.Parameter.empty, f"{module.__name__}.{name}"


def test_propose_tasks_is_part_of_the_teacher_protocol():
    import inspect

    from flywheel.curriculum import solving
    from flywheel.teacher import ScriptedTeacher
    from flywheel.teacher.base import Teacher
    from flywheel.teacher.openai_teacher import OpenAITeacher

    wanted = set(inspect.signature(Teacher.propose_tasks).parameters)
    for cls in (ScriptedTeacher, OpenAITeacher):
        assert wanted <= set(inspect.signature(cls.propose_tasks).parameters), cls.__name__
    assert "hasattr" not in inspect.getsource(solving)


@pytest.mark.parametrize("cls", RESOURCES, ids=lambda c: c.__name__)
def test_every_numeric_field_of_every_resource_is_bounded(cls):
    """Issue 56: a number the launchpad or a profile can set has a declared range, checked before any work."""
    def numeric(info) -> bool:
        kinds = {a for a in getattr(info.annotation, "__args__", (info.annotation,)) if a is not type(None)}
        return bool(kinds) and kinds <= {int, float}

    assert not [name for name, info in cls.model_fields.items()
                if numeric(info) and (info.json_schema_extra or {}).get("bound") is None]


def test_a_profile_s_teacher_and_curriculum_numbers_are_checked_when_it_loads():
    from flywheel.core.validation import ConfigurationError
    from flywheel.profile import profile_from_mapping

    with pytest.raises(ConfigurationError, match=r"teacher\.max_retries must be an integer in 0\.\.100, got -1"):
        profile_from_mapping({"teacher": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": -1}})
    with pytest.raises(ConfigurationError, match=r"curriculum\.candidate_limit must be an integer in 1\.\.100000"):
        profile_from_mapping({"curriculum": {"candidate_limit": 0}})
