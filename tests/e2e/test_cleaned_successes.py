"""Cleaned successes through Dagster on the tests' tiny benchmark (real env, store, gate and SFT; the policy is the
oracle of tests/loop_support.py, here with one look too many): the gate cuts the repeated look, a replay in the env
verifies the cut, the store records steps before and after, and SFT k+1 reads the cut trajectory."""

import dagster as dg

from flywheel.assets.training import gated_trajectories
from flywheel.core.store import Store
from flywheel.orchestration.partitions import partition_key
from flywheel.reports.results import arm_results
from tests.helpers import check_results, run
from tests.loop_support import BENCH, loop_defs

BOOTSTRAP = ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"]


def test_the_gate_cuts_a_repeated_look_verified_by_replay_and_sft_reads_the_cut(tmp_path, tiny):
    # k=0 looks twice: the second look repeats the first's observation
    defs = loop_defs(tmp_path, tiny, extra_looks=1, clean_successes=True)
    instance = dg.DagsterInstance.ephemeral()
    assert run(defs, "bootstrap_job", BENCH, BOOTSTRAP, instance).success
    it0 = run(defs, "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint", "rollouts", "gated_dataset"], instance)
    assert it0.success and check_results(it0) == {"gated_dataset_is_usable": True, "checkpoint_is_promoted": True}

    db = Store(tmp_path / "fw.duckdb")
    teacher = {t.task_id: t.actions for t in db.load_trajectories(benchmark=BENCH, source="teacher")}
    rows = db.gate_cleaning(BENCH, 0)
    assert len(rows) == 2 * len(teacher)  # 2 samples of each training task, all successes
    for r in rows:
        n = len(teacher[r["task_id"]])
        assert (r["outcome"], r["steps_before"], r["steps_after"]) == ("cut", n + 2, n + 1)
        assert r["kept"] == [0, *range(2, n + 2)]  # the second look is gone
    assert sum(r["admitted"] for r in rows) == len(teacher)  # the second sample repeats the first once cut

    ids = db.traj_ids_gated_at(BENCH, 0)
    played = db.load_trajectories(ids)
    assert all(t.actions[:2] == ("look around", "look around") for t in played)  # the store keeps what was played
    for t in gated_trajectories(db, ids, drop_invalid_steps=True):
        assert t.actions == ("look around", *teacher[t.task_id])  # what the check judged and SFT k+1 reads
        assert t.steps[1].observation == t.steps[0].next_observation

    meta = next(e.materialization.metadata for e in it0.get_asset_materialization_events()
                if e.materialization.asset_key == dg.AssetKey("gated_dataset"))
    steps = sum(len(v) for v in teacher.values())
    assert meta["steps_before_cleaning"].value == steps + 2 * len(teacher)
    assert meta["steps_after_cleaning"].value == steps + len(teacher)
    assert meta["cuts_verified"].value == 2 * len(teacher) and meta["cuts_rejected_by_replay"].value == 0
    assert meta["yield_per_100_episodes"].value == 100 * len(teacher) / len(rows)

    # The report's per-iteration row (flywheel.reports): the gate's yield and the admitted steps before and after.
    [row] = arm_results(db, BENCH, 0, {}, ("seen", "unseen"))["per_k"]
    assert row["gate"]["cleaning"] == {"steps_before": steps + 2 * len(teacher), "steps_after": steps + len(teacher),
                                       "cut": len(teacher)}
    assert row["gate"]["yield_per_100_episodes"] == 50.0
