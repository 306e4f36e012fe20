"""The Ray cluster a step runs on: `RayOptions` (where it is, what each piece of work asks of it) and
`ray_session` (connect to it, or start a one-machine one, for the length of a step).

Shared by Ray Train SFT (`flywheel.policy.sft_ray`) and rollouts on Ray actors (`flywheel.rollout.ray_pool`).
No Dagster here; `ray` is imported when a session starts, so the local backends work without the `ray` extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from envs.owned import clean_signals_for_children
from flywheel.core.options import Bound, check_bounds, option


@dataclass(frozen=True)
class RayOptions:
    """Where the cluster is and what each piece of work asks of it (the one place to set it).

    `address=None` starts a one-machine cluster in this process (`ray.init`) and stops it at the
    end; "auto" joins the cluster this machine belongs to; "ray://HOST:10001" is a Ray client
    connection (e.g. a KubeRay head service). When Ray is already initialised (a test fixture,
    a notebook) it is used as is and left running.
    """

    address: str | None = option(None, help='null: a one-machine cluster for the step; "auto": this machine\'s '
                                            'cluster; "ray://HOST:10001": a Ray client')
    num_cpus: int | None = option(None, help="CPUs of a local cluster (null: every core)",
                                  bound=Bound(1, 4_096))
    object_store_memory_mb: int = option(200, help="object store of a local cluster, MiB",
                                         bound=Bound(1, 10_000_000))
    namespace: str = option("flywheel", help="the Ray namespace")
    runtime_env: dict[str, Any] | None = option(None, hash=False, help='Ray runtime_env, e.g. {"env_vars": '
                                                '{...}}; the image should already hold the project')
    # env actors
    env_actor_cpus: float = option(1.0, help="CPUs per env actor (each runs envs_per_actor envs)",
                                   bound=Bound(0, 1_024, integer=False))
    env_actor_memory_mb: int | None = option(None, help="memory per env actor, MiB (e.g. 600 per ScienceWorld JVM x "
                                                        "envs_per_actor)", bound=Bound(1, 10_000_000))
    envs_per_actor: int = option(4, help="envs per env actor", bound=Bound(1, 1_024))
    max_actor_replacements: int = option(4, help="new actors a rollout call may start after actors die",
                                        bound=Bound(0, 1_024))
    # So an actor that hangs or can never be scheduled does not stall the run.
    call_timeout_s: float = option(600.0, help="an env call (reset/step) unanswered this long: its actor is taken "
                                               "as lost and killed", bound=Bound(0, 86_400, integer=False, open_lo=True))
    generation_actor: bool = option(False, help="transformers policy: the model generates in a Ray actor (e.g. on a "
                                                "GPU node), not the driver")
    generation_cpus: float = option(1.0, help="CPUs of the generation actor", bound=Bound(0, 1_024, integer=False))
    generation_gpus: float = option(0.0, help="GPUs of the generation actor (e.g. 1 with policy.device: cuda)",
                                    bound=Bound(0, 64, integer=False))
    # SFT on Ray Train (flywheel.policy.sft_ray)
    sft_workers: int = option(1, help="Ray Train workers for sft_checkpoint", bound=Bound(1, 1_024))
    sft_cpus_per_worker: float = option(1.0, help="CPUs per Ray Train worker", bound=Bound(0, 1_024, integer=False))
    sft_gpus_per_worker: float = option(0.0, help="GPUs per Ray Train worker", bound=Bound(0, 64, integer=False))
    storage_path: str | None = option(None, help="Ray Train's storage: a shared folder, NFS mount or s3:// URI "
                                                 "(the policy resource's default: <checkpoints_dir>/ray)")

    def __post_init__(self) -> None:
        check_bounds(self, where="policy.ray.")



def import_ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the Ray backend needs the `ray` extra: pip install -e '.[ray]' (or set rollout_backend: local)"
        ) from exc
    return ray


@contextmanager
def ray_session(opts: RayOptions) -> Iterator[Any]:
    """Connect to (or start) the cluster; shut down only what this call started."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"namespace": opts.namespace, "include_dashboard": False,
                              "log_to_driver": False, "runtime_env": opts.runtime_env}
    if opts.address is None:
        kwargs.update(num_cpus=opts.num_cpus, object_store_memory=opts.object_store_memory_mb * 2**20)
    else:
        kwargs.update(address=opts.address)
        kwargs.pop("include_dashboard")
    with clean_signals_for_children():  # the GCS, raylet and workers must be stoppable (envs.owned)
        ray.init(**kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()
