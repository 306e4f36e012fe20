from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.config.validation import ConfigurationError
from flywheel.rollout.ray_pool import RayOptions

BACKENDS = ("local", "ray")


class RayConfig(dg.Config):
    """The Ray cluster and what each piece of work asks of it: the one place to set it.

    Used when `policy.rollout_backend` or `policy.sft_backend` is "ray". `address` empty starts
    a one-machine cluster for the step (and stops it after); "auto" joins the cluster of this
    machine; "ray://HOST:10001" connects as a Ray client (e.g. a KubeRay head service).
    """

    address: str = ""
    num_cpus: int | None = None  # local cluster only; None = every core
    object_store_memory_mb: int = 200  # local cluster only
    namespace: str = "flywheel"
    runtime_env: dict[str, Any] = {}  # e.g. {"env_vars": {...}}; the image should already hold the project
    env_actor_cpus: float = 1.0  # CPUs per env actor (each runs envs_per_actor envs)
    env_actor_memory_mb: int | None = None  # memory per env actor, e.g. 600 x envs_per_actor for ScienceWorld
    envs_per_actor: int = 4
    max_actor_replacements: int = 4  # new actors a rollout call may start after actors die
    call_timeout_s: float = 600.0  # an env call unanswered this long: its actor is taken as lost
    sft_workers: int = 1  # Ray Train workers for sft_checkpoint
    sft_cpus_per_worker: float = 1.0
    sft_gpus_per_worker: float = 0.0
    generation_actor: bool = False  # TransformersPolicy: the model in a Ray actor, not the driver
    generation_cpus: float = 1.0
    generation_gpus: float = 0.0  # e.g. 1 with policy.device: cuda
    storage_path: str = ""  # Ray Train storage (shared folder, NFS mount, s3://...); empty = <checkpoints_dir>/ray

    def options(self, *, checkpoints_dir: str | None = None) -> RayOptions:
        """The plain options; `storage_path` defaults to `<checkpoints_dir>/ray` (absolute)."""
        if self.envs_per_actor < 1 or self.sft_workers < 1:
            raise ConfigurationError("ray.envs_per_actor and ray.sft_workers must be >= 1")
        if self.env_actor_cpus < 0 or self.sft_cpus_per_worker < 0 or self.sft_gpus_per_worker < 0:
            raise ConfigurationError("ray: CPUs and GPUs per actor or worker must be >= 0")
        if self.call_timeout_s <= 0:
            raise ConfigurationError(f"ray.call_timeout_s must be > 0, got {self.call_timeout_s}")
        default_storage = str(Path(checkpoints_dir).resolve() / "ray") if checkpoints_dir else None
        return RayOptions(
            address=self.address or None, num_cpus=self.num_cpus, object_store_memory_mb=self.object_store_memory_mb,
            namespace=self.namespace, runtime_env=dict(self.runtime_env) or None,
            env_actor_cpus=self.env_actor_cpus, env_actor_memory_mb=self.env_actor_memory_mb,
            envs_per_actor=self.envs_per_actor, max_actor_replacements=self.max_actor_replacements,
            call_timeout_s=self.call_timeout_s, generation_actor=self.generation_actor,
            generation_cpus=self.generation_cpus, generation_gpus=self.generation_gpus,
            sft_workers=self.sft_workers, sft_cpus_per_worker=self.sft_cpus_per_worker,
            sft_gpus_per_worker=self.sft_gpus_per_worker, storage_path=self.storage_path or default_storage,
        )


def check_backend(value: str, where: str) -> str:
    if value not in BACKENDS:
        raise ConfigurationError(f"{where} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value
