"""The one Dagster `Definitions` of the project."""

from __future__ import annotations

import dagster as dg

from flywheel.assets import baselines, bootstrap, checks, curriculum, evaluation, refinement, training
from flywheel.assets.baselines import MethodResource
from flywheel.assets.curriculum import CurriculumResource
from flywheel.assets.summary import flywheel_summary
from flywheel.partitions import flywheel_partitions
from flywheel.resources import (
    EnvResource,
    LoopResource,
    ScriptedTeacherResource,
    StoreResource,
    TransformersPolicy,
)
from flywheel.sensors import flywheel_schedule, flywheel_sensor, iteration_run_tags

stage_assets = dg.load_assets_from_modules([bootstrap, curriculum, training, refinement, evaluation, baselines])
stage_checks = dg.load_asset_checks_from_modules([refinement, checks])
summary_assets = [flywheel_summary]

summary_job = dg.define_asset_job(
    "summary_job",
    selection=dg.AssetSelection.assets(flywheel_summary),
    description="The flywheel dashboard of one benchmark (flywheel_summary): run it after evaluations to refresh "
    "the table and chart of success by iteration.",
)

bootstrap_job = dg.define_asset_job(
    "bootstrap_job",
    selection=dg.AssetSelection.groups("bootstrap", "curriculum"),
    description="Stage 1 and 2 for one benchmark: expert replay, teacher quaternions, curriculum.",
)
iteration_job = dg.define_asset_job(
    "iteration_job",
    selection=dg.AssetSelection.groups("flywheel"),
    # Every run of (b, k) is tagged flywheel/benchmark=b and dagster/priority=-k: with the
    # per-benchmark run limit in dagster.yaml, a backfill over one benchmark's iterations runs
    # them one at a time, lowest k first, whatever order the backfill submitted them in.
    config=dg.PartitionedConfig(
        partitions_def=flywheel_partitions,
        run_config_for_partition_key_fn=lambda _key: {},
        tags_for_partition_key_fn=iteration_run_tags,
    ),
    description="One flywheel iteration (benchmark, k): SFT, rollouts, reward gate, evaluation. "
    "Backfill it over a benchmark's iterations to run them in order.",
)

baselines_job = dg.define_asset_job(
    "baselines_job",
    selection=dg.AssetSelection.groups("baselines"),
    description="The baselines' own steps for (benchmark, k): base_checkpoint (zero-shot), preference_pairs + "
    "dpo_checkpoint (ETO DPO), grpo_checkpoint (multi-turn GRPO). Evaluate with iteration_job's evaluation.",
)

DEFAULT_RESOURCES = {
    "store": StoreResource(),
    "teacher": ScriptedTeacherResource(),
    "policy": TransformersPolicy(),
    "envs": EnvResource(),
    "loop": LoopResource(),
    "curriculum": CurriculumResource(),
    "method": MethodResource(),
}


def build_defs(resources: dict[str, dg.ConfigurableResource] | None = None) -> dg.Definitions:
    """The project's definitions; `resources` overrides the defaults (demo, tests)."""
    return dg.Definitions(
        assets=[*stage_assets, *summary_assets],
        asset_checks=stage_checks,
        jobs=[bootstrap_job, iteration_job, baselines_job, summary_job],
        sensors=[flywheel_sensor],
        schedules=[flywheel_schedule],
        resources={**DEFAULT_RESOURCES, **(resources or {})},
    )


defs = build_defs()
