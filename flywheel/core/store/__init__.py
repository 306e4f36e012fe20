"""DuckDB store for tasks, trajectories, steps, checkpoints, evaluations and the loop's record.

Every write replaces rows by natural key inside one transaction, so re-running a
partition overwrites it and a killed run leaves either the old rows or the new.
Connections are short-lived and retried on DuckDB's single-writer file lock, so
several processes (Dagster's multiprocess executor) can share one file.

`Store` is the one class callers use; its methods come from one module per group of tables, each of which
owns its SQL: `store_trajectories` (tasks, trajectories, steps), `store_gate` (the reward gate's record),
`store_checkpoints` (checkpoints, their training pairs, preference pairs), `store_evaluations`,
`store_loop` (the loop's iterations, claims and task stats) and `store_teacher_cache`, over
`store_connection` (connections, the file lock, `check_store`) and `store_schema` (tables, views,
migrations, the schema check). The curriculum's tables are flywheel/curriculum/tables.py's.
"""

from flywheel.core.store.store_checkpoints import CheckpointTables
from flywheel.core.store.store_connection import READER_WAIT_S, SAY_WAIT_AFTER_S, StoreBusyError, check_store
from flywheel.core.store.store_evaluations import EvaluationTables
from flywheel.core.store.store_gate import GateTables
from flywheel.core.store.store_loop import LoopTables
from flywheel.core.store.store_schema import (
    CURRICULUM_SCHEMA,
    ITERATION_DECISION_COLUMNS,
    MIGRATIONS,
    RENAMES,
    SCHEMA,
    STEP_COLUMNS,
    STORE_FIX,
    TRAJ_COLUMNS,
    VIEWS,
    DamagedStoreError,
    ForeignStoreError,
)
from flywheel.core.store.store_teacher_cache import TeacherCacheTables
from flywheel.core.store.store_trajectories import TrajectoryTables


class Store(TrajectoryTables, GateTables, CheckpointTables, EvaluationTables, LoopTables, TeacherCacheTables):
    """Plain DuckDB store; the Dagster resource only builds one of these."""


__all__ = [
    "CURRICULUM_SCHEMA", "ITERATION_DECISION_COLUMNS", "MIGRATIONS", "READER_WAIT_S", "RENAMES", "SAY_WAIT_AFTER_S",
    "SCHEMA", "STEP_COLUMNS", "STORE_FIX", "TRAJ_COLUMNS", "VIEWS", "DamagedStoreError", "ForeignStoreError", "Store",
    "StoreBusyError", "check_store",
]
