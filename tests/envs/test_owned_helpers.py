"""Expert helpers (a JVM, a worker process) are owned by a spec, and a run's EnvResource ends them.

A spec defined here by reference (a tiny benchmark whose gold paths "need" a helper process, as
ScienceWorld's need a JVM) stands in for the real ones, so the lifetime is tested without Java.
Every test runs under a parent with default signals, one that blocks SIGTERM and one that ignores it
(children inherit both across `exec`): helpers must still start clean and be stopped.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import dagster as dg
import psutil
import pytest

from envs import configure_spec
from envs.base import Task
from envs.owned import OwnedProcess, clean_signals, clean_signals_for_children, stop_process
from flywheel.resources.envs import EnvResource
from tests.signal_support import PARENTS, parent_sigterm, sigterm_state
from tests.tinybench import TinySpec


@pytest.fixture(autouse=True, params=PARENTS)
def parent(request):
    with parent_sigterm(request.param):
        yield request.param


def _sleeper(code: str = "import time; time.sleep(600)") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=clean_signals)


def _helper() -> OwnedProcess[subprocess.Popen]:
    return OwnedProcess(_sleeper, close=stop_process, alive=lambda p: p.poll() is None)


@dataclass(frozen=True)
class HelperSpec(TinySpec):
    name: str = "helpertiny"
    _helper: OwnedProcess[subprocess.Popen] = field(default_factory=_helper, init=False, repr=False, compare=False)

    def expert_actions(self, task: Task) -> list[str]:
        with self._helper.use():
            return super().expert_actions(task)

    def helper_pid(self) -> int:
        with self._helper.use() as proc:
            return proc.pid

    def close(self) -> None:
        self._helper.close()


SPEC = HelperSpec()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_owned_process_starts_once_restarts_a_dead_one_and_closes():
    owned = _helper()
    assert not owned.running and owned.starts == 0  # lazy: nothing until first use
    with owned.use() as first:
        pass
    with owned.use() as again:
        assert again is first and owned.starts == 1
    first.kill()
    first.wait()
    with owned.use() as second:
        assert second is not first and owned.starts == 2  # a dead helper is replaced
    owned.close()
    owned.close()  # idempotent
    assert not owned.running and _gone(second.pid)


def test_a_helper_starts_with_sigterm_neither_blocked_nor_ignored():
    owned = _helper()
    with owned.use() as proc:
        assert sigterm_state(proc.pid) == (False, False)
    owned.close()
    assert _gone(proc.pid)


def test_a_library_started_child_gets_a_clean_state_and_the_parent_keeps_its_own(parent):
    """`ray.init` starts its GCS and raylet with no preexec_fn: inside `clean_signals_for_children` they (and the
    workers they start) inherit SIGTERM neither blocked nor ignored, and this process's own state comes back."""
    before = (signal.pthread_sigmask(signal.SIG_BLOCK, ()), signal.getsignal(signal.SIGTERM))
    with clean_signals_for_children():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if parent != "default":
            signal.raise_signal(signal.SIGTERM)  # arrives in the window: must not end or change this process
    try:
        assert sigterm_state(proc.pid) == (False, False)
    finally:
        stop_process(proc, grace_s=2)
    assert (signal.pthread_sigmask(signal.SIG_BLOCK, ()), signal.getsignal(signal.SIGTERM)) == before
    if parent == "blocked":  # still pending, as if it had arrived while blocked
        assert signal.SIGTERM in signal.sigpending()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # discard it before the fixture unblocks
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGTERM, before[1])
        assert signal.SIGTERM not in signal.sigpending()


def test_stopping_a_helper_that_ignores_sigterm_escalates_to_sigkill():
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, preexec_fn=clean_signals)
    proc.stdout.readline()  # its handler is set
    stop_process(proc, grace_s=0.5)  # does not raise
    assert proc.returncode == -signal.SIGKILL


def test_an_unclosed_helper_ends_when_its_owner_is_collected():
    owned = _helper()
    with owned.use() as proc:
        pid = proc.pid
    del owned, proc
    gc.collect()
    assert _gone(pid)


def test_each_configured_spec_has_its_own_helper():
    a, b = configure_spec(SPEC, {}), configure_spec(SPEC, {})
    assert a is not SPEC and a is not b and a == b  # equal values, separate helpers
    try:
        assert a.helper_pid() != b.helper_pid()
        assert not SPEC._helper.running  # the registry's value never starts one
    finally:
        a.close()
        b.close()


def test_a_pickled_spec_arrives_with_its_own_unstarted_helper():
    """Ray ships a spec's bound `make_env` to its env actors: a lock and a process do not travel."""
    from ray import cloudpickle

    a = configure_spec(SPEC, {})
    try:
        pid = a.helper_pid()
        b = cloudpickle.loads(cloudpickle.dumps(a))
        assert b == a and b._helper is not a._helper and not b._helper.running
        assert b.helper_pid() != pid and a.helper_pid() == pid
        b.close()
    finally:
        a.close()


def test_a_runs_env_resource_owns_one_spec_per_benchmark_and_ends_its_helpers():
    @dg.asset
    def gold(envs: EnvResource) -> int:
        spec = envs.spec("helpertiny")
        assert envs.spec("helpertiny") is spec  # one spec per benchmark for the run
        task = spec.load_tasks("train")[0]
        assert spec.expert_actions(task) == spec.expert_actions(task)
        assert spec._helper.starts == 1  # both gold paths on one helper
        return spec.helper_pid()

    resource = EnvResource(benchmark_refs={"helpertiny": "tests.envs.test_owned_helpers:SPEC"})
    result = dg.materialize([gold], resources={"envs": resource})
    assert result.success
    pid = result.output_for_node("gold")
    assert _gone(pid)  # ended when the run's execution ended, not at interpreter exit
    assert not SPEC._helper.running
