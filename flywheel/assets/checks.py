"""Policy-quality check on `evaluation`: is checkpoint k better than k-1 on the seen split?

Non-blocking, WARN severity: it never stops the loop (the loop's own stop rules do), it
flags a regression in the UI. The statistics are in `flywheel.core.quality`.
"""


import dagster as dg

from flywheel.assets.evaluation import evaluation
from flywheel.core.quality import compare_iterations
from flywheel.orchestration.partitions import keys_of
from flywheel.resources import StoreResource


def seen_success_check(partitions_def: dg.PartitionsDefinition) -> dg.AssetChecksDefinition:
    """The check over `partitions_def` (a check's partitions must be its asset's: build_defs passes the
    profile's)."""
    return dg.asset_check(
        asset=evaluation,
        name="seen_success_vs_previous",
        partitions_def=partitions_def,
        blocking=False,
        description="Seen-split success of policy k vs k-1: delta with a 95% confidence interval "
        "(paired bootstrap over the same tasks, Newcombe's interval as well); warns when k is significantly worse.",
    )(check_seen_success)


def check_seen_success(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    benchmark, k = keys_of(context)
    result = compare_iterations(store.get(), benchmark, k, split="seen")
    metadata = {key: (float(v) if isinstance(v, float) else v) for key, v in result.metadata.items()}
    metadata["verdict"] = result.verdict
    return dg.AssetCheckResult(passed=result.passed, severity=dg.AssetCheckSeverity.WARN, metadata=metadata)

