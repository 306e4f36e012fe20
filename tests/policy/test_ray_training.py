"""SFT as a Ray Train job (TorchTrainer, one CPU worker) on a real local Ray cluster, tiny model.

The same TRL code runs on the worker; the checkpoint goes through Ray Train's storage path
(a local folder here, shared storage on a cluster) and lands, published atomically, where
the local backend would have put it; it loads and generates. Same data, same seed: the same
loss as the local run.
"""

import json

import pytest

from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.ray_session import RayOptions
from flywheel.policy.sft import TrainConfig, sft_examples, train_sft
from flywheel.resources import TransformersPolicy
from flywheel.resources.ray_cluster import RayConfig
from tests.fakes import make_traj

pytest.importorskip("ray.train", reason="SFT on Ray needs the `ray` extra")


@pytest.mark.slow  # a Ray cluster plus a Ray Train run: ~1.5 min on 2 busy cores
def test_sft_runs_as_a_ray_train_job_and_publishes_the_checkpoint(tmp_path, tiny):
    from flywheel.policy.sft_ray import train_sft_on_ray

    rows = sft_examples([make_traj(n=3), make_traj(task="t2", n=2)], lambda t: "instr")
    cfg = TrainConfig(max_steps=2, batch_size=2, learning_rate=1e-3, bf16=False)
    storage = tmp_path / "shared"
    opts = RayOptions(num_cpus=2, sft_workers=1, sft_cpus_per_worker=1, storage_path=str(storage))
    out = tmp_path / "ck" / "scienceworld" / "k0"
    res = train_sft_on_ray(tiny, rows, out, cfg, opts)
    # max_steps 2 rounds up to one whole pass over the 5 examples: 3 steps of 2 (TrainConfig.whole_passes)
    assert (res.path, res.n_examples, res.steps) == (str(out), 5, 3) and res.train_loss > 0
    assert json.loads((out / "training.json").read_text())["n_examples"] == 5
    assert not out.with_name("k0.partial").exists()
    assert any(p.name.startswith("checkpoint") for p in storage.rglob("*") if p.is_dir())  # via the storage path
    [gen] = TransformersGenerator(str(out)).generate([rows[0]["prompt"]], temperature=0.0, max_new_tokens=4)
    assert gen.completion_tokens <= 4
    local = train_sft(tiny, rows, tmp_path / "local", cfg)
    assert res.train_loss == pytest.approx(local.train_loss, rel=1e-3)
    assert res.world_size == local.world_size == 1
    assert res.compute_dtype == local.compute_dtype in ("bfloat16", "float32")  # carried back from the worker


@pytest.mark.slow  # two Ray Train workers: ~1-2 min on 2 busy cores
def test_two_ray_train_workers_train_data_parallel_on_cpu(tmp_path, tiny):
    """sft_workers=2: Ray Train sets up the process group (gloo on CPU) and the HF Trainer inside
    `train_sft` runs DDP over it: world size 2, each worker a different half of every global batch.
    (FSDP is not exercised: the HF Trainer does not enable it on CPU, measured: `is_fsdp_enabled`
    stays False with `fsdp="full_shard"` under torchrun on this machine.)"""
    from flywheel.policy.sft_ray import train_sft_on_ray

    rows = sft_examples([make_traj(n=4), make_traj(task="t2", n=4)], lambda t: "instr")
    cfg = TrainConfig(max_steps=2, batch_size=2, learning_rate=1e-3, bf16=False)
    opts = RayOptions(num_cpus=2, sft_workers=2, sft_cpus_per_worker=1, storage_path=str(tmp_path / "shared"))
    out = tmp_path / "ck" / "k0"
    res = train_sft_on_ray(tiny, rows, out, cfg, opts)
    assert (res.world_size, res.steps, res.n_examples) == (2, 2, 8) and res.train_loss > 0
    [gen] = TransformersGenerator(str(out)).generate([rows[0]["prompt"]], temperature=0.0, max_new_tokens=4)
    assert gen.completion_tokens <= 4


def test_policy_resource_sends_sft_to_ray_when_configured(tmp_path, tiny, monkeypatch):
    import flywheel.policy.sft_ray as training_ray

    calls = []
    monkeypatch.setattr(training_ray, "train_sft_on_ray", lambda *a, **kw: calls.append((a, kw)) or "ray-result")
    policy = TransformersPolicy(sft_backend="ray", checkpoints_dir=str(tmp_path / "ck"),
                                ray=RayConfig(sft_workers=2, sft_gpus_per_worker=1))
    assert policy.train(tiny, [{"x": 1}], tmp_path / "out", TrainConfig(), progress=print) == "ray-result"
    (_, _, _, _, opts), _ = calls[0]
    assert (opts.sft_workers, opts.sft_gpus_per_worker) == (2, 1.0)
    assert opts.storage_path == str((tmp_path / "ck").resolve() / "ray")
