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
import json
import logging
import os
import resource
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.methods import METHODS, implied_sections, job_for, method_stages
from flywheel.partitions import run_max_iteration
from flywheel.policy.training import trim_heap
from flywheel.profile import SECTIONS, model_folder, read_yaml, section
from flywheel.provenance import (
    arm_file,
    code_commit,
    fingerprint,
    machine,
    read_arm,
    weights_sha256,
    write_arm,
)
from flywheel.quality import arm_checkpoints, paired_difference, wilson_interval
from flywheel.settings import REPO_ROOT
from flywheel.store import Store
from flywheel.validation import ConfigurationError

log = logging.getLogger(__name__)

PRESETS_DIR = REPO_ROOT / "experiments"
RESULTS_DIR = PRESETS_DIR / "results"
TOP_LEVEL = {"name", "description", "benchmark", "iterations", "model", "arms", "notes", "continue_on_empty_gate",
             "policy_backend", "compare", "replicates",
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
    # The claims the report states up front: (arm, k, reference arm, k); k None = the arm's last evaluated k.
    compare: list[tuple[str, int | None, str, int | None]] = field(default_factory=list)
    # Replicate runs of one recipe: group name -> its arms (same configuration, independent rollout samples);
    # a claim naming the group's first arm is reported per replicate and pooled over them.
    replicates: dict[str, list[str]] = field(default_factory=dict)

    def arm_sections(self, arm: str) -> dict[str, dict[str, Any]]:
        """The preset's sections with `arm`'s overrides merged in (one level deep per section)."""
        merged = copy.deepcopy(self.sections)
        method = self.method(arm)
        if method != "bpo":  # the fields a method implies (flywheel/methods.py) sit between preset and arm
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
        compare=[parse_claim(c, arms, where=str(path)) for c in raw.get("compare") or []],
        replicates=parse_replicates(raw.get("replicates") or {}, arms, where=str(path)),
    )
    for arm in preset.arms:  # build every arm's resources now: a bad field fails before any work
        build_resources(preset, arm, Path("/nonexistent-check"), model_path="/nonexistent-check")
        method = preset.arm_sections(arm).get("method", {})
        for name in ("start_from", "controls"):
            if method.get(name) and (method[name] not in preset.arms or method[name] == arm):
                raise ConfigurationError(f"{path}: arm {arm!r}: method.{name} {method[name]!r} must name another "
                                         f"arm of the preset ({', '.join(a for a in preset.arms if a != arm)})")
        if preset.method(arm) == "sft-control" and not method.get("controls"):
            raise ConfigurationError(f"{path}: arm {arm!r} (method sft-control) needs method.controls: the arm "
                                     "whose SFT steps it trains at each k")
    arm_order(preset, list(preset.arms))  # no cycle of start_from / controls
    return preset


def parse_claim(text: Any, arms: dict[str, Any], *, where: str) -> tuple[str, int | None, str, int | None]:
    """`"bpo@2 vs sft-control@2"` -> ("bpo", 2, "sft-control", 2); `@last` or no `@` = the last evaluated k."""
    def side(s: str) -> tuple[str, int | None]:
        arm, _, k = s.strip().partition("@")
        if arm not in arms:
            raise ConfigurationError(f"{where}: compare {text!r}: no arm {arm!r}; arms: {', '.join(arms)}")
        if k in ("", "last"):
            return arm, None
        if not k.isdigit():
            raise ConfigurationError(f"{where}: compare {text!r}: @{k} must be an iteration number or 'last'")
        return arm, int(k)

    if not isinstance(text, str) or text.count(" vs ") != 1:
        raise ConfigurationError(f"{where}: compare entries read 'ARM@K vs ARM@K', got {text!r}")
    (a, ka), (b, kb) = (side(s) for s in text.split(" vs "))
    return a, ka, b, kb


def parse_replicates(raw: Any, arms: dict[str, Any], *, where: str) -> dict[str, list[str]]:
    if not isinstance(raw, dict) or not all(isinstance(v, list) and v for v in raw.values()):
        raise ConfigurationError(f"{where}: replicates maps a group name to a list of its arms, got {raw!r}")
    for group, members in raw.items():
        if missing := [m for m in members if m not in arms]:
            raise ConfigurationError(f"{where}: replicates {group!r}: no arm(s) {missing}; arms: {', '.join(arms)}")
        if members[0] != group:
            raise ConfigurationError(f"{where}: replicates {group!r}: its first arm must be {group!r} itself")
    return {str(g): [str(m) for m in ms] for g, ms in raw.items()}


# -- resources -------------------------------------------------------------------------------
def build_resources(preset: Preset, arm: str, arm_dir: Path, *, model_path: str,
                    policy_fields: dict[str, Any] | None = None) -> dict[str, dg.ConfigurableResource]:
    """The resources dict handed to `build_defs` for one arm: its own store and checkpoints, the
    preset's sections with the arm's overrides, built as a profile's are (flywheel/profile.py).
    `policy_fields` override the policy's for one stage (the equal-compute control's steps)."""
    from flywheel.profile import build_resources as build_profile_resources

    where = f"experiment {preset.name}, arm {arm}"
    if preset.method(arm) not in METHODS:
        raise ConfigurationError(f"{where}: unknown method {preset.method(arm)!r}; valid: {list(METHODS)}")
    sections = preset.arm_sections(arm)
    if policy_fields:
        sections["policy"] = {**sections.get("policy", {}), **policy_fields}
    return build_profile_resources(
        sections, policy_backend=preset.policy_backend, where=where,
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
    """Finished stages of one arm, written atomically after each stage succeeds; also where the arm ran
    (its run id, every code commit and machine that ran a stage of it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = (json.loads(path.read_text()) if path.exists()
                                     else {"done": {}, "run_id": uuid.uuid4().hex[:12], "machine": machine()})

    def done(self, stage: str) -> bool:
        return stage in self.data["done"]

    def mark(self, stage: str, seconds: float, **extra: Any) -> None:
        self.data["done"][stage] = {"seconds": round(seconds, 1), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                    "commit": code_commit(), "host": machine()["host"], **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)


def release_memory() -> dict[str, float]:
    """Hand freed heap back to the OS after a stage; return the process's RSS now and its peak, in GiB.

    Every stage runs in this one process (`execute_in_process`), so what one stage frees and glibc keeps
    stays resident for the next. Measured on cpu-scienceworld (SmolLM2-135M, float32, batch 8 x <= 1024
    tokens, no gradient checkpointing): a fresh process peaks at ~12 GiB in SFT, but sft:2, run after five
    other stages in the same process, reached 19.2 GiB and was OOM-killed on a 24 GiB machine beside the
    warm vLLM server. The trim (`trim_heap`) returns glibc's free arenas; each stage's RSS lands in progress.json."""
    trim_heap()
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
    """(stage name, partition key or None for the benchmark partition, asset selection), in order: the
    method's stages (`flywheel.methods.method_stages`, the one planner). `evaluate_start=False` (an arm that
    takes its k=0 checkpoint from another arm, `method.start_from`) skips evaluation:0: the tables use that
    arm's evaluation of the same weights."""
    return method_stages(benchmark, iterations, method, evaluate_start=evaluate_start)


def run_arm(
    preset: Preset, arm: str, arm_dir: Path, *, instance: dg.DagsterInstance, model_path: str,
    on_stage: Callable[[str], None] | None = None, results: Path | None = None, accept_k0_drift: bool = False,
) -> str | None:
    """Run the missing stages of one arm; returns why it stopped early (a failed gate), else None.

    `results` (the preset's committed results) serves an arm whose `method.start_from` arm is not in this
    runs folder: its k=0 is trained here and must hash to the recorded weights (`accept_k0_drift`: go on
    with the k=0 trained here, recorded as drift, and evaluate it)."""
    from flywheel.definitions import build_defs
    from flywheel.pipeline import GateBlocked, run_stage
    from flywheel.profile import Profile

    arm_dir.mkdir(parents=True, exist_ok=True)
    resources = build_resources(preset, arm, arm_dir, model_path=model_path)
    config = arm_config(preset, arm, model_path)
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

    def jobs_for(policy_fields: dict[str, Any]) -> dict[str, dg.JobDefinition]:
        res = resources if not policy_fields else build_resources(preset, arm, arm_dir, model_path=model_path,
                                                                  policy_fields=policy_fields)
        defs = build_defs(res, profile=Profile(benchmarks=(preset.benchmark,), max_iteration=preset.max_iteration))
        return {name: defs.resolve_job_def(f"{name}_job") for name in ("bootstrap", "iteration", "baselines")}

    jobs = jobs_for({})
    store = Store(arm_dir / "flywheel.duckdb")
    method = preset.arm_sections(arm).get("method", {})
    source, controls = method.get("start_from"), method.get("controls")
    for stage, key, selection in stage_plan(preset.benchmark, preset.iterations, preset.method(arm)):
        if progress.done(stage):
            continue
        if stage == "evaluation:0" and not method.get("evaluate_start", True) and not progress.data.get("k0_drift"):
            continue  # the start arm's evaluation of the same weights stands for it
        if stage.startswith("sft:") and progress.data.get("stopped"):
            return progress.data["stopped"]
        log.info("== experiment %s / %s: %s", preset.name, arm, stage)
        if on_stage:
            on_stage(stage)
        started = time.monotonic()
        k = int(stage.split(":")[1]) if ":" in stage else None
        if stage == "sft:0" and source:
            check_shares_k0(preset, arm, source)
            if start_arm_is_here(preset, arm, source, arm_dir):
                progress.mark(stage, 0.0, imported_from=import_start_checkpoint(preset, arm, source, arm_dir, store))
                continue
            recorded_start(preset, arm, source, results)  # before training: is there a k=0 to compare with?
        stage_jobs = jobs
        extra: dict[str, Any] = {}
        if stage.startswith("sft:") and k and controls:  # the equal-compute control: the same steps as `controls`
            extra["matched_steps_of"], extra["steps"] = controls, controlled_steps(preset, arm, controls, k,
                                                                                  arm_dir.parent, results)
            stage_jobs = jobs_for({"max_train_steps": extra["steps"], "whole_passes": False})
        try:
            run_stage(stage_jobs[job_for(stage)], key or preset.benchmark, selection, instance)
        except GateBlocked as exc:  # nothing passed the gate: K stops here, a result, not a crash
            if preset.continue_on_empty_gate:
                progress.data.setdefault("empty_gates", []).append(stage)
                log.warning("%s: %s; continuing (continue_on_empty_gate)", stage, exc)
            else:
                progress.data["stopped"] = str(exc)
                progress.mark(stage, time.monotonic() - started)
                return str(exc)
        if stage == "sft:0" and source:  # trained here for want of the start arm's: the same weights?
            extra.update(check_retrained_k0(preset, arm, source, store, results, progress, accept_k0_drift))
        if stage.startswith("rollouts:"):
            extra["episodes"] = next((r["episodes"] for r in store.rollout_summary(preset.benchmark)
                                      if r["iteration"] == k), 0)
        progress.mark(stage, time.monotonic() - started, **extra, **release_memory())
    return None


def arm_config(preset: Preset, arm: str, model_path: str) -> dict[str, Any]:
    """What an arm is: preset, arm, benchmark, model and its merged sections (config.json; fingerprinted)."""
    return json.loads(json.dumps({"preset": preset.name, "arm": arm, "benchmark": preset.benchmark,
                                  "model": model_path, "sections": preset.arm_sections(arm)}, default=str))


def lineage_of(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint row's lineage as a dict (the store keeps it as JSON text)."""
    raw = checkpoint["lineage"]
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})


def start_arm_is_here(preset: Preset, arm: str, source: str, arm_dir: Path) -> bool:
    """Whether `source`'s finished k=0 SFT is in this runs folder (else this arm trains it and checks it);
    `source` is an arm of the preset (`check_shares_k0`, `load_preset`)."""
    src = arm_dir.parent / source
    done = json.loads((src / "progress.json").read_text())["done"] if (src / "progress.json").exists() else {}
    return "sft:0" in done and (src / "flywheel.duckdb").exists()


def recorded_start(preset: Preset, arm: str, source: str, results: Path | None) -> dict[str, Any]:
    """`source`'s committed results, which must record its k=0 weights' hash and the preset's configuration."""
    recorded = read_arm(results, source)
    where = f"arm {arm!r} starts from arm {source!r}'s k=0 SFT"
    if not ((recorded or {}).get("provenance") or {}).get("k0_weights_sha256"):
        raise ConfigurationError(f"{where}, which is neither in this runs folder nor in committed results "
                                 f"({arm_file(results, source) if results else 'no results folder'}): run arm "
                                 f"{source!r} first (arms run in the preset's order)")
    if recorded.get("config") != preset.arm_sections(source):
        raise ConfigurationError(f"{where}: its committed results ({arm_file(results, source)}) were run with "
                                 f"another configuration than the preset's now: run arm {source!r} again")
    return recorded


def check_retrained_k0(preset: Preset, arm: str, source: str, store: Store, results: Path | None,
                       progress: Progress, accept_drift: bool) -> dict[str, Any]:
    """This arm trained the k=0 of `source` itself (not in this runs folder): its weights must hash to the
    ones `source`'s committed results record, or, with `accept_drift`, the difference is recorded and this
    arm evaluates its own k=0. Returns what progress.json records about it."""
    recorded = recorded_start(preset, arm, source, results)
    where = f"arm {arm!r} starts from arm {source!r}'s k=0 SFT"
    want = recorded["provenance"]["k0_weights_sha256"]
    ckpt = store.latest_checkpoint(preset.benchmark, 0)
    got = weights_sha256(ckpt["path"])
    if got == want:
        return {"retrained_for": source, "k0_weights_sha256": got, "k0_matches_recorded": True}
    drift = {"retrained_for": source, "k0_weights_sha256": got, "recorded_sha256": want,
             "train_loss": ckpt["train_loss"],
             "recorded_train_loss": ((recorded.get("results") or {}).get("per_k") or [{}])[0]
             .get("checkpoint", {}).get("train_loss"),
             "recorded_commit": recorded["provenance"].get("commit"), "recorded_host": recorded["provenance"].get("host")}
    if not accept_drift:
        raise ConfigurationError(
            f"{where}: retrained here, its weights (sha256 {got[:12]}, train loss {ckpt['train_loss']:.4f}) differ "
            f"from the recorded ones (sha256 {want[:12]}, loss {drift['recorded_train_loss']}, commit "
            f"{drift['recorded_commit']}, host {drift['recorded_host']}): SFT here is not bit-for-bit that run. "
            f"Run arm {source!r} in this runs folder, or pass --accept-k0-drift to go on with this k=0 "
            "(recorded as drift; this arm then evaluates its own k=0)")
    progress.data["k0_drift"] = drift
    log.warning("%s: k=0 retrained here differs from the recorded weights; going on (--accept-k0-drift)", where)
    return {**drift, "k0_matches_recorded": False}


def controlled_steps(preset: Preset, arm: str, target: str, k: int, runs: Path, results: Path | None) -> int:
    """The SFT steps arm `target` trained at checkpoint k: the equal-compute control trains as many. Read
    from `target`'s store in this runs folder, else from its committed results."""
    if target not in preset.arms or target == arm:
        raise ConfigurationError(f"arm {arm!r}: method.controls {target!r} must name another arm of {preset.name}")
    db = runs / target / "flywheel.duckdb"
    steps: dict[int, Any] = {}
    if db.exists():
        for row in Store(db, read_only=True).checkpoint_rows(preset.benchmark):
            lineage = lineage_of(row)
            steps[int(row["iteration"])] = lineage.get("train_steps")
    elif (recorded := read_arm(results, target)) is not None:
        steps = {r["k"]: r.get("checkpoint", {}).get("train_steps") for r in recorded["results"]["per_k"]}
    if not steps.get(k):
        raise ConfigurationError(f"arm {arm!r} trains as many SFT steps as arm {target!r} at k={k}, which has not "
                                 f"trained checkpoint {k} yet: run arm {target!r} first (arms run in dependency order)")
    return int(steps[k])


# Fields that cannot change the k=0 SFT (which rollouts and evaluations play, how they sample, and how k > 0
# trains): an arm may differ from its start_from arm in these and still share its k=0 checkpoint.
NOT_IN_SFT0 = {
    "envs": ("train_limit", "eval_limit", "eval_splits", "max_steps"),
    "policy": ("samples_per_task", "temperature", "eval_temperature", "max_new_tokens", "parallel_envs",
               "keep_server", "refine_from", "replay", "rollout_seed"),
}


def import_start_checkpoint(preset: Preset, arm: str, source: str, arm_dir: Path, store: Store) -> str:
    """`method.start_from: ARM`: record ARM's k=0 checkpoint as this arm's (the same weights, not copied) instead
    of training an identical SFT again. Refused unless ARM's training configuration (envs, policy, curriculum,
    teacher, up to the fields in NOT_IN_SFT0) is this arm's and ARM has finished its sft:0; returns the
    imported checkpoint id."""
    check_shares_k0(preset, arm, source)
    if not start_arm_is_here(preset, arm, source, arm_dir):
        raise ConfigurationError(f"arm {arm!r} starts from arm {source!r}'s k=0 SFT, which has not finished: "
                                 f"run arm {source!r} first (arms run in the preset's order)")
    ckpt = Store(arm_dir.parent / source / "flywheel.duckdb").latest_checkpoint(preset.benchmark, 0)
    if ckpt is None:
        raise ConfigurationError(f"arm {source!r} records no k=0 checkpoint")
    lineage = lineage_of(ckpt)
    store = Store(store.path, method=preset.method(arm))  # rows carry this arm's method
    store.record_checkpoint({**{k: ckpt[k] for k in ("benchmark", "iteration", "path", "base_model", "n_examples",
                                                      "n_trajectories", "train_loss")},
                             "checkpoint_id": f"{ckpt['checkpoint_id']}@{source}",
                             "lineage": {**lineage, "imported_from_arm": source,
                                         "imported_checkpoint_id": ckpt["checkpoint_id"]}})
    return source


def check_shares_k0(preset: Preset, arm: str, source: str) -> None:
    """`arm` may take `source`'s k=0 SFT only if their training configurations agree (up to NOT_IN_SFT0)."""
    if source not in preset.arms or source == arm:
        raise ConfigurationError(f"arm {arm!r}: method.start_from {source!r} must name another arm of {preset.name}")
    mine, theirs = preset.arm_sections(arm), preset.arm_sections(source)
    differ = [f"{s}.{f}" for s in ("envs", "policy", "curriculum", "teacher")
              for f in sorted(set(mine.get(s, {})) | set(theirs.get(s, {})))
              if mine.get(s, {}).get(f) != theirs.get(s, {}).get(f) and f not in NOT_IN_SFT0.get(s, ())]
    if differ:
        raise ConfigurationError(f"arm {arm!r}: cannot start from arm {source!r}'s k=0 SFT: their {differ} differ "
                                 f"(only {sorted(f'{s}.{f}' for s, fs in NOT_IN_SFT0.items() for f in fs)} may)")


def arm_order(preset: Preset, arms: list[str]) -> list[str]:
    """`arms` with every arm after the arms it starts from or controls (`method.start_from`, `method.controls`)."""
    needs = {a: [n for n in (preset.arm_sections(a).get("method", {}).get(f) for f in ("start_from", "controls"))
                 if n in arms and n != a] for a in arms}
    out: list[str] = []

    def visit(a: str, path: tuple[str, ...]) -> None:
        if a in out:
            return
        if a in path:
            raise ConfigurationError(f"{preset.name}: arms {' -> '.join((*path, a))} start from or control each "
                                     "other in a cycle")
        for n in needs[a]:
            visit(n, (*path, a))
        out.append(a)

    for a in arms:
        visit(a, ())
    return out


def run_experiment(
    preset: Preset, *, runs: Path, results: Path, instance: dg.DagsterInstance, arms: list[str] | None = None,
    accept_k0_drift: bool = False, on_arm_done: Callable[[str, Path], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) every arm, then write report.md, results.json and the plots into `results`; each arm's
    results (arms/ARM.json) are written as soon as it finishes, then `on_arm_done(arm, file)` (e.g. a commit)."""
    from flywheel.resources.policy import stop_warm_servers

    arms = arms or list(preset.arms)
    unknown = [a for a in arms if a not in preset.arms]
    if unknown:
        raise ConfigurationError(f"unknown arm(s) {unknown} in {preset.name}; its arms: {list(preset.arms)}")
    runs.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model(preset.model, runs)
    for arm in arm_order(preset, arms):
        try:
            run_arm(preset, arm, runs / arm, instance=instance, model_path=model_path, results=results,
                    accept_k0_drift=accept_k0_drift)
        finally:
            # The arm owns the servers `policy.keep_server` kept warm across its stages: each arm has its own
            # (its own log folder), so one left running would hold its memory through every later arm.
            stop_warm_servers()
        write_report(preset, runs=runs, results=results)
        if on_arm_done:
            on_arm_done(arm, arm_file(results, arm))
    return write_report(preset, runs=runs, results=results)


# -- results ---------------------------------------------------------------------------------
def _rate(successes: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(successes, n)
    return {"n": n, "successes": successes, "rate": successes / n if n else 0.0, "ci_low": lo, "ci_high": hi}


def arm_results(store: Store, benchmark: str, iterations: int, progress: dict[str, Any],
                splits: tuple[str, ...], types_of: dict[str, dict[str, str]] | None = None,
                k0_from: tuple[str, dict[str, dict[str, tuple[bool, float]]]] | None = None) -> dict[str, Any]:
    """Everything the report shows for one arm, read from its store (and its stage timings).

    `k0_from` (ARM, its k=0 outcomes per split): this arm took its k=0 checkpoint from ARM (`method.start_from`) and did not
    evaluate it again; its k-vs-0 comparisons then use ARM's k=0 evaluation of the same weights, marked
    `old_arm`, and its by-type table shows them as k=0 (the per-k table keeps only this arm's own evaluations)."""
    done = progress.get("done", {})
    evals = {(r["iteration"], r["split"]): r for r in store.evaluation_rows(benchmark)}
    outcomes = {(k, s): store.policy_outcomes(benchmark, k, s) for k in range(iterations + 1) for s in splits}
    k0_arm = None
    if k0_from is not None and not any((0, s) in evals for s in splits) and all(s in k0_from[1] for s in splits):
        k0_arm = k0_from[0]
        outcomes.update({(0, s): k0_from[1][s] for s in splits})
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
            lineage = lineage_of(c)
            steps, train_s = lineage.get("train_steps"), lineage.get("train_seconds")
            row["checkpoint"] = {"checkpoint_id": c["checkpoint_id"], "train_loss": c["train_loss"],
                                 "examples": examples, "trajectories": c["n_trajectories"],
                                 "sft_stage_seconds": secs, "train_seconds": train_s, "train_steps": steps}
            if train_s and steps:  # examples seen per second of training (steps x batch)
                row["checkpoint"]["sft_examples_per_s"] = steps * int(lineage.get("batch_size", 8)) / train_s
            if train_s and lineage.get("tokens_trained"):
                row["checkpoint"]["sft_tokens_per_s"] = lineage["tokens_trained"] / train_s
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


def collect_results(preset: Preset, runs: Path, results: Path | None = None) -> dict[str, Any]:
    """Every arm's results: from its store in `runs` when it has one, else from its committed results
    (`results`/arms/ARM.json: an arm run in another sitting, runs folder or machine), else "not run". The
    arms are then compared with each other over the same tasks, whatever run each came from."""
    out: dict[str, Any] = {"preset": preset.name, "benchmark": preset.benchmark, "iterations": preset.iterations,
                           "model": preset.model, "description": preset.description, "arms": {}}
    records, local = {}, []
    for arm in arm_order(preset, list(preset.arms)):
        committed = read_arm(results, arm)
        record = local_arm_record(preset, arm, runs / arm, records) if (runs / arm / "flywheel.duckdb").exists() else None
        if record is not None and committed is not None and not supersedes(record, committed):
            log.warning("arm %s: keeping its committed results (run %s, %d stages) over this runs folder's run %s "
                        "(%d stages); delete %s to replace them", arm, committed["provenance"].get("run_id"),
                        len(committed["results"]["stages"]), record["provenance"]["run_id"],
                        len(record["results"]["stages"]), arm_file(results, arm))
            record = None
        if record is not None:
            local.append(arm)
        elif committed is not None:
            record = {**committed, "origin": f"committed {arm_file(results, arm).relative_to(results.parent)}"}
        else:
            out["arms"][arm] = {"status": "not run"}
            continue
        records[arm] = record
        out["arms"][arm] = {**record["results"], "config": record["config"], "splits": record["splits"],
                            "provenance": record["provenance"], "origin": record["origin"]}
    out["arms"] = {a: out["arms"][a] for a in preset.arms}  # the preset's order
    out["arm_comparisons"] = compare_arms({a: outcomes_of(records[a]) for a in preset.arms if a in records})
    out["claims"] = claims(preset, records)
    out["_records"], out["_local"] = records, local
    return out


def claim_outcomes(preset: Preset, records: dict[str, dict[str, Any]], arm: str,
                   k: int | None) -> tuple[int, dict[str, dict[str, bool]]] | None:
    """(k, {split: {task: success}}) of an arm at k (None: its last evaluated k); a k=0 that the arm took from
    its start arm without evaluating it again is that arm's evaluation of the same weights."""
    if arm not in records:
        return None
    own = outcomes_of(records[arm])
    source = preset.arm_sections(arm).get("method", {}).get("start_from")
    if k == 0 and not any(kk == 0 for kk, _ in own) and source in records:
        own = {key: v for key, v in outcomes_of(records[source]).items() if key[0] == 0}
    ks = sorted({kk for kk, _ in own})
    k = ks[-1] if k is None and ks else k
    splits = {s: v for (kk, s), v in own.items() if kk == k}
    return (k, splits) if splits else None


def claims(preset: Preset, records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The preset's `compare` claims, paired over the same tasks per split and pooled; a claim whose arm heads a
    `replicates` group is reported for each replicate that has run and pooled over them
    (`flywheel.quality.replicate_difference`)."""
    from flywheel.quality import replicate_difference

    rows = []
    for arm, k, ref, kref in preset.compare:
        old = claim_outcomes(preset, records, ref, kref)
        members = preset.replicates.get(arm, [arm])
        news = {m: got for m in members if (got := claim_outcomes(preset, records, m, k)) is not None}
        if old is None or not news:
            rows.append({"arm": arm, "k": k, "reference": ref, "reference_k": kref, "status": "not run yet",
                         "missing": [a for a in (*members, ref) if a not in records]})
            continue
        kk = next(iter(news.values()))[0]
        splits = [s for s in old[1] if all(s in n[1] for n in news.values())]
        for s in (*splits, "all") if len(splits) > 1 else splits:
            pick = splits if s == "all" else [s]

            def flat(by_split: dict[str, dict[str, bool]]) -> dict[str, bool]:
                return {f"{sp}/{t}": v for sp in pick for t, v in by_split[sp].items()}  # noqa: B023

            per = {m: paired_difference(flat(n[1]), flat(old[1])) for m, n in news.items()}
            row = {"arm": arm, "k": kk, "reference": ref, "reference_k": old[0], "split": s, "replicates": per}
            if len(members) > 1:
                row["pooled"] = replicate_difference([flat(n[1]) for n in news.values()], flat(old[1]))
                row["missing"] = [m for m in members if m not in news]
            rows.append(row)
    return rows


def supersedes(record: dict[str, Any], committed: dict[str, Any]) -> bool:
    """Whether this runs folder's record of an arm may replace its committed one: the same run going on,
    or a run that has done at least as many stages."""
    same = record["provenance"]["run_id"] == committed.get("provenance", {}).get("run_id")
    return same or len(record["results"]["stages"]) >= len(committed["results"]["stages"])


def outcomes_of(record: dict[str, Any]) -> dict[tuple[int, str], dict[str, bool]]:
    """{(k, split): {task: success}} of an arm's own evaluations."""
    return {(int(key.split("|")[0]), key.split("|")[1]): {t: bool(v[0]) for t, v in tasks.items()}
            for key, tasks in record["outcomes"].items()}


def local_arm_record(preset: Preset, arm: str, arm_dir: Path, records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One arm's results as committed (arms/ARM.json), read from its store: the report's numbers, the per-task
    outcomes every paired comparison needs, the paper's per-checkpoint cells, and where it ran."""
    from flywheel.resources import EnvResource

    sections = preset.arm_sections(arm)
    splits = EnvResource(**sections.get("envs", {})).eval_splits(preset.benchmark)
    progress = json.loads((arm_dir / "progress.json").read_text()) if (arm_dir / "progress.json").exists() else {}
    store = Store(arm_dir / "flywheel.duckdb", read_only=True)
    method = sections.get("method", {})
    source = method.get("start_from") if not method.get("evaluate_start", True) else None
    k0_from = None
    if source in records and all(f"0|{s}" in records[source]["outcomes"] for s in splits):
        k0_from = (source, {s: {t: (bool(v[0]), float(v[1])) for t, v in records[source]["outcomes"][f"0|{s}"].items()}
                            for s in splits})
    res = arm_results(store, preset.benchmark, preset.iterations, progress, splits,
                      types_of=task_types_of(preset, sections.get("envs", {}), splits), k0_from=k0_from)
    evaluated = sorted({(r["iteration"], r["split"]) for r in store.evaluation_rows(preset.benchmark)})
    outcomes = {f"{k}|{s}": {t: [ok, reward] for t, (ok, reward) in store.policy_outcomes(preset.benchmark, k, s).items()}
                for k, s in evaluated if s in splits}
    k0 = store.latest_checkpoint(preset.benchmark, 0)
    lineage = lineage_of(k0) if k0 else {}
    k0_hash = lineage.get("weights_sha256")
    if k0 is not None and not k0_hash and Path(k0["path"]).is_dir():
        k0_hash = weights_sha256(k0["path"])
    done = progress.get("done", {})
    config = arm_config(preset, arm, json.loads((arm_dir / "config.json").read_text())["model"]
                        if (arm_dir / "config.json").exists() else preset.model)
    provenance = {"run_id": progress.get("run_id"), "machine": progress.get("machine"),
                  "commits": sorted({v["commit"] for v in done.values() if v.get("commit")}),
                  "hosts": sorted({v["host"] for v in done.values() if v.get("host")}),
                  "config_fingerprint": fingerprint(config["sections"]), "k0_weights_sha256": k0_hash,
                  "k0_checkpoint_id": k0["checkpoint_id"] if k0 else None, "k0_drift": progress.get("k0_drift"),
                  "complete": all(stage in done for stage, _, _ in stage_plan(preset.benchmark, preset.iterations,
                                                                               preset.method(arm), evaluate_start=False)
                                  if stage != "evaluation:0") and not progress.get("stopped")}
    return {"arm": arm, "preset": preset.name, "config": sections, "splits": list(splits), "results": res,
            "outcomes": outcomes, "paper": arm_checkpoints(store, preset.benchmark), "provenance": provenance,
            "origin": f"store {arm_dir / 'flywheel.duckdb'}"}


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
    parts += render_claims(results.get("claims") or [])
    for arm, res in results["arms"].items():
        parts += [f"## Arm `{arm}`", ""]
        if res.get("status") == "not run":
            parts += ["Not run.", ""]
            continue
        prov = res.get("provenance") or {}
        mach = prov.get("machine") or {}
        parts += [f"Run `{prov.get('run_id')}` from {res.get('origin', 'its store')}; commit(s) "
                  f"{', '.join(c[:12] for c in prov.get('commits') or []) or 'unknown'}; machine "
                  f"{mach.get('host', '?')} ({mach.get('cpu', '?')}, {mach.get('cores', '?')} cores, torch "
                  f"{mach.get('torch', '?')}); k=0 weights sha256 {str(prov.get('k0_weights_sha256'))[:12]}"
                  + ("" if prov.get("complete", True) else "; **not complete**")
                  + (f"; **k=0 retrained here differs from arm `{prov['k0_drift']['retrained_for']}`'s**"
                     if prov.get("k0_drift") else "") + ".", ""]
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
                ck.get("train_steps") or "-", f"{ck['sft_tokens_per_s']:.0f}" if ck.get("sft_tokens_per_s") else "-",
                ro["episodes"] if ro else "-", _ci(ro["pass_rate"]) if ro else "-",
                _ci(ro["pass_at_n"]) if ro else "-",
                _ci(ro["seed_tasks_pass_rate"]) if ro and ro["seed_tasks_pass_rate"]["n"] else "-",
                _ci(ro["other_tasks_pass_rate"]) if ro and ro["other_tasks_pass_rate"]["n"] else "-",
                f"{ro['episodes_per_min']:.1f}" if ro and ro.get("episodes_per_min") else "-",
                g["new_unique_successes"] if g else "-", g["distinct_tasks"] if g else "-",
                g["tasks_without_seed"] if g else "-", g["gated_total"] if g else "-",
            ])
        parts += ["**The flywheel per iteration** (SFT of checkpoint k; its rollouts on the training tasks; the gate):", ""]
        parts += [_md(["k", "SFT examples", "SFT trajectories", "train loss", "SFT examples/s", "SFT steps",
                       "SFT tokens/s", "rollouts",
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
    ran = {a: sum(v.get("seconds", 0) for v in r.get("stages", {}).values()) for a, r in results["arms"].items()
           if r.get("stages")}
    if ran:
        parts += [f"**What it cost:** {sum(ran.values()) / 3600:.1f} h of stages over {len(ran)} arm(s) ("
                  + ", ".join(f"{a} {t / 60:.0f} min" for a, t in ran.items()) + "), as measured on each arm's machine.",
                  ""]
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
    plots = results.get("plots", [])
    parts += [f"Plots: {', '.join(f'`{p}`' for p in plots)} beside this file." if plots else "Plots: none yet (nothing evaluated)."]
    return "\n".join(parts)


def render_claims(rows: list[dict[str, Any]]) -> list[str]:
    """The preset's claims first: each replicate's paired difference, then the pooled one."""
    if not rows:
        return []

    def diff(d: dict[str, Any]) -> str:
        return f"{100 * d['delta']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"

    table = []
    for r in rows:
        name = f"`{r['arm']}`@{r['k'] if r['k'] is not None else 'last'} vs `{r['reference']}`@" \
               f"{r['reference_k'] if r['reference_k'] is not None else 'last'}"
        if r.get("status"):
            table.append([name, "-", "-", f"not run yet (missing: {', '.join(r['missing'])})", "-", "-", "-"])
            continue
        for m, d in r["replicates"].items():
            table.append([name, r["split"], f"`{m}`", diff(d), f"{d['gained']}/{d['lost']}", f"{d['mcnemar_p']:.3g}",
                          "yes" if d["significant"] else "no"])
        if p := r.get("pooled"):
            rates = ", ".join(f"{100 * x:.0f}" for x in p["replicate_rates"])
            table.append([name, r["split"], f"pooled over {p['replicates']} (rates {rates}; spread "
                          f"{100 * p['spread']:.0f} pts" + (f"; not run: {', '.join(r['missing'])}" if r["missing"] else "")
                          + ")", diff(p), "-", "-", "yes" if p["significant"] else "no"])
    return ["## Claims", "",
            "Each claim paired over the same tasks (per split and pooled over splits, n in each arm's table): "
            "per run, the mean difference with a 95% paired bootstrap interval (10,000 resamples), tasks "
            "gained/lost and the exact McNemar p; pooled over replicate runs, a two-level bootstrap (tasks, then "
            "replicates, 2,000 resamples).", "",
            _md(["claim", "split", "run", "delta (pts) [95% CI]", "gained/lost", "McNemar p", "excludes 0"], table), ""]


def _err(r: dict[str, Any], side: str) -> float:
    """Error-bar length in points (never negative: Wilson bounds can sit a rounding error off the rate)."""
    gap = r["rate"] - r["ci_low"] if side == "low" else r["ci_high"] - r["rate"]
    return max(0.0, 100 * gap)


def _finish(plt, fig, ax, path: Path, ylabel: str, title: str, iterations: int) -> str:
    """Label (x is the iteration k, integer ticks 0..K), save and close one plot; returns its file name."""
    ax.set_xticks(range(iterations + 1))
    ax.set_xlim(-0.5, iterations + 0.5)
    ax.set_xlabel("iteration k")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, never over the points
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path.name


def render_plots(results: dict[str, Any], out: Path) -> list[str]:
    """success_by_k, gate_by_k and rollout_pass_by_k, each written only when it has a point to show (an old
    file of a plot with nothing to show is removed); titles name the experiment, labels give n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, K = results["preset"], results["iterations"]
    arms = {a: r for a, r in results["arms"].items() if r.get("status") != "not run"}
    success = [(f"{arm} {s}", [(r["k"], r["splits"][s]) for r in res["per_k"] if s in r["splits"]])
               for arm, res in arms.items() for s in res["splits"]]
    gates = [(arm, [(r["k"], r["gate"]) for r in res["per_k"] if r.get("gate")]) for arm, res in arms.items()]
    rollouts = [(arm, [(r["k"], r["rollouts"]["pass_rate"]) for r in res["per_k"] if r.get("rollouts")])
                for arm, res in arms.items()]
    plots = {"success_by_k.png": [x for x in success if x[1]], "gate_by_k.png": [x for x in gates if x[1]],
             "rollout_pass_by_k.png": [x for x in rollouts if x[1]]}
    written = []
    for file, series in plots.items():
        if not series:
            (out / file).unlink(missing_ok=True)
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(series)
        for i, (label, points) in enumerate(series):
            ks = [k for k, _ in points]
            if file == "gate_by_k.png":
                ns = "/".join(str(g["candidates"]) for _, g in points)
                ax.plot(ks, [g["gated_total"] for _, g in points], "o-", label=f"{label} gated total")
                ax.plot(ks, [g["new_unique_successes"] for _, g in points], "s--",
                        label=f"{label} new unique successes (of n={ns} candidates)")
                ax.plot(ks, [g["distinct_tasks"] for _, g in points], "^:", label=f"{label} gated tasks")
                continue
            xs = [k - 0.4 + width * (i + 0.5) for k in ks]  # arms side by side at each k
            ns = "/".join(str(r["n"]) for _, r in points)
            ax.errorbar(xs, [100 * r["rate"] for _, r in points], yerr=[[_err(r, "low") for _, r in points],
                        [_err(r, "high") for _, r in points]], fmt="o-", capsize=4, label=f"{label} (n={ns})")
        ylabel, title = {"success_by_k.png": ("success % (95% Wilson CI)", "success by iteration"),
                         "gate_by_k.png": ("trajectories / tasks", "reward gate by iteration"),
                         "rollout_pass_by_k.png": ("successful rollouts % (95% CI)", "training rollouts that pass the reward")}[file]
        written.append(_finish(plt, fig, ax, out / file, ylabel, f"{name}: {title}", K))
    return written


def write_report(preset: Preset, *, runs: Path, results: Path) -> dict[str, Any]:
    """Rebuild every local arm's committed results (arms/ARM.json), then results.json, report.md and the PNG
    plots from all arms, local or committed (never writes a store)."""
    results.mkdir(parents=True, exist_ok=True)
    data = collect_results(preset, runs, results)
    records, local = data.pop("_records"), data.pop("_local")
    for arm in local:
        write_arm(results, arm, {k: v for k, v in records[arm].items() if k != "origin"})
    data["runs_dir"] = str(runs)
    (results / "results.json").write_text(json.dumps(data, indent=2, default=str))
    data["plots"] = render_plots(data, results)
    (results / "report.md").write_text(render_markdown(data, preset) + "\n")
    return data
