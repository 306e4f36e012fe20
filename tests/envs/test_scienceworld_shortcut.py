"""The teleport-shortcut expert and the compact prompt (ScienceWorld spec/env options)."""

from __future__ import annotations

import pytest

from envs import configure_spec, get_benchmark
from envs.scienceworld import SPEC, ScienceWorldEnv, make_task
from envs.scienceworld.shortcut import allows_teleport, teleport_shortcut
from flywheel.rollout.seeds import collect_expert, replay


def test_walks_collapse_into_one_teleport_to_where_they_end():
    gold = ["open door to hallway", "go to hallway", "open door to kitchen", "go to kitchen",
            "look around", "focus on cup", "open door to bathroom", "go to bathroom", "move cup to blue box"]
    assert teleport_shortcut(gold) == [
        "teleport to kitchen", "look around", "focus on cup", "teleport to bathroom", "move cup to blue box"]


def test_door_moves_without_arrival_are_kept_and_other_actions_untouched():
    assert teleport_shortcut(["open door to kitchen", "look around"]) == ["open door to kitchen", "look around"]
    assert teleport_shortcut(["focus on cup", "wait1"]) == ["focus on cup", "wait1"]
    assert teleport_shortcut([]) == []


def test_teleport_needs_the_simplification():
    assert allows_teleport("easy") and allows_teleport("openDoors,teleportAction")
    assert not allows_teleport("") and not allows_teleport("openDoors")


def test_unknown_expert_path_is_a_clear_error():
    with pytest.raises(ValueError, match="gold, shortcut"):
        ScienceWorldEnv(expert_path="fastest")


def test_compact_prompt_is_a_spec_option_and_bad_options_name_valid_ones():
    compact = configure_spec(get_benchmark("scienceworld"), {"prompt": "compact"})
    assert compact.system_prompt() != SPEC.system_prompt()
    assert len(compact.system_prompt()) < len(SPEC.system_prompt()) / 3
    for needle in ("focus on OBJ", "teleport to LOC", "irreversible"):
        assert needle in compact.system_prompt()
    with pytest.raises(ValueError, match="Valid: compact, full|Valid: full, compact"):
        configure_spec(SPEC, {"prompt": "tiny"})
    with pytest.raises(ValueError, match="Valid: prompt"):
        configure_spec(SPEC, {"promt": "compact"})


def test_shortcut_expert_is_shorter_and_succeeds_in_the_real_engine():
    tasks = [make_task("find-non-living-thing", 38), make_task("lifespan-longest-lived", 2)]
    with ScienceWorldEnv(expert_path="shortcut") as env:
        for task in tasks:
            gold = env.gold_actions(task)
            short = env.expert_actions(task)
            assert any(a.startswith("teleport to") for a in short)
            assert len(short) < len(gold)
            assert replay(env, task, short).success
        ok, failed = collect_expert(SPEC, tasks, make_env=lambda: ScienceWorldEnv(expert_path="shortcut"))
        assert not failed and len(ok) == 2
        # the replay stops at success, so a trailing gold move (e.g. "wait1") may go unplayed
        assert all(len(t.steps) <= len(env.expert_actions(task)) for t, task in zip(ok, tasks, strict=True))


def test_shortcut_falls_back_to_gold_when_it_does_not_solve_the_task():
    # Life stages must be watched in order outdoors; teleports skip the waits the gold path relies on.
    task = make_task("identify-life-stages-1", 0)
    with ScienceWorldEnv(expert_path="shortcut") as env:
        gold = env.gold_actions(task)
        short = teleport_shortcut(gold)
        if replay(env, task, short).success:
            pytest.skip("the shortcut happens to work on this variation")
        assert env.expert_actions(task) == gold
        assert replay(env, task, gold).success
