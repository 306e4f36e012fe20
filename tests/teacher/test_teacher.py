import json

import pytest

from flywheel.core.store import Store
from flywheel.teacher import OpenAITeacher, ScriptedTeacher, TeacherError
from flywheel.teacher.base import TeacherRefused, apply_annotations
from flywheel.teacher.scripted import pick_harder
from tests.fakes import make_traj
from tests.openai_stub import StubServer

SECRET = "sk-test-SECRET-abcdef123456"


def good_answer(n: int) -> str:
    return "```json\n" + json.dumps({"steps": [{"thought": f"think {i}. more.", "plan": f"plan {i}"} for i in range(n)]}) + "\n```"


def test_scripted_teacher_is_informative():
    traj = make_traj(n=3)
    notes = ScriptedTeacher(lambda a: f"do {a}", grounded_lookahead=False).annotate(traj, "instr")
    assert len(notes) == 3
    assert "g" in notes[0].thought and "do a0" in notes[0].thought and "do a1" in notes[0].thought
    assert "a0" in notes[1].thought and "o1" in notes[1].thought  # what the last action changed
    assert notes[2].plan.startswith("Do a2") and "complete" in notes[2].thought
    assert all(len(n.plan) < len(n.thought) for n in notes)  # short plan, long thought
    annotated = apply_annotations(traj, notes)
    assert annotated.source == "teacher" and annotated.steps[1].plan == notes[1].plan


def test_scripted_lookahead_names_only_what_the_agent_has_seen():
    """The answer object appears in o_2 (after looking around): no thought before that names it."""
    from flywheel.core.trajectory import Step, Trajectory

    obs = ["You are in the kitchen.", "You teleport to the outside.", "Here you see: a butterfly, a rock.",
           "You focus on the butterfly.", "You move the butterfly to the inventory."]
    actions = ["teleport to outside", "look around", "focus on butterfly", "pick up butterfly", "teleport to kitchen"]
    steps = [Step(observation=obs[i], thought="", plan="", action=a, next_observation=obs[i + 1] if i + 1 < 5 else "Done.")
             for i, a in enumerate(actions)]
    traj = Trajectory(benchmark="b", split="train", task_id="t", source="expert", iteration=0, sample=0,
                      goal="Find an animal and move it to the red box in the kitchen.", steps=steps, success=True,
                      reward=1.0)
    instructions = "Actions: teleport to LOC, look around, focus on OBJ, pick up OBJ, move OBJ to OBJ."
    notes = ScriptedTeacher(lambda a: f"do {a}").annotate(traj, instructions)
    assert "butterfly" not in notes[0].thought + notes[0].plan + notes[1].thought + notes[1].plan
    assert "do look around" in notes[0].thought and "decide what comes next from what I see" in notes[0].thought
    assert "do focus on butterfly. After that: do pick up butterfly" in notes[2].thought  # seen in o_2: named
    assert "do teleport to kitchen" in notes[3].thought  # words from the goal are known from the start
    leaky = ScriptedTeacher(lambda a: f"do {a}", grounded_lookahead=False).annotate(traj, instructions)
    assert "butterfly" in leaky[0].thought  # the earlier teacher named it at step 0


def test_numbered_names_are_known_only_once_seen_and_the_thought_says_where():
    """ALFWorld: the goal's "egg" and the instructions' example "apple 1" do not tell where egg 1 lies;
    the thought names the take only at the receptacle that shows it, and says it sees it there."""
    from flywheel.core.trajectory import Step, Trajectory

    obs = ["You are in the middle of a room. Looking quickly around you, you see a countertop 1, a fridge 1, "
           "and a garbagecan 1.", "You arrive at fridge 1. The fridge 1 is closed.", "You arrive at garbagecan 1. "
           "On the garbagecan 1, you see a apple 1, and a egg 1.", "You pick up the egg 1 from the garbagecan 1.",
           "You arrive at countertop 1. On the countertop 1, you see nothing."]
    actions = ["go to fridge 1", "go to garbagecan 1", "take egg 1 from garbagecan 1", "go to countertop 1",
               "move egg 1 to countertop 1"]
    steps = [Step(observation=obs[i], thought="", plan="", action=a, next_observation=obs[i + 1] if i + 1 < 5 else "Done.")
             for i, a in enumerate(actions)]
    traj = Trajectory(benchmark="b", split="train", task_id="t", source="expert", iteration=0, sample=0,
                      goal="put some egg in countertop.", steps=steps, success=True, reward=1.0)
    instructions = "Actions: go to X, take X from Y (numbered names, e.g. apple 1, egg 1), move X to Y."
    notes = ScriptedTeacher(lambda a: f"do {a}").annotate(traj, instructions)
    for n in notes[:2]:  # before o_2 showed it, egg 1's place is unknown
        assert "egg 1" not in n.thought + n.plan and "decide what comes next from what I see" in n.thought
    assert "I see egg 1 here." in notes[2].thought and "do take egg 1 from garbagecan 1" in notes[2].thought
    assert not any(" here." in n.thought for n in (notes[1], notes[3], notes[4]))  # nothing asked for first shown
    assert "do move egg 1 to countertop 1" in notes[3].thought  # seen, and countertop 1 is in the room
    leaky = ScriptedTeacher(lambda a: f"do {a}", grounded_lookahead=False).annotate(traj, instructions)
    assert "take egg 1" in leaky[0].thought


def test_openai_teacher_retries_5xx_and_429_then_caches(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    with StubServer([(500, "boom"), (429, "slow down"), (200, good_answer(3))]) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key=SECRET, cache=store, sleep=lambda s: None)
        notes = teacher.annotate(make_traj(n=3), "instr")
        assert [n.plan for n in notes] == ["plan 0", "plan 1", "plan 2"]
        assert len(srv.requests) == 3
        again = teacher.annotate(make_traj(n=3), "instr")  # same request: from the cache, no new call
        assert again == notes and len(srv.requests) == 3
        assert {k.lower(): v for k, v in srv.headers[0].items()}["authorization"] == f"Bearer {SECRET}"


def test_openai_teacher_gives_up_with_clear_error_and_no_secret(tmp_path):
    with StubServer([(503, f"overloaded, key {SECRET}")]) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key=SECRET, max_retries=2, sleep=lambda s: None)
        with pytest.raises(TeacherError) as err:
            teacher.annotate(make_traj(n=2), "instr")
        assert len(srv.requests) == 3
        assert "after 3 attempt" in str(err.value) and SECRET not in str(err.value)


def test_openai_teacher_does_not_retry_client_errors():
    with StubServer([(400, "bad request")]) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key="k", sleep=lambda s: None)
        with pytest.raises(TeacherRefused, match="refused the request"):  # exit 2 in the CLI: no retry helps
            teacher.annotate(make_traj(n=2), "instr")
        assert len(srv.requests) == 1


def test_malformed_teacher_answer_is_a_clear_error():
    with StubServer([(200, "I cannot do JSON today")]) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key="k", sleep=lambda s: None)
        with pytest.raises(TeacherError, match="malformed"):
            teacher.annotate(make_traj(n=2), "instr")
    with StubServer([(200, good_answer(1))]) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key="k", sleep=lambda s: None)
        with pytest.raises(TeacherError, match="1 annotations for 2"):
            teacher.annotate(make_traj(n=2), "instr")


def test_scripted_teacher_writes_plain_english_for_one_step_and_doubled_names():
    from envs.scienceworld.prompts import describe_action

    [note] = ScriptedTeacher(lambda a: f"do {a}").annotate(make_traj(n=1), "instr")
    assert "I expect about 1 step." in note.thought and "1 steps" not in note.thought
    assert "I expect about 3 steps." in ScriptedTeacher(lambda a: f"do {a}").annotate(make_traj(n=3), "instr")[0].thought
    intent = describe_action("focus on baby baby dragonfly")  # ScienceWorld's own object name
    assert "the baby dragonfly" in intent and "baby baby" not in intent
    assert describe_action("move egg 1 to inventory") == "move the egg 1 to the inventory"


def test_pick_harder_prefers_long_and_takes_turns():
    cands = [{"kind": "a", "params": {"i": i}, "expected_length": n} for i, n in enumerate([2, 9, 3])] + \
            [{"kind": "b", "params": {"j": j}, "expected_length": 8} for j in range(3)]
    picked = pick_harder(cands, seed_lengths=[5, 5, 6], n=4)
    assert [p["kind"] for p in picked] == ["a", "b", "a", "b"]
    assert picked[0]["params"] == {"i": 1}  # the candidate longer than the seed median comes first
    assert "seed median 5" in picked[0]["rationale"]
