"""Plain-code parts of the living flywheel: adaptive sampling, the per-task cap, the stop
rules, the confidence intervals, the store's loop tables, and the budget setting."""

import pytest

from flywheel.core.decisions import IterationFacts, StopRules, decide
from flywheel.core.quality import compare_iterations, newcombe_difference, paired_bootstrap, wilson_interval
from flywheel.core.sampling import (
    allocate_attempts,
    cap_per_task,
    history_from_rows,
    jobs_from_allocation,
    task_stats_rows,
)
from flywheel.core.store import Store
from flywheel.core.trajectory import Trajectory
from flywheel.resources import LoopResource
from flywheel.rollout.engine import plan_resume
from tests.fakes import counter_task, make_traj

# -- adaptive sampling --------------------------------------------------------------------------


def test_no_history_is_uniform():
    ids = [f"t{i}" for i in range(5)]
    assert allocate_attempts(ids, {}, 10) == dict.fromkeys(ids, 2)


def test_hard_tasks_get_more_easy_fewer_total_fixed():
    ids = ["always", "never", "half", "new"]
    history = {"always": (4, 4), "never": (4, 0), "half": (4, 2)}
    alloc = allocate_attempts(ids, history, 12)
    assert sum(alloc.values()) == 12
    assert alloc["never"] > alloc["half"] > alloc["always"] >= 1
    assert alloc["never"] >= alloc["new"] >= alloc["always"]


def test_min_and_max_per_task_are_respected():
    ids = ["easy", "hard"]
    alloc = allocate_attempts(ids, {"easy": (10, 10), "hard": (10, 0)}, 8, min_per_task=2, max_per_task=5)
    assert alloc == {"easy": 3, "hard": 5}
    # caps that make the total impossible: everything at the cap
    assert allocate_attempts(ids, {}, 20, max_per_task=3) == {"easy": 3, "hard": 3}
    with pytest.raises(ValueError):
        allocate_attempts(ids, {}, 1, min_per_task=1)


def test_allocation_is_deterministic_and_jobs_follow_it():
    tasks = [counter_task(i) for i in range(3)]
    hist = {"c0": (2, 2), "c1": (2, 0)}
    a1 = allocate_attempts([t.task_id for t in tasks], hist, 7)
    assert a1 == allocate_attempts([t.task_id for t in tasks], hist, 7)
    jobs = jobs_from_allocation(tasks, a1)
    assert len(jobs) == 7 and [s for t, s in jobs if t.task_id == "c1"] == list(range(a1["c1"]))


def test_history_from_rows_skips_current_and_errored():
    rows = [
        {"iteration": 0, "task_id": "a", "attempts": 4, "successes": 1, "errored": 1},
        {"iteration": 1, "task_id": "a", "attempts": 2, "successes": 2, "errored": 0},
        {"iteration": 2, "task_id": "a", "attempts": 9, "successes": 9, "errored": 0},
    ]
    assert history_from_rows(rows, before_iteration=2) == {"a": (5, 3)}
    assert history_from_rows(rows, before_iteration=2, decay=0.5) == {"a": (4, 2)}  # 3*0.5+2, 1*0.5+2


def test_task_stats_rows_count_attempts_successes_errored():
    rows = [{"task_id": "a", "status": "ok", "success": True}, {"task_id": "a", "status": "errored", "success": False},
            {"task_id": "b", "status": "ok", "success": False}]
    got = {r["task_id"]: r for r in task_stats_rows(rows, ["a", "b", "c"])}
    assert got["a"] == {"task_id": "a", "attempts": 2, "successes": 1, "errored": 1}
    assert got["c"]["attempts"] == 0


def test_cap_per_task_counts_earlier_gated():
    trajs = [make_traj(task="a", sample=i) for i in range(3)] + [make_traj(task="b")]
    kept, dropped = cap_per_task(trajs, {"a": 1}, 2)
    assert [(t.task_id, t.sample) for t in kept] == [("a", 0), ("b", 0)] and dropped == 2
    assert cap_per_task(trajs, {}, None) == (trajs, 0)


def test_plan_resume_keeps_done_pairs_of_the_same_checkpoint():
    jobs = [(counter_task(i), s) for i in range(2) for s in range(2)]
    rows = [{"traj_id": "x0", "task_id": "c0", "sample": 0, "model_id": "ck", "status": "ok"},
            {"traj_id": "x1", "task_id": "c0", "sample": 1, "model_id": "ck", "status": "errored"},
            {"traj_id": "x9", "task_id": "c9", "sample": 0, "model_id": "ck", "status": "ok"}]
    plan = plan_resume(jobs, rows, "ck")
    assert [(t.task_id, s) for t, s in plan.todo] == [("c0", 1), ("c1", 0), ("c1", 1)]
    assert plan.stale_ids == ["x9"] and plan.resumed == 1
    other = plan_resume(jobs, rows, "new-checkpoint")  # another checkpoint: replace, never mix
    assert len(other.todo) == 4 and sorted(other.stale_ids) == ["x0", "x1", "x9"]


# -- stop rules -----------------------------------------------------------------------------------


def facts(k, new=2, seen=0.5, passed=True, total=None):
    return IterationFacts(k, passed, new, total if total is not None else 2 * (k + 1), seen, seen)


def test_continue_until_budget():
    pol = StopRules(iterations=2, patience=2)
    d0 = decide([facts(0, seen=0.1)], pol)
    assert d0.action == "continue" and d0.next_iteration == 1 and "iteration 0 added 2" in d0.reason
    d2 = decide([facts(0, seen=0.1), facts(1, seen=0.2), facts(2, seen=0.3)], pol)
    assert d2.action == "stop" and d2.code == "budget"


def test_failed_gate_check_stops():
    d = decide([facts(0, new=0, passed=False)], StopRules(iterations=3))
    assert d.action == "stop" and d.code == "gate_check_failed"


def test_dataset_stall_and_seen_stall_with_patience():
    pol = StopRules(iterations=9, patience=2, min_new_successes=3)
    d = decide([facts(0, new=5, seen=0.1), facts(1, new=1, seen=0.2), facts(2, new=2, seen=0.3)], pol)
    assert d.code == "dataset_stalled" and "[1, 2]" in d.reason
    pol = StopRules(iterations=9, patience=2)
    seen = [0.2, 0.5, 0.4, 0.5]
    d = decide([facts(i, seen=s) for i, s in enumerate(seen)], pol)
    assert d.code == "seen_stalled"
    assert decide([facts(i, seen=s) for i, s in enumerate(seen[:3])], pol).action == "continue"
    # patience 1: a single non-improving iteration stops
    assert decide([facts(0, seen=0.5), facts(1, seen=0.5)], StopRules(iterations=9, patience=1)).code == "seen_stalled"


def test_negative_budget_rejected():
    with pytest.raises(ValueError):
        StopRules(iterations=-1)


# -- confidence intervals -----------------------------------------------------------------------------


def test_wilson_and_newcombe_known_values():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    # Newcombe (1998) example: 56/70 vs 48/80 -> 0.2000 (0.0524, 0.3339)
    d, lo, hi = newcombe_difference(56, 70, 48, 80)
    assert d == pytest.approx(0.2) and lo == pytest.approx(0.0524, abs=1e-3) and hi == pytest.approx(0.3339, abs=1e-3)


def test_paired_bootstrap():
    d, lo, hi = paired_bootstrap([(1, 0)] * 8 + [(0, 0)] * 2)
    assert d == pytest.approx(0.8) and 0.5 <= lo <= 0.8 <= hi <= 1.0
    d, lo, hi = paired_bootstrap([(1, 1), (0, 0)])
    assert (d, lo, hi) == (0.0, 0.0, 0.0)


def test_compare_iterations_from_store(tmp_path):
    db = Store(tmp_path / "s.duckdb")

    def ev(k, succ):
        db.write_trajectories([Trajectory(benchmark="b", split="seen", task_id=f"t{i}", source="policy",
                                          iteration=k, success=s) for i, s in enumerate(succ)])
        db.write_evaluation({"benchmark": "b", "iteration": k, "split": "seen", "checkpoint_id": f"c{k}",
                             "episodes": len(succ), "success_rate": sum(succ) / len(succ)})

    assert compare_iterations(db, "b", 0).passed
    ev(0, [True] * 10 + [False] * 10)
    ev(1, [False] * 20)
    worse = compare_iterations(db, "b", 1)
    assert not worse.passed and "significantly worse" in worse.verdict
    assert worse.metadata["method"] == "paired_bootstrap" and worse.metadata["tasks_lost"] == 10
    assert worse.metadata["ci_high"] < 0 and worse.metadata["newcombe_ci_high"] < 0
    ev(2, [True] * 11 + [False] * 9)
    assert compare_iterations(db, "b", 2).passed


# -- store tables and settings -------------------------------------------------------------------------


def test_iteration_decision_is_claimed_once_and_cleared_by_a_new_gate(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    db.record_gate_stats("b", 0, candidates=4, new_unique_successes=2, gated_total=2)
    assert db.claim_decision("b", 0, {"decision": "continue", "reason": "r", "decided_by": "sensor"})
    assert not db.claim_decision("b", 0, {"decision": "stop", "reason": "r2", "decided_by": "schedule"})
    row = db.iterations("b").row(0, named=True)
    assert (row["decision"], row["decided_by"], row["new_unique_successes"]) == ("continue", "sensor", 2)
    db.record_gate_stats("b", 0, candidates=4, new_unique_successes=3, gated_total=3)  # gate re-ran
    row = db.iterations("b").row(0, named=True)
    assert row["decision"] is None and row["new_unique_successes"] == 3


def test_task_stats_replace_per_iteration(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    db.write_task_stats("b", 0, [{"task_id": "a", "attempts": 2, "successes": 1}])
    db.write_task_stats("b", 0, [{"task_id": "a", "attempts": 3, "successes": 0, "errored": 1}])
    db.write_task_stats("b", 1, [{"task_id": "a", "attempts": 1, "successes": 1}])
    assert db.task_stats("b").select("iteration", "attempts", "errored").rows() == [(0, 3, 1), (1, 1, 0)]
    assert db.task_stats("b", before_iteration=1).height == 1


def test_iteration_budget_is_checked_against_the_partitions():
    """K (loop.iterations) >= 0 always; K <= the highest iteration partition when it is known."""
    from flywheel.core.validation import ConfigurationError

    assert LoopResource(iterations=1).stop_rules(max_partition=3).iterations == 1
    with pytest.raises(ConfigurationError, match="must be >= 0"):
        LoopResource(iterations=-1).stop_rules()
    with pytest.raises(ConfigurationError, match="raise the profile's iterations to at least 7"):
        LoopResource(iterations=7).stop_rules(max_partition=3)