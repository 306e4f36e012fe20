"""Environment adapters behind one protocol, and the benchmark registry.

The registry is a plain dict: benchmark name -> "module:attribute" of its
`BenchmarkSpec`. Imports are lazy so an unused benchmark's heavy deps
(Java, TextWorld) never load.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from envs.base import SPLITS, BenchmarkSpec, Env, EnvError, StepResult, Task

REGISTRY: dict[str, str] = {
    "alfworld": "envs.alfworld:SPEC",
    "scienceworld": "envs.scienceworld:SPEC",
    "webshop": "envs.webshop:SPEC",
}


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


def load_ref(ref: str):
    """Import `"package.module:attribute"` lazily (registries name their entries this way)."""
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


__all__ = ["REGISTRY", "SPLITS", "BenchmarkSpec", "Env", "EnvError", "StepResult", "Task", "configure_spec", "get_benchmark", "load_ref", "UnknownBenchmarkError"]
