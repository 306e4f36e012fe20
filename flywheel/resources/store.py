import dagster as dg

from flywheel.settings import runs_dir
from flywheel.store import Store


class StoreResource(dg.ConfigurableResource):
    """The DuckDB file that holds tasks, trajectories, steps, checkpoints and evaluations."""

    path: str = str(runs_dir() / "flywheel.duckdb")

    def get(self) -> Store:
        return Store(self.path)
