import dagster as dg

from flywheel.core.settings import DEFAULT_RUNS_DIR
from flywheel.core.store import Store
from flywheel.resources.fields import setting


class StoreResource(dg.ConfigurableResource):
    """The DuckDB file that holds tasks, trajectories, steps, checkpoints and evaluations."""

    path: str = setting(str(DEFAULT_RUNS_DIR / "flywheel.duckdb"), help="the DuckDB file")
    method: str = setting("bpo", help="written into the method column of every trajectory and checkpoint (an "
                          "experiment sets its arm's method)")

    def get(self) -> Store:
        return Store(self.path, method=self.method)

    def reader(self) -> Store:
        """The store opened read-only (the dashboard): nothing is created or written; waits for a writer as `get`
        does (a run's connections are short-lived). A missing file is a FileNotFoundError naming it."""
        return Store(self.path, read_only=True)
