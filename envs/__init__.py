"""Environment adapters behind one protocol, and the benchmark registry.

The registry is a plain dict: benchmark name -> "module:attribute" of its
`BenchmarkSpec`. Imports are lazy so an unused benchmark's heavy deps
(Java, TextWorld) never load.
"""

from __future__ import annotations

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


def get_benchmark(name: str) -> BenchmarkSpec:
    if name not in REGISTRY:
        raise UnknownBenchmarkError(
            f"Unknown benchmark {name!r}. Known: {', '.join(sorted(REGISTRY))}. "
            "Register a new one in envs/__init__.py."
        )
    return load_ref(REGISTRY[name])


def configure_spec(spec: BenchmarkSpec, options: dict[str, Any]) -> BenchmarkSpec:
    """A copy of a (dataclass) spec with some fields set, e.g. ScienceWorld's `prompt="compact"`."""
    if not options:
        return spec
    fields = ({f.name for f in dataclasses.fields(spec) if f.init and f.name != "name"}
              if dataclasses.is_dataclass(spec) else set())
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
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


__all__ = [
    "DEFAULT_BENCHMARK", "REGISTRY", "SPLITS", "BenchmarkSpec", "Env", "EnvError", "StepResult", "Task",
    "check_env_options", "configure_spec", "env_option_names", "get_benchmark", "load_ref", "UnknownBenchmarkError",
]
