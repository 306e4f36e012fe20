"""Partitions: benchmark x iteration k, sized by the profile handed to `build_defs`.

Stage-1/2 assets depend only on the benchmark; every flywheel asset is keyed by
(benchmark, iteration). The asset modules declare the placeholders below (every registered
benchmark, iterations 0..DEFAULT_ITERATIONS); `build_defs` swaps them for the profile's
(`Partitions(benchmarks, max_partition)`), so nothing here reads the environment and the
partition range is configuration, not import-time state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import dagster as dg

from envs import REGISTRY
from flywheel.core.settings import DEFAULT_ITERATIONS

BENCHMARK = "benchmark"
ITERATION = "iteration"


@dataclass(frozen=True)
class Partitions:
    """The partitions of one set of definitions: these benchmarks, iterations 0..max_partition."""

    benchmarks: tuple[str, ...]
    max_partition: int = DEFAULT_ITERATIONS

    @cached_property
    def benchmark(self) -> dg.StaticPartitionsDefinition:
        return dg.StaticPartitionsDefinition(sorted(self.benchmarks))

    @cached_property
    def iteration(self) -> dg.StaticPartitionsDefinition:
        return dg.StaticPartitionsDefinition([str(k) for k in range(self.max_partition + 1)])

    @cached_property
    def flywheel(self) -> dg.MultiPartitionsDefinition:
        return dg.MultiPartitionsDefinition({BENCHMARK: self.benchmark, ITERATION: self.iteration})

    @cached_property
    def previous_iteration(self) -> dg.MultiPartitionMapping:
        """(b, k-1) upstream -> (b, k) downstream: what a baseline at k reads."""
        return dg.MultiPartitionMapping({
            BENCHMARK: dg.DimensionPartitionMapping(BENCHMARK, dg.IdentityPartitionMapping()),
            ITERATION: dg.DimensionPartitionMapping(ITERATION, dg.StaticPartitionMapping(
                {str(k): str(k + 1) for k in range(self.max_partition)})),
        })


def max_partition_for(iterations: int) -> int:
    """The highest iteration partition of a run of iterations 0..K (the demo, an experiment): K, and at
    least the default range, so its partitions are the ones the UI shows."""
    return max(iterations, DEFAULT_ITERATIONS)


# The placeholders the asset modules declare; build_defs replaces them with the profile's.
DEFAULT = Partitions(tuple(sorted(REGISTRY)), DEFAULT_ITERATIONS)
benchmark_partitions = DEFAULT.benchmark
iteration_partitions = DEFAULT.iteration
flywheel_partitions = DEFAULT.flywheel

# A (benchmark, k) asset reads the benchmark-only assets of its benchmark.
by_benchmark = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name=BENCHMARK)


def partition_key(benchmark: str, iteration: int) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({BENCHMARK: benchmark, ITERATION: str(iteration)})


def parse_key(key: str) -> tuple[str, int]:
    """(benchmark, iteration) of a flywheel partition key: a `MultiPartitionKey`, or its string
    ("<benchmark>|2", as run tags and `tags_for_partition_key_fn` carry it) read by the partitions
    definition, so the dimension order is Dagster's, not a guess. ValueError on anything else."""
    try:
        if not isinstance(key, dg.MultiPartitionKey):
            key = flywheel_partitions.get_partition_key_from_str(key)
        dims = key.keys_by_dimension
        benchmark, iteration = dims[BENCHMARK], int(dims[ITERATION])
    except Exception as exc:  # Dagster's own check error (not a public class), a k that is no integer
        raise ValueError(f"{key!r} is not a flywheel partition key ({BENCHMARK}|{ITERATION})") from exc
    if not benchmark or iteration < 0:
        raise ValueError(f"{key!r} is not a flywheel partition key: it needs a benchmark and an iteration k >= 0")
    return benchmark, iteration


def benchmark_of(key: str) -> str:
    """The benchmark of a partition key of either kind: a benchmark-only key ("<benchmark>", stages 1-2) or a
    flywheel key (read by `parse_key`)."""
    try:
        return parse_key(key)[0]
    except ValueError:
        return key


def keys_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> tuple[str, int]:
    """(benchmark, iteration) of a flywheel partition, from an asset or an asset-check context."""
    return parse_key(context.partition_key)
