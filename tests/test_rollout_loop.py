"""Unit tests of the batched rollout loop on a fake env (the real envs have their own tests)."""

from flywheel.rollout import RolloutConfig, run_rollouts
from tests.fakes import CounterEnv, ScriptGenerator, counter_task


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


def test_history_and_quaternions_recorded():
    [t] = run([(counter_task(0), 0)], ScriptGenerator())
    assert t.steps[0].observation.startswith("Your task")
    assert t.steps[1].observation == "Value is 1."
    assert (t.steps[0].thought, t.steps[0].plan, t.steps[0].action) == ("count up.", "increment.", "inc")
    assert t.steps[0].prompt_tokens == 10 and t.reward == 1.0


def test_malformed_output_is_an_invalid_step_not_a_crash():
    [t] = run([(counter_task(0), 0)], ScriptGenerator("I refuse to follow the format"))
    assert not t.success and t.status == "ok"
    assert len(t.steps) == 6 and all(s.invalid for s in t.steps)
    assert "Invalid response format" in t.steps[0].next_observation


def test_invalid_action_is_an_observation():
    [t] = run([(counter_task(0), 0)], ScriptGenerator("Thought: x\nPlan: y\nAction: dance"), max_steps=2)
    assert len(t.steps) == 2 and t.steps[0].next_observation == "Nothing happens." and t.steps[0].invalid


def test_env_crash_restarts_and_retries_then_marks_errored():
    made = []

    def crashing():
        env = CounterEnv(crash_at=2)
        made.append(env)
        return env

    [t] = run([(counter_task(0), 0)], ScriptGenerator(), make_env=crashing, max_env_retries=2)
    assert t.status == "errored" and not t.success and "simulated engine crash" in t.error
    assert len(made) == 3  # first env + 2 restarts

    flaky_calls = {"n": 0}

    def flaky():
        flaky_calls["n"] += 1
        return CounterEnv(crash_at=2 if flaky_calls["n"] == 1 else None)

    [t2] = run([(counter_task(0), 0)], ScriptGenerator(), make_env=flaky)
    assert t2.status == "ok" and t2.success and len(t2.steps) == 3


def test_parallel_1_is_sequential():
    gen = ScriptGenerator()
    run([(counter_task(i), 0) for i in range(3)], gen, parallel_envs=1)
    assert set(gen.batches) == {1}


def test_envs_start_and_reset_side_by_side():
    """JVM starts are seconds each: four envs must be starting at the same time, not in turn."""
    import threading

    barrier = threading.Barrier(4, timeout=10)  # breaks (and the run fails) if starts are sequential

    def slow_start():
        barrier.wait()
        return CounterEnv()

    trajs = run([(counter_task(i), 0) for i in range(4)], ScriptGenerator(), make_env=slow_start, parallel_envs=4)
    assert all(t.success for t in trajs)


def test_reset_that_keeps_crashing_marks_only_that_episode_errored():
    from envs.base import EnvError

    class BadTaskEnv(CounterEnv):
        def reset(self, task):
            if task.task_id == "c1":
                raise EnvError("cannot load task")
            return super().reset(task)

    trajs = run([(counter_task(i), 0) for i in range(4)], ScriptGenerator(), make_env=BadTaskEnv, parallel_envs=2)
    assert [t.task_id for t in trajs] == ["c0", "c1", "c2", "c3"]
    assert [t.status for t in trajs] == ["ok", "errored", "ok", "ok"]
    assert "reset failed: cannot load task" in trajs[1].error and all(trajs[i].success for i in (0, 2, 3))
