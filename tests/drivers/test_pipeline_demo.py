"""The demo driver separates 'the gate blocked' (a result) from a crash."""

import pytest

from flywheel.drivers.pipeline import GateBlocked, StageFailed, run_flywheel
from flywheel.policy.models import build_tiny_model
from flywheel.resources import EnvResource, StoreResource, TransformersPolicy


def test_empty_gate_is_reported_as_gate_blocked(tmp_path):
    import dagster as dg

    from flywheel.assets.curriculum import CurriculumResource

    tiny = str(build_tiny_model(tmp_path / "tiny", vocab_size=400))
    resources = {
        "store": StoreResource(path=str(tmp_path / "fw.duckdb")),
        "envs": EnvResource(train_limit=1, eval_limit=1, max_steps=2),
        "policy": TransformersPolicy(base_model_path=tiny, checkpoints_dir=str(tmp_path / "ck"), max_train_steps=1,
                                     max_new_tokens=8, samples_per_task=1, batch_size=2),
        "curriculum": CurriculumResource(synthesize=False),
    }
    with pytest.raises(GateBlocked, match="gated_dataset_is_usable"):
        run_flywheel("webshop", resources=resources, iterations=1, instance=dg.DagsterInstance.ephemeral())
    assert issubclass(GateBlocked, StageFailed)
