"""A helper process owned by one object: started on first use, closed by its owner.

Benchmarks need long-lived helpers to compute expert paths: ScienceWorld a JVM, ALFWorld a
TextWorld worker process. Each belongs to the benchmark spec object that uses it (a run's
`EnvResource` holds one spec per benchmark and closes it when the run ends), not to the module:
two specs never share one, and nothing is a process-wide singleton. A finalizer still ends the
process at interpreter exit if its owner never called `close()`.

Every helper starts with a clean signal state (`clean_signals`) and is stopped by `stop_process`
(SIGTERM, then SIGKILL after a grace period): a parent that blocks or ignores SIGTERM (a launcher,
a CI runner, or Dagster after copying an ignored SIGINT onto SIGTERM) would otherwise pass that on
across `exec`, and its helpers could not be stopped.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


def clean_signals() -> None:
    """`preexec_fn` for a helper: default dispositions and an empty signal mask, whatever the parent's
    (a blocked mask and ignored dispositions survive `exec`)."""
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # signals Python cannot set (e.g. 32, 33 under glibc)
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


# The signals a launcher commonly blocks or ignores, and that stop a helper.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def clean_signals_for_children() -> Iterator[None]:
    """While the block runs, processes this thread starts (and `exec`) inherit a clean state for STOP_SIGNALS,
    for libraries whose process starts take no `preexec_fn` (`ray.init` starting the GCS and the raylet, whose
    workers inherit from it). This process keeps its own behaviour: a signal it ignored is caught by a no-op
    handler (a handler resets to the default across `exec`) and dropped; one it blocked is caught and raised
    again after the mask is restored, so it stays pending as it would have. Only the main thread can set
    handlers: elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    caught: list[int] = []
    saved = {}
    for sig in STOP_SIGNALS:
        old = signal.getsignal(sig)
        if old is signal.SIG_IGN or sig in mask:
            saved[sig] = old
            signal.signal(sig, lambda signum, _frame: caught.append(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig in caught:
            if sig in mask and saved.get(sig) is not signal.SIG_IGN:
                signal.raise_signal(sig)  # blocked again: pending, as it was before the block


def stop_process(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: never raises for a helper that ignores SIGTERM."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _close_box(box: list, close: Callable) -> None:
    helper, box[0] = box[0], None
    if helper is not None:
        close(helper)


class OwnedProcess(Generic[T]):
    """`use()` hands out the live helper under a lock, starting it (or replacing a dead one)."""

    def __init__(self, start: Callable[[], T], *, close: Callable[[T], None],
                 alive: Callable[[T], bool] = lambda _: True) -> None:
        self._start, self._close, self._alive = start, close, alive
        self._box: list[T | None] = [None]  # the finalizer holds the box, not self
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_box, self._box, close)
        self.starts = 0  # how many times a helper was started (a dead one counts again)

    @contextmanager
    def use(self) -> Iterator[T]:
        with self._lock:
            helper = self._box[0]
            if helper is None or not self._alive(helper):
                _close_box(self._box, self._close)
                helper = self._box[0] = self._start()
                self.starts += 1
            yield helper

    @property
    def running(self) -> bool:
        return self._box[0] is not None

    def close(self) -> None:
        """End the helper (idempotent); the next `use()` starts a new one."""
        with self._lock:
            _close_box(self._box, self._close)

    def __deepcopy__(self, memo: dict) -> OwnedProcess[T]:
        """A copy of its owner gets its own, not-yet-started helper."""
        return _fresh(self._start, self._close, self._alive)

    def __reduce__(self):
        """Pickled with its owner (a spec shipped to a Ray actor): arrives with its own, not-yet-started
        helper; a process and a lock do not travel."""
        return _fresh, (self._start, self._close, self._alive)


def _fresh(start: Callable[[], T], close: Callable[[T], None], alive: Callable[[T], bool]) -> OwnedProcess[T]:
    return OwnedProcess(start, close=close, alive=alive)
