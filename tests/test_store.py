import multiprocessing as mp

from flywheel.store import Store
from flywheel.trajectory import Step, Trajectory


def make_traj(task="t1", sample=0, iteration=0, source="policy", success=True, n=3) -> Trajectory:
    steps = [Step(observation=f"o{i}", elaborate=f"e{i}", plan=f"p{i}", action=f"a{i}",
                  next_observation=f"o{i + 1}", prompt_tokens=10 + i) for i in range(n)]
    return Trajectory(benchmark="b", split="train", task_id=task, source=source, iteration=iteration,
                      sample=sample, goal="g", steps=steps, success=success, reward=float(success))


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


def test_gated_ids_up_to_iteration(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    db.write_gated("b", 0, [("x0", "t")])
    db.write_gated("b", 1, [("x1", "t")])
    db.write_gated("b", 1, [("x1b", "t")])  # re-run replaces
    assert db.gated_ids("b", up_to_iteration=0) == ["x0"]
    assert db.gated_ids("b", up_to_iteration=1) == ["x0", "x1b"]
    assert db.gated_iterations("b") == [0, 1]


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
