import dagster as dg

from flywheel.core.settings import DEFAULT_RUNS_DIR
from flywheel.core.store import Store


class StoreResource(dg.ConfigurableResource):
    """The DuckDB file that holds tasks, trajectories, steps, checkpoints and evaluations."""

    path: str = str(DEFAULT_RUNS_DIR / "flywheel.duckdb")
    # Written into the `method` column of every trajectory and checkpoint (an experiment sets its arm's method).
    method: str = "bpo"

    def get(self) -> Store:
        return Store(self.path, method=self.method)
