"""The demo driver builds the resources its command line documents, and runs the chain with a tiny model."""

from __future__ import annotations

import logging

import pytest

from flywheel.cli import build_parser
from flywheel.core.store import Store
from flywheel.core.validation import ConfigurationError
from flywheel.drivers.demo import demo_resources, demo_settings, demo_table, validate_demo_args
from flywheel.drivers.demo_flags import DEMO_FIELDS


def test_demo_defaults_use_the_small_model_settings_on_scienceworld(tmp_path):
    args = build_parser().parse_args(["demo", "--runs-dir", str(tmp_path)])
    res = demo_resources(args)
    envs = res["envs"]
    assert envs.spec_options == {"scienceworld": {"prompt": "compact"}}
    assert envs.env_options == {"scienceworld": {"expert_path": "shortcut"}}
    assert envs.spec("scienceworld").system_prompt() != envs.spec("webshop").system_prompt()
    assert len(envs.spec("scienceworld").system_prompt()) < 1000  # the compact prompt
    assert envs.train_limit == DEMO_FIELDS["train_tasks"][2]
    assert res["policy"].max_train_steps == DEMO_FIELDS["max_train_steps"][2]
    assert res["store"].path == str(tmp_path / "flywheel.duckdb")


def test_every_demo_flag_reaches_the_field_it_names(tmp_path):
    argv = ["demo", "--runs-dir", str(tmp_path)]
    expected = {}
    for flag, (section, field, default) in DEMO_FIELDS.items():
        if isinstance(default, bool):  # a switch: --no-FLAG / --FLAG
            value = not default
            argv += ["--" + ("" if value else "no-") + flag.replace("_", "-")]
        else:
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


PROFILE = """
runs_dir: {runs}
envs: {train_limit: 5, task_types: {scienceworld: [find-animal]}}
policy: {history_window: 1, samples_per_task: 3, max_train_steps: 4}
loop: {continue_on_empty_gate: false}
"""


def _profile(tmp_path, text=PROFILE):
    path = tmp_path / "profile.yaml"
    path.write_text(text.replace("{runs}", str(tmp_path / "runs")))
    return str(path)


def test_a_flag_given_beats_the_profile_which_beats_the_demo_default(tmp_path):
    """k=0 from the demo and k=1 launched from the UI with the same profile train alike: the profile's
    fields reach the demo unless a flag is given; only fields neither names take the demo's default."""
    argv = ["--profile", _profile(tmp_path), "demo", "--samples", "5", "--train-tasks", "6"]
    args = build_parser().parse_args(argv)
    res = demo_resources(args)
    assert res["policy"].samples_per_task == 5 and res["envs"].train_limit == 6  # flags given
    assert res["policy"].history_window == 1 and res["policy"].max_train_steps == 4  # the profile's
    assert res["envs"].task_types == {"scienceworld": ["find-animal"]}  # the profile's, not the spec's demo types
    assert res["policy"].batch_size == DEMO_FIELDS["batch_size"][2]  # neither: the demo's default
    assert res["loop"].continue_on_empty_gate is False  # the profile's loop section, over the demo's default
    settings = demo_settings(args)
    assert settings["samples"] == (5, "flag") and settings["history_window"] == (1, "profile")
    assert settings["batch_size"][1] == "demo default"
    # A profile value out of bounds is named as the profile's field, not as a flag the user never gave.
    bad = build_parser().parse_args(["--profile", _profile(tmp_path, "policy: {batch_size: 0}\n"), "demo"])
    with pytest.raises(ConfigurationError, match=r"profile.yaml: policy.batch_size must be"):
        validate_demo_args(bad)


def test_the_demo_defaults_without_a_profile_are_the_table_s(tmp_path):
    args = build_parser().parse_args(["demo", "--runs-dir", str(tmp_path)])
    assert {flag: v for flag, (v, _) in demo_settings(args).items()} == {f: d for f, (_, _, d) in DEMO_FIELDS.items()}
    assert demo_resources(args)["policy"].stop_on_loop is True
    off = build_parser().parse_args(["demo", "--runs-dir", str(tmp_path), "--no-stop-on-loop"])
    assert demo_resources(off)["policy"].stop_on_loop is False


@pytest.mark.parametrize("where", ["flag", "profile"])
def test_model_tiny_is_built_for_the_demo_as_for_experiments(tmp_path, monkeypatch, capsys, where):
    """`--model tiny` (or the profile's `model: tiny`) is a tiny random Llama built under the demo's runs
    dir, as `flywheel experiment` builds it; the run itself is replaced here (the next test runs one)."""
    import flywheel.drivers.demo
    from flywheel.cli import main

    seen = {}

    def fake_run_flywheel(benchmark, *, resources, **kwargs):
        seen["policy"] = resources["policy"]
        return []

    monkeypatch.setattr(flywheel.drivers.demo, "run_flywheel", fake_run_flywheel)
    runs = tmp_path / "demo-runs"
    argv = ["demo", "--runs-dir", str(runs)] + (["--model", "tiny"] if where == "flag" else [])
    if where == "profile":
        argv = ["--profile", _profile(tmp_path, "model: tiny\n")] + argv
    assert main(argv) == 0
    assert seen["policy"].base_model_path == str(runs / "tiny-model")
    assert (runs / "tiny-model" / "flywheel_model.json").is_file()
    out = capsys.readouterr().out
    assert "make ui" in out and "make experiment PRESET=cpu-scienceworld" in out and str(runs / "flywheel.duckdb") in out


def test_the_demo_honours_continue_on_empty_gate(tmp_path, capsys, monkeypatch, caplog):
    """The tiny model's gate is empty (it solves nothing): with the profile's `loop.continue_on_empty_gate`
    the demo trains and evaluates k=1 anyway and says so; its table has n and Wilson intervals. It ends by
    materializing the dashboard (flywheel_summary) into the instance `make ui` shows, and leaves its profile
    beside its store for `make ui` to load."""
    import dagster as dg

    from flywheel.cli import main
    from flywheel.policy.models import build_tiny_model

    tiny = str(build_tiny_model(tmp_path / "tiny", vocab_size=400))
    profile = _profile(tmp_path, "loop: {continue_on_empty_gate: true}\ncurriculum: {synthesize: false}\n"
                                 "policy: {max_length: 3072}\n")  # the tiny tokenizer's examples are long
    runs = tmp_path / "demo-runs"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))  # as `make demo` sets it
    caplog.set_level(logging.INFO, logger="flywheel")
    code = main(["--profile", profile, "demo", "--benchmark", "webshop", "--model", tiny, "--runs-dir", str(runs),
                 "--train-tasks", "1", "--eval-tasks", "1", "--max-steps", "2", "--samples", "1",
                 "--max-train-steps", "1", "--batch-size", "2", "--max-new-tokens", "8", "--parallel-envs", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert sorted({r["iteration"] for r in Store(runs / "flywheel.duckdb").evaluation_rows("webshop")}) == [0, 1]
    assert "empty reward gate(s), trained on anyway (loop.continue_on_empty_gate)" in out
    assert "| k=1 | unseen | 1 | 0.0 [0.0, 79.3] (0/1) |" in out
    # Quiet: Dagster's console at WARNING, one line per asset and check instead of its progress lines.
    assert " - dagster - INFO - " not in err and "Traceback" not in err
    logged = caplog.text  # the demo's own log lines (stderr outside pytest)
    assert "   sft_checkpoint: trajectories 1, train_steps " in logged and "   evaluation: unseen_successes 0, unseen_episodes 1" in logged
    assert "   gated_dataset: tasks_with_a_success 0, candidates 1, passed 0" in logged
    assert "   check gated_dataset_is_usable: WARN" in logged
    assert "k=1 vs k=0 on unseen, paired over the same 1 tasks: +0.0 points" in out
    assert f"FLYWHEEL_PROFILE={runs / 'profile.yaml'} make ui" in out  # not the default runs/demo: named
    with dg.DagsterInstance.get() as instance:
        summary = instance.get_latest_materialization_event(dg.AssetKey("flywheel_summary"))
        assert summary is not None and summary.asset_materialization.partition == "webshop"
        meta = summary.asset_materialization.metadata
        assert meta["store"].value == str(runs / "flywheel.duckdb") and meta["iterations"].value == 2
        assert (runs / "dashboard" / "webshop_summary.png").is_file()
        # The UI's one code location, from the demo's profile, has the jobs the demo's runs name (the UI's
        # "Re-execute" finds a run's job by name there), with the demo's store and settings.
        monkeypatch.setenv("FLYWHEEL_PROFILE", str(runs / "profile.yaml"))
        from flywheel.definitions import defs

        ui = defs if isinstance(defs, dg.Definitions) else defs()
        assert ui.resources["store"].path == str(runs / "flywheel.duckdb") and ui.resources["envs"].eval_limit == 1
        names = {r.job_name for r in instance.get_runs()}
        assert names == {"bootstrap_job", "iteration_job", "summary_job"}
        assert all(ui.resolve_job_def(name) for name in names)


def test_the_demo_s_profile_gives_the_ui_the_demo_s_resources_and_jobs(tmp_path, monkeypatch):
    """`make ui` loads the profile the demo writes beside its store (runs/demo/profile.yaml): the code location
    built from it is the demo's own definitions (its resources, its partitions: the same job snapshots), so the
    UI's "Re-execute" of a demo run (found by job name in that location) runs it as the demo did."""
    import dagster as dg

    import flywheel.definitions
    from flywheel.definitions import build_defs
    from flywheel.drivers.demo import DEMO_PROFILE, demo_run_profile

    runs = tmp_path / "demo-runs"
    args = build_parser().parse_args(["--profile", _profile(tmp_path), "demo", "--runs-dir", str(runs),
                                      "--iterations", "2", "--eval-tasks", "4"])
    demo = demo_run_profile(args)
    path = runs / DEMO_PROFILE
    path.parent.mkdir(parents=True)
    path.write_text(demo.to_yaml())
    monkeypatch.setenv("FLYWHEEL_PROFILE", str(path))  # what `make ui` sets when runs/demo/profile.yaml exists
    ui = flywheel.definitions.defs
    ui = ui() if not isinstance(ui, dg.Definitions) else ui
    ran = build_defs(demo_resources(args), profile=demo)  # the definitions the demo's runs execute in
    assert ui.resources["store"].path == str(runs / "flywheel.duckdb")
    for name in ("envs", "policy", "loop", "curriculum", "method", "teacher", "store"):
        assert ui.resources[name].model_dump() == ran.resources[name].model_dump(), name
    assert ui.resources["envs"].eval_limit == 4 and ui.resources["envs"].train_limit == 5  # flag, profile
    assert ui.resources["loop"].iterations == 3  # the profile's K (the default), not the demo's partitions
    for job in ("bootstrap_job", "iteration_job", "summary_job"):
        assert ui.resolve_job_def(job).get_job_snapshot_id() == ran.resolve_job_def(job).get_job_snapshot_id(), job


def test_the_demo_table_writes_success_as_every_report_does(tmp_path):
    """`flywheel report`'s table: success % [95% Wilson] (s/n) from the store, "- (0/0)" where no episode counted."""
    db = Store(tmp_path / "s.duckdb")
    for split, episodes, rate in (("seen", 3, 1 / 3), ("unseen", 0, 0.0)):
        db.write_evaluation({"benchmark": "webshop", "iteration": 1, "split": split, "checkpoint_id": "c",
                             "episodes": episodes, "errored": 0, "success_rate": rate, "avg_reward": 0.5,
                             "mean_steps": 2.0, "tokens_per_step": 1.0, "prompt_tokens_per_step": 1.0,
                             "invalid_action_rate": 0.0})
    lines = demo_table(db, "webshop").splitlines()
    assert lines[0].startswith("| checkpoint | split | n | success % [95% CI] (s/n) |")
    assert lines[2].startswith("| k=1 | seen | 3 | 33.3 [6.1, 79.2] (1/3) | 0.500 |")
    assert lines[3].startswith("| k=1 | unseen | 0 | - (0/0) |")


def test_the_demo_closes_with_k_against_k_minus_1_paired_over_the_same_tasks(tmp_path):
    """After the table: per split, k=1 - k=0 over the same tasks with its paired bootstrap interval and the
    tasks gained and lost; a split only one checkpoint evaluated, or an unreadable store, adds nothing."""
    from flywheel.core.trajectory import Trajectory
    from flywheel.drivers.demo import paired_lines

    db = Store(tmp_path / "s.duckdb")
    for k, outcomes in ((0, [True, True, False, False]), (1, [True, False, True, True])):
        db.write_trajectories([Trajectory(benchmark="b", split="seen", task_id=f"t{i}", source="policy",
                                          iteration=k, success=ok) for i, ok in enumerate(outcomes)])
        db.write_evaluation({"benchmark": "b", "iteration": k, "split": "seen", "checkpoint_id": f"c{k}",
                             "episodes": 4, "success_rate": sum(outcomes) / 4})
    db.write_evaluation({"benchmark": "b", "iteration": 1, "split": "unseen", "checkpoint_id": "c1",
                         "episodes": 1, "success_rate": 0.0})
    del db
    lines = paired_lines(tmp_path / "s.duckdb", "b")
    assert lines[0] == "" and len(lines) == 2  # a blank line, then seen only: unseen has no k=0
    assert lines[1].startswith("k=1 vs k=0 on seen, paired over the same 4 tasks: +25.0 points [")
    assert lines[1].endswith("(95% paired bootstrap), 2 task(s) gained, 1 lost")
    assert paired_lines(tmp_path / "missing.duckdb", "b") == []
