"""The one Dagster `Definitions` of the project, built from a profile (flywheel/profile.py)."""

from __future__ import annotations

import os

import dagster as dg

from flywheel.assets import baselines, bootstrap, checks, curriculum, evaluation, refinement, training
from flywheel.assets.baselines import previous_iteration
from flywheel.assets.summary import flywheel_summary
from flywheel.orchestration.partitions import Partitions, benchmark_partitions, flywheel_partitions
from flywheel.profile import PROFILE_ENV, Profile, load_profile
from flywheel.sensors import iteration_run_tags, loop_automation

stage_assets = dg.load_assets_from_modules([bootstrap, curriculum, training, refinement, evaluation, baselines])
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
baselines_job = dg.define_asset_job(
    "baselines_job",
    selection=dg.AssetSelection.groups("baselines"),
    description="The baselines' own steps for (benchmark, k): base_checkpoint (zero-shot), preference_pairs + "
    "dpo_checkpoint (ETO DPO), grpo_checkpoint (multi-turn GRPO). Evaluate with iteration_job's evaluation.",
)


def _with_partitions(asset: dg.AssetsDefinition, parts: Partitions) -> dg.AssetsDefinition:
    """`asset` over the profile's partitions instead of the placeholders its module declared."""
    swap = {benchmark_partitions: parts.benchmark, flywheel_partitions: parts.flywheel}

    def respec(spec: dg.AssetSpec) -> dg.AssetSpec:
        deps = [dg.AssetDep(d.asset_key, partition_mapping=parts.previous_iteration)
                if d.partition_mapping == previous_iteration else d for d in spec.deps]
        return spec.replace_attributes(partitions_def=swap.get(spec.partitions_def, spec.partitions_def), deps=deps)

    return asset.map_asset_specs(respec)


def build_defs(
    resources: dict[str, dg.ConfigurableResource] | None = None, *, profile: Profile | None = None,
) -> dg.Definitions:
    """The project's definitions, configured by `profile` (benchmarks, iteration range, resources);
    `resources` overrides single resources on top (tests, the demo). No profile = `Profile()`, the defaults."""
    profile = profile or Profile()
    parts = Partitions(tuple(profile.benchmarks), profile.iterations)
    iteration_job = dg.define_asset_job(
        "iteration_job",
        selection=dg.AssetSelection.groups("flywheel"),
        # Every run of (b, k) is tagged flywheel/benchmark=b and dagster/priority=-k: with the
        # per-benchmark run limit in dagster.yaml, a backfill over one benchmark's iterations runs
        # them one at a time, lowest k first, whatever order the backfill submitted them in.
        config=dg.PartitionedConfig(
            partitions_def=parts.flywheel,
            run_config_for_partition_key_fn=lambda _key: {},
            tags_for_partition_key_fn=lambda key: iteration_run_tags(key, max_partition=parts.max_partition),
        ),
        description="One flywheel iteration (benchmark, k): SFT, rollouts, reward gate, evaluation. "
        "Backfill it over a benchmark's iterations to run them in order.",
    )
    sensor, schedule = loop_automation(profile.loop_cron, parts)
    return dg.Definitions(
        assets=[_with_partitions(a, parts) for a in [*stage_assets, *summary_assets]],
        asset_checks=[refinement.gated_dataset_check(parts.flywheel), checks.seen_success_check(parts.flywheel)],
        jobs=[bootstrap_job, iteration_job, baselines_job, summary_job],
        sensors=[sensor],
        schedules=[schedule],
        resources={**profile.resources(), **(resources or {})},
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The code location `workspace.yaml` loads: the profile named by $FLYWHEEL_PROFILE (read here, once,
    when the code location starts; unset = the defaults)."""
    return build_defs(profile=load_profile(os.environ.get(PROFILE_ENV)))
