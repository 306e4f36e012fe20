"""Cleaned successes verified by replay (flywheel.rollout.replay) in a real env: the tests' tiny benchmark."""

from envs.base import Task
from flywheel.core.trajectory import Step, Trajectory
from flywheel.rollout.replay import clean_successes, replays_the_same
from tests.tinybench import SPEC, make_task

TASK = make_task("train", "key2-door3", keys=(2,), door=3)


def played(actions: list[str], task: Task = TASK, sample: int = 0) -> Trajectory:
    """The trajectory the env really gives for `actions` (as the rollout engine records it)."""
    env = SPEC.make_env()
    before, steps, last = env.reset(task), [], None
    for action in actions:
        last = env.step(action)
        steps.append(Step(observation=before, thought="t", plan="p", action=action, next_observation=last.observation,
                          reward=last.reward, done=last.done, invalid=bool(last.info.get("invalid"))))
        before = last.observation
    return Trajectory(benchmark="tinybench", split="train", task_id=task.task_id, source="policy", sample=sample,
                      steps=steps, success=bool(last and last.success), reward=float(last.reward if last else 0))


def test_a_loop_is_cut_and_the_cut_replays_to_the_same_success():
    tr = played(["go to room 4", "go to room 5", "go to room 4", "look around", "look around", "go to room 2",
                 "take key", "go to room 3", "open door"])
    assert tr.success
    [c] = clean_successes([tr], {TASK.task_id: TASK}.__getitem__, SPEC.make_env)
    assert c.outcome == "cut" and (c.steps_before, c.steps_after) == (9, 5)
    assert c.trajectory.actions == ("go to room 4", "go to room 2", "take key", "go to room 3", "open door")
    assert replays_the_same(SPEC.make_env(), TASK, c.trajectory)


def test_a_cut_that_breaks_the_success_is_rejected_by_replay():
    # Room 3's observation repeats after the key is taken: the observation is the same, the state is not.
    # Cutting "back" to it drops the key, and the door stays locked on replay.
    tr = played(["go to room 3", "go to room 2", "take key", "go to room 3", "open door"])
    assert tr.success and tr.steps[0].next_observation == tr.steps[3].next_observation
    [c] = clean_successes([tr], {TASK.task_id: TASK}.__getitem__, SPEC.make_env)
    assert c.outcome == "rejected"
    assert c.trajectory is tr and c.kept == (0, 1, 2, 3, 4)  # the original, uncut


def test_nothing_to_cut_needs_no_replay():
    tr = played(["go to room 2", "take key", "go to room 3", "open door"])
    [c] = clean_successes([tr], {}.__getitem__, lambda: (_ for _ in ()).throw(AssertionError("no env needed")))
    assert c.outcome == "unchanged" and c.trajectory is tr


def test_an_unknown_task_keeps_the_success_uncut():
    tr = played(["look around", "look around", "go to room 2", "take key", "go to room 3", "open door"])
    [c] = clean_successes([tr], {}.__getitem__, SPEC.make_env)
    assert c.outcome == "rejected" and c.trajectory is tr
