"""Every network call has a deadline: the teacher's and the policy's OpenAI-compatible clients end a request
within its total time (connect, first byte, whole body; retries and waits included) against loopback endpoints
that trickle one byte a second or hang, and an interrupted rollout exits without waiting for requests in flight.
Before: the teacher's per-read timeout let a trickling endpoint hold a request for 150 s against 5 s; the policy
client had no timeout at all (600 s, 2 retries), and a SIGTERMed command lived on while its threads were joined."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.core.deadline import map_on_daemon_threads, retry_within
from flywheel.policy.inference import OpenAICompatibleGenerator
from flywheel.teacher import OpenAITeacher, TeacherError
from tests.openai_stub import StalledServer

MESSAGES = [{"role": "user", "content": "hello"}]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["trickle", "trickle-headers", "hang"])
def test_a_teacher_request_ends_within_its_timeout_retries_included(mode):
    with StalledServer(mode) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key="k", timeout_s=2.0, max_retries=5,
                                backoff_s=0.2)
        started = time.monotonic()
        with pytest.raises(TeacherError):
            teacher.chat(MESSAGES)
        assert time.monotonic() - started < 8  # 2 s and the slack of a busy CPU (before: 18 s hanging, hours trickling)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["trickle", "trickle-headers", "hang"])
def test_a_policy_request_ends_within_its_timeout_retries_included(mode):
    with StalledServer(mode) as srv:
        gen = OpenAICompatibleGenerator(base_url=srv.base_url, model="m", request_timeout_s=2.0, concurrency=4)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="policy endpoint failed"):
            gen.generate([MESSAGES] * 4, temperature=0.0, max_new_tokens=8)
        assert time.monotonic() - started < 8  # before: no deadline (600 s, 2 retries)


CHILD = """
import signal, sys
from concurrent.futures import ThreadPoolExecutor, wait
from flywheel.policy.inference import OpenAICompatibleGenerator

def interrupt(*_):  # as the CLI under Dagster: SIGTERM raises KeyboardInterrupt in the main thread
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, interrupt)
gen = OpenAICompatibleGenerator(base_url=sys.argv[1], model="m", request_timeout_s=300.0, concurrency=4)
prompt = [{"role": "user", "content": "x"}]
print("started", flush=True)
if sys.argv[2] == "batch":  # one call, eight prompts
    gen.generate([prompt] * 8, temperature=0.0, max_new_tokens=8)
else:  # rollouts: four per-episode slot threads (joined at exit), each waiting on its own request
    from flywheel.rollout.engine import RolloutConfig, run_rollouts
    from tests.fakes import CounterEnv, counter_task
    run_rollouts([(counter_task(i), 0) for i in range(8)], make_env=CounterEnv, generator=gen,
                 instructions="Count.", normalize_action=str.strip,
                 cfg=RolloutConfig(parallel_envs=4, scheduling="per_episode", max_new_tokens=8))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("caller", ["batch", "rollouts"])
def test_sigterm_during_generation_exits_without_joining_requests_in_flight(caller):
    with StalledServer("hang") as srv:
        child = subprocess.Popen([sys.executable, "-c", CHILD, srv.base_url, caller], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert child.stdout.readline().strip() == b"started"
        deadline = time.monotonic() + 60
        while srv.requests < 4 and time.monotonic() < deadline:  # four requests in flight, four queued
            time.sleep(0.1)
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=15)
        finally:
            child.kill()
        assert time.monotonic() - sent < 10
        assert srv.requests == 4  # the four queued prompts (episodes) were never sent


def test_retries_count_against_the_one_deadline():
    calls, waits = [], []

    def attempt(left_s: float) -> None:
        calls.append(left_s)
        raise TimeoutError("slow")

    def wait(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    with pytest.raises(TimeoutError):
        retry_within(3.0, attempt, retryable=lambda exc: True, backoff_s=1.0, max_attempts=10, sleep=wait)
    assert len(calls) == 2 and waits == [1.0]  # a second wait of 2 s would pass the deadline: not taken


def test_daemon_map_keeps_order_and_raises_the_first_error():
    assert map_on_daemon_threads(lambda x: x * 2, range(10), 3) == [2 * x for x in range(10)]

    def fails(x: int) -> int:
        raise ValueError(x)

    with pytest.raises(ValueError):
        map_on_daemon_threads(fails, [1, 2], 2)
