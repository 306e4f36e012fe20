"""The test worker's signal state does not leak from one test into the next (see conftest.py)."""

from __future__ import annotations

import os
import signal

import dagster as dg
import pytest

from tests.signal_support import PARENTS, parent_sigterm, sigterm_state


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


@pytest.mark.parametrize("inherited", PARENTS)
def test_the_parent_fixture_sets_the_state_it_names_whatever_this_process_inherited(inherited):
    """tests/signal_support.parent_sigterm under a launcher that blocked or ignored SIGTERM: "blocked" used to keep
    an inherited SIG_IGN, so a SIGTERM raised in the helper tests' window was discarded instead of pending."""
    want = {"default": (False, False), "blocked": (True, False), "ignored": (False, True)}
    with parent_sigterm(inherited):  # what the launcher left to this process
        for state in PARENTS:
            with parent_sigterm(state):
                assert sigterm_state(os.getpid()) == want[state], state
                assert signal.getsignal(signal.SIGTERM) == (signal.SIG_IGN if state == "ignored" else signal.SIG_DFL)
