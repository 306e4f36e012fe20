"""The one Dagster `Definitions` of the project."""

from __future__ import annotations

import dagster as dg

from flywheel.assets import bootstrap, curriculum, evaluation, refinement, training
from flywheel.resources import EnvResource, ScriptedTeacherResource, StoreResource, TransformersPolicy

stage_assets = dg.load_assets_from_modules([bootstrap, curriculum, training, refinement, evaluation])
stage_checks = dg.load_asset_checks_from_modules([refinement])

bootstrap_job = dg.define_asset_job(
    "bootstrap_job",
    selection=dg.AssetSelection.groups("bootstrap", "curriculum"),
    description="Stage 1 and 2 for one benchmark: expert replay, teacher quaternions, curriculum.",
)
iteration_job = dg.define_asset_job(
    "iteration_job",
    selection=dg.AssetSelection.groups("flywheel"),
    description="One flywheel iteration (benchmark, k): SFT, rollouts, reward gate, evaluation.",
)

DEFAULT_RESOURCES = {
    "store": StoreResource(),
    "teacher": ScriptedTeacherResource(),
    "policy": TransformersPolicy(),
    "envs": EnvResource(),
}


def build_defs(resources: dict[str, dg.ConfigurableResource] | None = None) -> dg.Definitions:
    """The project's definitions; `resources` overrides the defaults (demo, tests)."""
    return dg.Definitions(
        assets=stage_assets,
        asset_checks=stage_checks,
        jobs=[bootstrap_job, iteration_job],
        resources={**DEFAULT_RESOURCES, **(resources or {})},
    )


defs = build_defs()
