"""The dashboard asset (`flywheel_summary`): read-only, one row per iteration in percent with successes/n, the
Wilson interval, the gate and the training; over a store without evaluations it fails naming the store."""

import dagster as dg

from flywheel.assets.summary import flywheel_summary
from flywheel.core.store import Store
from flywheel.resources import StoreResource

BENCH = "webshop"


def _materialize(path):
    return dg.materialize([flywheel_summary], partition_key=BENCH, raise_on_error=False,
                          resources={"store": StoreResource(path=str(path))})


def _failure(result) -> str:
    [event] = [e for e in result.all_events if e.is_step_failure]
    return event.event_specific_data.error.message


def test_a_store_without_evaluations_fails_naming_the_store_and_writes_nothing(tmp_path):
    path = tmp_path / "runs" / "flywheel.duckdb"
    result = _materialize(path)  # no store at all: not created
    assert not result.success and str(path) in _failure(result) and not path.exists()
    Store(path)  # what `make ui` over a new runs folder leaves
    before = path.read_bytes()
    result = _materialize(path)
    assert not result.success
    message = _failure(result)
    assert str(path) in message and "holds no evaluation of webshop" in message and "make demo" in message
    assert path.read_bytes() == before


def test_one_row_per_iteration_in_percent_with_the_gate_and_the_training(tmp_path):
    path = tmp_path / "runs" / "flywheel.duckdb"
    db = Store(path)
    for k, (seen, unseen) in enumerate([(0.25, 0.0), (0.5, 0.1)]):
        db.record_checkpoint({"checkpoint_id": f"w-k{k}", "benchmark": BENCH, "iteration": k, "path": "/nowhere",
                              "n_examples": 8, "train_loss": 1.5 - k, "lineage": {"train_steps": 6 + k}})
        db.write_evaluation({"benchmark": BENCH, "iteration": k, "split": "seen", "checkpoint_id": f"w-k{k}",
                             "episodes": 4, "success_rate": seen, "avg_reward": seen})
        db.write_evaluation({"benchmark": BENCH, "iteration": k, "split": "unseen", "checkpoint_id": f"w-k{k}",
                             "episodes": 10, "success_rate": unseen, "avg_reward": unseen})
    db.write_gated(BENCH, 0, [], candidates=8)  # the gate admitted nothing
    db.record_gate_stats(BENCH, 0, candidates=8, new_unique_successes=0, gated_total=0, capped_dropped=0)
    db.record_gate_check(BENCH, 0, passed=False, trajectories=0, problems=["dataset is empty"])
    result = _materialize(path)
    assert result.success
    [mat] = result.asset_materializations_for_node("flywheel_summary")
    meta = mat.metadata
    table = meta["summary"].value
    rows = [r.data for r in table.records]
    assert [r["k"] for r in rows] == [0, 1]
    assert rows[1]["seen_success_pct"] == 50.0 and rows[1]["seen_successes_n"] == "2/4"
    assert rows[1]["seen_ci95_pct"] == "[15.0, 85.0]" and rows[1]["unseen_successes_n"] == "1/10"
    assert rows[0]["gate_candidates"] == 8 and rows[0]["new_unique_successes"] == 0
    assert rows[0]["gate_verdict"].startswith("empty: admitted 0 of 8")
    assert rows[0]["train_loss"] == 1.5 and rows[1]["train_steps"] == 7
    assert meta["latest_seen_success_pct"].value == 50.0 and meta["best_unseen_success_pct"].value == 10.0
    assert meta["warning"].value == "empty reward gate at k = 0: checkpoint k=1 trained on the earlier data only"
