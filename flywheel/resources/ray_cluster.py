import dataclasses
from pathlib import Path
from typing import Any

import dagster as dg

from flywheel.core.validation import ConfigurationError
from flywheel.policy.ray_session import RayOptions
from flywheel.resources.fields import check_fields, same_as

BACKENDS = ("local", "ray")


class RayConfig(dg.Config):
    """The Ray cluster and what each piece of work asks of it: the one place to set it.

    Used when `policy.rollout_backend` or `policy.sft_backend` is "ray". `address` empty starts
    a one-machine cluster for the step (and stops it after); "auto" joins the cluster of this
    machine; "ray://HOST:10001" connects as a Ray client (e.g. a KubeRay head service).
    """

    # The Dagster config spells "none" as empty: address "" and storage_path "" are RayOptions' None.
    address: str = same_as(RayOptions, "address", default="")
    num_cpus: int | None = same_as(RayOptions, "num_cpus")
    object_store_memory_mb: int = same_as(RayOptions, "object_store_memory_mb")
    namespace: str = same_as(RayOptions, "namespace")
    runtime_env: dict[str, Any] = same_as(RayOptions, "runtime_env", default_factory=dict)
    env_actor_cpus: float = same_as(RayOptions, "env_actor_cpus")
    env_actor_memory_mb: int | None = same_as(RayOptions, "env_actor_memory_mb")
    envs_per_actor: int = same_as(RayOptions, "envs_per_actor")
    max_actor_replacements: int = same_as(RayOptions, "max_actor_replacements")
    call_timeout_s: float = same_as(RayOptions, "call_timeout_s")
    sft_workers: int = same_as(RayOptions, "sft_workers")
    sft_cpus_per_worker: float = same_as(RayOptions, "sft_cpus_per_worker")
    sft_gpus_per_worker: float = same_as(RayOptions, "sft_gpus_per_worker")
    generation_actor: bool = same_as(RayOptions, "generation_actor")
    generation_cpus: float = same_as(RayOptions, "generation_cpus")
    generation_gpus: float = same_as(RayOptions, "generation_gpus")
    storage_path: str = same_as(RayOptions, "storage_path", default="")

    def options(self, *, checkpoints_dir: str | None = None) -> RayOptions:
        """The plain options, every field copied by name; `storage_path` defaults to `<checkpoints_dir>/ray`
        (absolute)."""
        check_fields(self, where="policy.ray.")  # each number within its declared bound
        default_storage = str(Path(checkpoints_dir).resolve() / "ray") if checkpoints_dir else None
        return RayOptions(**{**{f.name: getattr(self, f.name) for f in dataclasses.fields(RayOptions)},
                             "address": self.address or None, "runtime_env": dict(self.runtime_env) or None,
                             "storage_path": self.storage_path or default_storage})


def check_backend(value: str, where: str) -> str:
    if value not in BACKENDS:
        raise ConfigurationError(f"{where} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value
