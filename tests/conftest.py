"""Test-wide settings."""

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
import torch

from flywheel.policy.models import build_tiny_model
from tests.fakes import filled_store

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

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@pytest.fixture(autouse=True)
def _signal_state_restored():
    """Each test leaves the worker's signal dispositions and mask as it found them. Dagster's in-process
    execution copies SIGINT's handler onto SIGTERM and leaves it there: under a launcher that ignores
    SIGINT (a background job of a non-interactive shell) every later helper inherited an ignored SIGTERM."""
    handlers, mask = [signal.getsignal(s) for s in _SIGNALS], signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    for sig, handler in zip(_SIGNALS, handlers, strict=True):
        if handler is not None:  # None: set outside Python, left alone
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def pytest_addoption(parser):
    parser.addoption(
        "--test-order", default="file", metavar="ORDER",
        help="order of test modules (and of the tests inside each): 'file' (collection order, the default), "
             "'reverse', or 'shuffle:SEED' (a seeded shuffle; every xdist worker computes the same order). "
             "A module's tests stay together, so module-scoped fixtures are built once. "
             "Example: make test TEST_ARGS='--test-order shuffle:7'")


def pytest_collection_modifyitems(config, items):
    order = config.getoption("--test-order")
    if order == "file":
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    if order == "reverse":
        groups = [g[::-1] for g in groups[::-1]]
    elif order.startswith("shuffle:") and order[8:].isdigit():
        import random

        rng = random.Random(int(order[8:]))
        rng.shuffle(groups)
        for g in groups:
            rng.shuffle(g)
    else:
        raise pytest.UsageError(f"--test-order must be 'file', 'reverse' or 'shuffle:SEED' (an integer), got {order!r}")
    items[:] = [item for g in groups for item in g]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A tiny random Llama (vocabulary 512), built once per test module: fast to train and to sample, and never
    successful, so a test that needs successes plays a scripted policy (tests/loop_support.py)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", vocab_size=512))


@pytest.fixture
def store(tmp_path):
    """tests.fakes.filled_store: what the export and view tests read."""
    return filled_store(tmp_path)
