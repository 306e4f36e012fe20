"""A benchmark is a value: what flywheel knows of a benchmark comes from its spec (envs/base.py).

No env is started here: specs, their optional attributes, the generic defaults flywheel uses
when a spec lacks one, and the demo's command line resolving a benchmark's settings.
"""

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml

from envs import REGISTRY, Task, check_env_options, configure_spec, env_option_names, get_benchmark
from envs.base import BenchmarkSpec
from flywheel.cli import build_parser
from flywheel.core.metrics import PRIMARY_METRICS, display_name, primary_metric
from flywheel.core.trajectory import Step, Trajectory
from flywheel.core.validation import ConfigurationError
from flywheel.curriculum.buckets import DEFAULT_EVAL_EDGES, Buckets, eval_buckets
from flywheel.curriculum.complexity import ComplexityScorer
from flywheel.curriculum.gold import gold_length
from flywheel.curriculum.proposals import UnknownSynthesizerError, get_synthesizer
from flywheel.drivers.demo import demo_options, demo_resources, demo_task_types, validate_demo_args
from tests.fakes import BareSpec
from tests.loop_support import REPO_ROOT

# Modules that must never name a benchmark: everything they know comes from a spec.
BENCHMARK_FREE = ["flywheel/cli.py", "flywheel/drivers/demo.py", "flywheel/drivers/demo_flags.py", "flywheel/core/metrics.py", "flywheel/reports/paper.py", "flywheel/drivers/pipeline.py",
                  *sorted(p.relative_to(REPO_ROOT).as_posix()
                          for p in (REPO_ROOT / "flywheel" / "curriculum").glob("*.py"))]




def _string_literals(path: Path) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_curriculum_cli_and_reports_never_name_a_benchmark():
    assert "flywheel/curriculum/complexity.py" in BENCHMARK_FREE and len(BENCHMARK_FREE) > 8
    offenders = {path: sorted({b for s in _string_literals(REPO_ROOT / path) for b in REGISTRY if b in s.lower()})
                 for path in BENCHMARK_FREE}
    assert {p: names for p, names in offenders.items() if names} == {}


@pytest.mark.parametrize("benchmark", sorted(REGISTRY))
def test_registered_specs_hold_valid_optional_attributes(benchmark):
    spec = get_benchmark(benchmark)
    assert isinstance(spec, BenchmarkSpec) and spec.name == benchmark
    Buckets(tuple(float(e) for e in spec.eval_bucket_edges))  # increasing, two edges for three buckets
    assert type(get_synthesizer(spec)).__module__ == f"envs.{benchmark}.synthesis"
    assert set(spec.complexity_signals()) <= {"length", "locations", "subgoals"}
    assert display_name(spec) and primary_metric(spec) in PRIMARY_METRICS  # a bad metric raises
    assert set(getattr(spec, "eval_splits", ())) <= {"seen", "unseen"}  # the splits every spec loads
    assert all(isinstance(n, str) and n for n in getattr(spec, "paper_notes", ()))
    # The demo's settings are options this benchmark takes (a typo would fail only inside a run).
    configure_spec(spec, dict(getattr(spec, "demo_spec_options", {})))
    check_env_options(spec, dict(getattr(spec, "demo_env_options", {})))


def test_a_spec_without_optional_attributes_gets_the_generic_defaults():
    spec = BareSpec()
    assert display_name(spec) == "bare" and primary_metric(spec) == "success_rate"
    assert not hasattr(spec, "paper_notes") and not hasattr(spec, "eval_splits")
    assert eval_buckets(spec).edges == tuple(float(e) for e in DEFAULT_EVAL_EDGES)
    assert gold_length(spec, Task("bare", "seen", "t")) == 3  # len(expert_actions)
    assert gold_length(spec, Task("bare", "seen", "t", expert_actions=("x",))) == 1  # the task's own path first
    with pytest.raises(UnknownSynthesizerError, match="'bare'.*defines no `synthesizer"):
        get_synthesizer(spec)
    assert env_option_names(spec) is None  # make_env(**options) with no env class to read: nothing checked
    steps = [Step("start", "", "", a, next_observation="ok", reward=r, invalid=bad)
             for a, r, bad in [("go to desk 1", 0.0, False), ("go to desk 1", 0.3, False), ("go to bed 1", 0.3, True),
                               ("open drawer", 0.2, False), ("teleport to hall", 0.8, False)]]
    traj = Trajectory(benchmark="bare", split="train", task_id="t", source="teacher", steps=steps)
    assert ComplexityScorer(other="locations").score(traj, spec).other_signal == 3.0  # start, desk 1, hall
    assert ComplexityScorer(other="subgoals").score(traj, spec).other_signal == 2.0  # reward rose twice


def test_a_primary_metric_the_tables_cannot_show_is_refused():
    spec = dataclasses.make_dataclass("MedianSpec", [("primary_metric", str, "median_steps")], bases=(BareSpec,),
                                      frozen=True)()
    with pytest.raises(ValueError, match="'bare' has primary_metric 'median_steps'; use one of success_rate, avg_reward"):
        primary_metric(spec)


def test_a_spec_signal_replaces_the_generic_one_only_for_its_benchmark():
    # The same steps: ScienceWorld names the start room from the observation, the generic signal cannot.
    steps = [Step("This room is called the hallway. You see a door.", "", "", "go to kitchen", next_observation="ok")]
    sw = Trajectory(benchmark="scienceworld", split="train", task_id="t", source="teacher", steps=steps)
    scorer = ComplexityScorer(other="locations")
    assert scorer.score(sw, get_benchmark("scienceworld")).other_signal == 2.0  # hallway, kitchen
    assert scorer.score(dataclasses.replace(sw, benchmark="bare"), BareSpec()).other_signal == 2.0  # <start>, kitchen
    ws = dataclasses.replace(sw, benchmark="webshop")
    assert scorer.score(ws, get_benchmark("webshop")).other_signal == 0.0  # not a search or a product page
    with pytest.raises(ValueError, match="'scienceworld', scored as 'webshop'"):
        scorer.score(sw, get_benchmark("webshop"))


def test_alfworld_grades_by_its_walkthrough_without_a_worker():
    spec = get_benchmark("alfworld")
    task = Task("alfworld", "seen", "x", meta={"walkthrough": ("go to desk 1", "take pen 1 from desk 1")})
    assert gold_length(spec, task) == 2
    assert gold_length(spec, dataclasses.replace(task, expert_actions=("a", "b", "c"))) == 3


def _demo(*argv):
    return build_parser().parse_args(["demo", "--runs-dir", "unused", *argv])


def test_webshop_demo_plays_webshop_tasks():
    """The demo's defaults for WebShop filter nothing (ScienceWorld's task types are its own)."""
    args = _demo("--benchmark", "webshop", "--train-tasks", "4", "--eval-tasks", "3")
    validate_demo_args(args)
    spec = get_benchmark("webshop")
    assert demo_task_types(args, spec) == []
    envs = demo_resources(args)["envs"]
    assert envs.task_types == {} and envs.spec_options == {} and envs.env_options == {}
    assert len(envs.tasks("webshop", "train")) == 4 and len(envs.tasks("webshop", "unseen")) == 3
    sw_types = get_benchmark("scienceworld").demo_task_types
    assert spec.load_tasks("train", task_types=sw_types) == []  # what inheriting them would have done


def test_demo_options_are_the_benchmarks_own_and_checked():
    webshop = get_benchmark("webshop")
    assert demo_options(_demo("--benchmark", "webshop", "--prompt", "compact"), webshop) == ({"prompt": "compact"}, {})
    spec_opts, env_opts = demo_options(_demo("--benchmark", "webshop", "--spec-option", "max_steps=5",
                                             "--env-option", "search_anywhere=true"), webshop)
    assert spec_opts == {"max_steps": 5} and env_opts == {"search_anywhere": True}  # JSON values, typed
    with pytest.raises(ConfigurationError, match="Unknown env option.*'expert_path'.*Valid: catalog, data_path"):
        validate_demo_args(_demo("--benchmark", "webshop", "--expert-path", "gold"))
    with pytest.raises(ConfigurationError, match="Unknown option.*'prompt'.*'alfworld'. Valid: expert_path_steps, expert_seed, max_steps, root"):
        validate_demo_args(_demo("--benchmark", "alfworld", "--prompt", "compact"))
    with pytest.raises(ConfigurationError, match="--spec-option takes KEY=VALUE, got 'prompt'"):
        validate_demo_args(_demo("--spec-option", "prompt"))
    sw = get_benchmark("scienceworld")
    assert demo_options(_demo("--prompt", "full", "--expert-path", "gold"), sw) == (
        {"prompt": "full"}, {"expert_path": "gold"})  # the flags win over the spec's demo settings


def test_env_option_names_come_from_the_env_class():
    assert "expert_path" in env_option_names(get_benchmark("scienceworld"))
    assert "expert_path" not in env_option_names(get_benchmark("webshop"))
    with pytest.raises(ValueError, match=r"Unknown env option\(s\) \['fats'\] for benchmark 'scienceworld'"):
        check_env_options(get_benchmark("scienceworld"), {"fats": True})


def test_experiment_presets_name_options_their_benchmarks_take():
    """Every preset's spec_options and env_options validate (e.g. WebShop's `prompt: compact`)."""
    checked = 0
    for path in sorted((REPO_ROOT / "experiments").glob("*.yaml")):
        envs = (yaml.safe_load(path.read_text()) or {}).get("envs") or {}
        for benchmark, options in (envs.get("spec_options") or {}).items():
            configure_spec(get_benchmark(benchmark), options)
            checked += 1
        for benchmark, options in (envs.get("env_options") or {}).items():
            check_env_options(get_benchmark(benchmark), options)
            checked += 1
    assert checked >= 3
    assert configure_spec(get_benchmark("webshop"), {"prompt": "compact"}).prompt == "compact"
