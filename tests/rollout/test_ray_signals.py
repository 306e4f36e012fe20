"""A local Ray cluster started under a parent that blocks or ignores SIGTERM can still be stopped: its GCS and
raylet (and the workers they start) inherit a clean signal state (`envs.owned.clean_signals_for_children`)."""

from __future__ import annotations

import psutil
import pytest

from flywheel.policy.ray_session import RayOptions, ray_session
from tests.signal_support import parent_sigterm, sigterm_state

pytestmark = pytest.mark.slow  # starts a Ray cluster per parameter (~15 s each on 2 cores)


@pytest.mark.parametrize("parent", ["blocked", "ignored"])
def test_ray_processes_start_stoppable_under_a_parent_that_blocks_or_ignores_sigterm(parent):
    pytest.importorskip("ray")
    with parent_sigterm(parent), ray_session(RayOptions(num_cpus=1, namespace="signals")) as ray:
        @ray.remote
        def pid() -> int:
            import os

            return os.getpid()

        worker = ray.get(pid.remote())
        started = [p for p in psutil.Process().children(recursive=True)
                   if any(name in " ".join(p.cmdline()) for name in ("gcs_server", "raylet"))]
        assert started, "no GCS or raylet process found under this one"
        for proc in [*started, psutil.Process(worker)]:
            assert sigterm_state(proc.pid) == (False, False), proc.cmdline()[:2]
