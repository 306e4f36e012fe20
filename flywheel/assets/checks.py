"""Policy-quality check on `evaluation`: is checkpoint k better than k-1 on the seen split?

Non-blocking, WARN severity: it never stops the loop (the loop's own stop rules do), it
flags a regression in the UI. The statistics are in `flywheel.quality`.
"""


import dagster as dg

from flywheel.assets.evaluation import evaluation
from flywheel.partitions import flywheel_partitions, keys_of
from flywheel.quality import compare_iterations
from flywheel.resources import StoreResource


@dg.asset_check(
    asset=evaluation,
    partitions_def=flywheel_partitions,
    blocking=False,
    description="Seen-split success of policy k vs k-1: delta with a 95% confidence interval "
    "(paired bootstrap over the same tasks, Newcombe's interval as well); warns when k is significantly worse.",
)
def seen_success_vs_previous(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    benchmark, k = keys_of(context)
    result = compare_iterations(store.get(), benchmark, k, split="seen")
    metadata = {key: (float(v) if isinstance(v, float) else v) for key, v in result.metadata.items()}
    metadata["verdict"] = result.verdict
    return dg.AssetCheckResult(passed=result.passed, severity=dg.AssetCheckSeverity.WARN, metadata=metadata)
