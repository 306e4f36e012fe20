"""Two partitions materializing into the same DuckDB file at once lose nothing.

Two processes run `gated_dataset` (through Dagster, with its blocking check) for two
benchmarks' partitions, three times each, at the same time; both write the gated,
gate_runs and iterations tables of one store file.
"""

import multiprocessing as mp

import pytest

from flywheel.core.store import Store
from flywheel.core.trajectory import Step, Trajectory

N = 120  # candidates per partition: enough rows that the two writers' transactions overlap


def candidates(benchmark: str) -> list[Trajectory]:
    return [Trajectory(benchmark=benchmark, split="train", task_id=f"t{i % 40}", source="policy", iteration=0,
                       sample=i // 40, success=i % 3 != 0, reward=1.0, model_id="ck",
                       steps=[Step(observation="o", thought="think", plan="plan", action=f"a{i}")])
            for i in range(N)]


def _materialize(path: str, benchmark: str, start) -> None:
    import dagster as dg

    from flywheel.definitions import build_defs
    from flywheel.orchestration.partitions import partition_key
    from flywheel.resources import StoreResource

    job = build_defs({"store": StoreResource(path=path)}).resolve_job_def("iteration_job")
    start.wait(120)  # both processes imported Dagster: go together
    for _ in range(3):
        result = job.execute_in_process(partition_key=str(partition_key(benchmark, 0)), raise_on_error=False,
                                        instance=dg.DagsterInstance.ephemeral(),
                                        asset_selection=[dg.AssetKey("gated_dataset")])
        assert result.success


@pytest.mark.slow
def test_two_partitions_writing_the_store_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "fw.duckdb")
    db = Store(path)
    for b in ("scienceworld", "alfworld"):
        db.write_trajectories(candidates(b))
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_materialize, args=(path, b, start)) for b in ("scienceworld", "alfworld")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    expected = N - N // 3  # every third candidate failed
    got = dict(db.query("SELECT benchmark, count(*) FROM gated GROUP BY 1").rows())
    assert got == {"scienceworld": expected, "alfworld": expected}
    assert sorted(db.query("SELECT benchmark, candidates, passed FROM gate_runs").rows()) == [
        ("alfworld", N, expected), ("scienceworld", N, expected)]
    assert sorted(db.query("SELECT benchmark, new_unique_successes FROM iterations").rows()) == [
        ("alfworld", expected), ("scienceworld", expected)]
