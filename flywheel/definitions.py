"""The one Dagster `Definitions` of the project."""

from __future__ import annotations

import dagster as dg

from flywheel.assets import bootstrap, curriculum, evaluation, refinement, training
from flywheel.partitions import benchmark_partitions, flywheel_partitions
from flywheel.resources import EnvResource, ScriptedTeacherResource, StoreResource, TransformersPolicy

stage_assets = dg.load_assets_from_modules([bootstrap, curriculum, training, refinement, evaluation])
stage_checks = dg.load_asset_checks_from_modules([refinement])

bootstrap_job = dg.define_asset_job(
    "bootstrap_job",
    selection=dg.AssetSelection.groups("bootstrap", "curriculum"),
    partitions_def=benchmark_partitions,
    description="Stage 1 and 2 for one benchmark: expert replay, teacher quaternions, curriculum.",
)
iteration_job = dg.define_asset_job(
    "iteration_job",
    selection=dg.AssetSelection.groups("flywheel"),
    partitions_def=flywheel_partitions,
    description="One flywheel iteration (benchmark, k): SFT, rollouts, reward gate, evaluation.",
)

defs = dg.Definitions(
    assets=stage_assets,
    asset_checks=stage_checks,
    jobs=[bootstrap_job, iteration_job],
    resources={
        "store": StoreResource(),
        "teacher": ScriptedTeacherResource(),
        "policy": TransformersPolicy(),
        "envs": EnvResource(),
    },
)
