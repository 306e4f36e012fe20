import multiprocessing as mp

import pytest

from flywheel.core.store import Store
from tests.fakes import make_traj


def test_roundtrip(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    tr = make_traj()
    db.write_trajectories([tr])
    [back] = db.load_trajectories(benchmark="b")
    assert back.traj_id == tr.traj_id and back.steps == tr.steps and back.success


def test_write_is_idempotent_on_natural_key(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    db.write_trajectories([make_traj(), make_traj(task="t2")])
    db.write_trajectories([make_traj(n=2), make_traj(task="t2")])
    assert db.query("SELECT count(*) AS n FROM trajectories")["n"][0] == 2
    assert db.query("SELECT count(*) AS n FROM steps")["n"][0] == 2 + 3


def test_replace_scope_replaces_a_partition(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    db.write_trajectories([make_traj(task=f"t{i}") for i in range(4)] + [make_traj(iteration=1)])
    db.write_trajectories([make_traj(task="t9")], replace_scope={"benchmark": "b", "iteration": 0})
    rows = db.trajectory_table(benchmark="b")
    assert sorted(zip(rows["task_id"], rows["iteration"], strict=True)) == [("t1", 1), ("t9", 0)]
    orphans = db.query("SELECT count(*) AS n FROM steps WHERE traj_id NOT IN (SELECT traj_id FROM trajectories)")
    assert orphans["n"][0] == 0


def test_failed_transaction_keeps_old_rows(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    db.write_trajectories([make_traj()])
    try:
        with db.transaction() as con:
            con.execute("DELETE FROM trajectories")
            raise RuntimeError("killed mid-write")
    except RuntimeError:
        pass
    assert db.trajectory_table().height == 1


def test_gated_ids_say_which_gates_and_whether_trajectories_or_tasks(tmp_path):
    """Issue 56: `traj_ids_gated_up_to` (gates 0..k), `traj_ids_gated_at` (gate k) and `task_ids_gated_at` (gate
    k's distinct tasks), not gated_ids / gated_ids_of / gated_task_ids."""
    db = Store(tmp_path / "s.duckdb")
    db.write_gated("b", 0, [("x0", "t")])
    db.write_gated("b", 1, [("x1", "t")])
    db.write_gated("b", 1, [("x1b", "t"), ("x1c", "t"), ("x1d", "u")])  # re-run replaces
    assert db.traj_ids_gated_up_to("b", 0) == ["x0"]
    assert db.traj_ids_gated_up_to("b", 1) == ["x0", "x1b", "x1c", "x1d"]
    assert db.traj_ids_gated_at("b", 1) == ["x1b", "x1c", "x1d"]
    assert db.task_ids_gated_at("b", 1) == ["t", "u"]
    assert db.gated_iterations("b") == [0, 1]
    assert not {"gated_ids", "gated_ids_of", "gated_task_ids"} & set(dir(Store))


def _writer(path: str, offset: int) -> None:
    db = Store(path)
    for i in range(15):
        db.write_trajectories([make_traj(task=f"p{offset}-{i}")])


def test_two_processes_writing_lose_nothing(tmp_path):
    path = str(tmp_path / "s.duckdb")
    Store(path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, k)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert Store(path).trajectory_table().height == 30


def test_gate_check_verdict_is_recorded_replaced_and_cleared(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    assert db.gate_check_passed("b", 0) is None  # never evaluated
    db.write_gated("b", 0, [("x0", "t")])
    db.record_gate_check("b", 0, passed=False, trajectories=1, problems=["x0: no steps", "x0: bad action"])
    db.record_gate_check("b", 0, passed=False, trajectories=1, problems=["x0: no steps"])  # a re-run replaces
    assert db.gate_check_passed("b", 0) is False and db.gate_check_passed("b", 1) is None
    row = db.query("SELECT * FROM gate_checks").row(0, named=True)
    assert (row["trajectories"], row["problems"], row["first_problem"]) == (1, 1, "x0: no steps")
    db.record_gate_check("b", 1, passed=True, trajectories=2, problems=[])
    db.write_gated("b", 0, [("x0b", "t")])  # a gate re-run alone keeps the latest verdict (as Dagster's record)
    assert db.gate_check_passed("b", 0) is False
    db.clear_gate_check("b", 0)  # the gate re-runs with its check: not evaluated until the check runs
    assert db.gate_check_passed("b", 0) is None and db.gate_check_passed("b", 1) is True
    db.clear_gate_check("b", 0)  # idempotent
    assert db.query("SELECT count(*) AS n FROM gate_checks")["n"][0] == 1


def test_an_older_store_file_gains_the_gate_checks_table(tmp_path):
    import duckdb

    from flywheel.core.store import SCHEMA

    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute(SCHEMA.split("CREATE TABLE IF NOT EXISTS gate_checks")[0])  # the tables before gate_checks
    con.execute("INSERT INTO gate_runs VALUES ('b', 0, 3, 1, now())")
    con.close()
    db = Store(path)
    assert db.gate_run("b", 0)["passed"] == 1 and db.gate_check_passed("b", 0) is None
    db.record_gate_check("b", 0, passed=True, trajectories=1, problems=[])
    assert Store(path, read_only=True).gate_check_passed("b", 0) is True


def test_an_older_store_file_with_elaborate_steps_is_renamed_to_thought(tmp_path):
    """e_t was stored as `steps.elaborate`; a writer renames it to `thought`, data and views intact."""
    import duckdb

    path = tmp_path / "old.duckdb"
    db = Store(path)
    db.write_trajectories([make_traj("t1", success=True)])
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE steps RENAME COLUMN thought TO elaborate")
    con.close()
    [traj] = Store(path).load_trajectories()
    assert traj.steps and traj.steps[0].thought == make_traj("t1", success=True).steps[0].thought
    con = duckdb.connect(str(path), read_only=True)
    cols = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'steps'").fetchall()]
    con.close()
    assert "thought" in cols and "elaborate" not in cols


def _evaluate(db, benchmark, k, split, success, reward=0.5):
    db.write_evaluation({"benchmark": benchmark, "iteration": k, "split": split, "checkpoint_id": f"{benchmark}-{k}",
                         "episodes": 10, "success_rate": success, "avg_reward": reward})


def test_evaluations_at_and_evaluation_values(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    _evaluate(db, "b", 0, "seen", 0.2)
    _evaluate(db, "b", 0, "unseen", 0.1)
    _evaluate(db, "b", 1, "seen", 0.4, reward=0.75)
    _evaluate(db, "c", 0, "unseen", 0.3)
    at0 = db.evaluations_at("b", 0)
    assert sorted(at0) == ["seen", "unseen"] and at0["seen"]["success_rate"] == 0.2 and at0["seen"]["episodes"] == 10
    assert list(db.evaluations_at("b", 1)) == ["seen"] and db.evaluations_at("b", 2) == {}
    assert db.evaluation_values("success_rate") == {("b", "seen", 0): 0.2, ("b", "unseen", 0): 0.1,
                                                    ("b", "seen", 1): 0.4, ("c", "unseen", 0): 0.3}
    assert db.evaluation_values("avg_reward")[("b", "seen", 1)] == 0.75
    with pytest.raises(ValueError, match="unknown evaluation metric 'success_rate; DROP TABLE evaluations'"):
        db.evaluation_values("success_rate; DROP TABLE evaluations")
    with pytest.raises(ValueError, match="unknown evaluation metric 'checkpoint_id'"):
        db.evaluation_values("checkpoint_id")


def test_evaluated_benchmarks(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    assert db.evaluated_benchmarks() == []
    _evaluate(db, "c", 0, "unseen", 0.3)
    _evaluate(db, "b", 0, "seen", 0.2)
    _evaluate(db, "b", 1, "seen", 0.4)
    assert db.evaluated_benchmarks() == ["b", "c"]
    assert Store(tmp_path / "s.duckdb", read_only=True).evaluated_benchmarks() == ["b", "c"]


def test_eval_buckets_of_a_checkpoint(tmp_path):
    from flywheel.curriculum.tables import write_eval_buckets

    db = Store(tmp_path / "s.duckdb")
    assert db.eval_buckets_of("b", 0) == []  # no evaluation yet: the table does not exist
    assert Store(tmp_path / "s.duckdb", read_only=True).eval_buckets_of("b", 0) == []

    def bucket(name, lo, hi, n, ok):
        return {"bucket": name, "lo": lo, "hi": hi, "episodes": n, "successes": ok, "success_rate": ok / n,
                "mean_gold_length": 1.0}

    write_eval_buckets(db, "b", 0, "unseen", [bucket("hard", 10.0, None, 2, 0), bucket("easy", None, 5.0, 4, 3)], "ck0")
    write_eval_buckets(db, "b", 0, "seen", [bucket("medium", 5.0, 10.0, 3, 1)], "ck0")
    write_eval_buckets(db, "b", 1, "seen", [bucket("easy", None, 5.0, 1, 1)], "ck1")
    write_eval_buckets(db, "c", 0, "seen", [bucket("easy", None, 5.0, 9, 9)], "c0")
    rows = db.eval_buckets_of("b", 0)
    assert [(r["split"], r["bucket"], r["lo"], r["hi"], r["episodes"], r["successes"]) for r in rows] == [
        ("seen", "medium", 5.0, 10.0, 3, 1), ("unseen", "easy", None, 5.0, 4, 3), ("unseen", "hard", 10.0, None, 2, 0)]
    assert [r["successes"] for r in db.eval_buckets_of("b", 1)] == [1] and db.eval_buckets_of("b", 2) == []


def test_gated_growth_benchmarks_and_teacher_models(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    assert db.gated_growth("b") == [] and db.trajectory_benchmarks() == [] and db.teacher_models() == []
    db.write_gated("b", 1, [("y0", "t"), ("y1", "u")], candidates=4)
    db.write_gated("b", 0, [("x0", "t")], candidates=2)
    db.write_gated("c", 0, [], candidates=5)
    growth = db.gated_growth("b")
    assert [(r["iteration"], r["candidates"], r["new_unique_successes"], r["gated_total"]) for r in growth] == [
        (0, 2, 1, 1), (1, 4, 2, 3)]
    assert growth[1]["pass_rate"] == 0.5
    db.write_trajectories([make_traj(), make_traj(task="t2")])
    assert db.trajectory_benchmarks() == ["b"]
    db.cache_put("k1", "teacher-b", "answer")
    db.cache_put("k2", "teacher-a", "answer")
    db.cache_put("k3", "teacher-b", "answer")
    assert db.teacher_models() == ["teacher-a", "teacher-b"]


def test_success_views_count_successes_give_wilson_intervals_and_null_for_no_episode(tmp_path):
    from flywheel.core.quality import wilson_interval
    from flywheel.curriculum.tables import write_eval_buckets

    db = Store(tmp_path / "s.duckdb")
    for k, (rate, n) in enumerate([(0.5, 10), (0.0, 0), (1.0, 4)]):
        db.write_evaluation({"benchmark": "b", "iteration": k, "split": "seen", "checkpoint_id": f"c{k}",
                             "episodes": n, "success_rate": rate})
    rows = db.query("SELECT successes, success_rate, ci_low, ci_high FROM success_by_iteration").rows()
    lo, hi = wilson_interval(5, 10)
    assert rows == [(5, 0.5, round(lo, 4), round(hi, 4)), (0, None, None, None), (4, 1.0, round(wilson_interval(4, 4)[0], 4), 1.0)]
    write_eval_buckets(db, "b", 0, "seen", [
        {"bucket": "easy", "lo": None, "hi": 5.0, "episodes": 0, "successes": 0, "success_rate": 0.0, "mean_gold_length": 1.0},
        {"bucket": "hard", "lo": 5.0, "hi": None, "episodes": 3, "successes": 0, "success_rate": 0.0, "mean_gold_length": 9.0}], "c0")
    db = Store(tmp_path / "s.duckdb")  # views are made on open: now over eval_buckets too
    buckets = db.query("SELECT bucket, success_rate, ci_low, ci_high FROM success_by_bucket").rows()
    assert buckets == [("easy", None, None, None), ("hard", 0.0, 0.0, round(wilson_interval(0, 3)[1], 4))]


def test_copy_episodes_takes_a_checkpoints_finished_episodes_this_store_lacks(tmp_path):
    """Arms sharing a k=0 checkpoint share its episodes: only that checkpoint's (under any settings tag), only
    finished ones, of the splits asked for, only (split, task, sample) keys the store lacks (its own are never
    overwritten), steps and all; copying again copies nothing."""
    def tagged(model_id, status="ok", **kw):
        tr = make_traj(**kw)
        tr.model_id, tr.status = model_id, status
        return tr

    src, dst = Store(tmp_path / "a.duckdb"), Store(tmp_path / "b.duckdb", method="other")
    src.write_trajectories([tagged("X@a", task="t1"), tagged("X@a#1234abcd", task="t2", n=5),
                            tagged("X@a", task="t3", status="errored"), tagged("Y@a", task="t4"),
                            tagged("X@a", task="t5", iteration=1), tagged("X@a", task="t6", success=False),
                            tagged("X@ab", task="t7")])
    [t8] = [tagged("X@a", task="t8")]
    t8.split = "seen"  # an evaluation split: not asked for
    src.write_trajectories([t8])
    dst.write_trajectories([tagged("X@a", task="t6", success=True, n=1)])  # played here already
    assert dst.copy_episodes(src, benchmark="b", iteration=0, checkpoint_id="X@a", splits=["train", "validation"]) == 2
    rows = {r["task_id"]: r for r in dst.trajectory_table(benchmark="b").iter_rows(named=True)}
    assert sorted(rows) == ["t1", "t2", "t6"]
    assert rows["t2"]["model_id"] == "X@a#1234abcd" and rows["t2"]["method"] == "other"
    assert rows["t6"]["success"] and rows["t6"]["steps"] == 1  # its own episode kept
    [t2] = dst.load_trajectories(traj_ids=[rows["t2"]["traj_id"]])
    assert len(t2.steps) == 5 and t2.steps == src.load_trajectories(traj_ids=[rows["t2"]["traj_id"]])[0].steps
    assert dst.copy_episodes(src, benchmark="b", iteration=0, checkpoint_id="X@a", splits=["train", "validation"]) == 0
