"""Test-wide settings."""

import os
import shutil
import tempfile
from pathlib import Path

import torch

# Tests run tiny models beside JVMs on a 2-core machine: one torch thread avoids
# OpenMP spin-wait thrash that makes tiny matmuls ~20x slower.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Each test process gets its own Dagster instance home (the repository's dagster.yaml, so pools and
# run limits are the real ones), never the developer's `.dagster_home` that `make` exports: the CLI
# commands the tests call in process (`demo`, `experiment`) use $DAGSTER_HOME, and two pytest-xdist
# workers sharing one instance would see each other's runs holding the accelerator pool.
_HOME = Path(tempfile.mkdtemp(prefix=f"flywheel-dagster-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"))
shutil.copy(Path(__file__).resolve().parents[1] / "dagster.yaml", _HOME / "dagster.yaml")
os.environ["DAGSTER_HOME"] = str(_HOME)
