"""Experiment presets (`experiments/NAME.yaml`): parsing and checking, before anything runs.

A preset names one benchmark, K (iterations 0..K), the base model and the fields of the project's resources
(`envs`, `policy`, `loop`, `curriculum`, `teacher`), plus optional `arms` (named overrides of those fields, each
run into its own store), `replicates` and `claims` (docs/experiments.md).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.core.options import Bound, option
from flywheel.core.settings import REPO_ROOT
from flywheel.core.validation import ConfigurationError, check_benchmark, check_plain_name
from flywheel.orchestration.methods import METHODS, implied_sections
from flywheel.orchestration.partitions import max_partition_for
from flywheel.policy.vllm_server import ServerPool
from flywheel.profile import SECTIONS, Profile, check_iterations, read_yaml, resources_from_sections, section

log = logging.getLogger(__name__)

PRESETS_DIR = REPO_ROOT / "experiments"
RESULTS_DIR = PRESETS_DIR / "results"
PROMOTED = "promoted"  # a claim's `ARM@promoted`: the checkpoint the promotion gate holds after the arm's last k
TOP_LEVEL = {"name", "description", "benchmark", "iterations", "model", "arms", "notes", "continue_on_empty_gate",
             "policy_backend", "compare", "replicates", "minimal_effect", "runs",
             *SECTIONS}
MAX_ARMS = 64  # the largest shipped preset has 16; each arm's resources are built when the preset loads


# -- presets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A parsed `experiments/*.yaml`: benchmark, K, model, resource fields, arms."""

    name: str
    benchmark: str
    iterations: int
    model: str = Profile.model  # as a profile's `model` (flywheel/profile.py)
    description: str = ""
    notes: list[str] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    arms: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"bpo": {}})
    source: str = ""
    # The preset-wide value of loop.continue_on_empty_gate (the option is declared there, with its default):
    # True also lets the runner go on past a blocked gate. None: the loop's default.
    continue_on_empty_gate: bool | None = None
    # Who generates in rollouts and evaluation: "transformers" (in process) or "vllm" (a managed
    # vLLM server from `make vllm`'s environment); training is the same TRL SFT either way.
    policy_backend: str = Profile.policy_backend
    # The claims the report states up front: (arm, k, reference arm, k); k None = the arm's last evaluated k,
    # PROMOTED = the checkpoint the promotion gate holds after the arm's last k.
    compare: list[tuple[str, int | str | None, str, int | str | None]] = field(default_factory=list)
    # Replicate runs of one recipe: group name -> its arms (same configuration, independent rollout samples);
    # a claim naming the group's first arm is reported per replicate and pooled over them.
    replicates: dict[str, list[str]] = field(default_factory=dict)
    # The design's power (docs/experiments.md "The design's power"): the smallest difference the claims must
    # detect and the runs per arm planned for it; the report gives each claim's power and says "underpowered".
    minimal_effect: float | None = option(
        None, bound=Bound(0.0, 1.0, integer=False, open_lo=True, why="a success-rate difference"),
        help="the smallest success-rate difference the claims must detect at 80% power, as a fraction (0.07 = 7 "
             "points); null: the report states no power")
    runs: int | None = option(None, bound=Bound(1, 1000, why="runs per arm"),
                              help="runs per arm the design plans (each with its own control); the report "
                                   "compares it with the runs that 80% power needs")

    def arm_sections(self, arm: str) -> dict[str, dict[str, Any]]:
        """The preset's sections with `arm`'s overrides merged in (one level deep per section)."""
        merged = copy.deepcopy(self.sections)
        method = self.method(arm)
        if method != "bpo":  # the fields a method implies (flywheel/orchestration/methods.py) sit between preset and arm
            for section, fields_ in implied_sections(method).items():
                merged.setdefault(section, {}).update(copy.deepcopy(fields_))
        for section, fields_ in self.arms[arm].items():
            merged.setdefault(section, {}).update(copy.deepcopy(fields_))
        return merged


    @property
    def max_partition(self) -> int:
        """The highest iteration partition of this experiment's definitions: K, and at least the default range's (the
        profile's `iterations` its definitions are built with; the arms' stages stop at K)."""
        return max_partition_for(self.iterations)

    def method(self, arm: str) -> str:
        """The arm's training method (flywheel/orchestration/methods.py): `method: NAME` on the arm, else on the preset, else bpo."""
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

    check_benchmark(raw["benchmark"], where=f"{path}: benchmark")
    iterations = check_iterations(raw["iterations"], str(path))
    sections = {s: section(s, raw.get(s), str(path)) for s in SECTIONS if raw.get(s) is not None}
    arms_raw = raw.get("arms") or {"bpo": {}}
    if not isinstance(arms_raw, dict) or not arms_raw:
        raise ConfigurationError(f"{path}: arms must be a non-empty mapping name -> overrides")
    if len(arms_raw) > MAX_ARMS:
        raise ConfigurationError(f"{path}: {len(arms_raw)} arms, more than {MAX_ARMS}: split the preset into several "
                                 "(each arm is a whole run with its own store)")
    arms: dict[str, dict[str, dict[str, Any]]] = {}
    for arm, overrides in arms_raw.items():
        overrides = overrides or {}
        bad = sorted(set(overrides) - set(SECTIONS))
        if bad:
            raise ConfigurationError(f"{path}: arm {arm!r} overrides unknown section(s) {bad}; valid: {list(SECTIONS)}")
        arms[str(arm)] = {s: section(s, v, f"{path}: arm {arm}") for s, v in overrides.items()}
    name = check_plain_name(str(raw.get("name") or path.stem), f"{path}: name")  # names the results' folder
    for arm in arms:
        check_plain_name(arm, f"{path}: arm")  # names its store's folder
    preset = Preset(
        name=name, benchmark=raw["benchmark"], iterations=iterations,
        model=str(raw.get("model") or Preset.model), description=str(raw.get("description") or ""),
        notes=list(raw.get("notes") or []), sections=sections, arms=arms, source=str(path),
        continue_on_empty_gate=(None if raw.get("continue_on_empty_gate") is None
                                else bool(raw["continue_on_empty_gate"])),
        policy_backend=str(raw.get("policy_backend") or Preset.policy_backend),
        compare=[parse_claim(c, arms, where=str(path)) for c in raw.get("compare") or []],
        replicates=parse_replicates(raw.get("replicates") or {}, arms, where=str(path)),
        minimal_effect=check_preset_number(raw, "minimal_effect", where=str(path)),
        runs=check_preset_number(raw, "runs", where=str(path)),
    )
    for arm in preset.arms:  # build every arm's resources now: a bad field fails before any work
        arm_resources(preset, arm, Path("/nonexistent-check"), model_path="/nonexistent-check")
        method = preset.arm_sections(arm).get("method", {})
        for name in ("start_from", "controls"):
            if method.get(name) and (method[name] not in preset.arms or method[name] == arm):
                raise ConfigurationError(f"{path}: arm {arm!r}: method.{name} {method[name]!r} must name another "
                                         f"arm of the preset ({', '.join(a for a in preset.arms if a != arm)})")
        equal_steps = METHODS[preset.method(arm)].equal_steps
        if equal_steps != bool(method.get("controls")):
            raise ConfigurationError(
                f"{path}: arm {arm!r} (method {preset.method(arm)}) needs method.controls: the arm whose SFT steps it "
                "trains at each k" if equal_steps else f"{path}: arm {arm!r}: method.controls is for a method that "
                f"trains as many steps as another arm ({', '.join(m for m in METHODS if METHODS[m].equal_steps)}); "
                f"method {preset.method(arm)} does not: drop it")
    arm_order(preset, list(preset.arms))  # no cycle of start_from / controls
    return preset


def parse_claim(text: Any, arms: dict[str, Any], *, where: str) -> tuple[str, int | str | None, str, int | str | None]:
    """`"bpo@2 vs sft-control@2"` -> ("bpo", 2, "sft-control", 2); `@last` or no `@` = the last evaluated k;
    `@promoted` = the checkpoint the promotion gate holds after the arm's last k (the last k where no gate ran)."""
    def side(s: str) -> tuple[str, int | str | None]:
        arm, _, k = s.strip().partition("@")
        if arm not in arms:
            raise ConfigurationError(f"{where}: compare {text!r}: no arm {arm!r}; arms: {', '.join(arms)}")
        if k in ("", "last"):
            return arm, None
        if k == PROMOTED:
            return arm, PROMOTED
        if not k.isdigit():
            raise ConfigurationError(f"{where}: compare {text!r}: @{k} must be an iteration number, 'last' or "
                                     f"'{PROMOTED}'")
        return arm, int(k)

    if not isinstance(text, str) or text.count(" vs ") != 1:
        raise ConfigurationError(f"{where}: compare entries read 'ARM@K vs ARM@K', got {text!r}")
    (a, ka), (b, kb) = (side(s) for s in text.split(" vs "))
    return a, ka, b, kb


def check_preset_number(raw: dict[str, Any], name: str, *, where: str) -> Any:
    """A top-level numeric field checked against its declared bound (None when the preset leaves it out)."""
    value = raw.get(name)
    if value is None:
        return None
    f = next(f for f in dataclasses.fields(Preset) if f.name == name)
    bound = f.metadata["bound"]
    if not bound.allows(value):
        raise ConfigurationError(f"{where}: {name} must be {bound.describe()} ({bound.why}), got {value!r}; "
                                 f"{name}: {f.metadata['help']}")
    return value


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


def arm_resources(preset: Preset, arm: str, arm_dir: Path, *, model_path: str,
                  policy_fields: dict[str, Any] | None = None,
                  server_pool: ServerPool | None = None) -> dict[str, dg.ConfigurableResource]:
    """The resources dict handed to `build_defs` for one arm: its own store and checkpoints, the
    preset's sections with the arm's overrides, built as a profile's are (`profile.resources_from_sections`).
    `policy_fields` override the policy's for one stage (the equal-compute control's steps); `server_pool`: the
    runner's warm vLLM servers (`policy.keep_server`)."""

    where = f"experiment {preset.name}, arm {arm}"
    if preset.method(arm) not in METHODS:
        raise ConfigurationError(f"{where}: unknown method {preset.method(arm)!r}; valid: {list(METHODS)}")
    sections = preset.arm_sections(arm)
    if policy_fields:
        sections["policy"] = {**sections.get("policy", {}), **policy_fields}
    return resources_from_sections(
        sections, policy_backend=preset.policy_backend, where=where,
        runs_dir=arm_dir, model_path=model_path, iterations=preset.max_partition, store_fields={"method": preset.method(arm)},
        loop_defaults={"continue_on_empty_gate": True} if preset.continue_on_empty_gate else None,
        server_pool=server_pool,
    )


def arm_config(preset: Preset, arm: str, model_path: str) -> dict[str, Any]:
    """What an arm is: preset, arm, benchmark, model and its merged sections (config.json; fingerprinted)."""
    return json.loads(json.dumps({"preset": preset.name, "arm": arm, "benchmark": preset.benchmark,
                                  "model": model_path, "sections": preset.arm_sections(arm)}, default=str))


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
