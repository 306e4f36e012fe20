"""Rollouts spent where they teach (flywheel.core.sampling.teaching_weights): same total, shifted the right way."""

from flywheel.core.sampling import allocate_attempts, history_from_rows, teaching_weights

PER_TASK = 4


def allocate(history: dict[str, tuple[int, int]], ids: list[str]) -> dict[str, int]:
    weights, caps = teaching_weights(ids, history, PER_TASK)
    return allocate_attempts(ids, history, PER_TASK * len(ids), min_per_task=1, weights=weights, caps=caps)


def test_the_total_is_unchanged_and_sometimes_solved_tasks_get_the_most():
    ids = ["always", "sometimes", "never", "sometimes2", "untried"]
    history = {"always": (4, 4), "sometimes": (4, 1), "never": (4, 0), "sometimes2": (4, 3)}
    alloc = allocate(history, ids)
    assert sum(alloc.values()) == PER_TASK * len(ids)  # the arm's budget: tasks x samples_per_task
    assert alloc["always"] < PER_TASK < alloc["sometimes"] and alloc["sometimes2"] > PER_TASK
    assert 1 <= alloc["always"] and alloc["never"] <= PER_TASK and alloc["untried"] <= PER_TASK  # bounded


def test_no_history_is_uniform():
    ids = [f"t{i}" for i in range(7)]
    assert allocate({}, ids) == dict.fromkeys(ids, PER_TASK)


def test_the_total_holds_when_only_always_and_never_solved_tasks_are_left():
    ids = ["a1", "a2", "n1", "n2", "n3"]
    history = {"a1": (2, 2), "a2": (2, 2), "n1": (2, 0), "n2": (2, 0), "n3": (2, 0)}
    alloc = allocate(history, ids)
    assert sum(alloc.values()) == PER_TASK * len(ids)
    assert all(alloc[n] == PER_TASK for n in ("n1", "n2", "n3"))  # never solved: capped at the uniform share


def test_the_store_rows_drive_it_errored_episodes_are_not_attempts():
    rows = [{"iteration": 0, "task_id": "x", "attempts": 3, "successes": 1, "errored": 1},
            {"iteration": 0, "task_id": "y", "attempts": 2, "successes": 2, "errored": 0}]
    history = history_from_rows(rows, before_iteration=1)
    assert history == {"x": (2, 1), "y": (2, 2)}
    alloc = allocate(history, ["x", "y"])
    assert alloc["x"] > alloc["y"] and sum(alloc.values()) == 2 * PER_TASK
