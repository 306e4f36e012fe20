"""Partitions, defined once: benchmark x iteration k.

Stage-1/2 assets depend only on the benchmark; every flywheel asset is keyed by
(benchmark, iteration). Iterations are static partitions 0..K
(`FLYWHEEL_MAX_ITERATION`, default 3).
"""

from __future__ import annotations

import dagster as dg

from envs import REGISTRY
from flywheel.settings import max_iteration

BENCHMARK = "benchmark"
ITERATION = "iteration"

benchmark_partitions = dg.StaticPartitionsDefinition(sorted(REGISTRY))
iteration_partitions = dg.StaticPartitionsDefinition([str(k) for k in range(max_iteration() + 1)])
flywheel_partitions = dg.MultiPartitionsDefinition({BENCHMARK: benchmark_partitions, ITERATION: iteration_partitions})

# A (benchmark, k) asset reads the benchmark-only assets of its benchmark.
by_benchmark = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=BENCHMARK)


def partition_key(benchmark: str, iteration: int) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({BENCHMARK: benchmark, ITERATION: str(iteration)})


def keys_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> tuple[str, int]:
    """(benchmark, iteration) of a flywheel partition, from an asset or an asset-check context."""
    key = context.partition_key
    if not isinstance(key, dg.MultiPartitionKey):
        key = flywheel_partitions.get_partition_key_from_str(str(key))
    dims = key.keys_by_dimension
    return dims[BENCHMARK], int(dims[ITERATION])
