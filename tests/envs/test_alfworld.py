"""ALFWorld adapter against the real games: splits, data rebuild, env, expert, verbs.

Needs the shared archive (unpacked once into the cache, ~8 s) and the
`alfworld` extra. The differential test drives TextWorld exactly as ALFWorld's
`AlfredTWEnv` does (textworld.gym + AlfredDemangler) in this process, with
none of the adapter's speed-ups, and compares every observation.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from envs.alfworld import SPEC, AlfWorldEnv, AlfWorldSpec, solve_in_worker  # noqa: E402
from envs.alfworld import data as alf_data  # noqa: E402
from envs.alfworld import worker as alf_worker  # noqa: E402
from envs.alfworld.env import strip_banner  # noqa: E402
from envs.alfworld.expert import choose, expert_limit  # noqa: E402
from envs.alfworld.prompts import describe_action, normalize_action  # noqa: E402
from envs.alfworld.tasks import ALIASES, TASK_TYPES, eto_unseen_ids, split_folder, spread, task_type_of  # noqa: E402
from envs.base import EnvError, Task  # noqa: E402
from envs.data import MissingDataError  # noqa: E402
from tests.signal_support import parent_sigterm, sigterm_state  # noqa: E402

HEAT_GAME = "pick_heat_then_place_in_recep-Apple-None-GarbageCan-10/trial_T20190908_145143_820541"


@pytest.fixture(scope="module")
def root() -> Path:
    return alf_data.alfworld_root()


@pytest.fixture(scope="module")
def env():
    environment = SPEC.make_env(admissible_commands=True)
    yield environment
    environment.close()


def unseen_task(game_id: str, **changes) -> Task:
    task = next(t for t in SPEC.load_tasks("unseen") if t.task_id == game_id)
    return Task(**{**task.__dict__, **changes}) if changes else task


def reference_env(game: Path):
    """TextWorld driven the way ALFWorld's AlfredTWEnv drives it."""
    import textworld
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    env_id = textworld.gym.register_game(
        str(game),
        infos,
        batch_size=1,
        asynchronous=False,
        max_episode_steps=200,
        wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
    )
    return textworld.gym.make(env_id)


# --- splits and data -------------------------------------------------------


def test_split_counts_and_order():
    counts = {split: len(SPEC.load_tasks(split)) for split in ("train", "seen", "unseen")}
    assert counts == {"train": 3553, "seen": 140, "unseen": 134}
    tasks = SPEC.load_tasks("seen")
    ids = [t.task_id for t in tasks]
    assert len(set(ids)) == len(ids)
    for kind in TASK_TYPES:  # each type's games in spread order (objects, then rooms, in turn)
        of_kind = [i for i in ids if task_type_of(i) == kind]
        assert of_kind == spread(sorted(of_kind))
    assert all(t.max_steps == 40 and t.benchmark == "alfworld" and t.goal for t in tasks)
    assert [t.task_id for t in SPEC.load_tasks("seen", limit=5)] == ids[:5]


def test_a_limited_prefix_covers_every_type():
    """Sorted ids group games by type: a prefix of three types' training games must not be one type."""
    tasks = SPEC.load_tasks("train", task_types=("pick", "look", "heat"), limit=40)
    counts = Counter(t.meta["task_type"] for t in tasks)
    assert len(tasks) == 40 and set(counts) == {ALIASES[a] for a in ("pick", "look", "heat")}
    assert max(counts.values()) - min(counts.values()) <= 1
    # A type that runs out leaves the others to fill the prefix.
    seen = SPEC.load_tasks("seen", task_types=("look", "pick"))
    assert Counter(t.meta["task_type"] for t in seen) == {"pick_and_place_simple": 35, "look_at_obj_in_light": 13}
    assert {t.meta["task_type"] for t in seen[-(35 - 13):]} == {"pick_and_place_simple"}


def test_a_limited_prefix_spreads_over_objects_and_rooms():
    """In sorted order a type's first training games are a few rooms of one object (12 seeds of pick: all
    AlarmClock); a preset's seeds must show the policy many objects and rooms."""
    tasks = SPEC.load_tasks("train", task_types=("pick", "look", "heat"), limit=36)
    objects = {kind: {t.task_id.split("-")[1] for t in tasks if t.meta["task_type"] == kind} for kind in
               (ALIASES[a] for a in ("pick", "look", "heat"))}
    assert {kind: len(o) for kind, o in objects.items()} == {
        "pick_and_place_simple": 12, "look_at_obj_in_light": 12, "pick_heat_then_place_in_recep": 8}  # heat has 8
    rooms = {t.task_id.split("/")[0].split("-")[-1] for t in tasks}
    assert len(rooms) == 26  # of 35 game folders
    # Every game is still there, once, and the order is a pure function of the ids.
    assert spread(["b-X-None-R-2/t1", "b-X-None-R-1/t1", "b-Y-None-R-1/t1", "b-X-None-R-1/t2"]) == [
        "b-X-None-R-1/t1", "b-Y-None-R-1/t1", "b-X-None-R-2/t1", "b-X-None-R-1/t2"]


def test_unseen_split_is_the_eto_list():
    ours = [t.task_id for t in SPEC.load_tasks("unseen")]
    eto = eto_unseen_ids()
    assert len(eto) == 134
    assert sorted(eto) == sorted(ours)


def test_task_type_filter_and_aliases():
    look = SPEC.load_tasks("unseen", task_types=("look",))
    assert look and all(t.meta["task_type"] == "look_at_obj_in_light" for t in look)
    assert [t.task_id for t in look] == [
        t.task_id for t in SPEC.load_tasks("unseen", task_types=("look_at_obj_in_light",))
    ]
    pick = SPEC.load_tasks("unseen", task_types=("pick",))
    assert all(t.meta["task_type"] == "pick_and_place_simple" for t in pick)  # "pick" is not pick_two
    by_type = sum(len(SPEC.load_tasks("unseen", task_types=(tt,))) for tt in TASK_TYPES)
    assert by_type == 134
    with pytest.raises(ValueError, match="Unknown ALFWorld task type"):
        SPEC.load_tasks("unseen", task_types=("juggle",))
    with pytest.raises(ValueError, match="Unknown ALFWorld split"):
        split_folder("test")


def test_goal_matches_the_game_text(root):
    task = unseen_task(HEAT_GAME)
    assert task.goal == "heat some apple and put it in garbagecan."
    grammar = json.loads(alf_data.game_file(root, "valid_unseen", HEAT_GAME).read_text())["grammar"]
    assert f"Your task is to: {task.goal}" in grammar


def test_traj_data_rebuilt_from_folder_names(root):
    look = alf_data.traj_data("look_at_obj_in_light-AlarmClock-None-DeskLamp-308", "trial_X")
    assert look["pddl_params"] == {
        "object_target": "AlarmClock",
        "object_sliced": False,
        "mrecep_target": "",
        "parent_target": "",
        "toggle_target": "DeskLamp",
    }
    assert look["scene"]["scene_num"] == 308 and look["task_type"] == "look_at_obj_in_light"
    sliced = alf_data.traj_data("pick_cool_then_place_in_recep-AppleSliced-Pan-CounterTop-12")
    assert sliced["pddl_params"]["object_target"] == "Apple" and sliced["pddl_params"]["object_sliced"] is True
    assert sliced["pddl_params"]["mrecep_target"] == "Pan" and sliced["pddl_params"]["parent_target"] == "CounterTop"
    with pytest.raises(ValueError):
        alf_data.traj_data("not-a-game")
    on_disk = alf_data.game_file(root, "valid_unseen", HEAT_GAME).parent / "traj_data.json"
    assert json.loads(on_disk.read_text())["pddl_params"]["parent_target"] == "GarbageCan"
    assert all((root / "logic" / name).stat().st_size > 1000 for name in alf_data.LOGIC_FILES)


def _tiny_archive(root: Path, out: Path, games: list[tuple[str, str]]) -> None:
    """A two-game copy of the shared archive, to test the unpack quickly."""
    (out / "alfworld").mkdir(parents=True)
    with tarfile.open(out / alf_data.ARCHIVE, "w:xz") as tar:
        for split, game_id in games:
            path = alf_data.game_file(root, split, game_id)
            tar.add(path, arcname=f"json_2.1.1/{split}/{game_id}/game.tw-pddl")


def test_unpack_is_atomic_and_redone_after_a_failure(root, tmp_path, monkeypatch):
    games = [("valid_unseen", HEAT_GAME), ("valid_seen", SPEC.load_tasks("seen", limit=1)[0].task_id)]
    _tiny_archive(root, tmp_path / "data", games)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    dest = tmp_path / "cache" / "alfworld"

    def killed(_: Path) -> None:
        raise KeyboardInterrupt  # as if the unpack were killed half-way

    monkeypatch.setattr(alf_data, "copy_logic", killed)
    with pytest.raises(KeyboardInterrupt):
        alf_data.alfworld_root(dest)
    assert not dest.exists() and not [p for p in dest.parent.iterdir() if "unpack" in p.name]

    monkeypatch.undo()
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path / "data"))
    (dest.parent / ".alfworld-unpack-stale").mkdir()  # what a `kill -9` mid-unpack leaves behind
    assert alf_data.alfworld_root(dest) == dest
    assert not (dest.parent / ".alfworld-unpack-stale").exists()
    index = alf_data.load_index(dest)
    assert set(index["valid_unseen"]) == {HEAT_GAME} and len(index["valid_seen"]) == 1
    assert (alf_data.game_file(dest, "valid_unseen", HEAT_GAME).parent / "traj_data.json").exists()
    assert (dest / "logic" / "alfred.twl2").exists()


@pytest.mark.slow
def test_full_unpack_killed_midway_then_redone(tmp_path):
    """A real `kill -9` during the full unpack leaves no `dest`; the next call unpacks everything."""
    dest = tmp_path / "alfworld"
    code = "from envs.alfworld.data import alfworld_root; import sys; alfworld_root(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, str(dest)])
    deadline = time.time() + 60
    while not list(tmp_path.glob(".alfworld-unpack-*/json_2.1.1/*/*")) and time.time() < deadline:
        time.sleep(0.05)  # kill only once game files are being written
    proc.kill()
    proc.wait()
    assert not dest.exists()
    started = time.time()
    assert alf_data.alfworld_root(dest) == dest
    print(f"full unpack: {time.time() - started:.1f}s")
    index = alf_data.load_index(dest)
    assert {k: len(v) for k, v in index.items()} == {"train": 3553, "valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
    assert len(list(dest.glob("json_2.1.1/*/*/*/traj_data.json"))) == 4027
    assert not list(tmp_path.glob(".alfworld-unpack-*"))


def test_official_layout_folder_is_used_as_is(root, tmp_path, monkeypatch):
    """$FLYWHEEL_ALFWORLD_DIR naming an alfworld-download folder: read in place, index cached elsewhere."""
    official = tmp_path / "official"
    source = alf_data.game_file(root, "valid_unseen", HEAT_GAME)
    target = official / "json_2.1.1" / "valid_unseen" / HEAT_GAME / "game.tw-pddl"
    target.parent.mkdir(parents=True)
    target.write_bytes(source.read_bytes())
    unsolvable = official / "json_2.1.1" / "valid_unseen" / "pick_and_place_simple-Mug-None-Desk-1" / "trial_T1"
    unsolvable.mkdir(parents=True)
    (unsolvable / "game.tw-pddl").write_text(json.dumps({"solvable": False, "walkthrough": []}))
    monkeypatch.setenv("FLYWHEEL_ALFWORLD_DIR", str(official))
    monkeypatch.setenv("FLYWHEEL_CACHE_DIR", str(tmp_path / "cache"))
    tasks = SPEC.load_tasks("unseen")
    assert [t.task_id for t in tasks] == [HEAT_GAME]  # the unsolvable game is skipped, like AlfredTWEnv does
    assert tasks[0].goal == "heat some apple and put it in garbagecan."
    assert sorted(p.name for p in official.iterdir()) == ["json_2.1.1"]  # nothing written into it
    assert list((tmp_path / "cache").glob("alfworld_index_*.json"))


def test_missing_archive_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    with pytest.raises(MissingDataError, match="alfworld-download"):
        alf_data.alfworld_root(tmp_path / "nowhere")


# --- prompts and action syntax --------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("put apple 3 in/on garbagecan 1", "move apple 3 to garbagecan 1"),
        ("Action: put the apple 3 in garbagecan 1.", "move apple 3 to garbagecan 1"),
        ("place mug 1 on shelf 2", "move mug 1 to shelf 2"),
        ("move apple 3 to garbagecan 1", "move apple 3 to garbagecan 1"),
        ("goto fridge 1", "go to fridge 1"),
        ("move to fridge 1", "go to fridge 1"),
        ("> Go to Cabinet 1\nThought: next", "go to cabinet 1"),
        ("pick up mug 2 from shelf 1", "take mug 2 from shelf 1"),
        ("turn on desklamp 1", "use desklamp 1"),
        ("heat apple 1 with microwave 1", "heat apple 1 with microwave 1"),
    ],
)
def test_normalize_action(raw, expected):
    assert normalize_action(raw) == expected
    assert normalize_action(expected) == expected  # idempotent


def test_prompt_teaches_move_and_describe_action():
    prompt = SPEC.system_prompt()
    assert "move <object> to <receptacle>" in prompt and "put <object>" not in prompt
    assert "Thought" not in prompt and "Action:" not in prompt  # the core adds the response format
    assert describe_action("go to fridge 1") == "walk over to fridge 1 to see what is there"
    assert describe_action("put apple 1 in sinkbasin 1") == "place apple 1 in/on sinkbasin 1"


# --- the env ---------------------------------------------------------------


def test_reset_step_invalid_and_truncation(env):
    task = unseen_task(HEAT_GAME, max_steps=3)
    first = env.reset(task)
    assert first.startswith("You are in the middle of a room.")
    assert first.rstrip().endswith(f"Your task is to: {task.goal}")
    assert "go to sinkbasin 1" in env.admissible()
    bad = env.step("fly to the moon")
    assert bad.observation == "Nothing happens." and bad.info["invalid"]
    assert (bad.done, bad.success, bad.reward) == (False, False, 0.0)
    good = env.step("go to sinkbasin 1")
    assert not good.info["invalid"] and "apple 3" in good.observation
    assert "take apple 3 from sinkbasin 1" in good.info["admissible_commands"]
    last = env.step("look")
    assert last.done and last.info["truncated"] and not last.success
    with pytest.raises(RuntimeError):
        env.step("look")


def test_walkthrough_wins_and_keeps_banner_option(env, root):
    task = unseen_task(HEAT_GAME)
    env.reset(task)
    results = [env.step(action) for action in task.meta["walkthrough"]]
    assert results[-1].success and results[-1].done and results[-1].reward == 1.0
    assert not any(r.success for r in results[:-1])
    with AlfWorldEnv(strip_banner=False) as raw_env:
        assert raw_env.reset(task).startswith("-= Welcome to TextWorld, ALFRED! =-")


def test_move_is_the_verb_that_changes_state(env, root):
    """`move X to Y` wins; the raw game ignores `put X in Y`; the adapter translates it."""
    task = unseen_task(HEAT_GAME)
    *prefix, final = task.meta["walkthrough"]
    assert final == "move apple 3 to garbagecan 1"

    reference = reference_env(alf_data.game_file(root, "valid_unseen", HEAT_GAME))
    reference.reset()
    for action in prefix:
        reference.step([action])
    obs, _, _, info = reference.step(["put apple 3 in garbagecan 1"])
    assert obs[0] == "Nothing happens." and not info["won"][0]
    obs, _, _, info = reference.step(["inventory"])
    assert "apple 3" in obs[0]  # still held: the old verb did nothing
    obs, _, _, info = reference.step([final])
    assert obs[0] == "You move the apple 3 to the garbagecan 1." and info["won"][0]
    reference.close()

    for verb_form in ("put apple 3 in/on garbagecan 1", final):
        env.reset(task)
        for action in prefix:
            env.step(action)
        result = env.step(verb_form)
        assert result.info["action"] == final and result.success


def test_differential_against_plain_textworld(root):
    """Random admissible actions, then the walkthrough: same text, commands and `won` as ALFWorld's stack."""
    assert not alf_worker._MEMOIZED  # the reference below runs unpatched TextWorld
    rng = random.Random(7)
    game_ids = [HEAT_GAME, SPEC.load_tasks("seen", task_types=("pick_two",), limit=1)[0].task_id]
    with AlfWorldEnv(admissible_commands=True, strip_banner=False) as ours:
        for game_id in game_ids:
            split = "unseen" if game_id == HEAT_GAME else "seen"
            task = next(t for t in SPEC.load_tasks(split) if t.task_id == game_id)
            reference = reference_env(alf_data.game_file(root, split_folder(split), game_id))
            for episode in ("random", "walkthrough"):
                ref_obs, ref_info = reference.reset()
                assert ours.reset(task) == ref_obs[0]
                commands = ref_info["admissible_commands"][0]
                assert ours.admissible() == commands
                plan = list(task.meta["walkthrough"]) if episode == "walkthrough" else None
                won = False
                for step in range(len(plan) if plan else 15):
                    action = plan[step] if plan else rng.choice(commands)
                    ref_obs, _, _, ref_info = reference.step([action])
                    mine = ours.step(action)
                    assert mine.observation == ref_obs[0], (game_id, step, action)
                    commands = ref_info["admissible_commands"][0]
                    assert mine.info["admissible_commands"] == commands
                    assert mine.success == bool(ref_info["won"][0])
                    won = mine.success
                    if mine.done:
                        break
                assert won == (episode == "walkthrough")
            reference.close()


def test_errors_unknown_game_dead_engine_and_close(root):
    environment = AlfWorldEnv()
    with pytest.raises(ValueError, match="Unknown ALFWorld game"):
        environment.reset(Task(benchmark="alfworld", split="unseen", task_id="no-such-game/trial_T0"))
    task = unseen_task(HEAT_GAME)
    environment.reset(task)
    os.kill(environment.worker.pid, signal.SIGKILL)
    with pytest.raises(EnvError):
        environment.step("go to sinkbasin 1")
    assert environment.reset(task).startswith("You are in the middle")  # a fresh worker takes over
    assert environment.step("go to sinkbasin 1").observation.startswith("You arrive at sinkbasin 1.")
    environment.close()
    environment.close()  # idempotent
    assert environment.worker.pid is None
    with pytest.raises(RuntimeError):
        environment.step("look")


@pytest.mark.parametrize("parent", ["blocked", "ignored"])
def test_a_worker_started_by_a_parent_that_blocks_or_ignores_sigterm_starts_clean(parent):
    worker = alf_worker.WorkerClient()
    with parent_sigterm(parent):
        worker.begin_episode()
    try:
        assert sigterm_state(worker.pid) == (False, False)
    finally:
        worker.stop()


def test_worker_is_recycled():
    task = unseen_task(HEAT_GAME)
    with AlfWorldEnv(recycle_every=2) as environment:
        pids = []
        for _ in range(3):
            environment.reset(task)
            pids.append(environment.worker.pid)
        assert pids[0] == pids[1] != pids[2] and environment.worker.recycles == 1
        assert environment.worker.rss_mb() > 50
        environment.worker.max_rss_mb = 1.0  # now every worker is "too big"
        environment.reset(task)
        assert environment.worker.pid != pids[2] and environment.worker.recycles == 2


# --- expert ----------------------------------------------------------------


def _sample(split: str, count: int) -> list[Task]:
    tasks = SPEC.load_tasks(split)
    return random.Random(split).sample(tasks, count)


@pytest.mark.parametrize("split", ["seen", "unseen"])
def test_expert_paths_replay_to_success(split, root, env):
    worker = alf_worker.WorkerClient(timeout_s=600.0)
    try:
        for task in _sample(split, 2):
            result = solve_in_worker(worker, root, split_folder(split), task.task_id)
            actions, source = choose(result, list(task.meta["walkthrough"]), task.max_steps)
            assert source in {"handcoded", "walkthrough"} and 0 < len(actions) <= task.max_steps
            env.reset(task)
            outcomes = [env.step(action) for action in actions]
            assert outcomes[-1].success, (task.task_id, source)
            assert not any(o.success for o in outcomes[:-1])
    finally:
        worker.stop()


def test_spec_expert_actions_uses_handcoded_expert(root, tmp_path, monkeypatch):
    task = unseen_task(HEAT_GAME)
    monkeypatch.setenv("FLYWHEEL_CACHE_DIR", str(tmp_path))  # a fresh expert cache; data stays where it is
    spec = AlfWorldSpec(root=str(root))
    record = spec.expert_result(task)
    assert record["handcoded"]["won"] and record["source"] == "handcoded" and record["walkthrough_won"]
    assert record["handcoded"]["actions"][0] == "look"  # ALFWorld's AlfredExpert always starts with "look"
    assert record["actions"] == [a for a in record["handcoded"]["actions"] if a != "look"]  # no-ops dropped
    with AlfWorldEnv() as environment:  # and the path without them still wins
        environment.reset(task)
        assert [environment.step(a) for a in record["actions"]][-1].success
    assert list(tmp_path.glob("alfworld_expert/*.json"))  # cached for the next call
    assert spec.expert_actions(task) == record["actions"]
    given = Task(**{**task.__dict__, "expert_actions": ("a", "b")})
    assert spec.expert_actions(given) == ["a", "b"]


def test_expert_path_steps_caps_the_searching_path_and_keeps_the_walkthrough():
    """`expert_path_steps` (AlfWorldSpec): a searching path longer than it gives way to the PDDL walkthrough, so a
    longer episode limit need not change the seeds (cpu-alfworld-horizon: 9 of 36 seed paths grew at 36 steps)."""
    search = ["look"] + [f"go to shelf {i}" for i in range(1, 20)] + ["take book 1 from shelf 19"]
    result = {"handcoded": {"won": True, "actions": search, "stopped": None}, "walkthrough_won": True}
    walk = ["go to shelf 19", "take book 1 from shelf 19", "go to desk 1", "move book 1 to desk 1"]
    assert choose(result, walk, expert_limit(36, None)) == (search[1:], "handcoded")  # 20 steps, within 36
    assert choose(result, walk, expert_limit(36, 12)) == (walk, "walkthrough")
    assert expert_limit(8, 12) == 8 and AlfWorldSpec(max_steps=36, expert_path_steps=12).expert_path_steps == 12


@pytest.mark.slow
def test_expert_on_more_train_games(root):
    """12 train games across all task types: the chosen path always replays to a win."""
    tasks = [t for tt in TASK_TYPES for t in random.Random(tt).sample(SPEC.load_tasks("train", task_types=(tt,)), 2)]
    with AlfWorldEnv() as environment:
        for task in tasks:
            actions = SPEC.expert_actions(task)
            environment.reset(task)
            assert [environment.step(a) for a in actions][-1].success, task.task_id


def test_strip_banner_only_removes_the_banner():
    assert strip_banner("-= Welcome to TextWorld, ALFRED! =-\n\nYou are here.") == "You are here."
    assert strip_banner("You are here.") == "You are here."
