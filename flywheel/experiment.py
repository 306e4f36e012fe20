"""Experiments: a named preset (`experiments/NAME.yaml`) run through the same Dagster jobs as the UI,
resumable after a kill, ending in a report whose every rate has n and a 95% interval.

A preset names one benchmark, K (iterations 0..K), the base model and the fields of the
project's resources (`envs`, `policy`, `loop`, `curriculum`, `teacher`), plus optional
`arms`: named overrides of those fields, each run into its own store (one arm = one
configuration tried; the report shows every arm, not only the best).

Resume: each finished stage (bootstrap, and per k: sft, rollouts+gate, evaluation) is
recorded in the arm's `progress.json` after its Dagster run succeeded; a re-run skips
recorded stages, and a stage killed half-way runs again (rollouts then resume from the
episodes already in DuckDB). The report is rebuilt from the store every time.
"""

from __future__ import annotations

import copy
import ctypes
import gc
import json
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.partitions import run_max_iteration
from flywheel.profile import SECTIONS, model_folder, read_yaml, section
from flywheel.quality import paired_difference, wilson_interval
from flywheel.settings import REPO_ROOT
from flywheel.store import Store
from flywheel.validation import ConfigurationError

log = logging.getLogger(__name__)

PRESETS_DIR = REPO_ROOT / "experiments"
RESULTS_DIR = PRESETS_DIR / "results"
TOP_LEVEL = {"name", "description", "benchmark", "iterations", "model", "arms", "notes", "continue_on_empty_gate",
             "policy_backend",
             *SECTIONS}


# -- presets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A parsed `experiments/*.yaml`: benchmark, K, model, resource fields, arms."""

    name: str
    benchmark: str
    iterations: int
    model: str = "smollm2"
    description: str = ""
    notes: list[str] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    arms: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"bpo": {}})
    source: str = ""
    # An empty gate stops the arm (as it stops the sensor); True trains k+1 on the same data anyway.
    continue_on_empty_gate: bool = False
    # Who generates in rollouts and evaluation: "transformers" (in process) or "vllm" (a managed
    # vLLM server from `make vllm`'s environment); training is the same TRL SFT either way.
    policy_backend: str = "transformers"

    def arm_sections(self, arm: str) -> dict[str, dict[str, Any]]:
        """The preset's sections with `arm`'s overrides merged in (one level deep per section)."""
        merged = copy.deepcopy(self.sections)
        method = self.method(arm)
        if method != "bpo":  # the fields a method implies (flywheel/methods.py) sit between preset and arm
            from flywheel.methods import implied_sections

            for section, fields_ in implied_sections(method).items():
                merged.setdefault(section, {}).update(copy.deepcopy(fields_))
        for section, fields_ in self.arms[arm].items():
            merged.setdefault(section, {}).update(copy.deepcopy(fields_))
        return merged


    @property
    def max_iteration(self) -> int:
        """The iteration partitions of this experiment's definitions: 0..K (at least the default range)."""
        return run_max_iteration(self.iterations)

    def method(self, arm: str) -> str:
        """The arm's training method (flywheel/methods.py): `method: NAME` on the arm, else on the preset, else bpo."""
        return str(self.arms[arm].get("method", {}).get("name") or self.sections.get("method", {}).get("name") or "bpo")


def preset_path(name_or_path: str) -> Path:
    """`cpu-webshop` -> experiments/cpu-webshop.yaml; an existing path is taken as is."""
    p = Path(name_or_path)
    if p.suffix in {".yaml", ".yml"} or p.exists():
        return p
    return PRESETS_DIR / f"{name_or_path}.yaml"


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_preset(name_or_path: str) -> Preset:
    """Parse and validate a preset; every mistake is a ConfigurationError naming the fix."""
    path = preset_path(name_or_path)
    if not path.is_file():
        raise ConfigurationError(
            f"no experiment preset {name_or_path!r} (looked for {path}); available: {', '.join(available_presets()) or 'none'}"
        )
    raw = read_yaml(path)
    unknown = sorted(set(raw) - TOP_LEVEL)
    if unknown:
        raise ConfigurationError(f"{path}: unknown field(s) {unknown}; valid: {sorted(TOP_LEVEL)}")
    for key in ("benchmark", "iterations"):
        if key not in raw:
            raise ConfigurationError(f"{path}: missing required field {key!r}")
    from flywheel.validation import check_benchmark, check_plain_name

    check_benchmark(raw["benchmark"], where=f"{path}: benchmark")
    iterations = raw["iterations"]
    if not isinstance(iterations, int) or iterations < 0:
        raise ConfigurationError(f"{path}: iterations (K) must be an integer >= 0, got {iterations!r}")
    sections = {s: section(s, raw.get(s)) for s in SECTIONS if raw.get(s) is not None}
    arms_raw = raw.get("arms") or {"bpo": {}}
    if not isinstance(arms_raw, dict) or not arms_raw:
        raise ConfigurationError(f"{path}: arms must be a non-empty mapping name -> overrides")
    arms: dict[str, dict[str, dict[str, Any]]] = {}
    for arm, overrides in arms_raw.items():
        overrides = overrides or {}
        bad = sorted(set(overrides) - set(SECTIONS))
        if bad:
            raise ConfigurationError(f"{path}: arm {arm!r} overrides unknown section(s) {bad}; valid: {list(SECTIONS)}")
        arms[str(arm)] = {s: section(s, v) for s, v in overrides.items()}
    name = check_plain_name(str(raw.get("name") or path.stem), f"{path}: name")  # names the results' folder
    for arm in arms:
        check_plain_name(arm, f"{path}: arm")  # names its store's folder
    preset = Preset(
        name=name, benchmark=raw["benchmark"], iterations=iterations,
        model=str(raw.get("model") or "smollm2"), description=str(raw.get("description") or ""),
        notes=list(raw.get("notes") or []), sections=sections, arms=arms, source=str(path),
        continue_on_empty_gate=bool(raw.get("continue_on_empty_gate", False)),
        policy_backend=str(raw.get("policy_backend") or "transformers"),
    )
    for arm in preset.arms:  # build every arm's resources now: a bad field fails before any work
        build_resources(preset, arm, Path("/nonexistent-check"), model_path="/nonexistent-check")
        seen = [arm]  # method.start_from: another arm, no cycle
        while source := preset.arm_sections(seen[-1]).get("method", {}).get("start_from"):
            if source not in preset.arms or source in seen:
                raise ConfigurationError(f"{path}: arm {seen[-1]!r}: method.start_from {source!r} must name another "
                                         f"arm of {preset.name} ({list(preset.arms)}), without a cycle ({seen})")
            seen.append(source)
    return preset


# -- resources -------------------------------------------------------------------------------
def build_resources(preset: Preset, arm: str, arm_dir: Path, *, model_path: str) -> dict[str, dg.ConfigurableResource]:
    """The resources dict handed to `build_defs` for one arm: its own store and checkpoints, the
    preset's sections with the arm's overrides, built as a profile's are (flywheel/profile.py)."""
    from flywheel.methods import METHODS
    from flywheel.profile import build_resources as build_profile_resources

    where = f"experiment {preset.name}, arm {arm}"
    if preset.method(arm) not in METHODS:
        raise ConfigurationError(f"{where}: unknown method {preset.method(arm)!r}; valid: {list(METHODS)}")
    return build_profile_resources(
        preset.arm_sections(arm), policy_backend=preset.policy_backend, where=where,
        runs_dir=arm_dir, model_path=model_path, max_iteration=preset.max_iteration, store_fields={"method": preset.method(arm)},
        loop_defaults={"continue_on_empty_gate": True} if preset.continue_on_empty_gate else None,
    )


def resolve_model(model: str, runs: Path) -> str:
    """The folder `model` names (`flywheel.profile.model_folder`), checked; `tiny` is a tiny random Llama
    built once under `runs`."""
    from flywheel.policy.models import build_tiny_model, require_model

    path = model_folder(model, runs)
    if model == "tiny":
        if not (Path(path) / "flywheel_model.json").exists():
            build_tiny_model(Path(path), vocab_size=512)
        return path
    require_model(path)
    return path


# -- running ---------------------------------------------------------------------------------
class Progress:
    """Finished stages of one arm, written atomically after each stage succeeds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"done": {}}

    def done(self, stage: str) -> bool:
        return stage in self.data["done"]

    def mark(self, stage: str, seconds: float, **extra: Any) -> None:
        self.data["done"][stage] = {"seconds": round(seconds, 1), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)


def release_memory() -> dict[str, float]:
    """Hand freed heap back to the OS after a stage; return the process's RSS now and its peak, in GiB.

    Every stage runs in this one process (`execute_in_process`), so what one stage frees and glibc keeps
    stays resident for the next. Measured on cpu-scienceworld (SmolLM2-135M, float32, batch 8 x <= 1024
    tokens, no gradient checkpointing): a fresh process peaks at ~12 GiB in SFT, but sft:2, run after five
    other stages in the same process, reached 19.2 GiB and was OOM-killed on a 24 GiB machine beside the
    warm vLLM server. `malloc_trim(0)` returns glibc's free arenas; each stage's RSS lands in progress.json."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        rss = pages * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        rss = float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peak_gib = peak / 2**30 if os.uname().sysname == "Darwin" else peak / 2**20
    return {"rss_gib": round(rss, 2), "peak_rss_gib": round(peak_gib, 2)}


def stage_plan(benchmark: str, iterations: int, method: str = "bpo", *,
               evaluate_start: bool = True) -> list[tuple[str, str | None, list[str]]]:
    """(stage name, partition key or None for the benchmark partition, asset selection), in order.

    `evaluate_start=False` (an arm that takes its k=0 checkpoint from another arm, `method.start_from`) skips
    evaluation:0: the tables use that arm's evaluation of the same weights."""
    from flywheel.partitions import partition_key

    if method != "bpo":  # the baselines' and ablations' stages (flywheel/methods.py)
        from flywheel.methods import method_stages

        return method_stages(benchmark, iterations, method, evaluate_start=evaluate_start)

    plan: list[tuple[str, str | None, list[str]]] = [
        ("bootstrap", None, ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"])]
    for k in range(iterations + 1):
        key = str(partition_key(benchmark, k))
        plan.append((f"sft:{k}", key, ["sft_checkpoint"]))
        if k < iterations:
            plan.append((f"rollouts:{k}", key, ["rollouts", "gated_dataset"]))
        if k or evaluate_start or not iterations:
            plan.append((f"evaluation:{k}", key, ["evaluation"]))
    return plan


def run_arm(
    preset: Preset, arm: str, arm_dir: Path, *, instance: dg.DagsterInstance, model_path: str,
    on_stage: Callable[[str], None] | None = None,
) -> str | None:
    """Run the missing stages of one arm; returns why it stopped early (a failed gate), else None."""
    from flywheel.definitions import build_defs
    from flywheel.pipeline import GateBlocked, run_stage
    from flywheel.profile import Profile

    arm_dir.mkdir(parents=True, exist_ok=True)
    resources = build_resources(preset, arm, arm_dir, model_path=model_path)
    config = json.loads(json.dumps(
        {"preset": preset.name, "arm": arm, "benchmark": preset.benchmark, "model": model_path,
         "sections": preset.arm_sections(arm)}, default=str))
    saved = arm_dir / "config.json"
    if saved.exists() and (old := json.loads(saved.read_text())) != config:
        changed = sorted(k for k in set(old["sections"]) | set(config["sections"])
                         if old["sections"].get(k) != config["sections"].get(k))
        raise ConfigurationError(
            f"arm {arm!r} in {arm_dir} was started with another configuration (changed: "
            f"{changed or [k for k in config if old.get(k) != config[k]]}): resuming would mix two configurations. "
            f"Use another --runs-dir, add the change as a new arm, or delete {arm_dir} to start over")
    saved.write_text(json.dumps(config, indent=2))
    progress = Progress(arm_dir / "progress.json")
    defs = build_defs(resources, profile=Profile(benchmarks=(preset.benchmark,), max_iteration=preset.max_iteration))
    jobs = {"bootstrap": defs.resolve_job_def("bootstrap_job"), "iteration": defs.resolve_job_def("iteration_job"),
            "baselines": defs.resolve_job_def("baselines_job")}
    store = Store(arm_dir / "flywheel.duckdb")
    from flywheel.methods import job_for

    evaluate_start = bool(preset.arm_sections(arm).get("method", {}).get("evaluate_start", True))
    for stage, key, selection in stage_plan(preset.benchmark, preset.iterations, preset.method(arm),
                                            evaluate_start=evaluate_start):
        if progress.done(stage):
            continue
        if stage.startswith("sft:") and progress.data.get("stopped"):
            return progress.data["stopped"]
        log.info("== experiment %s / %s: %s", preset.name, arm, stage)
        if on_stage:
            on_stage(stage)
        started = time.monotonic()
        if stage == "sft:0" and (source := preset.arm_sections(arm).get("method", {}).get("start_from")):
            progress.mark(stage, 0.0, imported_from=import_start_checkpoint(preset, arm, source, arm_dir, store))
            continue
        job = jobs[job_for(stage)]
        try:
            run_stage(job, key or preset.benchmark, selection, instance)
        except GateBlocked as exc:  # nothing passed the gate: K stops here, a result, not a crash
            if preset.continue_on_empty_gate:
                progress.data.setdefault("empty_gates", []).append(stage)
                log.warning("%s: %s; continuing (continue_on_empty_gate)", stage, exc)
            else:
                progress.data["stopped"] = str(exc)
                progress.mark(stage, time.monotonic() - started)
                return str(exc)
        extra: dict[str, Any] = {}
        if stage.startswith("rollouts:"):
            k = int(stage.split(":")[1])
            extra["episodes"] = next((r["episodes"] for r in store.rollout_summary(preset.benchmark)
                                      if r["iteration"] == k), 0)
        progress.mark(stage, time.monotonic() - started, **extra, **release_memory())
    return None


# Fields that cannot change the k=0 SFT (which rollouts and evaluations play, how they sample, and how k > 0
# trains): an arm may differ from its start_from arm in these and still share its k=0 checkpoint.
NOT_IN_SFT0 = {
    "envs": ("train_limit", "eval_limit", "eval_splits", "max_steps"),
    "policy": ("samples_per_task", "temperature", "eval_temperature", "max_new_tokens", "parallel_envs",
               "keep_server", "refine_from", "replay"),
}


def import_start_checkpoint(preset: Preset, arm: str, source: str, arm_dir: Path, store: Store) -> str:
    """`method.start_from: ARM`: record ARM's k=0 checkpoint as this arm's (the same weights, not copied) instead
    of training an identical SFT again. Refused unless ARM's training configuration (envs, policy, curriculum,
    teacher, up to the fields in NOT_IN_SFT0) is this arm's and ARM has finished its sft:0; returns the
    imported checkpoint id."""
    if source not in preset.arms or source == arm:
        raise ConfigurationError(f"arm {arm!r}: method.start_from {source!r} must name another arm of {preset.name}")
    mine, theirs = preset.arm_sections(arm), preset.arm_sections(source)
    differ = [f"{s}.{f}" for s in ("envs", "policy", "curriculum", "teacher")
              for f in sorted(set(mine.get(s, {})) | set(theirs.get(s, {})))
              if mine.get(s, {}).get(f) != theirs.get(s, {}).get(f) and f not in NOT_IN_SFT0.get(s, ())]
    if differ:
        raise ConfigurationError(f"arm {arm!r}: cannot start from arm {source!r}'s k=0 SFT: their {differ} differ "
                                 f"(only {sorted(f'{s}.{f}' for s, fs in NOT_IN_SFT0.items() for f in fs)} may)")
    src_dir = arm_dir.parent / source
    done = json.loads((src_dir / "progress.json").read_text())["done"] if (src_dir / "progress.json").exists() else {}
    if "sft:0" not in done or not (src_dir / "flywheel.duckdb").exists():
        raise ConfigurationError(f"arm {arm!r} starts from arm {source!r}'s k=0 SFT, which has not finished: "
                                 f"run arm {source!r} first (arms run in the preset's order)")
    ckpt = Store(src_dir / "flywheel.duckdb").latest_checkpoint(preset.benchmark, 0)
    if ckpt is None:
        raise ConfigurationError(f"arm {source!r} records no k=0 checkpoint")
    lineage = json.loads(ckpt["lineage"]) if isinstance(ckpt["lineage"], str) else dict(ckpt["lineage"] or {})
    store = Store(store.path, method=preset.method(arm))  # rows carry this arm's method
    store.record_checkpoint({**{k: ckpt[k] for k in ("benchmark", "iteration", "path", "base_model", "n_examples",
                                                      "n_trajectories", "train_loss")},
                             "checkpoint_id": f"{ckpt['checkpoint_id']}@{source}",
                             "lineage": {**lineage, "imported_from_arm": source,
                                         "imported_checkpoint_id": ckpt["checkpoint_id"]}})
    return source


def run_experiment(
    preset: Preset, *, runs: Path, results: Path, instance: dg.DagsterInstance, arms: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) every arm, then write report.md, results.json and the plots into `results`."""
    from flywheel.resources.policy import stop_warm_servers

    arms = arms or list(preset.arms)
    unknown = [a for a in arms if a not in preset.arms]
    if unknown:
        raise ConfigurationError(f"unknown arm(s) {unknown} in {preset.name}; its arms: {list(preset.arms)}")
    runs.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model(preset.model, runs)
    stopped = {}
    # An arm that starts from another's k=0 SFT (method.start_from) runs after it when both are asked for.
    source = {a: preset.arm_sections(a).get("method", {}).get("start_from") for a in arms}
    arms = sorted(arms, key=lambda a: (source[a] in arms, arms.index(a)))
    for arm in arms:
        try:
            why = run_arm(preset, arm, runs / arm, instance=instance, model_path=model_path)
        finally:
            # The arm owns the servers `policy.keep_server` kept warm across its stages: each arm has its own
            # (its own log folder), so one left running would hold its memory through every later arm.
            stop_warm_servers()
        if why:
            stopped[arm] = why
    return write_report(preset, runs=runs, results=results)


# -- results ---------------------------------------------------------------------------------
def _rate(successes: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(successes, n)
    return {"n": n, "successes": successes, "rate": successes / n if n else 0.0, "ci_low": lo, "ci_high": hi}


def arm_results(store: Store, benchmark: str, iterations: int, progress: dict[str, Any],
                splits: tuple[str, ...], types_of: dict[str, dict[str, str]] | None = None,
                k0_from: tuple[str, Store] | None = None) -> dict[str, Any]:
    """Everything the report shows for one arm, read from its store (and its stage timings).

    `k0_from` (ARM, its store): this arm took its k=0 checkpoint from ARM (`method.start_from`) and did not
    evaluate it again; its k-vs-0 comparisons then use ARM's k=0 evaluation of the same weights, marked
    `old_arm`, and its by-type table shows them as k=0 (the per-k table keeps only this arm's own evaluations)."""
    done = progress.get("done", {})
    evals = {(r["iteration"], r["split"]): r for r in store.evaluation_rows(benchmark)}
    outcomes = {(k, s): store.policy_outcomes(benchmark, k, s) for k in range(iterations + 1) for s in splits}
    k0_arm = None
    if k0_from is not None and not any((0, s) in evals for s in splits):
        source_evals = {(r["iteration"], r["split"]) for r in k0_from[1].evaluation_rows(benchmark)}
        if all((0, s) in source_evals for s in splits):
            k0_arm = k0_from[0]
            outcomes.update({(0, s): k0_from[1].policy_outcomes(benchmark, 0, s) for s in splits})
    checkpoints = {r["iteration"]: r for r in store.checkpoint_rows(benchmark)}
    gates = {r["iteration"]: r for r in store.iterations(benchmark).iter_rows(named=True)}
    checks = store.gate_check_rows(benchmark)
    rollouts = {r["iteration"]: r for r in store.rollout_summary(benchmark)}
    seeds = set(store.seed_task_ids(benchmark))
    # (attempts, successes) per task for every (k, split) read below; split "train" = checkpoint k's rollouts.
    per_task_counts = {key: {t: (1, int(ok)) for t, (ok, _) in out.items()} for key, out in outcomes.items()}
    per_k: list[dict[str, Any]] = []
    for k in range(iterations + 1):
        row: dict[str, Any] = {"k": k, "splits": {}}
        for s in splits:
            out = outcomes[(k, s)]
            if (k, s) not in evals:
                continue
            ev = evals[(k, s)]
            succ = sum(ok for ok, _ in out.values())
            row["splits"][s] = {**_rate(succ, len(out)), "avg_reward": ev["avg_reward"], "errored": ev["errored"],
                                "mean_steps": ev["mean_steps"], "invalid_action_rate": ev["invalid_action_rate"],
                                "prompt_tokens_per_step": ev["prompt_tokens_per_step"]}
        if k in checkpoints:
            c = checkpoints[k]
            sft = done.get(f"sft:{k}", {})
            secs = sft.get("seconds")
            examples = int(c["n_examples"] or 0)
            lineage = json.loads(c["lineage"]) if isinstance(c["lineage"], str) else (c["lineage"] or {})
            steps, train_s = lineage.get("train_steps"), lineage.get("train_seconds")
            row["checkpoint"] = {"checkpoint_id": c["checkpoint_id"], "train_loss": c["train_loss"],
                                 "examples": examples, "trajectories": c["n_trajectories"],
                                 "sft_stage_seconds": secs, "train_seconds": train_s, "train_steps": steps}
            if train_s and steps:  # examples seen per second of training (steps x batch)
                row["checkpoint"]["sft_examples_per_s"] = steps * int(lineage.get("batch_size", 8)) / train_s
        if k in rollouts:
            r = rollouts[k]
            secs = done.get(f"rollouts:{k}", {}).get("seconds")
            per_task = per_task_counts[(k, "train")] = store.rollout_task_outcomes(benchmark, k)
            seed_tasks = [t for t in per_task if t in seeds]
            new_tasks = [t for t in per_task if t not in seeds]
            row["rollouts"] = {
                "episodes": r["episodes"], "successes": r["successes"], "errored": r["errored"],
                "pass_rate": _rate(int(r["successes"]), int(r["episodes"] - r["errored"])),
                "pass_at_n": _rate(int(r["tasks_solved"]), int(r["tasks"])),
                "seed_tasks_pass_rate": _rate(sum(per_task[t][1] for t in seed_tasks), sum(per_task[t][0] for t in seed_tasks)),
                "other_tasks_pass_rate": _rate(sum(per_task[t][1] for t in new_tasks), sum(per_task[t][0] for t in new_tasks)),
                "seconds": secs, "episodes_per_min": (60 * r["episodes"] / secs) if secs else None,
            }
        if k in gates:
            g = gates[k]
            gated_tasks = store.gated_task_ids(benchmark, k)
            row["gate"] = {"candidates": g["candidates"], "new_unique_successes": g["new_unique_successes"],
                           "gated_total": g["gated_total"], "capped_dropped": g["capped_dropped"],
                           "distinct_tasks": len(gated_tasks),
                           "tasks_without_seed": len([t for t in gated_tasks if t not in seeds])}
            if k in checks:  # the blocking gated_dataset_is_usable check's verdict on this gate
                row["gate"]["check"] = {f: checks[k][f] for f in ("passed", "problems", "first_problem")}
        per_k.append(row)
    evaluated = [k for k in range(iterations + 1) if all((k, s) in evals for s in splits) or (k == 0 and k0_arm)]
    comparisons: list[dict[str, Any]] = []
    pairs = [(k, k - 1) for k in evaluated if k - 1 in evaluated]
    if evaluated and evaluated[-1] != 0 and 0 in evaluated and (evaluated[-1], 0) not in pairs:
        pairs.append((evaluated[-1], 0))
    for new, old in pairs:
        for s in (*splits, "all") if len(splits) > 1 else splits:
            if s == "all":
                a = {f"{sp}/{t}": v[0] for sp in splits for t, v in outcomes[(new, sp)].items()}
                b = {f"{sp}/{t}": v[0] for sp in splits for t, v in outcomes[(old, sp)].items()}
            else:
                a = {t: v[0] for t, v in outcomes[(new, s)].items()}
                b = {t: v[0] for t, v in outcomes[(old, s)].items()}
            comparisons.append({"new": new, "old": old, "split": s, **paired_difference(a, b),
                                **({"old_arm": k0_arm} if old == 0 and k0_arm else {})})
    return {"per_k": per_k, "comparisons": comparisons, "seed_tasks": len(seeds),
            "by_task_type": success_by_type(per_task_counts, types_of or {}),
            "stages": done, "stopped": progress.get("stopped"), "empty_gates": progress.get("empty_gates", [])}


def collect_results(preset: Preset, runs: Path) -> dict[str, Any]:
    from flywheel.resources import EnvResource

    out: dict[str, Any] = {"preset": preset.name, "benchmark": preset.benchmark, "iterations": preset.iterations,
                           "model": preset.model, "description": preset.description, "arms": {}}
    outcomes: dict[str, dict[tuple[int, str], dict[str, bool]]] = {}
    for arm in preset.arms:
        arm_dir = runs / arm
        db_path = arm_dir / "flywheel.duckdb"
        if not db_path.exists():
            out["arms"][arm] = {"status": "not run"}
            continue
        sections = preset.arm_sections(arm)
        splits = EnvResource(**sections.get("envs", {})).eval_splits(preset.benchmark)
        progress = json.loads((arm_dir / "progress.json").read_text()) if (arm_dir / "progress.json").exists() else {}
        store = Store(db_path, read_only=True)
        method = sections.get("method", {})
        source = method.get("start_from") if not method.get("evaluate_start", True) else None
        source_db = runs / source / "flywheel.duckdb" if source else None
        res = arm_results(store, preset.benchmark, preset.iterations, progress, splits,
                          types_of=task_types_of(preset, sections.get("envs", {}), splits),
                          k0_from=(source, Store(source_db, read_only=True)) if source_db and source_db.exists() else None)
        res["config"] = sections
        res["splits"] = list(splits)
        out["arms"][arm] = res
        evaluated = {(r["iteration"], r["split"]) for r in store.evaluation_rows(preset.benchmark)}
        outcomes[arm] = {key: {t: v[0] for t, v in store.policy_outcomes(preset.benchmark, *key).items()}
                         for key in sorted(evaluated) if key[1] in splits}
    out["arm_comparisons"] = compare_arms(outcomes)
    return out


def task_types_of(preset: Preset, envs_section: dict[str, Any], splits: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """{split: {task_id: type}} for the preset's `envs.task_types`, asked of the benchmark's spec one type
    at a time (the spec knows what a type is: a ScienceWorld task name, a WebShop category), never parsed
    from ids. Empty when the preset names no types."""
    from flywheel.resources import EnvResource

    types = envs_section.get("task_types", {}).get(preset.benchmark) or []
    out: dict[str, dict[str, str]] = {}
    for kind in types:
        env = EnvResource(**{**envs_section, "task_types": {preset.benchmark: [kind]},
                             "train_limit": None, "eval_limit": None, "seed_limit": None})
        try:
            for split in ("train", *splits):
                for task in env.tasks(preset.benchmark, split):
                    out.setdefault(split, {})[task.task_id] = kind
        finally:
            env.close()  # a spec may hold helpers (a search index, a JVM)
    return out


def success_by_type(per_task: dict[tuple[int, str], dict[str, tuple[int, int]]],
                    types_of: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Per task type, k and split: successes with n and a Wilson interval, from (attempts, successes) per
    task at each (k, split) (evaluation splits: greedy episodes; "train": checkpoint k's rollouts). Shows
    what a pooled rate hides: the gate can only add data on types the policy already solves sometimes,
    and k+1 can forget a type outright."""
    rows: list[dict[str, Any]] = []
    for (k, split), tasks in sorted(per_task.items()):
        counts: dict[str, list[int]] = {}
        for task, (attempts, passed) in tasks.items():
            if (kind := types_of.get(split, {}).get(task)) is not None:
                c = counts.setdefault(kind, [0, 0])
                c[0], c[1] = c[0] + attempts, c[1] + passed
        rows += [{"k": k, "split": split, "type": kind, **_rate(x, n)} for kind, (n, x) in sorted(counts.items())]
    return rows


def compare_arms(outcomes: dict[str, dict[tuple[int, str], dict[str, bool]]]) -> list[dict[str, Any]]:
    """Each arm against the first arm that has evaluations, at every (k, split) both evaluated, paired
    over the tasks both played (arms evaluate the same tasks), plus the splits pooled per k."""
    arms = [a for a, o in outcomes.items() if o]
    if len(arms) < 2:
        return []
    ref, rows = arms[0], []
    for arm in arms[1:]:
        common = sorted(set(outcomes[arm]) & set(outcomes[ref]))
        for k in sorted({k for k, _ in common}):
            splits = [s for kk, s in common if kk == k]
            for s in (*splits, "all") if len(splits) > 1 else splits:
                pick = splits if s == "all" else [s]
                a = {f"{sp}/{t}": v for sp in pick for t, v in outcomes[arm][(k, sp)].items()}
                b = {f"{sp}/{t}": v for sp in pick for t, v in outcomes[ref][(k, sp)].items()}
                rows.append({"arm": arm, "reference": ref, "k": k, "split": s, **paired_difference(a, b)})
    return rows


# -- the report ------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _ci(r: dict[str, Any]) -> str:
    return f"{_pct(r['rate'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] ({r['successes']}/{r['n']})"


def _md(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(results: dict[str, Any], preset: Preset) -> str:
    parts = [f"# Experiment `{preset.name}`: {preset.benchmark}, K={preset.iterations}, model {preset.model}", ""]
    if preset.description:
        parts += [preset.description.strip(), ""]
    parts += ["Success rates in percent with 95% Wilson intervals and (successes/n); greedy evaluation, the same "
              "tasks for every checkpoint. Differences are paired over tasks: mean difference with a 95% paired "
              "bootstrap interval (10,000 resamples), tasks gained/lost and the exact McNemar p.", ""]
    for arm, res in results["arms"].items():
        parts += [f"## Arm `{arm}`", ""]
        if res.get("status") == "not run":
            parts += ["Not run.", ""]
            continue
        splits = res["splits"]
        header = ["k"] + [f"{s} success % [95% CI] (s/n)" for s in splits] + [f"{s} avg reward" for s in splits]
        rows = []
        for r in res["per_k"]:
            if not r["splits"]:
                continue
            rows.append([r["k"]] + [_ci(r["splits"][s]) if s in r["splits"] else "-" for s in splits]
                        + [f"{r['splits'][s]['avg_reward']:.3f}" if s in r["splits"] else "-" for s in splits])
        parts += [_md(header, rows) if rows else "No checkpoint evaluated yet.", ""]
        if res["comparisons"]:
            parts += ["**Differences** (paired over the same tasks):", ""]
            parts += [_md(["comparison", "split", "n", "delta (pts)", "95% CI (pts)", "gained", "lost", "McNemar p", "excludes 0"],
                          [[f"k={c['new']} vs k={c['old']}" + (f" (arm `{c['old_arm']}`)" if c.get("old_arm") else ""),
                            c["split"], c["n"], f"{100 * c['delta']:+.1f}",
                            f"[{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}]", c["gained"], c["lost"],
                            f"{c['mcnemar_p']:.3g}", "yes" if c["significant"] else "no"] for c in res["comparisons"]]), ""]
        flow = []
        for r in res["per_k"]:
            ck, ro, g = r.get("checkpoint", {}), r.get("rollouts"), r.get("gate")
            flow.append([
                r["k"], ck.get("examples", "-"), ck.get("trajectories", "-"),
                f"{ck['train_loss']:.3f}" if ck.get("train_loss") is not None else "-",
                f"{ck['sft_examples_per_s']:.2f}" if ck.get("sft_examples_per_s") else "-",
                ro["episodes"] if ro else "-", _ci(ro["pass_rate"]) if ro else "-",
                _ci(ro["pass_at_n"]) if ro else "-",
                _ci(ro["seed_tasks_pass_rate"]) if ro and ro["seed_tasks_pass_rate"]["n"] else "-",
                _ci(ro["other_tasks_pass_rate"]) if ro and ro["other_tasks_pass_rate"]["n"] else "-",
                f"{ro['episodes_per_min']:.1f}" if ro and ro.get("episodes_per_min") else "-",
                g["new_unique_successes"] if g else "-", g["distinct_tasks"] if g else "-",
                g["tasks_without_seed"] if g else "-", g["gated_total"] if g else "-",
            ])
        parts += ["**The flywheel per iteration** (SFT of checkpoint k; its rollouts on the training tasks; the gate):", ""]
        parts += [_md(["k", "SFT examples", "SFT trajectories", "train loss", "SFT examples/s", "rollouts",
                       "rollout pass rate %", "train pass@n % (tasks)", "seed-task pass %", "non-seed-task pass %",
                       "episodes/min", "gated new", "gated tasks", "gated tasks w/o seed", "gated total"], flow), ""]
        parts += [f"Seed tasks (teacher trajectories): {res['seed_tasks']}.", ""]
        if res.get("by_task_type"):
            ks = sorted({r["k"] for r in res["by_task_type"]})
            cells = {(r["type"], r["split"], r["k"]): f"{r['successes']}/{r['n']}" for r in res["by_task_type"]}
            keys = sorted({(r["type"], r["split"]) for r in res["by_task_type"]},
                          key=lambda ts: (ts[0], ts[1] == "train", ts[1]))
            parts += ["**By task type** (successes/n: greedy evaluation per split; `train`: the training rollouts "
                      "of checkpoint k):", ""]
            parts += [_md(["type", "split", *[f"k={k}" for k in ks]],
                          [[t, s, *[cells.get((t, s, k), "-") for k in ks]] for t, s in keys]), ""]
        if res.get("stopped"):
            parts += [f"**Stopped early:** {res['stopped']}", ""]
        if res.get("empty_gates"):  # the stages whose gate check blocked the next iteration
            failed = {r["k"]: r["gate"]["check"] for r in res["per_k"] if (r.get("gate") or {}).get("check")}
            why = [f"k={k}: {c['problems']} problem(s), first: `{c['first_problem']}`"
                   for k, c in failed.items() if not c["passed"]]
            parts += [f"**Gate check failed** (`gated_dataset_is_usable`, an empty or malformed gated set; continued "
                      f"anyway, `continue_on_empty_gate`): {', '.join(res['empty_gates'])}"
                      + (f" ({'; '.join(why)})" if why else ""), ""]
        stages = res.get("stages", {})
        if stages:
            total = sum(v.get("seconds", 0) for v in stages.values())
            parts += [f"Stage wall time: {total / 60:.1f} min in all; " + ", ".join(
                f"{k} {v.get('seconds', 0) / 60:.1f}" for k, v in stages.items()) + " (min).", ""]
        parts += ["Configuration:", "", "```json", json.dumps(res["config"], indent=1, sort_keys=True), "```", ""]
    if results.get("arm_comparisons"):
        parts += ["## Arms compared", "",
                  "Each arm against the first evaluated arm at the same k, paired over the same evaluation tasks.", ""]
        parts += [_md(["arm vs reference", "k", "split", "n", "delta (pts)", "95% CI (pts)", "gained", "lost",
                       "McNemar p", "excludes 0"],
                      [[f"{c['arm']} vs {c['reference']}", c["k"], c["split"], c["n"], f"{100 * c['delta']:+.1f}",
                        f"[{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}]", c["gained"], c["lost"],
                        f"{c['mcnemar_p']:.3g}", "yes" if c["significant"] else "no"]
                       for c in results["arm_comparisons"]]), ""]
    if preset.notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in preset.notes] + [""]
    parts += ["Plots: `success_by_k.png`, `gate_by_k.png`, `rollout_pass_by_k.png` beside this file."]
    return "\n".join(parts)


def _err(r: dict[str, Any], side: str) -> float:
    """Error-bar length in points (never negative: Wilson bounds can sit a rounding error off the rate)."""
    gap = r["rate"] - r["ci_low"] if side == "low" else r["ci_high"] - r["rate"]
    return max(0.0, 100 * gap)


def _finish(plt, fig, ax, path: Path, ylabel: str, title: str) -> str:
    """Label (x is always the iteration k), save and close one plot; returns its file name."""
    ax.set_xlabel("iteration k")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def render_plots(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    arms = {a: r for a, r in results["arms"].items() if r.get("status") != "not run"}
    if not arms:
        return written
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, sum(len(r["splits"]) for r in arms.values()))
    i = 0
    for arm, res in arms.items():
        for s in res["splits"]:
            ks = [r["k"] for r in res["per_k"] if s in r["splits"]]
            rates = [100 * r["splits"][s]["rate"] for r in res["per_k"] if s in r["splits"]]
            lo = [_err(r["splits"][s], "low") for r in res["per_k"] if s in r["splits"]]
            hi = [_err(r["splits"][s], "high") for r in res["per_k"] if s in r["splits"]]
            xs = [k - 0.4 + width * (i + 0.5) for k in ks]
            ax.errorbar(xs, rates, yerr=[lo, hi], fmt="o-", capsize=4, label=f"{arm} {s}")
            i += 1
    ax.set_xticks(range(results["iterations"] + 1))
    written.append(_finish(plt, fig, ax, out / "success_by_k.png", "success % (95% Wilson CI)",
                           f"{results['preset']}: success by iteration"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, res in arms.items():
        ks = [r["k"] for r in res["per_k"] if r.get("gate")]
        ax.plot(ks, [r["gate"]["gated_total"] for r in res["per_k"] if r.get("gate")], "o-", label=f"{arm} gated total")
        ax.plot(ks, [r["gate"]["new_unique_successes"] for r in res["per_k"] if r.get("gate")], "s--",
                label=f"{arm} new unique successes")
        ax.plot(ks, [r["gate"]["distinct_tasks"] for r in res["per_k"] if r.get("gate")], "^:", label=f"{arm} gated tasks")
    written.append(_finish(plt, fig, ax, out / "gate_by_k.png", "trajectories / tasks", "reward gate by iteration"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, res in arms.items():
        rows = [r for r in res["per_k"] if r.get("rollouts")]
        rates = [100 * r["rollouts"]["pass_rate"]["rate"] for r in rows]
        lo = [_err(r["rollouts"]["pass_rate"], "low") for r in rows]
        hi = [_err(r["rollouts"]["pass_rate"], "high") for r in rows]
        ax.errorbar([r["k"] for r in rows], rates, yerr=[lo, hi], fmt="o-", capsize=4, label=f"{arm} rollout pass rate")
    written.append(_finish(plt, fig, ax, out / "rollout_pass_by_k.png", "successful rollouts % (95% CI)",
                           "training rollouts that pass the reward"))
    return written


def write_report(preset: Preset, *, runs: Path, results: Path) -> dict[str, Any]:
    """Rebuild results.json, report.md and the PNG plots from the arms' stores (never writes a store)."""
    results.mkdir(parents=True, exist_ok=True)
    data = collect_results(preset, runs)
    data["runs_dir"] = str(runs)
    (results / "results.json").write_text(json.dumps(data, indent=2, default=str))
    (results / "report.md").write_text(render_markdown(data, preset) + "\n")
    data["plots"] = render_plots(data, results)
    return data
