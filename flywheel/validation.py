"""Fail fast on bad configuration, before any expensive work, with a message that names the fix.

Plain functions (no Dagster): the resources call them in `setup_for_execution` (so a run
fails at its first step, before a JVM starts or a model loads), the sensors call them on
every tick, and `pipeline.run_flywheel` calls them before its first run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from envs import REGISTRY, get_benchmark
from envs.data import ENV_VAR as DATA_ENV_VAR
from envs.data import MissingDataError, data_dir


class ConfigurationError(ValueError):
    """A configuration that cannot work; the message says how to fix it."""


def check_benchmark(name: str, *, where: str = "benchmark") -> str:
    if name not in REGISTRY:
        raise ConfigurationError(
            f"Unknown benchmark {name!r} in {where}. Known: {', '.join(sorted(REGISTRY))}. "
            "Fix the name, or register a new benchmark in envs/__init__.py."
        )
    return name


def check_benchmarks(names: Iterable[str], *, where: str) -> list[str]:
    return [check_benchmark(n, where=where) for n in names]


def check_budget(k: int, *, max_partition: int) -> int:
    """K (iterations 0..K) must be >= 0 and have a partition for every iteration."""
    if k < 0:
        raise ConfigurationError(
            f"The iteration budget K must be >= 0, got {k}: set loop.max_iterations "
            "(or FLYWHEEL_ITERATION_BUDGET) to 0 or more."
        )
    if k > max_partition:
        raise ConfigurationError(
            f"The iteration budget K = {k} exceeds the iteration partitions 0..{max_partition}: "
            f"raise FLYWHEEL_MAX_ITERATION to at least {k}, or lower loop.max_iterations."
        )
    return k


def check_model_path(path: str | Path, *, what: str = "policy.base_model_path") -> Path:
    p = Path(path)
    if not (p / "config.json").exists():
        raise ConfigurationError(
            f"No Hugging Face model at {p} ({what}; config.json missing). Run `make model` for "
            "SmolLM2-135M, `python -m flywheel.cli prepare-model --tiny PATH` for a test model, or set "
            f"{what} / FLYWHEEL_BASE_MODEL to a local HF checkpoint."
        )
    return p


def check_data(benchmark: str, splits: Iterable[str] = ("train", "seen", "unseen")) -> None:
    """The benchmark's offline data is where the loaders look (cheap: reads the split files only)."""
    root = data_dir()
    if not root.is_dir():
        raise ConfigurationError(
            f"Data folder {root} does not exist ({benchmark} needs its offline data): put the project's "
            f"shared data there or set {DATA_ENV_VAR} to the folder that holds it."
        )
    spec = get_benchmark(check_benchmark(benchmark))
    for split in splits:
        try:
            spec.load_tasks(split, limit=1)
        except MissingDataError as exc:
            raise ConfigurationError(f"{benchmark} data missing for split {split!r}: {exc}") from None


def check_positive(value: int | float, name: str) -> None:
    if value <= 0:
        raise ConfigurationError(f"{name} must be > 0, got {value}")
