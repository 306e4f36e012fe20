from flywheel.core.prompting import (
    INVALID_FORMAT_OBSERVATION,
    HistoryItem,
    build_messages,
    format_response,
    parse_response,
)


def test_parse_roundtrip():
    text = format_response("The door is closed. I should open it.", "Open the door, then go.", "open door to kitchen")
    r = parse_response(text)
    assert (r.thought, r.plan, r.action, r.well_formed) == (
        "The door is closed. I should open it.", "Open the door, then go.", "open door to kitchen", True
    )


def test_parse_multiline_thought_and_trailing_text():
    r = parse_response("Thought: line one\nline two\nPlan: p\nAction: look around\nObservation: hallucinated")
    assert r.thought == "line one\nline two"
    assert r.action == "look around"


def test_parse_malformed_never_raises():
    for junk in ["", "hello", "Thought: only a thought", "Action:   \n", "Plan: x\nAction:"]:
        r = parse_response(junk)
        assert not r.well_formed and r.action == ""
    assert "Action" in INVALID_FORMAT_OBSERVATION


def test_parse_is_case_insensitive_and_first_action_wins():
    r = parse_response("thought: t\nplan: p\naction: go north\nAction: go south")
    assert r.action == "go north"


def test_fusion_keeps_only_plans_in_history():
    hist = [
        HistoryItem(plan="PLAN-1", action="a1", observation="obs-1", thought="LONG-THOUGHT-1"),
        HistoryItem(plan="PLAN-2", action="a2", observation="obs-2", thought="LONG-THOUGHT-2"),
    ]
    fused = build_messages("instr", "start obs", hist)
    user = fused[1]["content"]
    assert "PLAN-1" in user and "PLAN-2" in user and "obs-2" in user and "a2" in user
    assert "LONG-THOUGHT" not in user
    full = build_messages("instr", "start obs", hist, keep_thoughts=True)[1]["content"]
    assert "LONG-THOUGHT-1" in full and len(full) > len(user)
    assert fused[0]["role"] == "system" and "Action:" in fused[0]["content"]


def test_history_window_keeps_goal_and_recent_steps():
    hist = [HistoryItem(plan=f"p{i}", action=f"a{i}", observation=f"o{i}") for i in range(10)]
    user = build_messages("instr", "GOAL OBS", hist, history_window=3)[1]["content"]
    assert user.startswith("GOAL OBS")
    assert "7 earlier steps omitted" in user
    assert "a9" in user and "a7" in user and "a6" not in user
    assert "[Step 11]" in user


def test_observation_clipping_spares_the_latest_observation():
    hist = [HistoryItem(plan="p", action="a", observation="x" * 500),
            HistoryItem(plan="p", action="b", observation="y" * 500)]
    user = build_messages("i", "s", hist, max_observation_chars=50)[1]["content"]
    assert "x" * 51 not in user and "x" * 50 in user  # a past page: clipped
    assert "y" * 500 in user  # the page the model acts on: whole
    react = build_messages("i", "s", hist, max_observation_chars=50, history_mode="react")
    assert "x" * 51 not in react[3]["content"] and "y" * 500 in react[5]["content"]
