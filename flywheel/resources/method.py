"""Which method a run belongs to (flywheel/config/methods.py) and its DPO/GRPO knobs, as a Dagster resource."""

import dagster as dg

from flywheel.config.methods import METHODS


class MethodResource(dg.ConfigurableResource):
    """The method this run belongs to (flywheel/config/methods.py) and the DPO/GRPO knobs."""

    name: str = "bpo"
    # Experiments: False skips evaluation:0 of methods that continue from a k=0 SFT another arm also trains
    # and evaluates (flywheel.config.methods.method_stages).
    evaluate_start: bool = True
    # Experiments: take the k=0 SFT of this earlier arm (same envs/policy/curriculum/teacher) instead of training
    # the same SFT again (flywheel.drivers.experiment.import_start_checkpoint).
    start_from: str = ""
    # Method sft-control: the arm whose SFT steps at each k > 0 this control trains, on seeds and curriculum
    # only (flywheel.reports.results reads them from that arm's store or committed results).
    controls: str = ""
    # DPO (eto-dpo)
    dpo_beta: float = 0.1
    dpo_learning_rate: float = 5e-6
    dpo_epochs: float = 1.0
    dpo_batch_size: int = 2
    dpo_max_steps: int = -1
    dpo_max_pairs_per_task: int = 2
    # GRPO
    grpo_group_size: int = 4  # G episodes per task
    grpo_tasks: int = 0  # training tasks per update (0 = all of envs.tasks(b, "train"))
    grpo_temperature: float = 1.0
    grpo_learning_rate: float = 1e-5
    grpo_epochs: int = 1
    grpo_clip: float = 0.2
    grpo_batch_size: int = 4
    grpo_scale_rewards: bool = True

    def check(self) -> str:
        if self.name not in METHODS:
            raise dg.Failure(f"method.name must be one of {', '.join(METHODS)}, got {self.name!r}")
        return self.name

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.check()
