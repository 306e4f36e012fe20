"""End to end through Dagster: the whole chain on real ScienceWorld, checked in DuckDB.

1. The tiny random model: every stage materializes; nothing passes the reward gate,
   so the blocking check stops that run; iteration 1 still trains on seeds only.
2. An oracle policy (a test double for the *policy*, the env stays real) that
   replays the teacher's answers with one extra 'look around': its successes are
   new action sequences, pass the gate, and iteration 1 trains on them.
"""

import dagster as dg
import pytest

from flywheel.assets.curriculum import CurriculumResource
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.resources import EnvResource, LoopResource, StoreResource, TransformersPolicy
from tests.helpers import check_results, run
from tests.loop_support import OraclePolicy  # replays the teacher's answers after one extra look

BENCH = "scienceworld"








def base_resources(tmp_path, policy):
    return {
        "store": StoreResource(path=str(tmp_path / "fw.duckdb")),
        # 8 steps: stage 2 keeps only synthesized tasks whose expert path fits the episode cap (3 kept none)
        "envs": EnvResource(task_types={BENCH: ["find-non-living-thing"]}, train_limit=2, eval_limit=1, max_steps=8,
                            validation_tasks=1),
        "policy": policy,
    }


@pytest.mark.slow  # ~50 s; the default suite runs the chain on tests/tinybench and on real WebShop
def test_whole_chain_tiny_model(tmp_path, tiny):
    policy = TransformersPolicy(base_model_path=tiny, checkpoints_dir=str(tmp_path / "ck"), epochs=1,
                                max_new_tokens=24, samples_per_task=1, parallel_envs=2, batch_size=4)
    defs = build_defs(base_resources(tmp_path, policy))
    instance = dg.DagsterInstance.ephemeral()
    boot = run(defs, "bootstrap_job", BENCH, ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"], instance)
    assert boot.success
    it0 = run(defs, "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"], instance)
    assert check_results(it0)["gated_dataset_is_usable"] is False  # empty gate blocks
    mats = {e.asset_key.to_user_string() for e in it0.get_asset_materialization_events()}
    assert mats == {"sft_checkpoint", "rollouts", "gated_dataset", "evaluation"}
    it1 = run(defs, "iteration_job", partition_key(BENCH, 1), ["sft_checkpoint", "evaluation"], instance)
    assert not it1.success  # the failed blocking check of gate 0 binds k=1 (as it stops the sensor)
    # An explicit opt-out trains k=1 anyway (on the same data).
    defs = build_defs({**base_resources(tmp_path, policy), "loop": LoopResource(continue_on_empty_gate=True)})
    it1 = run(defs, "iteration_job", partition_key(BENCH, 1), ["sft_checkpoint", "evaluation"], instance)
    assert it1.success

    db = Store(tmp_path / "fw.duckdb")
    by_source = dict(db.query("SELECT source, count(*) AS n FROM trajectories GROUP BY 1").iter_rows())
    assert by_source["expert"] == 2 and by_source["teacher"] == 2
    assert by_source.get("synthetic", 0) >= 1  # stage 2 synthesized and solved at least one task
    assert by_source["policy"] == 2 + 2 * 2  # train rollouts + seen/unseen for k=0 and k=1
    quats = db.query("SELECT s.* FROM steps s JOIN trajectories t USING (traj_id) WHERE t.source = 'teacher'")
    assert quats.height >= 6 and all(quats["thought"].str.len_chars() > quats["plan"].str.len_chars())
    pol = db.query("SELECT * FROM trajectories WHERE source = 'policy' AND split = 'train'")
    assert all(pol["prompt_tokens"] > 0) and all(pol["steps"] == 8) and not any(pol["success"])
    ck = db.query("SELECT iteration, lineage FROM checkpoints ORDER BY iteration")
    assert ck["iteration"].to_list() == [0, 1] and '"gated_iterations": [0]' in ck["lineage"][1]
    ev = db.query("SELECT iteration, split, episodes FROM evaluations ORDER BY 1, 2")
    assert ev.rows() == [(0, "seen", 1), (0, "unseen", 1), (1, "seen", 1), (1, "unseen", 1)]
    assert db.query("SELECT passed, candidates FROM gate_runs").rows() == [(0, 2)]

    # Re-running a partition replaces its rows, never duplicates them.
    again = run(defs, "iteration_job", partition_key(BENCH, 1), ["evaluation"], instance)
    assert again.success
    assert db.query("SELECT count(*) FROM trajectories WHERE iteration = 1").item() == 2


@pytest.mark.slow  # ~30 s; tests/e2e/test_tiny_benchmark.py covers k=0 -> gate -> k=1 in the default suite
def test_gated_successes_flow_into_next_iteration(tmp_path, tiny):
    res = base_resources(tmp_path, None)
    res["envs"] = EnvResource(task_types={BENCH: ["find-non-living-thing"]}, train_limit=2, eval_limit=1, validation_tasks=1)
    res["curriculum"] = CurriculumResource(synthesize=False)  # exact seed counts below
    res["policy"] = OraclePolicy(store_path=str(tmp_path / "fw.duckdb"), benchmark=BENCH, base_model_path=tiny,
                                 checkpoints_dir=str(tmp_path / "ck"), epochs=1, samples_per_task=2, batch_size=4)
    defs = build_defs(res)
    instance = dg.DagsterInstance.ephemeral()
    assert run(defs, "bootstrap_job", BENCH, ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"], instance).success
    it0 = run(defs, "iteration_job", partition_key(BENCH, 0), ["sft_checkpoint", "rollouts", "gated_dataset"], instance)
    assert it0.success and check_results(it0) == {"gated_dataset_is_usable": True}
    db = Store(tmp_path / "fw.duckdb")
    # 2 tasks x 2 samples succeed; the second sample repeats the first's actions and is dropped.
    assert db.query("SELECT passed, candidates FROM gate_runs").rows() == [(2, 4)]
    gated = db.load_trajectories(db.traj_ids_gated_up_to(BENCH, 0))
    assert all(t.success and t.actions[0] == "look around" for t in gated)
    it1 = run(defs, "iteration_job", partition_key(BENCH, 1), ["sft_checkpoint"], instance)
    assert it1.success
    meta = it1.get_asset_materialization_events()[0].materialization.metadata
    assert meta["gated_trajectories"].value == 2 and meta["seed_or_curriculum_trajectories"].value == 2
    assert "gated_dataset iterations [0]" in meta["back_edge"].value
