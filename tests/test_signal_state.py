"""The test worker's signal state does not leak from one test into the next (see conftest.py)."""

from __future__ import annotations

import signal

import dagster as dg


def test_a_materialize_under_a_launcher_that_ignores_sigint():
    """Dagster copies SIGINT's disposition onto SIGTERM; SIGINT is ignored under e.g. `make test &`."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        @dg.asset
        def one() -> int:
            return 1

        assert dg.materialize([one]).success
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # what Dagster leaves behind
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_next_test_finds_sigterm_at_its_default():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
