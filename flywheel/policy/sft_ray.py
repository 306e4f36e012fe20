"""SFT as a Ray Train job: `TorchTrainer` around the same TRL code (`train_sft`).

Every worker runs `train_sft` on the same examples (with several workers, Ray Train sets up
the torch process group and the HF Trainer inside `train_sft` runs data-parallel DDP); rank 0
reports the finished model as a Ray Train checkpoint. Ray persists it to `storage_path`,
which every worker and the driver must reach: a local folder on one machine, an NFS/EFS mount
or an object-store URI (`s3://bucket/prefix`, `gs://...`) on a cluster. The driver (the
Dagster step) then copies it to `out_dir` and publishes it atomically, exactly like the
local `train_sft`, so the rest of the flywheel never knows where training ran.

The base model path must be readable on the workers too (baked into the image, or on the
shared mount). No dagster here.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel.policy.ray_session import RayOptions, ray_session
from flywheel.policy.sft import TrainConfig, TrainResult, train_sft

log = logging.getLogger(__name__)


def _train_loop(config: dict[str, Any]) -> None:
    """Runs on each Ray Train worker."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    with tempfile.TemporaryDirectory(prefix="flywheel-sft-") as tmp:
        # The worker trains in a folder that dies with it: nothing to resume from, so no saves.
        cfg = dataclasses.replace(config["cfg"], save_minutes=0)
        result = train_sft(config["base_model"], config["examples"], Path(tmp) / "model", cfg,
                           progress=lambda line: log.info("rank %s: %s", rank, line))
        metrics = {"train_loss": result.train_loss, "steps": result.steps, "n_examples": result.n_examples,
                   "n_dropped": result.n_dropped, "dropped": list(result.dropped), "world_size": result.world_size,
                   "tokens_per_pass": result.tokens_per_pass, "answer_tokens": list(result.answer_tokens),
                   "computed_tokens_per_pass": result.computed_tokens_per_pass, "compute_dtype": result.compute_dtype}
        checkpoint = ray.train.Checkpoint.from_directory(result.path) if rank == 0 else None
        ray.train.report(metrics, checkpoint=checkpoint)


def train_sft_on_ray(
    base_model: str | Path,
    examples: list[dict],
    out_dir: str | Path,
    cfg: TrainConfig,
    opts: RayOptions,
    *,
    progress: Callable[[str], None] = log.info,
) -> TrainResult:
    """`train_sft` as a Ray Train job; the checkpoint lands in `out_dir` (published atomically)."""
    if not examples:
        raise ValueError("no training examples: the dataset is empty")
    if not opts.storage_path:
        raise ValueError("SFT on Ray needs a storage path every worker reaches (ray.storage_path)")
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = opts.storage_path
    if "://" not in storage:
        storage = str(Path(storage).resolve())
        Path(storage).mkdir(parents=True, exist_ok=True)
    name = f"sft-{Path(out_dir).name}-{uuid.uuid4().hex[:6]}"
    resources: dict[str, float] = {"CPU": opts.sft_cpus_per_worker}
    if opts.sft_gpus_per_worker:
        resources["GPU"] = opts.sft_gpus_per_worker
    with ray_session(opts):
        trainer = TorchTrainer(
            _train_loop,
            train_loop_config={"base_model": str(base_model), "examples": examples, "cfg": cfg},
            scaling_config=ScalingConfig(num_workers=opts.sft_workers, use_gpu=opts.sft_gpus_per_worker > 0,
                                         resources_per_worker=resources),
            run_config=RunConfig(name=name, storage_path=storage),
        )
        progress(f"sft on Ray: {opts.sft_workers} worker(s) x {resources}, run {name} under {storage}")
        started = time.monotonic()
        result = trainer.fit()
        if result.error is not None:
            raise result.error
        if result.checkpoint is None:
            raise RuntimeError(f"Ray Train run {name} finished without a checkpoint")
        out = Path(out_dir)
        work = out.with_name(out.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        result.checkpoint.to_directory(str(work))
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    metrics = result.metrics or {}
    progress(f"sft on Ray: done in {time.monotonic() - started:.1f} s on {metrics.get('world_size')} data-parallel "
             f"worker(s), loss {metrics.get('train_loss')}, "
             f"checkpoint copied from {result.checkpoint.path} to {out}")
    return TrainResult(path=str(out), n_examples=int(metrics["n_examples"]), n_dropped=int(metrics["n_dropped"]),
                       train_loss=float(metrics["train_loss"]), steps=int(metrics["steps"]),
                       dropped=tuple(metrics.get("dropped", ())), world_size=int(metrics.get("world_size", 1)),
                       tokens_per_pass=int(metrics.get("tokens_per_pass", 0)),
                       computed_tokens_per_pass=int(metrics.get("computed_tokens_per_pass", 0)),
                       answer_tokens=tuple(int(n) for n in metrics.get("answer_tokens", ())),
                       compute_dtype=str(metrics.get("compute_dtype", "")))
