"""Project paths that every layer agrees on, overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def runs_dir() -> Path:
    """Where the store and checkpoints live (`$FLYWHEEL_RUNS_DIR`, else `<repo>/runs`)."""
    return Path(os.environ.get("FLYWHEEL_RUNS_DIR", REPO_ROOT / "runs")).expanduser()


def default_base_model() -> str:
    return os.environ.get("FLYWHEEL_BASE_MODEL", str(REPO_ROOT / ".cache" / "models" / "smollm2-135m"))


def max_iteration() -> int:
    """Highest iteration partition k (iterations are 0..K)."""
    value = _int_env("FLYWHEEL_MAX_ITERATION", 3)
    if value < 0:
        raise ValueError(f"FLYWHEEL_MAX_ITERATION must be >= 0, got {value}: set it to the highest iteration partition")
    return value


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def iteration_budget() -> int:
    """K of the living flywheel: the loop runs iterations 0..K and then stops.

    `$FLYWHEEL_ITERATION_BUDGET`, default `max_iteration()`. It must lie in 0..FLYWHEEL_MAX_ITERATION
    because every iteration is a partition that has to exist.
    """
    cap = max_iteration()
    value = _int_env("FLYWHEEL_ITERATION_BUDGET", cap)
    if value < 0:
        raise ValueError(f"FLYWHEEL_ITERATION_BUDGET (K) must be >= 0, got {value}: set it to 0..{cap}")
    if value > cap:
        raise ValueError(
            f"FLYWHEEL_ITERATION_BUDGET (K) = {value} exceeds the iteration partitions 0..{cap}: "
            f"raise FLYWHEEL_MAX_ITERATION to at least {value} or lower the budget"
        )
    return value


def loop_cron() -> str:
    """Cadence of `flywheel_schedule` (`$FLYWHEEL_LOOP_CRON`, default every 30 minutes)."""
    return os.environ.get("FLYWHEEL_LOOP_CRON", "*/30 * * * *")


def rollout_retry_delay_s() -> float:
    """First delay of the rollouts op retry policy (`$FLYWHEEL_ROLLOUT_RETRY_DELAY_S`, default 10 s)."""
    return float(os.environ.get("FLYWHEEL_ROLLOUT_RETRY_DELAY_S", "10"))
