"""The demo (`flywheel demo`): one benchmark's k=0 and gated iterations on the Dagster asset graph, sized to
run on a CPU; each setting from its flag (`DEMO_FIELDS` in demo_flags.py), else the profile, else the demo's
default; it closes with a table of every checkpoint's success."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from envs import check_env_options, configure_spec, get_benchmark
from flywheel.config.presets import PRESETS_DIR
from flywheel.core.metrics import markdown_table, success_cell
from flywheel.core.quality import compare_iterations, rate
from flywheel.core.settings import DEFAULT_RUNS_DIR
from flywheel.core.store import Store, check_store
from flywheel.core.validation import (
    ConfigurationError,
    check_benchmark,
    check_data,
    check_options,
    check_writable_dir,
    load_yaml,
)
from flywheel.drivers.demo_flags import DEMO_FIELDS, DEMO_OPTIONS
from flywheel.drivers.experiment import resolve_model
from flywheel.drivers.pipeline import GateBlocked, StageFailed, materialize_dashboard, run_flywheel
from flywheel.orchestration.partitions import max_partition_for
from flywheel.orchestration.slots import command_instance, ready_instance
from flywheel.policy.vllm_server import ServerPool
from flywheel.profile import Profile, model_folder, profile_of
from flywheel.resources import EnvResource, LoopResource, TransformersPolicy
from flywheel.resources.fields import bounds_of

# Dagster's console level in the demo: its warnings only; each stage then prints one line per asset and check
# (`stage_lines`), and every progress line stays in the run's log in the UI.
DEMO_LOG_LEVEL = "WARNING"
DEMO_PROFILE = "profile.yaml"  # the demo's own profile, beside its store: `make ui` loads runs/demo/profile.yaml


def demo_profile(args: argparse.Namespace) -> Profile:
    """The command's profile (`profile_of`), with the demo's --runs-dir and --model filled from it when they
    were not given (once, kept on `args`); the demo's model (`smollm2`, `tiny` or a folder, from --model or
    the profile's `model`) becomes its folder, `args.model_name` keeps the name (`tiny` is built under the
    demo's --runs-dir by `run_demo`, as an experiment builds it under its runs)."""
    profile = profile_of(args)
    if not hasattr(args, "model_name"):
        if args.runs_dir is None:
            args.runs_dir = str(profile.runs_path / "demo")
        args.model_name = args.model if args.model is not None else profile.model
        args.model = model_folder(args.model_name, Path(args.runs_dir))
    return profile


def demo_field_class(section: str) -> type:
    """The resource class that declares a demo flag's field (its help text and bound)."""
    return {"envs": EnvResource, "policy": TransformersPolicy, "inference": TransformersPolicy,
            "loop": LoopResource}[section]


def demo_bounds() -> dict:
    """Option name -> bound, for every numeric demo flag (read from the fields' declarations)."""
    sections = {"loop", *(section for section, _, _ in DEMO_FIELDS.values())}
    return bounds_of(*{demo_field_class(s) for s in sections})


def demo_settings(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """flag -> (value, where it came from: "flag", "profile" or "demo default"), for every DEMO_FIELDS row:
    the flag if given, else the profile's field (an `inference` row reads the profile's `policy` section),
    else the demo's default."""
    sections = demo_profile(args).sections
    out: dict[str, tuple[object, str]] = {}
    for flag, (section, field, default) in DEMO_FIELDS.items():
        profile_section = sections.get("policy" if section == "inference" else section, {})
        if getattr(args, flag) is not None:
            out[flag] = (getattr(args, flag), "flag")
        elif field in profile_section:
            out[flag] = (profile_section[field], "profile")
        else:
            out[flag] = (default, "demo default")
    return out


def validate_demo_args(args: argparse.Namespace) -> None:
    """Every numeric option within its bound and every benchmark option one the benchmark takes,
    before any work (ConfigurationError names the flag or the valid options)."""
    check_benchmark(args.benchmark, where="--benchmark", refs=demo_profile(args).benchmark_refs)
    check_writable_dir(Path(args.runs_dir), "--runs-dir")
    settings = demo_settings(args)
    values = {flag: value for flag, (value, _) in settings.items()} | {"iterations": args.iterations}

    def named(flag: str) -> str:  # how the user gave the value: a flag, or a field of the profile
        if flag in settings and settings[flag][1] == "profile":
            section, field, _ = DEMO_FIELDS[flag]
            return f"{demo_profile(args).source}: {'policy' if section == 'inference' else section}.{field}"
        return "--" + flag.replace("_", "-")

    check_options({opt: values[flag] for flag, opt in DEMO_OPTIONS.items()}, bounds=demo_bounds(),
                  names={opt: named(flag) for flag, opt in DEMO_OPTIONS.items()})
    demo_options(args, demo_spec(args))


def demo_resources(args: argparse.Namespace, server_pool=None) -> dict:
    """The demo's resources: those of `demo_run_profile`; `server_pool` keeps vLLM servers warm across the
    demo's runs (`policy.keep_server`)."""
    return demo_run_profile(args).resources(server_pool)


def demo_run_profile(args: argparse.Namespace) -> Profile:
    """The demo's own profile: the command's profile (`demo_profile`: backends, teacher, loop, every field the
    demo has no flag for) with the demo's settings (`demo_settings`: a flag given, else the profile's field,
    else the demo's default), its benchmark, its iterations' partitions, and its own store and checkpoints under
    --runs-dir. The demo runs with it and writes it beside its store (DEMO_PROFILE), where `make ui` loads
    it: the UI's code location then has the demo's store and resources, so it re-executes the demo's runs
    as the demo ran them."""
    profile = demo_profile(args)
    spec = demo_spec(args)
    spec_options, env_options = demo_options(args, spec)
    b = args.benchmark
    sections = {name: dict(fields) for name, fields in profile.sections.items()}
    envs = sections.setdefault("envs", {})
    for name, value in (("task_types", demo_task_types(args, spec)), ("spec_options", spec_options),
                        ("env_options", env_options)):  # this benchmark's entry; the profile's others stay
        envs[name] = {**{k: v for k, v in envs.get(name, {}).items() if k != b}, **({b: value} if value else {})}
    in_process = profile.policy_backend == "transformers"  # generation knobs of the in-process policy
    settings = demo_settings(args)
    for flag, (section, field, _) in DEMO_FIELDS.items():
        if section == "inference":
            if not in_process:
                continue
            section = "policy"
        sections.setdefault(section, {})[field] = settings[flag][0]
    if in_process:
        sections["policy"].setdefault("max_batch_size", settings["parallel_envs"][0])
    loop_k = sections.setdefault("loop", {}).setdefault("iterations", profile.iterations)  # the profile's K
    refs = {k: v for k, v in profile.benchmark_refs.items() if k == b}
    return Profile(benchmarks=(b,), benchmark_refs=refs, iterations=max(max_partition_for(args.iterations), loop_k),
                   runs_dir=str(Path(args.runs_dir).absolute()), model=args.model,
                   policy_backend=profile.policy_backend, loop_cron=profile.loop_cron, sections=sections,
                   source=str(Path(args.runs_dir) / DEMO_PROFILE))


def demo_spec(args: argparse.Namespace):

    return get_benchmark(args.benchmark, refs=demo_profile(args).benchmark_refs)


def demo_task_types(args: argparse.Namespace, spec) -> list[str]:
    """--task-types if given, else the profile's `envs.task_types` of the benchmark, else the benchmark's
    own `demo_task_types` (none: all of its tasks)."""
    if args.task_types is not None:
        return list(args.task_types)
    profile_types = demo_profile(args).sections.get("envs", {}).get("task_types", {})
    if args.benchmark in profile_types:
        return list(profile_types[args.benchmark])
    return list(getattr(spec, "demo_task_types", None) or ())


def demo_options(args: argparse.Namespace, spec) -> tuple[dict, dict]:
    """(spec options, env options) for the demo's benchmark.

    The benchmark's own demo settings (`demo_spec_options`, `demo_env_options`: e.g. a small
    model's compact prompt), then the profile's `envs.spec_options` / `envs.env_options` of the
    benchmark, then --spec-option / --env-option, then the --prompt and --expert-path shorthands; an
    option the benchmark does not take is a ConfigurationError that lists the ones it does.
    """
    envs = demo_profile(args).sections.get("envs", {})
    spec_options = {**getattr(spec, "demo_spec_options", {}), **envs.get("spec_options", {}).get(args.benchmark, {}),
                    **key_values(args.spec_option, "--spec-option")}
    env_options = {**getattr(spec, "demo_env_options", {}), **envs.get("env_options", {}).get(args.benchmark, {}),
                   **key_values(args.env_option, "--env-option")}
    if args.prompt is not None:
        spec_options["prompt"] = args.prompt
    if args.expert_path is not None:
        env_options["expert_path"] = args.expert_path
    try:
        configure_spec(spec, spec_options)
        check_env_options(spec, env_options)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return spec_options, env_options


def key_values(items: list[str] | None, flag: str) -> dict:
    """KEY=VALUE pairs; a VALUE that reads as JSON (5, 0.5, true, null) is that value, else the string."""


    options = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{flag} takes KEY=VALUE, got {item!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def run_demo(args: argparse.Namespace) -> int:
    """`flywheel demo`: k=0 and `--iterations` gated iterations of one benchmark on the Dagster asset graph,
    then the closing table; exit 1 when a stage failed and a rerun may succeed, 2 when none can."""
    validate_demo_args(args)  # first: before any store, model or run is made
    check_store(Path(args.runs_dir) / "flywheel.duckdb")  # a damaged or newer store: refused, nothing written
    # The demo's tasks load (task types known, data there, archives whole) before any run or store is made.
    check_data(args.benchmark, refs=demo_profile(args).benchmark_refs,
               task_types=tuple(demo_task_types(args, demo_spec(args))) or None)

    args.model = resolve_model(args.model_name, Path(args.runs_dir))  # `tiny`: built under --runs-dir once
    started = time.monotonic()
    pool = ServerPool()  # the demo owns the servers policy.keep_server keeps warm across its runs
    demo = demo_run_profile(args)
    resources = demo.resources(server_pool=pool)
    profile_path = Path(args.runs_dir) / DEMO_PROFILE  # first: the UI can show (and re-execute) a run under way
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile_path.write_text(f"# The demo's profile, written by `flywheel demo`: `make ui` loads it.\n{demo.to_yaml()}")
    logging.getLogger("flywheel.demo").info("demo settings: %s", ", ".join(
        f"--{flag.replace('_', '-')} {value} ({source})" for flag, (value, source) in demo_settings(args).items()))
    stopped, code, empty_gates = None, 0, []
    try:
        empty_gates = run_flywheel(args.benchmark, resources=resources, iterations=args.iterations,
                                   instance=ready_instance(), profile=demo, log_level=DEMO_LOG_LEVEL)
    except GateBlocked as exc:  # nothing passed the reward gate: a measured result, reported as such
        stopped = f"{exc} (no successful trajectory to refine on; the sensor would stop here too)"
    except StageFailed as exc:  # the cause is the last line; exit 2 when no rerun can fix it as it is
        stopped, code = str(exc), 1 if exc.retryable else 2
    finally:
        pool.stop_all()
    if code != 2:  # the dashboard of what was evaluated, also after an empty gate or a stage that a rerun can fix
        materialize_dashboard(args.benchmark, resources=resources, instance=command_instance(), profile=demo,
                              log_level=DEMO_LOG_LEVEL)
    minutes = (time.monotonic() - started) / 60
    store = Path(args.runs_dir) / "flywheel.duckdb"
    print(f"\n## {args.benchmark}: success of checkpoint k=0 (SFT on seeds) vs k={args.iterations} "
          f"(+ reward-gated self-refinement)\n")
    print(closing_table(store, args.benchmark))
    for line in paired_lines(store, args.benchmark):
        print(line)
    print("\nsuccess: % of greedy evaluation episodes with a 95% Wilson interval and (successes/n); the same tasks "
          "for every checkpoint. A demo-sized n shows the chain runs, not whether k beats k-1: an experiment "
          "measures that.")
    if empty_gates:
        print(f"empty reward gate(s), trained on anyway (loop.continue_on_empty_gate): {'; '.join(empty_gates)}")
    teacher = "scripted" if type(resources["teacher"]).__name__ == "ScriptedTeacherResource" else "openai-compatible"
    print(f"\nwall time: {minutes:.1f} min; store: {store}; teacher: {teacher}; model: {args.model}")
    plain = Path(args.runs_dir).absolute() == DEFAULT_RUNS_DIR / "demo" and not os.environ.get("FLYWHEEL_PROFILE")
    env = "" if plain else f"FLYWHEEL_PROFILE={profile_path} "  # `make ui` loads runs/demo/profile.yaml itself
    print(f"this demo's runs, its dashboard (flywheel_summary) and its store in the Dagster UI: {env}make ui   "
          "(http://127.0.0.1:3000)")
    print(f"a real experiment (n and paired intervals per checkpoint): {experiment_command(args.benchmark)}")
    if stopped:
        print(f"\nflywheel stopped early: {stopped}", file=sys.stderr)
    return code


def closing_table(path: Path, benchmark: str) -> str:
    """The demo's closing table, or one line saying why it cannot be read: never what fails (a full disk or a
    damaged store would otherwise hide the failure the demo stopped on behind a DuckDB traceback)."""
    if not path.is_file():
        return "(no evaluation recorded)"
    try:
        return demo_table(Store(path, read_only=True), benchmark)
    except Exception as exc:  # noqa: BLE001 - the closing lines report, they do not fail
        return f"(no table: the store {path} could not be read: {type(exc).__name__}: {' '.join(str(exc).split())})"


def paired_lines(path: Path, benchmark: str) -> list[str]:
    """Each checkpoint k > 0 against k-1 over the same evaluation tasks, per split: the paired difference in
    success with its 95% paired bootstrap interval and the tasks gained and lost (`compare_iterations`, the
    seen_success_vs_previous check's statistics); nothing when the store cannot be read."""
    try:
        store = Store(path, read_only=True)
        evaluated = sorted({(int(r["iteration"]), r["split"]) for r in store.evaluation_rows(benchmark)})
    except Exception:  # noqa: BLE001 - the closing table already said why it cannot read the store
        return []
    lines = []
    for k, split in evaluated:
        if k == 0 or (k - 1, split) not in evaluated:
            continue
        m = compare_iterations(store, benchmark, k, split=split).metadata
        if "paired_tasks" in m:
            lines.append(f"k={k} vs k={k - 1} on {split}, paired over the same {m['paired_tasks']} tasks: "
                         f"{100 * m['paired_delta']:+.1f} points [{100 * m['paired_ci_low']:+.1f}, "
                         f"{100 * m['paired_ci_high']:+.1f}] (95% paired bootstrap), {m['tasks_gained']} task(s) "
                         f"gained, {m['tasks_lost']} lost")
    return [""] + lines if lines else []


def demo_table(store, benchmark: str) -> str:
    """Every evaluated checkpoint and split: success % [95% Wilson interval] (successes/n), reward, steps."""
    rows = []
    for r in store.evaluation_rows(benchmark):
        n = int(r["episodes"] or 0)
        success = success_cell(rate(round((r["success_rate"] or 0.0) * n), n)) if n else "- (0/0)"
        rows.append({"checkpoint": f"k={r['iteration']}", "split": r["split"], "n": n,
                     "success % [95% CI] (s/n)": success, "avg reward": r["avg_reward"],
                     "mean steps": r["mean_steps"], "invalid actions": r["invalid_action_rate"],
                     "errored (not in n)": r["errored"]})
    cols = ["checkpoint", "split", "n", "success % [95% CI] (s/n)", "avg reward", "mean steps", "invalid actions",
            "errored (not in n)"]
    return markdown_table(rows, cols) if rows else "(no evaluation recorded)"


def experiment_command(benchmark: str) -> str:
    """`make experiment PRESET=...` for a preset of this benchmark (experiments/*.yaml), `cpu-<benchmark>` first."""
    def benchmark_of(path: Path) -> object:
        try:
            return (load_yaml(path.read_text(), str(path)) or {}).get("benchmark")
        except (ConfigurationError, AttributeError, OSError, UnicodeDecodeError):
            return None  # a damaged preset is named when it is run, not in the demo's closing lines

    names = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml") if benchmark_of(p) == benchmark)
    if not names:
        return "make experiment PRESET=NAME (a preset of experiments/*.yaml; none runs this benchmark yet)"
    names.sort(key=lambda n: n != f"cpu-{benchmark}")
    return f"make experiment PRESET={names[0]}" + (f"   (other presets: {', '.join(names[1:])})" if names[1:] else "")
