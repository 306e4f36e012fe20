from dataclasses import replace

from flywheel.evaluation import markdown_table, summarize
from flywheel.gate import dataset_problems, reward_gate
from tests.test_store import make_traj


def test_gate_keeps_only_new_successes():
    ok = make_traj(task="a")
    fail = make_traj(task="b", success=False)
    err = replace(make_traj(task="c"), status="errored")
    dup = make_traj(task="a", sample=1)  # same actions as `ok`
    seeded = make_traj(task="d")
    passed, stats = reward_gate([ok, fail, err, dup, seeded], already=[("d", seeded.actions)])
    assert [t.task_id for t in passed] == ["a"]
    assert (stats.candidates, stats.passed, stats.failed, stats.errored, stats.duplicates) == (5, 1, 1, 1, 2)


def test_dataset_problems():
    assert dataset_problems([]) == ["dataset is empty"]
    good = make_traj()
    assert dataset_problems([good]) == []
    bad = replace(good, steps=[replace(good.steps[0], plan=" ")])
    assert any("empty plan" in p for p in dataset_problems([bad]))
    assert any("not a successful" in p for p in dataset_problems([make_traj(success=False)]))


def test_summarize_excludes_errored_from_rates():
    trajs = [make_traj(task="a"), make_traj(task="b", success=False), replace(make_traj(task="c"), status="errored")]
    s = summarize(trajs)
    assert s["episodes"] == 2 and s["errored"] == 1
    assert s["success_rate"] == 0.5
    assert s["mean_steps"] == 3
    assert s["prompt_tokens_per_step"] == 11.0
    assert "| 0.500 |" in markdown_table([s], ["success_rate"])
