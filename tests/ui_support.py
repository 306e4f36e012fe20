"""Code location of the UI test (tests/reports/test_ui_dashboard.py): the project's definitions on a tiny WebShop
configuration, built from environment variables in the webserver's code-server process and in the test."""

from __future__ import annotations

import os
from pathlib import Path

from flywheel.assets.curriculum import CurriculumResource
from flywheel.definitions import build_defs
from flywheel.resources import EnvResource, StoreResource, TransformersPolicy

ROOT_ENV = "FLYWHEEL_UI_TEST_ROOT"
MODEL_ENV = "FLYWHEEL_UI_TEST_MODEL"


def ui_resources(root: str | Path, model: str) -> dict:
    root = Path(root)
    return {
        "store": StoreResource(path=str(root / "fw.duckdb")),
        "envs": EnvResource(train_limit=2, eval_limit=3, max_steps=3),
        "policy": TransformersPolicy(base_model_path=model, checkpoints_dir=str(root / "ck"), epochs=1,
                                     max_train_steps=2, max_new_tokens=24, samples_per_task=1, parallel_envs=3,
                                     batch_size=4),
        "curriculum": CurriculumResource(synthesize=False),
    }


defs = build_defs(ui_resources(os.environ[ROOT_ENV], os.environ[MODEL_ENV])) if os.environ.get(ROOT_ENV) else None
