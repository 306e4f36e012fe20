"""The demo's command line builds the resources it documents (no run: that is `make demo`)."""

from __future__ import annotations

import pytest

from flywheel.cli import build_parser, demo_resources, validate_demo_args
from flywheel.validation import ConfigurationError


def test_demo_defaults_use_the_small_model_settings_on_scienceworld(tmp_path):
    args = build_parser().parse_args(["demo", "--runs-dir", str(tmp_path)])
    res = demo_resources(args)
    envs = res["envs"]
    assert envs.spec_options == {"scienceworld": {"prompt": "compact"}}
    assert envs.env_options == {"scienceworld": {"expert_path": "shortcut"}}
    assert envs.spec("scienceworld").system_prompt() != envs.spec("webshop").system_prompt()
    assert len(envs.spec("scienceworld").system_prompt()) < 1000  # the compact prompt
    assert envs.train_limit == args.train_tasks and res["policy"].max_train_steps == args.max_train_steps
    assert res["store"].path == str(tmp_path / "flywheel.duckdb")


def test_every_demo_flag_reaches_the_field_it_names(tmp_path):
    from flywheel.cli import DEMO_FIELDS

    argv = ["demo", "--runs-dir", str(tmp_path)]
    expected = {}
    for flag, (section, field, default, _) in DEMO_FIELDS.items():
        # a value that is not the default, within its bound (learning_rate <= 1)
        value = "float32" if field == "dtype" else default / 2 if field == "learning_rate" else default + 1
        argv += ["--" + flag.replace("_", "-"), str(value)]
        expected[("policy" if section == "inference" else section, field)] = value
    res = demo_resources(build_parser().parse_args(argv))
    for (section, field), value in expected.items():
        assert getattr(res[section], field) == value, (section, field)
    assert res["policy"].max_batch_size == expected[("policy", "parallel_envs")]


def test_demo_on_another_benchmark_passes_no_scienceworld_options(tmp_path):
    args = build_parser().parse_args(["demo", "--benchmark", "webshop", "--runs-dir", str(tmp_path)])
    envs = demo_resources(args)["envs"]
    assert envs.spec_options == {} and envs.env_options == {}


def test_demo_rejects_an_unknown_prompt():
    with pytest.raises(ConfigurationError, match="Valid: full, compact"):
        validate_demo_args(build_parser().parse_args(["demo", "--prompt", "tiny"]))
