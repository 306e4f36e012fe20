"""The same Dagster assets with `rollout_backend: ray` and `sft_backend: ray` (real WebShop, tiny model).

Each step starts a one-machine Ray cluster from the policy resource's config (no address), as
a laptop run would: `sft_checkpoint` runs as a Ray Train job whose checkpoint goes through the
storage path, `rollouts` and `evaluation` play in Ray env actors, and the driver writes every
episode to DuckDB once.
"""

import logging

import dagster as dg
import pytest

from flywheel.assets.curriculum import CurriculumResource
from flywheel.core.store import Store
from flywheel.definitions import build_defs
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.models import build_tiny_model
from flywheel.resources import EnvResource, StoreResource, TransformersPolicy
from flywheel.resources.ray_cluster import RayConfig

pytest.importorskip("ray.train", reason="needs the `ray` extra")
pytestmark = pytest.mark.slow  # three local Ray clusters and a Ray Train run: ~3 min on 2 busy cores


def test_iteration_on_ray_through_the_dagster_assets(tmp_path, caplog):
    tiny = str(build_tiny_model(tmp_path / "tiny", vocab_size=512))
    ray_cfg = RayConfig(num_cpus=2, env_actor_cpus=0.5, envs_per_actor=1, sft_workers=1, sft_cpus_per_worker=1)
    resources = {
        "store": StoreResource(path=str(tmp_path / "fw.duckdb")),
        "envs": EnvResource(train_limit=2, eval_limit=1, max_steps=3),
        "policy": TransformersPolicy(base_model_path=tiny, checkpoints_dir=str(tmp_path / "ck"), epochs=1,
                                     max_train_steps=1, max_new_tokens=24, samples_per_task=2, parallel_envs=2,
                                     batch_size=4, rollout_backend="ray", sft_backend="ray", ray=ray_cfg),
        "curriculum": CurriculumResource(synthesize=False),
    }
    defs = build_defs(resources)
    instance = dg.DagsterInstance.ephemeral()
    assert defs.resolve_job_def("bootstrap_job").execute_in_process(partition_key="webshop", instance=instance).success
    with caplog.at_level(logging.INFO, logger="flywheel.rollout.ray_pool"):
        it0 = defs.resolve_job_def("iteration_job").execute_in_process(
            partition_key=str(partition_key("webshop", 0)), instance=instance,
            asset_selection=[dg.AssetKey(a) for a in ["sft_checkpoint", "rollouts", "evaluation"]],
        )
    assert it0.success
    used = [r.message for r in caplog.records if r.message.startswith("rollouts on Ray:")]
    assert len(used) == 2 and all("(0 lost)" in m for m in used)  # rollouts and evaluation
    db = Store(tmp_path / "fw.duckdb")
    [ck] = db.query("SELECT path FROM checkpoints WHERE benchmark = 'webshop'").rows()
    assert (tmp_path / "ck" / "ray").is_dir() and str(tmp_path / "ck") in ck[0]  # Ray Train storage + published copy
    pairs = db.query("SELECT task_id, sample FROM trajectories WHERE source = 'policy' AND split = 'train'").rows()
    assert len(pairs) == len(set(pairs)) == 4
    ev = db.query("SELECT episodes FROM evaluations WHERE benchmark = 'webshop'").rows()
    assert ev and all(e[0] >= 1 for e in ev)
