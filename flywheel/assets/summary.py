"""The flywheel dashboard in the Dagster UI: `flywheel_summary(b)`, one per benchmark.

Downstream of every `evaluation(b, k)`; its metadata holds the per-iteration table
(`MetadataValue.table`: success per split in percent with 95% Wilson intervals and successes/n, the gate's
candidates, admissions and verdict, gated total, train loss and steps), the chart (a PNG written beside the store,
embedded in a markdown entry and linked by path) and a few key floats for Dagster's own plots.
The numbers come from the store (`flywheel.reports.dashboard`), opened read-only, so it can be re-materialized at any
time; a store with no evaluation of the benchmark fails, naming the store, instead of showing an empty success.
"""

import base64
from pathlib import Path

import dagster as dg

from flywheel.assets._common import metadata_table, rounded
from flywheel.assets.evaluation import evaluation
from flywheel.orchestration.failures import fail_once, fails_once
from flywheel.orchestration.partitions import benchmark_partitions, by_benchmark
from flywheel.reports.dashboard import columns, key_metrics, render_chart, summary_rows, table_rows
from flywheel.resources import StoreResource


@dg.asset(
    partitions_def=benchmark_partitions,
    group_name="dashboard",
    deps=[dg.AssetDep(evaluation, partition_mapping=by_benchmark)],
    kinds={"duckdb", "matplotlib"},
    description="The flywheel dashboard of one benchmark: one row per iteration k with success on each evaluation "
    "split in percent (95% Wilson interval, successes/n), the reward gate's candidates, admissions and verdict, the "
    "gated total, the train loss and steps, as a table and a chart. Reads the store only; fails, naming the store, "
    "when it holds no evaluation. Materialize it (summary_job) after evaluations to refresh it.",
)
@fails_once
def flywheel_summary(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
    benchmark = context.partition_key
    db = _reader(context, store, benchmark)
    if benchmark not in db.evaluated_benchmarks():
        fail_once(context, f"flywheel_summary {benchmark}: the store {db.path} holds no evaluation of {benchmark}: "
                  f"materialize evaluation for {benchmark} first (iteration_job), or point the store resource at the "
                  "store that has them (after `make demo`: runs/demo/flywheel.duckdb)",
                  metadata={"store": dg.MetadataValue.path(str(db.path))})
    rows, splits = summary_rows(db, benchmark)
    chart = render_chart(rows, splits, Path(db.path).parent / "dashboard" / f"{benchmark}_summary.png",
                         title=benchmark)
    png = base64.b64encode(chart.read_bytes()).decode("ascii")
    metadata: dict[str, object] = {
        "summary": metadata_table(table_rows(rows, splits), columns(splits)),
        "chart": dg.MetadataValue.md(f"![{benchmark}: success by iteration](data:image/png;base64,{png})"),
        "chart_path": dg.MetadataValue.path(str(chart)),
        "store": dg.MetadataValue.path(str(db.path)),
        "iterations": len(rows),
        "splits": ", ".join(splits),
        **key_metrics(rows, splits),
    }
    if warning := empty_gates_warning(rows):
        metadata["warning"] = warning
    return dg.MaterializeResult(metadata=rounded(metadata))


def empty_gates_warning(rows: list[dict]) -> str:
    """What the empty gates meant: the checkpoint after each trained on the earlier data only, or the loop stopped."""
    trained = {r["k"] for r in rows if r["checkpoint_id"]}
    empty = [r["k"] for r in rows if (r["gate_verdict"] or "").startswith("empty")]
    parts = [f"checkpoint k={k + 1} trained on the earlier data only" if k + 1 in trained
             else f"no checkpoint k={k + 1} (the loop stops at an empty gate unless loop.continue_on_empty_gate)"
             for k in empty]
    return f"empty reward gate at k = {', '.join(map(str, empty))}: {'; '.join(parts)}" if empty else ""


def _reader(context: dg.AssetExecutionContext, store: StoreResource, benchmark: str):
    """The store, read-only; a missing file fails naming it (nothing is created)."""
    try:
        return store.reader()
    except FileNotFoundError:
        fail_once(context, f"flywheel_summary {benchmark}: no store at {store.path}: run the flywheel (make demo, or "
                  "bootstrap_job and iteration_job) first, or point the store resource's path at the store that has "
                  "its evaluations")
