"""Unit tests of the batched rollout loop on a fake env (the real envs have their own tests)."""

import pytest

from flywheel.policy.inference import Generation
from flywheel.rollout.engine import RolloutConfig, run_rollouts
from tests.fakes import CounterEnv, ScriptGenerator, ServerLikeGenerator, counter_task

SCHEDULES = pytest.mark.parametrize("scheduling", ["ticks", "per_episode"])


def generator_for(scheduling: str) -> type[ScriptGenerator]:
    return ServerLikeGenerator if scheduling == "per_episode" else ScriptGenerator


def run(jobs, gen, make_env=CounterEnv, **cfg):
    return run_rollouts(jobs, make_env=make_env, generator=gen, instructions="count", normalize_action=str.strip,
                        cfg=RolloutConfig(**cfg))


def test_batches_across_parallel_envs_and_keeps_job_order():
    gen = ScriptGenerator()
    jobs = [(counter_task(i, target=2 + i % 3), 0) for i in range(6)]
    trajs = run(jobs, gen, parallel_envs=3)
    assert [t.task_id for t in trajs] == [f"c{i}" for i in range(6)]
    assert all(t.success and t.status == "ok" for t in trajs)
    assert [len(t.steps) for t in trajs] == [2 + i % 3 for i in range(6)]
    assert max(gen.batches) == 3  # model calls were batched across envs


@SCHEDULES
def test_history_and_quaternions_recorded(scheduling):
    [t] = run([(counter_task(0), 0)], generator_for(scheduling)(), scheduling=scheduling)
    assert t.steps[0].observation.startswith("Your task")
    assert t.steps[1].observation == "Value is 1."
    assert (t.steps[0].thought, t.steps[0].plan, t.steps[0].action) == ("count up.", "increment.", "inc")
    assert t.steps[0].prompt_tokens == 10 and t.reward == 1.0


@SCHEDULES
def test_malformed_output_is_an_invalid_step_not_a_crash(scheduling):
    [t] = run([(counter_task(0), 0)], generator_for(scheduling)("I refuse to follow the format"), scheduling=scheduling)
    assert not t.success and t.status == "ok"
    assert len(t.steps) == 6 and all(s.invalid for s in t.steps)
    assert "Invalid response format" in t.steps[0].next_observation


@SCHEDULES
def test_invalid_action_is_an_observation(scheduling):
    [t] = run(
        [(counter_task(0), 0)],
        generator_for(scheduling)("Thought: x\nPlan: y\nAction: dance"),
        max_steps=2,
        scheduling=scheduling,
    )
    assert len(t.steps) == 2 and t.steps[0].next_observation == "Nothing happens." and t.steps[0].invalid


@SCHEDULES
def test_env_crash_restarts_and_retries_then_marks_errored(scheduling):
    made = []

    def crashing():
        env = CounterEnv(crash_at=2)
        made.append(env)
        return env

    [t] = run(
        [(counter_task(0), 0)], generator_for(scheduling)(), make_env=crashing, max_env_retries=2, scheduling=scheduling
    )
    assert t.status == "errored" and not t.success and "simulated engine crash" in t.error
    assert len(made) == 3  # first env + 2 restarts

    flaky_calls = {"n": 0}

    def flaky():
        flaky_calls["n"] += 1
        return CounterEnv(crash_at=2 if flaky_calls["n"] == 1 else None)

    [t2] = run([(counter_task(0), 0)], generator_for(scheduling)(), make_env=flaky, scheduling=scheduling)
    assert t2.status == "ok" and t2.success and len(t2.steps) == 3


def test_parallel_1_is_sequential():
    gen = ScriptGenerator()
    run([(counter_task(i), 0) for i in range(3)], gen, parallel_envs=1)
    assert set(gen.batches) == {1}


@SCHEDULES
def test_envs_start_and_reset_side_by_side(scheduling):
    """JVM starts are seconds each: four envs must be starting at the same time, not in turn."""
    import threading

    barrier = threading.Barrier(4, timeout=10)  # breaks (and the run fails) if starts are sequential

    def slow_start():
        barrier.wait()
        return CounterEnv()

    trajs = run(
        [(counter_task(i), 0) for i in range(4)],
        generator_for(scheduling)(),
        make_env=slow_start,
        parallel_envs=4,
        scheduling=scheduling,
    )
    assert all(t.success for t in trajs)


@SCHEDULES
def test_reset_that_keeps_crashing_marks_only_that_episode_errored(scheduling):
    from envs.base import EnvError

    class BadTaskEnv(CounterEnv):
        def reset(self, task):
            if task.task_id == "c1":
                raise EnvError("cannot load task")
            return super().reset(task)

    trajs = run(
        [(counter_task(i), 0) for i in range(4)],
        generator_for(scheduling)(),
        make_env=BadTaskEnv,
        parallel_envs=2,
        scheduling=scheduling,
    )
    assert [t.task_id for t in trajs] == ["c0", "c1", "c2", "c3"]
    assert [t.status for t in trajs] == ["ok", "errored", "ok", "ok"]
    assert "reset failed: cannot load task" in trajs[1].error and all(trajs[i].success for i in (0, 2, 3))


def test_auto_scheduling_batches_for_a_local_backend_and_goes_per_episode_for_a_server():
    local, server = ScriptGenerator(), ServerLikeGenerator()
    jobs = [(counter_task(i), 0) for i in range(4)]
    assert all(t.success for t in run(jobs, local, parallel_envs=4))
    assert max(local.batches) == 4  # ticks: one batched call for all live episodes
    trajs = run(jobs, server, parallel_envs=4)
    assert [t.task_id for t in trajs] == ["c0", "c1", "c2", "c3"] and all(t.success for t in trajs)
    assert set(server.batches) == {1} and len(server.batches) == 12  # per episode: one prompt per call


def test_per_episode_slots_do_not_wait_for_a_slow_episode():
    """Ticks wait for a tick's slowest answer; per episode, the other slot plays on meanwhile."""
    jobs = [(counter_task(0, target=3), 0)] + [(counter_task(i, target=1), 0) for i in range(1, 6)]
    for scheduling, finished_before_c0 in (("per_episode", 5), ("ticks", 2)):
        done: list[str] = []
        run_rollouts(
            jobs,
            make_env=CounterEnv,
            generator=ServerLikeGenerator(slow={"count to 3": 0.3}),
            instructions="count",
            normalize_action=str.strip,
            on_finished=lambda ts, done=done: done.extend(t.task_id for t in ts),
            cfg=RolloutConfig(parallel_envs=2, scheduling=scheduling),
        )
        assert sorted(done) == [f"c{i}" for i in range(6)]
        # c0 needs three slow answers; per episode the other slot finishes all five one-step jobs
        # meanwhile; in ticks it gets one job per (slow) tick: c1, c2 before c0's third tick ends.
        assert done.index("c0") == finished_before_c0, (scheduling, done)


def test_per_episode_seeds_are_distinct_per_job_and_step_and_reproducible():
    jobs = [(counter_task(0), s) for s in range(3)]  # equal prompts: samples of one task

    def seeds():
        gen = ServerLikeGenerator()
        run(jobs, gen, parallel_envs=3, scheduling="per_episode")
        return sorted(seed for _, seed in gen.seeds)

    first = seeds()
    assert len(first) == 9 and len(set(first)) == 9  # 3 jobs x 3 steps, no two alike
    assert seeds() == first  # whatever order the threads ran in


def test_unknown_scheduling_is_a_clear_error():
    with pytest.raises(ValueError, match="scheduling 'lockstep'"):
        run([(counter_task(0), 0)], ScriptGenerator(), scheduling="lockstep")


class ContextFills(ScriptGenerator):
    """Answers until a prompt holds `steps` earlier steps, then refuses it as a server does past its context."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        return [Generation("", 0, 0, error="BadRequestError: maximum context length is 4096 tokens", context_full=True)
                if " ".join(m["content"] for m in p).count("Value is") > self.steps else g  # the reset says one
                for p, g in zip(prompts, super().generate(prompts, temperature=temperature,
                                                          max_new_tokens=max_new_tokens), strict=True)]


def test_an_episode_whose_prompt_outgrows_the_context_ends_there_failed_not_errored():
    """A history too long for the policy's context is the policy's limit, not a fault: the episode ends at that
    step as a failure (counted in every rate), with the reason; an errored one would be left out and replayed."""
    [traj] = run_rollouts([(counter_task(0, target=5), 0)], make_env=CounterEnv, generator=ContextFills(2),
                          instructions="count", normalize_action=str.strip, cfg=RolloutConfig(parallel_envs=1))
    assert traj.status == "ok" and not traj.success and len(traj.steps) == 2
    assert "ended at step 3" in traj.error and "context" in traj.error
