"""A policy answer of 1 MB (an `Action:` line with no newline, or a run of blank lines) is parsed in
linear time and cut to what the generation budget allows: the rollout takes it as an invalid step
instead of stalling in a backtracking regex (it used to take > 600 s in `cut_after_action`)."""

import time

from flywheel.core.prompting import parse_response
from flywheel.policy.inference import MAX_CHARS_PER_TOKEN, OpenAICompatibleGenerator, cut_after_action
from flywheel.rollout.engine import RolloutConfig, run_rollouts
from tests.fakes import CounterEnv, counter_task
from tests.openai_stub import StubServer

LONG = "Thought: t\nAction: " + "x" * 1_000_000  # no trailing newline


def test_a_megabyte_answer_parses_in_linear_time():
    started = time.monotonic()
    assert cut_after_action(LONG) == LONG
    resp = parse_response(LONG)
    assert resp.thought == "t" and resp.action == "x" * 1_000_000
    blank = parse_response("\n" * 1_000_000)  # `^\s*` over blank lines was quadratic too
    assert not blank.well_formed
    assert time.monotonic() - started < 5  # about 0.1 s; the old regexes took minutes


def test_a_megabyte_answer_through_a_rollout_is_one_invalid_step():
    with StubServer([(200, LONG)]) as stub:
        gen = OpenAICompatibleGenerator(base_url=stub.base_url, model="m", concurrency=1)
        started = time.monotonic()
        [traj] = run_rollouts([(counter_task(0), 0)], make_env=CounterEnv, generator=gen, instructions="count",
                              normalize_action=str.strip, cfg=RolloutConfig(max_steps=2, max_new_tokens=8))
    assert time.monotonic() - started < 30
    assert len(traj.steps) == 2 and all(s.invalid for s in traj.steps)
    assert all(len(s.action) <= 8 * MAX_CHARS_PER_TOKEN for s in traj.steps)  # cut to the budget before parsing
