"""Where training logs go (flywheel/policy/logging_targets.py): TensorBoard into each checkpoint's folder by
default, W&B and MLflow through TRL's report_to, declared once and exposed on the policy resource."""

import pytest

from flywheel.policy import logging_targets
from flywheel.policy.logging_targets import HELP, LOGS_DIR, ScalarLog, log_callbacks, report_to, targets
from flywheel.resources import TransformersPolicy
from flywheel.resources.fields import help_of


def test_the_setting_names_targets_and_trl_gets_those_it_drives(monkeypatch):
    assert targets("tensorboard") == ["tensorboard"] and report_to("tensorboard") == []  # ours: into the checkpoint
    assert targets("none") == [] and targets("") == [] and report_to("none") == []
    monkeypatch.setitem(logging_targets.TARGETS, "wandb", ("json",))  # "installed"
    assert report_to("tensorboard, wandb") == ["wandb"] and targets("wandb,wandb") == ["wandb"]
    with pytest.raises(ValueError, match=r"unknown target\(s\) \['comet'\].*or none"):
        targets("comet")
    monkeypatch.setitem(logging_targets.TARGETS, "mlflow", ("no_such_package_for_flywheel",))
    with pytest.raises(ValueError, match="mlflow, which is not installed: `pip install no_such_package_for_flywheel`"):
        report_to("mlflow")


def test_tensorboard_writes_into_the_checkpoint_folder(tmp_path):
    model_dir = tmp_path / "ck" / "model"
    [callback] = log_callbacks("tensorboard", model_dir)
    assert callback.tb_writer is not None
    callback.tb_writer.add_scalar("train/loss", 1.5, 1)
    callback.tb_writer.close()
    log = ScalarLog("tensorboard", tmp_path / "grpo" / "model")  # a trainer with its own loop (GRPO)
    log.log(1, loss=2.0)
    log.close()
    for folder in (model_dir, tmp_path / "grpo" / "model"):
        [events] = (folder / LOGS_DIR).glob("events.out.tfevents.*")
        assert events.stat().st_size > 0
    assert log_callbacks("none", tmp_path / "other") == [] and not (tmp_path / "other").exists()
    ScalarLog("none", tmp_path / "other").log(1, loss=1.0)  # logs nowhere, creates nothing
    assert not (tmp_path / "other").exists()


def test_the_policy_resource_declares_it_once_with_its_help():
    assert TransformersPolicy().report_to == "tensorboard"
    assert help_of(TransformersPolicy, "report_to") == HELP
