"""The pure cutting logic of cleaned successes (flywheel.core.cleaning): no env here."""

from flywheel.core.cleaning import apply_cut, no_progress_cut, shortest_per_task
from flywheel.core.trajectory import Step, Trajectory


def traj(first: str, moves: list[tuple[str, str]], task: str = "t", sample: int = 0) -> Trajectory:
    """A success whose steps are (action, observation after it), starting from `first`."""
    steps, before = [], first
    for action, after in moves:
        steps.append(Step(observation=before, thought="th", plan="p", action=action, next_observation=after))
        before = after
    return Trajectory(benchmark="b", split="train", task_id=task, source="policy", sample=sample, steps=steps,
                      success=True, reward=1.0)


def test_a_loop_back_to_an_earlier_observation_is_cut():
    tr = traj("start", [("go a", "at a"), ("go b", "at b"), ("go c", "at c"), ("go a", "at a"), ("take x", "got x"),
                        ("put x", "done")])
    cut = no_progress_cut(tr)
    assert cut.kept == (0, 4, 5) and cut.loops == 3 and cut.repeats == 0
    assert (cut.steps_before, cut.steps_after) == (6, 3)
    short = apply_cut(tr, cut.kept)
    assert short.actions == ("go a", "take x", "put x")
    assert [s.observation for s in short.steps] == ["start", "at a", "got x"]  # each step taken where it now is


def test_a_repeated_action_with_an_unchanged_observation_is_cut():
    tr = traj("start", [("look", "room"), ("look", "room"), ("look", "room"), ("open", "open")])
    cut = no_progress_cut(tr)
    assert cut.kept == (0, 3) and cut.repeats == 2 and cut.loops == 0


def test_a_loop_back_to_the_first_observation_cuts_from_the_start():
    tr = traj("start", [("go a", "at a"), ("go back", "start"), ("go b", "at b"), ("win", "won")])
    assert no_progress_cut(tr).kept == (2, 3)


def test_the_winning_step_is_never_cut_and_progress_is_kept():
    tr = traj("start", [("go a", "at a"), ("go b", "at b"), ("win", "start")])  # the win's answer repeats the start
    cut = no_progress_cut(tr)
    assert cut.kept == (0, 1, 2) and not cut.changed


def test_nested_loops_forget_the_states_they_cut():
    # a -> b -> c -> b (cut c) -> d -> a (cut b, d): the state b seen inside the cut is forgotten
    tr = traj("s", [("1", "a"), ("2", "b"), ("3", "c"), ("4", "b"), ("5", "d"), ("6", "a"), ("7", "b"), ("8", "win")])
    cut = no_progress_cut(tr)
    assert apply_cut(tr, cut.kept).actions == ("1", "7", "8")
    assert cut.steps_before - cut.steps_after == cut.loops + cut.repeats == 5


def test_shortest_per_task_keeps_the_shortest_of_each_task_ties_included():
    a3 = traj("s", [("x", "1"), ("y", "2"), ("z", "3")], task="a", sample=0)
    a2 = traj("s", [("x", "1"), ("z", "3")], task="a", sample=1)
    a2b = traj("s", [("y", "2"), ("z", "3")], task="a", sample=2)
    b4 = traj("s", [("w", "1"), ("x", "2"), ("y", "3"), ("z", "4")], task="b")
    kept, dropped = shortest_per_task([a3, a2, b4, a2b])
    assert kept == [a2, b4, a2b] and dropped == 1
