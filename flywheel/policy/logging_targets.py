"""Where the trainers' logs (loss, learning rate, grad norm, each step) go: TensorBoard by default, W&B or MLflow
opt-in, through the names TRL's `report_to` takes.

The option is declared once, here (`TrainingLogs.report_to`); the policy resource exposes it as `policy.report_to`
and the trainers' configs take it with `report_to_option()`. TensorBoard's event files are written into the
checkpoint's own folder (`<checkpoint>/logs/`, published with the weights; the weights' hash reads only weight
files), so every checkpoint carries its loss curve: `make tensorboard` shows those of a runs folder. `wandb` and
`mlflow` are TRL's own integrations: install and configure them as their docs say (`WANDB_PROJECT`,
`MLFLOW_TRACKING_URI`, ...).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.core.options import option

LOGS_DIR = "logs"  # under each checkpoint's folder
# Each target -> the packages that can serve it (any one).
TARGETS = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}
HELP = ('where the trainers log loss, learning rate and grad norm each step: "tensorboard" (event files in each '
        'checkpoint\'s folder, logs/: make tensorboard), "wandb", "mlflow" (opt-in: installed and configured by you, '
        'as for TRL), several comma-separated, or "none"')


def report_to_option() -> Any:
    """The `report_to` field of a trainer's config (TrainConfig, DPOSettings, GRPOSettings): this declaration."""
    return option("tensorboard", help=HELP, sft0=False, play=False)


@dataclass(frozen=True)
class TrainingLogs:
    """The declaration the policy resource mirrors (`same_as(TrainingLogs, "report_to")`)."""

    report_to: str = report_to_option()


def targets(setting: str) -> list[str]:
    """The targets `setting` names ("tensorboard", "wandb,mlflow", "none" -> []); an unknown one or one whose package
    is not installed is a ValueError that names the fix."""
    names = [n.strip().lower() for n in str(setting).split(",") if n.strip()]
    if names in ([], ["none"]):
        return []
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise ValueError(f"policy.report_to: unknown target(s) {unknown}: use tensorboard, wandb, mlflow (comma-separated) "
                         "or none")
    missing = [n for n in names if not any(importlib.util.find_spec(p) for p in TARGETS[n])]
    if missing:
        raise ValueError(f"policy.report_to names {', '.join(missing)}, which is not installed: `pip install "
                         f"{' '.join(TARGETS[n][0] for n in missing)}` into the virtualenv, or set policy.report_to: "
                         "none")
    return list(dict.fromkeys(names))


def report_to(setting: str) -> list[str]:
    """TRL's `report_to` (SFTConfig, DPOConfig) for `setting`: the integrations TRL drives itself (wandb, mlflow).
    TensorBoard is left out here: its default folder is the trainer's scratch folder, deleted at publish, so
    `log_callbacks` writes it into the checkpoint instead."""
    return [n for n in targets(setting) if n != "tensorboard"]


def _summary_writer(folder: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
    except ImportError:
        from tensorboardX import SummaryWriter
    folder.mkdir(parents=True, exist_ok=True)
    return SummaryWriter(log_dir=str(folder))


def log_callbacks(setting: str, model_dir: str | Path) -> list[Any]:
    """The trainer callbacks for `setting`: TensorBoard's, writing into `model_dir`/logs (the folder that is
    published as the checkpoint); [] when TensorBoard is not a target."""
    if "tensorboard" not in targets(setting):
        return []
    from transformers.integrations import TensorBoardCallback

    return [TensorBoardCallback(tb_writer=_summary_writer(Path(model_dir) / LOGS_DIR))]


class ScalarLog:
    """For a trainer with its own loop (GRPO): `log(step, loss=..., ...)` each step, `close()` at the end. Writes
    TensorBoard scalars into `model_dir`/logs when TensorBoard is a target; otherwise does nothing."""

    def __init__(self, setting: str, model_dir: str | Path) -> None:
        self.writer = _summary_writer(Path(model_dir) / LOGS_DIR) if "tensorboard" in targets(setting) else None

    def log(self, step: int, **scalars: float) -> None:
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(f"train/{name}", float(value), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
