"""The same actions from the same reset give the same observations, reward and success: what replay
verification of cleaned successes (flywheel.rollout.replay) stands on. One test per benchmark, each played
twice on one env (reset between) and once on a fresh env; the expert's path with detours in it (an
invalid action, a wasted move), so that the path does not only cover the happy case."""

from __future__ import annotations

import time

import pytest

from envs.base import Task
from envs.data import data_dir
from tests.tinybench import SPEC as TINY
from tests.tinybench import make_task


def played(env, task: Task, actions: list[str]) -> list[tuple]:
    out: list[tuple] = [env.reset(task)]
    for action in actions:
        r = env.step(action)
        out.append((r.observation, r.reward, r.done, r.success))
    return out


def assert_deterministic(spec, task: Task, actions: list[str], **options) -> list[tuple]:
    env = spec.make_env(**options)
    try:
        first = played(env, task, actions)
        again = played(env, task, actions)
    finally:
        env.close()
    fresh_env = spec.make_env(**options)
    try:
        fresh = played(fresh_env, task, actions)
    finally:
        fresh_env.close()
    assert first == again == fresh
    assert first[-1][3], f"the path does not win {task.task_id}: it checks nothing about success"
    return first


def with_detours(expert: list[str], wasted: str) -> list[str]:
    """The expert's path with an invalid action and a wasted action before its second step."""
    return [expert[0], "fly to the moon", wasted, *expert[1:]]


def test_tinybench_replays_the_same():
    task = make_task("train", "k4-d2", keys=(4,), door=2)
    start = time.monotonic()
    trace = assert_deterministic(TINY, task, ["look around", "go to room 5", "go to room 4", "take key",
                                              "open door", "go to room 2", "open door"])
    assert trace[5][0].startswith("There is no door") and time.monotonic() - start < 2


@pytest.mark.slow
def test_alfworld_replays_the_same():
    pytest.importorskip("alfworld")
    from envs.alfworld import SPEC

    task = SPEC.load_tasks("train", limit=1, task_types=("pick_heat_then_place_in_recep",))[0]
    expert = SPEC.expert_actions(task)
    assert_deterministic(SPEC, task, with_detours(expert, "look"))


@pytest.mark.slow
def test_scienceworld_replays_the_same():
    from envs.scienceworld import SPEC

    task = SPEC.load_tasks("train", task_types=("find-animal",), limit=1)[0]
    expert = SPEC.expert_actions(task)
    assert_deterministic(SPEC, task, with_detours(expert, "look around"))


@pytest.mark.slow
@pytest.mark.skipif(not (data_dir() / "webshop" / "items_ins_v2_1000.json").exists(), reason="shared data missing")
def test_webshop_replays_the_same():
    from envs.webshop import SPEC

    task = next(t for t in SPEC.load_tasks("train") if t.meta.get("goal_options"))
    expert = SPEC.expert_actions(task)
    # WebShop's detour: a search whose results are then left (Back to Search) before the expert's own search.
    assert_deterministic(SPEC, task, ["search[something else]", "click[back to search]", "fly to the moon", *expert])
