"""A parent that blocks or ignores SIGTERM (as some launchers and CI runners do), for helper tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

PARENTS = ("default", "blocked", "ignored")


@contextmanager
def parent_sigterm(state: str) -> Iterator[None]:
    """SIGTERM in the state `state` names, whatever this process inherited, until the block ends: "default"
    (default disposition, unblocked), "blocked" (default disposition, blocked in this thread: a SIGTERM raised
    stays pending) or "ignored" (ignored, unblocked). Under a launcher that ignores SIGTERM, "blocked" without
    resetting the disposition was blocked *and* ignored: a raised SIGTERM was discarded, not pending."""
    mask, handler = signal.pthread_sigmask(signal.SIG_BLOCK, ()), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if state == "ignored" else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK if state == "blocked" else signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def sigterm_state(pid: int) -> tuple[bool, bool]:
    """(blocked, ignored) for SIGTERM in process `pid`, from /proc."""
    lines = open(f"/proc/{pid}/status").read().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    bit = 1 << (signal.SIGTERM - 1)
    return bool(int(fields["SigBlk"], 16) & bit), bool(int(fields["SigIgn"], 16) & bit)
