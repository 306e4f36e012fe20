"""One configuration: a profile (a YAML file) configures the Dagster definitions, the CLI and the loop.

Why: the UI, the sensor's and schedule's runs, backfills, the demo and experiments must all run
with the same settings, so that iteration k+1 trains and rolls out exactly as k did. Before
profiles, each entry point took its settings from somewhere else (code defaults, environment
variables read at import time, CLI flags), and the sensor's runs fell back to code defaults.

A profile names:
- `benchmarks`: the benchmark partitions (default: every benchmark in `envs.REGISTRY`): a list of
  registered names, or a mapping name -> "package.module:SPEC" that also names benchmarks by
  reference (`{mybench: "mypkg:SPEC", webshop: null}`, null = the registry's). The references
  reach every lookup of a benchmark's spec (the `envs` resource's `benchmark_refs`); the registry stays
  as it is;
- `iterations`: K, the loop runs iterations 0..K (default 3): the iteration partitions are 0..K, and the
  loop's `iterations` defaults to it (`loop.iterations` may stop the loop earlier);
- `runs_dir`: the store and checkpoints (relative paths are relative to the repository);
- `model`: the base model, `smollm2` (the prepared SmolLM2-135M folder), `tiny` (a tiny random
  Llama built under runs_dir, for smoke runs) or a model folder;
- `policy_backend`: `transformers` (in process), `vllm` (a managed vLLM server) or `openai` (any
  OpenAI-compatible server: `policy: {base_url: ...}`);
- `loop_cron`: the schedule's cadence;
- and the fields of each resource, section by section, with exactly the names the resources use:
  `envs`, `policy`, `loop`, `curriculum`, `method` and `teacher` (absent or without `base_url`: the
  scripted teacher; `{base_url, model, ...}`: an OpenAI-compatible teacher, key from $FLYWHEEL_TEACHER_API_KEY).

Every field is declared once, in its resource class; an unknown field fails before any work,
naming the valid ones. Experiment presets (`flywheel/config/presets.py`) are profiles plus arms and
build their resources with `resources_from_sections` below.

Nothing here reads the environment at import: the code location (`flywheel.definitions.defs`) and a
command (`profile_of`, when the CLI runs it) are the only places that read `$FLYWHEEL_PROFILE`, once, when
they start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.core.decisions import StopRules
from flywheel.core.options import option_field
from flywheel.core.settings import (
    DEFAULT_ITERATIONS,
    DEFAULT_LOOP_CRON,
    DEFAULT_RUNS_DIR,
    PROFILE_ENV,
    REPO_ROOT,
    SMOLLM2_DIR,
)
from flywheel.core.validation import (
    ConfigurationError,
    check_benchmark,
    check_benchmark_refs,
    check_options,
    load_yaml,
)
from flywheel.policy.vllm_server import ServerPool
from flywheel.resources import (
    CurriculumResource,
    EnvResource,
    LoopResource,
    MethodResource,
    OpenAITeacherResource,
    ScriptedTeacherResource,
    StoreResource,
)
from flywheel.resources.fields import bounds_of
from flywheel.resources.policy import ManagedVLLMPolicy, OpenAICompatiblePolicy, TransformersPolicy

log = logging.getLogger(__name__)

SECTIONS = ("envs", "policy", "loop", "curriculum", "teacher", "method")
# The names `policy_backend` takes, checked without importing the resources (they import torch).
POLICY_BACKENDS = ("transformers", "vllm", "openai")


def check_iterations(value: Any, where: str) -> int:
    """K (`iterations`) of a profile or preset within the bound `StopRules.iterations` declares."""
    bound = option_field(StopRules, "iterations").metadata["bound"]
    if not bound.allows(value):
        raise ConfigurationError(f"{where}: {bound.refusal('iterations', value)}")
    return value


def policy_classes() -> dict[str, type[dg.ConfigurableResource]]:
    """`policy_backend` name -> the policy resource class it picks."""

    return dict(zip(POLICY_BACKENDS, (TransformersPolicy, ManagedVLLMPolicy, OpenAICompatiblePolicy), strict=True))


def _all_benchmarks() -> tuple[str, ...]:
    from envs import REGISTRY

    return tuple(sorted(REGISTRY))


def model_folder(model: str, runs: Path) -> str:
    """The base model folder `model` names: `smollm2` (the prepared SmolLM2-135M), `tiny` (built under
    `runs` when needed) or a folder (not checked here: resources check it when they start)."""
    if model == "smollm2":
        return str(SMOLLM2_DIR)
    if model == "tiny":
        return str(runs / "tiny-model")
    return str(Path(model).expanduser())


@dataclass(frozen=True)
class Profile:
    """A parsed profile (see the module doc); `Profile()` is the built-in default."""

    benchmarks: tuple[str, ...] = field(default_factory=_all_benchmarks)
    # The benchmarks named by reference (name -> "package.module:SPEC"), each one of `benchmarks`.
    benchmark_refs: dict[str, str] = field(default_factory=dict)
    iterations: int = DEFAULT_ITERATIONS  # K: partitions 0..K, and the loop's K unless loop.iterations is lower
    runs_dir: str = DEFAULT_RUNS_DIR.name
    model: str = "smollm2"
    policy_backend: str = "transformers"
    loop_cron: str = DEFAULT_LOOP_CRON
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "profile"
        for name in ("runs_dir", "model", "loop_cron"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ConfigurationError(f"{where}: {name} must be a non-empty string, got {getattr(self, name)!r}: "
                                         f"set {name} to a {'folder' if name == 'runs_dir' else 'name'} in quotes")
        if not self.benchmarks:
            raise ConfigurationError(f"{where}: benchmarks must name at least one benchmark")
        stray = sorted(set(self.benchmark_refs) - set(self.benchmarks))
        if stray:
            raise ConfigurationError(f"{where}: benchmark reference(s) {stray} name no benchmark of benchmarks "
                                     f"{list(self.benchmarks)}")
        check_benchmark_refs(self.benchmark_refs, where=f"{where}: benchmarks")
        for b in self.benchmarks:
            check_benchmark(b, where=f"{where}: benchmarks", refs=self.benchmark_refs)
        check_iterations(self.iterations, where)
        if self.policy_backend not in POLICY_BACKENDS:
            raise ConfigurationError(f"{where}: policy_backend must be one of {list(POLICY_BACKENDS)}, "
                                     f"got {self.policy_backend!r}")
        bad = sorted(set(self.sections) - set(SECTIONS))
        if bad:
            raise ConfigurationError(f"{where}: unknown section(s) {bad}; valid: {list(SECTIONS)}")

    @property
    def runs_path(self) -> Path:
        p = Path(self.runs_dir).expanduser()
        return p if p.is_absolute() else REPO_ROOT / p

    def model_path(self) -> str:
        """The base model folder `model` names (see `model_folder`)."""
        return model_folder(self.model, self.runs_path)

    def resources(self, server_pool: ServerPool | None = None) -> dict[str, dg.ConfigurableResource]:
        """The resources `build_defs` gets: store and checkpoints under runs_dir, the profile's fields;
        `server_pool`: a driver's warm vLLM servers (`resources_from_sections`)."""
        return resources_from_sections(
            self.sections, policy_backend=self.policy_backend, where=self.source or "profile",
            runs_dir=self.runs_path, model_path=self.model_path(), iterations=self.iterations,
            benchmark_refs=self.benchmark_refs, benchmarks=self.benchmarks, server_pool=server_pool,
        )

    def to_yaml(self) -> str:
        """This profile as a profile file: `load_profile` of the text gives it back (the demo writes its own, which
        `make ui` loads, so that the UI's code location has the demo's resources)."""
        import yaml

        refs = self.benchmark_refs
        top = {"benchmarks": {b: refs.get(b) for b in self.benchmarks} if refs else list(self.benchmarks),
               "iterations": self.iterations, "runs_dir": self.runs_dir, "model": self.model,
               "policy_backend": self.policy_backend, "loop_cron": self.loop_cron}
        return yaml.safe_dump({**top, **self.sections}, sort_keys=False)


TOP_LEVEL = tuple(f.name for f in dataclasses.fields(Profile)
                  if f.name not in ("sections", "source", "benchmark_refs")) + SECTIONS  # refs: in `benchmarks`


# Old spellings of a field, accepted for one release with a warning naming the new one: (section or "" for the
# top level, old name) -> new name. K, the number of iterations, is `iterations` everywhere (docs/configuration.md).
RENAMED = {("", "max_iteration"): "iterations", ("loop", "max_iterations"): "iterations"}


def renamed(fields_: dict[str, Any], where: str, section_name: str = "") -> dict[str, Any]:
    """`fields_` with each old spelling (RENAMED) replaced by the new name, warning once per use; both given is
    an error naming the one to keep."""
    out = dict(fields_)
    for (sec, old), new in RENAMED.items():
        if sec != section_name or old not in out:
            continue
        shown = f"{sec}.{old}" if sec else old
        new_shown = f"{sec}.{new}" if sec else new
        if new in out:
            raise ConfigurationError(f"{where}: {shown} is the old name of {new_shown} and both are set: keep "
                                     f"{new_shown} only")
        message = f"{where}: {shown} is deprecated (accepted for one release): rename it to {new_shown}"
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        log.warning(message)
        out[new] = out.pop(old)
    return out


def section(name: str, value: Any, where: str = "profile") -> dict[str, Any]:
    """A section's fields; `method: NAME` is short for `method: {name: NAME}`, `teacher: scripted` for none."""
    if name == "method" and isinstance(value, str):
        return {"name": value}
    if name == "teacher" and value == "scripted":
        return {}
    if value is not None and not isinstance(value, dict):
        raise ConfigurationError(f"{where}: section {name!r} must be a mapping of fields, got {value!r}")
    return renamed(value or {}, where, name)


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping, or a ConfigurationError naming the file and the problem."""
    if not path.is_file():
        raise ConfigurationError(f"no such file: {path}")
    try:
        raw = load_yaml(path.read_text(), str(path)) or {}
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{path} is not UTF-8 text: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path} must be a mapping of fields, got {type(raw).__name__}")
    return raw


def benchmarks_field(value: Any, source: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """(names, references) of `benchmarks`: a name, a list of names, or a mapping name -> reference or null."""
    if isinstance(value, str):
        return (value,), {}
    if isinstance(value, dict):
        bad = {k: v for k, v in value.items() if not isinstance(k, str) or not (v is None or isinstance(v, str))}
        if bad:
            raise ConfigurationError(f"{source}: benchmarks maps each name to 'package.module:SPEC' or null "
                                     f"(the registry's), got {bad}")
        return tuple(value), {k: v for k, v in value.items() if v is not None}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value), {}
    raise ConfigurationError(f"{source}: benchmarks must be a list of names or a mapping name -> "
                             f"'package.module:SPEC', got {value!r}")


def profile_from_mapping(raw: dict[str, Any], *, source: str = "profile") -> Profile:
    raw = renamed(raw, source)
    unknown = sorted(set(raw) - set(TOP_LEVEL))
    if unknown:
        raise ConfigurationError(f"{source}: unknown field(s) {unknown}; valid: {sorted(TOP_LEVEL)}")
    top = {k: v for k, v in raw.items() if k not in SECTIONS}
    if "benchmarks" in top:
        top["benchmarks"], top["benchmark_refs"] = benchmarks_field(top["benchmarks"], source)
    sections = {s: section(s, raw[s], source) for s in SECTIONS if raw.get(s) is not None}
    profile = Profile(**top, sections=sections, source=source)
    profile.resources()  # every field checked now: a bad one fails before any work
    return profile


def load_profile(path: str | Path | None) -> Profile:
    """The profile in `path`; None (no profile named) is the built-in default `Profile()`."""
    if path is None or str(path).strip() == "":
        return Profile()
    p = Path(path).expanduser()
    return profile_from_mapping(read_yaml(p), source=str(p))


def profile_of(args: Any) -> Profile:
    """The one configuration of a command (`args`: its parsed flags): --profile, else $FLYWHEEL_PROFILE (read
    here, when the command runs), else the built-in defaults; resolved once and kept on `args.profile`."""
    if not isinstance(args.profile, Profile):
        args.profile = load_profile(args.profile if args.profile is not None else os.environ.get(PROFILE_ENV))
    return args.profile


# -- resources -------------------------------------------------------------------------------
def resource_classes(policy_backend: str) -> dict[str, type[dg.ConfigurableResource]]:
    """Section name -> the resource class that section configures (the policy's by backend)."""

    policies = policy_classes()
    if policy_backend not in policies:
        raise ConfigurationError(f"policy_backend must be one of {sorted(policies)}, got {policy_backend!r}")
    return {"envs": EnvResource, "policy": policies[policy_backend], "loop": LoopResource,
            "curriculum": CurriculumResource, "method": MethodResource}


def build_one(cls: type[dg.ConfigurableResource], name: str, fields_: dict[str, Any], where: str) -> dg.ConfigurableResource:
    valid = set(cls.model_fields)
    bad = sorted(set(fields_) - valid)
    if bad:
        raise ConfigurationError(f"{where}: unknown {name} field(s) {bad}; valid: {sorted(valid)}")
    try:
        return cls(**fields_)
    except Exception as exc:  # pydantic's message names the field and the expected type
        raise ConfigurationError(f"{where}: invalid {name} settings: {' '.join(str(exc).split())[:500]}") from None


def resources_from_sections(
    sections: dict[str, dict[str, Any]], *, policy_backend: str, where: str, runs_dir: Path, model_path: str, iterations: int, store_fields: dict[str, Any] | None = None,
    loop_defaults: dict[str, Any] | None = None, benchmark_refs: dict[str, str] | None = None,
    benchmarks: tuple[str, ...] | None = None, server_pool: ServerPool | None = None,
) -> dict[str, dg.ConfigurableResource]:
    """The resources dict handed to `build_defs`, built section by section from plain fields (a profile's, the
    demo's, or an experiment arm's: `config.presets.arm_resources`); the store (`flywheel.duckdb`) and the
    checkpoints live in `runs_dir`; `iterations` is the profile's K (the highest iteration partition, and the
    loop's K unless its section says less).

    `benchmark_refs` (the benchmarks named by reference) reach `envs`, which every spec lookup goes
    through; `benchmarks` (the partitions, when known) bound the loop's. `server_pool` is the driver's pool of
    warm vLLM servers (`policy.keep_server`): the driver owns it and stops its servers."""

    out: dict[str, dg.ConfigurableResource] = {
        "store": StoreResource(path=str(runs_dir / "flywheel.duckdb"), **(store_fields or {}))}
    for name, cls in resource_classes(policy_backend).items():
        fields_ = dict(sections.get(name, {}))
        if name == "policy":
            fields_.setdefault("base_model_path", model_path)
            fields_.setdefault("checkpoints_dir", str(runs_dir / "checkpoints"))
        if name == "policy" and server_pool is not None and "server_pool" in cls.model_fields:
            fields_["server_pool"] = server_pool
        if name == "envs" and benchmark_refs:
            fields_.setdefault("benchmark_refs", dict(benchmark_refs))
        if name == "loop":
            for k, v in (loop_defaults or {}).items():
                fields_.setdefault(k, v)
            fields_.setdefault("iterations", iterations)
        try:
            check_options(fields_, bounds=bounds_of(cls), where=f"{name}.")  # the fields' bounds, before any work
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        out[name] = build_one(cls, name, fields_, where)
    try:
        out["loop"].validate(iterations, benchmarks)  # type: ignore[attr-defined]
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    teacher = dict(sections.get("teacher", {}))  # with a base_url: an OpenAI-compatible endpoint, else scripted
    teacher_cls = OpenAITeacherResource if "base_url" in teacher else ScriptedTeacherResource
    try:
        check_options(teacher, bounds=bounds_of(teacher_cls), where="teacher.")
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    out["teacher"] = build_one(teacher_cls, "teacher", teacher, where)
    return out
