"""Environment adapters behind one protocol, and the benchmark registry.

The registry is a plain dict: benchmark name -> "module:attribute" of its
`BenchmarkSpec`. Imports are lazy so an unused benchmark's heavy deps
(Java, TextWorld) never load.

The registry is configuration, never mutated at runtime: a benchmark that lives elsewhere
(a package of your own, a test's) is named by reference where it is used, e.g. in a
profile (`benchmarks: {mybench: "mypkg:SPEC"}`), and every lookup takes those extra
references (`refs`) beside the registry's.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import typing
from typing import Any

from envs.base import SPLITS, BenchmarkSpec, Env, EnvError, StepResult, Task

REGISTRY: dict[str, str] = {
    "alfworld": "envs.alfworld:SPEC",
    "scienceworld": "envs.scienceworld:SPEC",
    "webshop": "envs.webshop:SPEC",
}
# What `flywheel demo` and `flywheel report` use when no --benchmark is given.
DEFAULT_BENCHMARK = "scienceworld"


class UnknownBenchmarkError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def known_benchmarks(refs: dict[str, str] | None = None) -> dict[str, str]:
    """Name -> reference of every benchmark a lookup with these extra `refs` finds (they win over the registry's)."""
    return {**REGISTRY, **(refs or {})}


def get_benchmark(name: str, refs: dict[str, str] | None = None) -> BenchmarkSpec:
    """The spec `name` refers to: in `refs` (name -> "module:attribute"), else in the registry.

    The spec must call itself `name` (its tasks and the store's rows carry `spec.name`, the
    partitions the name it was looked up by) and have the protocol's methods.
    """
    known = known_benchmarks(refs)
    if name not in known:
        raise UnknownBenchmarkError(
            f"Unknown benchmark {name!r}. Known: {', '.join(sorted(known))}. "
            "Register a new one in envs/__init__.py, or name it by reference in a profile "
            f"(benchmarks: {{{name}: \"package.module:SPEC\"}})."
        )
    spec = load_ref(known[name])
    if not isinstance(spec, BenchmarkSpec):
        missing = [m for m in ("name", *_PROTOCOL_METHODS) if not hasattr(spec, m)]
        raise TypeError(f"{known[name]} is not a BenchmarkSpec (envs/base.py): it lacks {', '.join(missing)}")
    if spec.name != name:
        raise ValueError(f"{known[name]} is the benchmark {spec.name!r}, not {name!r}: name it by its own name")
    return spec


_PROTOCOL_METHODS = ("load_tasks", "make_env", "system_prompt", "expert_actions", "normalize_action",
                     "describe_action")


def configure_spec(spec: BenchmarkSpec, options: dict[str, Any]) -> BenchmarkSpec:
    """A spec of its own, with some fields set (e.g. ScienceWorld's `prompt="compact"`).

    Always a new object, even without options: its caches and expert helpers (a gold-path JVM,
    a worker process) start empty and belong to whoever asked (an `EnvResource`, for a run),
    never to the module-level spec in the registry.
    """
    if not dataclasses.is_dataclass(spec):
        if options:
            raise ValueError(f"Unknown option(s) {sorted(options)} for benchmark {spec.name!r}. Valid: none")
        return copy.deepcopy(spec)
    fields = {f.name for f in dataclasses.fields(spec) if f.init and f.name != "name"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for benchmark {spec.name!r}. Valid: {', '.join(sorted(fields)) or 'none'}"
        )
    return dataclasses.replace(spec, **options)  # type: ignore[type-var]


def env_option_names(spec: BenchmarkSpec) -> list[str] | None:
    """The keyword options `spec.make_env` accepts, or None when its signature cannot tell.

    A `make_env(**options)` passes them on to its env class, so the names are that class's
    keyword parameters, found through `make_env`'s return annotation (no env is built).
    """
    own = inspect.signature(spec.make_env).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in own):
        return _keyword_names(own)
    try:
        env_class = typing.get_type_hints(spec.make_env).get("return")
    except (NameError, TypeError):  # an annotation that does not resolve: nothing to check against
        return None
    if not isinstance(env_class, type):
        return None
    params = inspect.signature(env_class).parameters.values()
    return None if any(p.kind is p.VAR_KEYWORD for p in params) else _keyword_names(params)


def _keyword_names(params) -> list[str]:
    return sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def check_env_options(spec: BenchmarkSpec, options: dict[str, Any]) -> None:
    """ValueError naming the valid ones when `options` has a key `spec.make_env` does not take."""
    names = env_option_names(spec)
    unknown = sorted(set(options) - set(names)) if names is not None else []
    if unknown:
        raise ValueError(
            f"Unknown env option(s) {unknown} for benchmark {spec.name!r}. Valid: {', '.join(names or []) or 'none'}"
        )


def load_ref(ref: str):
    """Import `"package.module:attribute"` lazily (registries name their entries this way)."""
    module, sep, attr = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not (module and sep and attr) or ":" in attr:
        raise ValueError(f"{ref!r} is not a reference of the form 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


__all__ = [
    "DEFAULT_BENCHMARK", "REGISTRY", "SPLITS", "BenchmarkSpec", "Env", "EnvError", "StepResult", "Task",
    "check_env_options", "configure_spec", "env_option_names", "get_benchmark", "known_benchmarks", "load_ref",
    "UnknownBenchmarkError",
]
