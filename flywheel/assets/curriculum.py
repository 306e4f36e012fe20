"""Stage 2 (extrapolation): the synthetic curriculum.

Placeholder in the lineage until task synthesis lands: it passes the teacher
quaternions through unchanged and says so in its metadata.
"""


import dagster as dg

from flywheel.assets.bootstrap import teacher_quaternions
from flywheel.partitions import benchmark_partitions
from flywheel.resources import StoreResource


@dg.asset(partitions_def=benchmark_partitions, group_name="curriculum", deps=[teacher_quaternions], kinds={"duckdb"})
def synthetic_curriculum(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
    """Seeds plus synthesized tasks, in training order (synthesis: not yet implemented)."""
    benchmark = context.partition_key
    seeds = store.get().trajectory_table(benchmark=benchmark, source="teacher")
    return dg.MaterializeResult(metadata={
        "seed_trajectories": seeds.height,
        "synthesized_trajectories": 0,
        "status": "pass-through: task synthesis not implemented yet",
    })
