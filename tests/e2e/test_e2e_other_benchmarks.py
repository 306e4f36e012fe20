"""The same flywheel assets, unchanged, on WebShop and ALFWorld (real envs, tiny model)."""

import dagster as dg
import pytest

from flywheel.assets.curriculum import CurriculumResource
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.resources import EnvResource, StoreResource, TransformersPolicy


@pytest.mark.parametrize("benchmark", ["webshop", pytest.param("alfworld", marks=pytest.mark.slow)])
def test_whole_chain_on_benchmark(tmp_path, tiny, benchmark):
    resources = {
        "store": StoreResource(path=str(tmp_path / "fw.duckdb")),
        "envs": EnvResource(train_limit=2, eval_limit=1, max_steps=3),
        "policy": TransformersPolicy(base_model_path=tiny, checkpoints_dir=str(tmp_path / "ck"), epochs=1,
                                     max_new_tokens=24, samples_per_task=1, parallel_envs=2, batch_size=4),
        "curriculum": CurriculumResource(max_proposals=2),
    }
    defs = build_defs(resources)
    instance = dg.DagsterInstance.ephemeral()
    boot = defs.resolve_job_def("bootstrap_job").execute_in_process(partition_key=benchmark, instance=instance)
    assert boot.success
    it0 = defs.resolve_job_def("iteration_job").execute_in_process(
        partition_key=str(partition_key(benchmark, 0)), instance=instance, raise_on_error=False,
        asset_selection=[dg.AssetKey(a) for a in ["sft_checkpoint", "rollouts", "gated_dataset", "evaluation"]],
    )
    mats = {e.asset_key.to_user_string() for e in it0.get_asset_materialization_events()}
    assert mats == {"sft_checkpoint", "rollouts", "gated_dataset", "evaluation"}
    db = Store(tmp_path / "fw.duckdb")
    by_source = dict(db.query("SELECT source, count(*) FROM trajectories WHERE benchmark = ? GROUP BY 1", [benchmark]).iter_rows())
    # Rollouts: 2 train tasks x 1 sample; evaluation: 1 task per evaluated split.
    splits = EnvResource().eval_splits(benchmark)
    assert by_source["expert"] == 2 and by_source["teacher"] == 2 and by_source["policy"] == 2 + len(splits)
    plans = db.query("SELECT s.plan FROM steps s JOIN trajectories t USING (traj_id) WHERE t.source = 'teacher'")
    assert plans.height > 0 and all(plans["plan"].str.len_chars() > 0)
    ev = db.query("SELECT split, episodes FROM evaluations WHERE benchmark = ? ORDER BY 1", [benchmark])
    # WebShop has one test set (seen = unseen goals): it is evaluated once, as "unseen".
    assert ev.rows() == ([("unseen", 1)] if benchmark == "webshop" else [("seen", 1), ("unseen", 1)])
