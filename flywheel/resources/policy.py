import dagster as dg

from flywheel.policy.inference import Generator, OpenAICompatibleGenerator, TransformersGenerator
from flywheel.policy.training import TrainConfig
from flywheel.rollout import RolloutConfig
from flywheel.settings import default_base_model, runs_dir
from flywheel.validation import BOUNDS, check_model_path, check_options


class PolicyResource(dg.ConfigurableResource):
    """Base model, SFT knobs and rollout knobs; subclasses choose the inference backend."""

    base_model_path: str = default_base_model()
    checkpoints_dir: str = str(runs_dir() / "checkpoints")
    # SFT
    epochs: float = 2.0
    learning_rate: float = 5e-5
    batch_size: int = 8
    max_length: int = 3072
    max_train_steps: int = -1
    lora: bool = False
    lora_r: int = 16
    # rollouts
    samples_per_task: int = 2
    temperature: float = 0.7
    eval_temperature: float = 0.0
    max_new_tokens: int = 256
    parallel_envs: int = 8
    history_window: int | None = None
    max_observation_chars: int | None = None
    seed: int = 0

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Fail fast, naming the fix, when the base model is missing and this run trains."""
        check_options({k: getattr(self, k) for k in (*BOUNDS, "dtype") if hasattr(self, k)}, where="policy.")
        run = context.dagster_run
        selection = run.asset_selection if run is not None else None
        if selection is None or dg.AssetKey("sft_checkpoint") in selection:
            check_model_path(self.base_model_path)

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            epochs=self.epochs, learning_rate=self.learning_rate, batch_size=self.batch_size,
            max_length=self.max_length, max_steps=self.max_train_steps, lora=self.lora, lora_r=self.lora_r,
            lora_alpha=2 * self.lora_r, seed=self.seed, history_window=self.history_window,
            max_observation_chars=self.max_observation_chars,
        )

    def rollout_config(self, *, evaluation: bool = False, max_steps: int | None = None) -> RolloutConfig:
        return RolloutConfig(
            temperature=self.eval_temperature if evaluation else self.temperature,
            max_new_tokens=self.max_new_tokens, parallel_envs=self.parallel_envs, max_steps=max_steps,
            history_window=self.history_window, max_observation_chars=self.max_observation_chars,
            seed=self.seed,
        )

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        raise NotImplementedError


class TransformersPolicy(PolicyResource):
    """Local `transformers` generation (CPU here; any GPU elsewhere)."""

    device: str = "cpu"
    dtype: str = "float32"
    max_batch_size: int = 8
    torch_threads: int = 0  # 0 = torch default; 1 avoids thread thrash on a busy small CPU

    def generator(self, checkpoint_path: str, checkpoint_id: str) -> Generator:
        return TransformersGenerator(
            checkpoint_path, device=self.device, dtype=self.dtype, max_batch_size=self.max_batch_size,
            model_id=checkpoint_id, num_threads=self.torch_threads,
        )


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
