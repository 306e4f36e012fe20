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


def test_the_next_test_finds_sigterm_not_ignored():
    # Not SIG_DFL: a module-scoped fixture of an earlier module in this worker (ray.init) may have installed
    # a handler, which exec resets for children; an ignored SIGTERM is what children would inherit.
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN
