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

import json
import logging
import os
import resource
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.assets._checkpoints import continued_checkpoint, promoted_checkpoint
from flywheel.assets.checks import VALIDATION
from flywheel.assets.evaluation import eval_tag
from flywheel.config.presets import Preset, arm_config, arm_order, arm_resources
from flywheel.core.provenance import (
    arm_file,
    code_commit,
    lineage_of,
    machine,
    read_arm,
    weights_sha256,
)
from flywheel.core.store import Store
from flywheel.core.validation import ConfigurationError
from flywheel.definitions import build_defs
from flywheel.drivers.pipeline import GateBlocked, empty_gate_warnings, promotion_verdicts, run_stage
from flywheel.orchestration.methods import METHODS, job_for, method_stages
from flywheel.policy.models import build_tiny_model, require_model
from flywheel.policy.sft import trim_heap
from flywheel.policy.vllm_server import ServerPool
from flywheel.profile import Profile, model_folder, policy_classes
from flywheel.reports.render import write_report
from flywheel.resources.envs import EnvResource
from flywheel.resources.fields import not_in_greedy_play, not_in_play, not_in_sft0
from flywheel.resources.policy import PolicyResource

log = logging.getLogger(__name__)


def resolve_model(model: str, runs: Path) -> str:
    """The folder `model` names (`flywheel.profile.model_folder`), checked; `tiny` is a tiny random Llama
    built once under `runs`."""

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


def run_arm(
    preset: Preset, arm: str, arm_dir: Path, *, instance: dg.DagsterInstance, model_path: str,
    on_stage: Callable[[str], None] | None = None, results: Path | None = None, accept_k0_drift: bool = False,
    server_pool: ServerPool | None = None,
) -> str | None:
    """Run the missing stages of one arm; returns why it stopped early (a failed gate), else None.

    `results` (the preset's committed results) serves an arm whose `method.start_from` arm is not in this
    runs folder: its k=0 is trained here and must hash to the recorded weights (`accept_k0_drift`: go on
    with the k=0 trained here, recorded as drift, and evaluate it)."""

    arm_dir.mkdir(parents=True, exist_ok=True)
    resources = arm_resources(preset, arm, arm_dir, model_path=model_path, server_pool=server_pool)
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
        res = resources if not policy_fields else arm_resources(preset, arm, arm_dir, model_path=model_path,
                                                                policy_fields=policy_fields, server_pool=server_pool)
        defs = build_defs(res, profile=Profile(benchmarks=(preset.benchmark,), iterations=preset.max_partition))
        return {name: defs.resolve_job_def(f"{name}_job") for name in ("bootstrap", "iteration", "baselines")}

    jobs = jobs_for({})
    store = Store(arm_dir / "flywheel.duckdb", method=preset.method(arm))  # what it writes carries the arm's method
    method = preset.arm_sections(arm).get("method", {})
    # A method that trains as many steps as another arm (`Method.equal_steps`, the control) names it in `controls`.
    source = method.get("start_from")
    controls = method.get("controls") if METHODS[preset.method(arm)].equal_steps else None
    stages = method_stages(preset.benchmark, preset.iterations, preset.method(arm))
    for stage, key, selection in stages:
        if progress.done(stage):
            continue
        if stage == "evaluation:0" and not method.get("evaluate_start", True) and not progress.data.get("k0_drift"):
            continue  # the start arm's evaluation of the same weights stands for it
        if stage.startswith("sft:") and progress.data.get("stopped"):
            return progress.data["stopped"]
        if not method.get("evaluate_rejected", True) and (why := rejected_evaluation(store, preset.benchmark, stage)):
            log.info("== experiment %s / %s: %s skipped: %s", preset.name, arm, stage, why)
            progress.mark(stage, 0.0, skipped=why)
            continue
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
        if source and (at := k0_plays_at(stage)) is not None and (
                shared := share_k0_episodes(preset, arm, arm_dir, store, [s for s, _, _ in stages], at,
                                            steers=resources["loop"].promotion_steers,
                                            greedy_settings=resources["policy"].rollout_config(
                                                evaluation=True, max_steps=resources["envs"].max_steps))):
            extra["shared_episodes"] = shared  # k=0's rollouts and validation games, played by these arms
        if stage.startswith("sft:") and k and controls:  # the same steps as arm `controls` trained at k
            extra["matched_steps_of"], extra["steps"] = controls, controlled_steps(preset, arm, controls, k,
                                                                                  arm_dir.parent, results)
            stage_jobs = jobs_for(control_budget(extra["steps"]))
        try:
            result = run_stage(stage_jobs[job_for(stage)], key or preset.benchmark, selection, instance)
            if empty_gate_warnings(result):  # the gate check's WARN: an empty gate the preset continues past
                progress.data.setdefault("empty_gates", []).append(stage)
            if verdicts := promotion_verdicts(result):  # the promotion gate on this stage's checkpoint
                extra["promoted"], extra["promotion"] = verdicts[-1]
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


def rejected_evaluation(store: Store, benchmark: str, stage: str) -> str | None:
    """Why `stage` is not run under `method.evaluate_rejected: false`: it evaluates a k > 0 whose latest checkpoint
    the promotion gate rejected (the loop went on from an earlier one); None for every other stage."""
    k = int(stage.split(":")[1]) if stage.startswith("evaluation:") else 0
    if not k or store.latest_checkpoint(benchmark, k) is None:
        return None
    kept = promoted_checkpoint(store, benchmark, k)["iteration"]
    return (f"the promotion gate rejected k={k} (k={kept} went on): method.evaluate_rejected is false"
            if kept != k else None)


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
    if differ := sft0_differences(recorded.get("config") or {}, preset.arm_sections(source)):
        raise ConfigurationError(f"{where}: its committed results ({arm_file(results, source)}) were run with "
                                 f"another k=0 configuration than the preset's now ({differ} differ): run arm "
                                 f"{source!r} again")
    return recorded


def check_retrained_k0(preset: Preset, arm: str, source: str, store: Store, results: Path | None,
                       progress: Progress, accept_drift: bool) -> dict[str, Any]:
    """This arm trained the k=0 of `source` itself (not in this runs folder): its weights must hash to the
    ones `source`'s committed results record, or, with `accept_drift`, the difference is recorded and this
    arm evaluates its own k=0. Returns what progress.json records about it."""
    recorded = recorded_start(preset, arm, source, results)
    where = f"arm {arm!r} starts from arm {source!r}'s k=0 SFT"
    prov = recorded["provenance"]
    want = prov["k0_weights_sha256"]
    ckpt = store.latest_checkpoint(preset.benchmark, 0)
    got = weights_sha256(ckpt["path"])
    if got == want:
        return {"retrained_for": source, "k0_weights_sha256": got, "k0_matches_recorded": True}
    examples, recorded_examples = lineage_of(ckpt).get("examples_sha256"), prov.get("k0_examples_sha256")
    drift = {"retrained_for": source, "k0_weights_sha256": got, "recorded_sha256": want,
             "train_loss": ckpt["train_loss"],
             "recorded_train_loss": ((recorded.get("results") or {}).get("per_k") or [{}])[0]
             .get("checkpoint", {}).get("train_loss"),
             "recorded_commit": ",".join(c[:12] for c in prov.get("commits") or []) or None,
             "recorded_host": ",".join(prov.get("hosts") or []) or None,
             "recorded_cpu_id": (prov.get("machine") or {}).get("cpu_id"), "cpu_id": machine().get("cpu_id"),
             "examples_sha256": examples, "recorded_examples_sha256": recorded_examples,
             # True: the same examples, so the weights differ numerically; None: the recorded run kept no hash
             "same_examples": None if not (examples and recorded_examples) else examples == recorded_examples}
    if not accept_drift:
        why = {True: "the same training examples, so the difference is numerical (CPU, math libraries)",
               False: "different training examples (data or prompt code changed since)",
               None: "whether the training examples were the same is unknown (the recorded run kept no examples hash)"}
        raise ConfigurationError(
            f"{where}: retrained here, its weights (sha256 {got[:12]}, train loss {ckpt['train_loss']:.4f}) differ "
            f"from the recorded ones (sha256 {want[:12]}, loss {drift['recorded_train_loss']}, commit "
            f"{drift['recorded_commit']}, host {drift['recorded_host']}): {why[drift['same_examples']]}. "
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


def control_budget(steps: int) -> dict[str, Any]:
    """The policy fields of the equal-compute control's SFT at k > 0: exactly `steps` optimizer steps (those the
    controlled arm trained at k), whatever the preset's own k > 0 budget (`refine_train_steps`) or rounding."""
    return {"max_train_steps": steps, "refine_train_steps": None, "whole_passes": False}


# Fields that cannot change the k=0 SFT (which rollouts and evaluations play, how they sample, and how k > 0
# trains), as their declarations say (`sft0=False`): an arm may differ from its start_from arm in these and
# still share its k=0 checkpoint.
NOT_IN_SFT0 = {"envs": not_in_sft0(EnvResource), "policy": not_in_sft0(*policy_classes().values())}


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


# Fields that cannot change how a checkpoint plays an episode (which tasks get how many episodes, where they
# run, how k > 0 trains), as their declarations say (`play=False`): arms that share a k=0 checkpoint and differ
# only in these, or outside envs and policy (the loop, the method), share its episodes (`share_k0_episodes`).
NOT_IN_PLAY = {"envs": not_in_play(EnvResource), "policy": not_in_play(*policy_classes().values())}
# ... and those that change an episode only through sampling (`greedy=False`: the rollouts' seed and
# temperature): arms that differ in these too (replicates) share the k=0's greedy episodes, its validation games.
NOT_IN_GREEDY_PLAY = {"envs": not_in_greedy_play(EnvResource), "policy": not_in_greedy_play(*policy_classes().values())}
EVAL_TEMPERATURE = PolicyResource.model_fields["eval_temperature"].default
# The stages that play episodes of the k=0 checkpoint: its rollouts, and sft:1, whose promotion gate plays k=0's
# validation games (a later gate that keeps k=0 finds them in the store).
PLAYS_K0 = ("rollouts:0", "sft:1")


def k0_plays_at(stage: str) -> int | None:
    """The iteration whose k=0 episodes `stage` may take from its siblings: 0 for PLAYS_K0; k for rollouts:k
    (k > 0), which the k=0 checkpoint plays when the promotion gate rejected every checkpoint up to k; else None."""
    if stage in PLAYS_K0:
        return 0
    return int(stage.split(":")[1]) if stage.startswith("rollouts:") else None


def episode_siblings(preset: Preset, arm: str, *, greedy: bool = False) -> list[str]:
    """The arms whose episodes of the k=0 checkpoint `arm` may take instead of playing its own: they start from
    the same arm (the same k=0 weights) and differ from `arm` only in NOT_IN_PLAY fields or outside envs and
    policy. Such episodes are draws from the same distribution (the same weights, tasks and sampling settings);
    taking them makes the arms' k=1 differ only in what the arm changes (common random numbers), and spares
    playing them again. Replicates, which set their own rollout_seed, never share sampled episodes; with
    `greedy`, the siblings for the episodes played at eval_temperature (the validation games), where both arms
    play those greedily: then fields that act only through sampling (NOT_IN_GREEDY_PLAY: rollout_seed,
    temperature) may differ too, and replicates share them (the same weights play the same greedy episode)."""
    mine = preset.arm_sections(arm)
    source = mine.get("method", {}).get("start_from")
    if not source:
        return []
    ignored = NOT_IN_GREEDY_PLAY if greedy else NOT_IN_PLAY

    def greedy_evaluation(sections: dict) -> bool:
        return sections.get("policy", {}).get("eval_temperature", EVAL_TEMPERATURE) == 0

    def same_play(other: str) -> bool:
        theirs = preset.arm_sections(other)
        if greedy and not (greedy_evaluation(mine) and greedy_evaluation(theirs)):
            return False
        return all(mine.get(s, {}).get(f) == theirs.get(s, {}).get(f) or f in ignored[s]
                   for s in ("envs", "policy") for f in set(mine.get(s, {})) | set(theirs.get(s, {})))
    return [a for a in preset.arms if a != arm and a != source
            and preset.arm_sections(a).get("method", {}).get("start_from") == source and same_play(a)]


def share_k0_episodes(preset: Preset, arm: str, arm_dir: Path, store: Store, stages: list[str],
                      k: int = 0, *, steers: bool = True, greedy_settings: object = None) -> dict[str, int]:
    """Copy into `store` the k=0 checkpoint's episodes that `episode_siblings` in this runs folder have played and
    this arm has not, of the kinds this arm's `stages` play (the promotion gate's validation games, from the
    greedy siblings; rollouts if it rolls out); returns how many came from each. Only where this arm took its
    k=0 from its start arm here (the same checkpoint id, the same weights). With k > 0: the rollouts of
    iteration k, where the promotion gate kept k=0 through k here (the loop goes on from k=0; not when it only
    selects, `steers` false: the arm's loop.promotion_steers) and a sibling's k=0 played them too. What the
    arm's plan does not ask for (another allocation) is dropped by the stage's own resume plan (plan_resume).
    `greedy_settings` (the arm's evaluation RolloutConfig): validation games only under the tag this arm's gate
    keeps (`eval_tag`), so a replicate takes them from whichever sibling played them so."""
    ckpt = store.latest_checkpoint(preset.benchmark, 0)
    if ckpt is None or "imported_from_arm" not in lineage_of(ckpt):
        return {}
    if k and (store.latest_checkpoint(preset.benchmark, k) is None
              or continued_checkpoint(store, preset.benchmark, k, steers=steers)["checkpoint_id"] != ckpt["checkpoint_id"]):
        return {}
    rollouts = ["train"] if k or "rollouts:0" in stages else []
    sampled, greedy = episode_siblings(preset, arm), episode_siblings(preset, arm, greedy=True)
    splits_of = {other: (rollouts if other in sampled else []) + ([] if k else [VALIDATION])
                 for other in preset.arms if other in sampled or other in greedy}
    copied = {}
    tag = eval_tag(ckpt["checkpoint_id"], greedy_settings) if greedy_settings is not None else None
    for other, splits in splits_of.items():
        db, saved = arm_dir.parent / other / "flywheel.duckdb", arm_dir.parent / other / "config.json"
        if not (splits and db.exists() and saved.exists()):
            continue
        if json.loads(saved.read_text())["sections"] != arm_config(preset, other, "")["sections"]:
            continue  # run under an older configuration than the preset names now: other episodes
        src, kw = Store(db, read_only=True), {"benchmark": preset.benchmark, "iteration": k,
                                              "checkpoint_id": ckpt["checkpoint_id"]}
        n = sum(store.copy_episodes(src, **kw, splits=[s], tag=tag if s == VALIDATION else None) for s in splits)
        if n:
            copied[other] = n
    return copied


def sft0_differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The fields ("section.field") in which two configurations' k=0 SFT differ: envs, policy, curriculum and
    teacher, up to NOT_IN_SFT0 (how k > 0 trains, what the loop does with the data, how episodes are played).
    A default pinned in a preset after its arms ran (e.g. `policy.refine_lr_scale`) leaves their k=0 the same."""
    return [f"{s}.{f}" for s in ("envs", "policy", "curriculum", "teacher")
            for f in sorted(set(mine.get(s, {})) | set(theirs.get(s, {})))
            if mine.get(s, {}).get(f) != theirs.get(s, {}).get(f) and f not in NOT_IN_SFT0.get(s, ())]


def check_shares_k0(preset: Preset, arm: str, source: str) -> None:
    """`arm` may take `source`'s k=0 SFT only if their training configurations agree (up to NOT_IN_SFT0)."""
    if source not in preset.arms or source == arm:
        raise ConfigurationError(f"arm {arm!r}: method.start_from {source!r} must name another arm of {preset.name}")
    if differ := sft0_differences(preset.arm_sections(arm), preset.arm_sections(source)):
        raise ConfigurationError(f"arm {arm!r}: cannot start from arm {source!r}'s k=0 SFT: their {differ} differ "
                                 f"(only {sorted(f'{s}.{f}' for s, fs in NOT_IN_SFT0.items() for f in fs)} may)")


def run_experiment(
    preset: Preset, *, runs: Path, results: Path, instance: dg.DagsterInstance, arms: list[str] | None = None,
    accept_k0_drift: bool = False, on_arm_done: Callable[[str, Path], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) every arm, then write report.md, results.json and the plots into `results`; each arm's
    results (arms/ARM.json) are written as soon as it finishes, then `on_arm_done(arm, file)` (e.g. a commit)."""

    arms = arms or list(preset.arms)
    unknown = [a for a in arms if a not in preset.arms]
    if unknown:
        raise ConfigurationError(f"unknown arm(s) {unknown} in {preset.name}; its arms: {list(preset.arms)}")
    runs.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model(preset.model, runs)
    for arm in arm_order(preset, arms):
        # The arm owns the servers `policy.keep_server` keeps warm across its stages: each arm has its own (its
        # own log folder), so one left running would hold its memory through every later arm.
        pool = ServerPool()
        try:
            run_arm(preset, arm, runs / arm, instance=instance, model_path=model_path, results=results,
                    accept_k0_drift=accept_k0_drift, server_pool=pool)
        finally:
            pool.stop_all()
        write_report(preset, runs=runs, results=results)
        if on_arm_done:
            on_arm_done(arm, arm_file(results, arm))
    return write_report(preset, runs=runs, results=results)


# -- results ---------------------------------------------------------------------------------
