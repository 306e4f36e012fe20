"""Answer lengths against the generation budget: the summary, and the store's count of evaluation answers."""

from flywheel.core.metrics import answer_lengths
from flywheel.core.store import Store
from flywheel.core.trajectory import Step, Trajectory


def test_answer_lengths_summarises_against_the_cap():
    got = answer_lengths([5, 1, 9, 3, 7, 160, 200, 2, 4, 6], cap=160)
    assert got == {"n": 10, "median": 5, "p95": 200, "max": 200, "cap": 160, "at_cap": 2}
    # nearest rank: the 95th percentile of 20 sorted values is the 19th
    assert answer_lengths(list(range(1, 21)), cap=100)["p95"] == 19
    assert answer_lengths([], cap=8) == {"n": 0, "median": None, "p95": None, "max": None, "cap": 8, "at_cap": 0}


def test_the_store_returns_each_evaluation_steps_answer_tokens(tmp_path):
    db = Store(tmp_path / "s.duckdb")

    def traj(task: str, tokens: list[int], *, split="unseen", iteration=1, sample=0, status="ok") -> Trajectory:
        return Trajectory(benchmark="b", split=split, task_id=task, source="policy", iteration=iteration,
                          sample=sample, goal="g", status=status,
                          steps=[Step(observation="o", thought="e", plan="p", action="a", completion_tokens=n)
                                 for n in tokens])

    db.write_trajectories([traj("t1", [10, 128]), traj("t2", [40]),
                           traj("t3", [999], split="seen"), traj("t4", [999], iteration=0),
                           traj("t5", [999], sample=1), traj("t6", [999], status="errored")])
    assert sorted(db.policy_answer_tokens("b", 1, "unseen")) == [10, 40, 128]
    assert db.policy_answer_tokens("b", 2, "unseen") == []
