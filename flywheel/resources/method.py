"""Which method a run belongs to (flywheel/orchestration/methods.py) and its DPO/GRPO knobs, as a Dagster resource."""

import dagster as dg

from flywheel.core.options import Bound
from flywheel.orchestration.methods import METHODS
from flywheel.policy.dpo import DPOSettings
from flywheel.policy.grpo import GRPOSettings
from flywheel.resources.fields import check_fields, same_as, setting

# Fields DPO and GRPO take from the policy's, so that they build prompts and drop examples as its SFT did.
FROM_POLICY = ("max_length", "max_observation_chars", "seed", "history_window", "packing")


class MethodResource(dg.ConfigurableResource):
    """The method this run belongs to and its DPO/GRPO knobs: `dpo_<name>` is `DPOSettings.<name>`,
    `grpo_<name>` is `GRPOSettings.<name>` (`dpo_settings()` / `grpo_settings()` build them)."""

    name: str = setting("bpo", help=f"the training method: {', '.join(METHODS)} (flywheel/orchestration/methods.py)")
    evaluate_start: bool = setting(True, help="experiments: false skips evaluation:0 of a method that continues "
                                   "from a k=0 SFT another arm also trains and evaluates")
    evaluate_rejected: bool = setting(True, help="experiments: false skips evaluation:k (k > 0) of a checkpoint the "
                                      "promotion gate rejected: nothing builds on it and `@promoted` never names it; "
                                      "its validation games are its record")
    start_from: str = setting("", help="experiments: take this earlier arm's k=0 SFT (the same envs, policy, "
                              "curriculum and teacher) instead of training the same SFT again")
    controls: str = setting("", help="method sft-control: the arm whose SFT steps at each k > 0 this control "
                            "trains, on seeds and curriculum only")
    # DPO (eto-dpo)
    dpo_beta: float = same_as(DPOSettings, "beta")
    dpo_learning_rate: float = same_as(DPOSettings, "learning_rate")
    dpo_epochs: float = same_as(DPOSettings, "epochs")
    dpo_batch_size: int = same_as(DPOSettings, "batch_size")
    dpo_max_steps: int = same_as(DPOSettings, "max_steps")
    dpo_max_pairs_per_task: int = setting(2, help="preference pairs per task at most (expert vs failed rollout)",
                                          bound=Bound(1, 1_000))
    # GRPO
    grpo_group_size: int = setting(4, help="G: episodes per task in one GRPO group", bound=Bound(1, 256))
    grpo_tasks: int = setting(0, help="training tasks per GRPO update (0: every training task)",
                              bound=Bound(0, 100_000))
    grpo_temperature: float = setting(1.0, help="sampling temperature of GRPO's episodes",
                                      bound=Bound(0, 5, integer=False))
    grpo_learning_rate: float = same_as(GRPOSettings, "learning_rate")
    grpo_epochs: int = same_as(GRPOSettings, "epochs")
    grpo_clip: float = same_as(GRPOSettings, "clip")
    grpo_batch_size: int = same_as(GRPOSettings, "batch_size")
    grpo_scale_rewards: bool = same_as(GRPOSettings, "scale_rewards")

    def check(self) -> str:
        if self.name not in METHODS:
            raise dg.Failure(f"method.name must be one of {', '.join(METHODS)} (flywheel/orchestration/methods.py, or "
                             f"one registered with flywheel.orchestration.methods.register), got {self.name!r}")
        return self.name

    def dpo_settings(self, policy) -> DPOSettings:
        return self._settings("dpo_", DPOSettings, policy)

    def grpo_settings(self, policy) -> GRPOSettings:
        return self._settings("grpo_", GRPOSettings, policy)

    def _settings(self, prefix: str, config: type, policy):
        """`config` from every `<prefix><name>` field of this resource, and FROM_POLICY from the policy's."""
        fields = config.__dataclass_fields__
        own = {name[len(prefix):]: getattr(self, name) for name in type(self).model_fields
               if name.startswith(prefix) and name[len(prefix):] in fields}
        # report_to (where training logs go) is the policy's, for every trainer whose config takes it.
        shared = FROM_POLICY + tuple(f for f in ("report_to",) if f in fields)
        return config(**own, **{f: getattr(policy, f) for f in shared})

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.check()
        check_fields(self, where="method.")
