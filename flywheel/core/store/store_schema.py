"""The store's schema: its tables (and the curriculum's, created beside them), the views for the common
questions, the columns each table has, the migrations of older files, and the check that refuses a file of
another schema or a newer flywheel's before anything is written to it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import duckdb

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    benchmark VARCHAR, split VARCHAR, task_id VARCHAR, goal VARCHAR, max_steps INTEGER,
    meta JSON, PRIMARY KEY (benchmark, split, task_id));
CREATE TABLE IF NOT EXISTS trajectories (
    traj_id VARCHAR PRIMARY KEY, benchmark VARCHAR, split VARCHAR, iteration INTEGER,
    source VARCHAR, task_id VARCHAR, sample INTEGER, goal VARCHAR, success BOOLEAN,
    reward DOUBLE, steps INTEGER, status VARCHAR, error VARCHAR,
    prompt_tokens BIGINT, completion_tokens BIGINT, model_id VARCHAR, created_at TIMESTAMP,
    method VARCHAR DEFAULT 'bpo');
CREATE TABLE IF NOT EXISTS steps (
    traj_id VARCHAR, t INTEGER, observation VARCHAR, thought VARCHAR, plan VARCHAR,
    action VARCHAR, next_observation VARCHAR, reward DOUBLE, done BOOLEAN, invalid BOOLEAN,
    prompt_tokens INTEGER, completion_tokens INTEGER, PRIMARY KEY (traj_id, t));
CREATE TABLE IF NOT EXISTS gated (
    benchmark VARCHAR, iteration INTEGER, traj_id VARCHAR, task_id VARCHAR,
    PRIMARY KEY (benchmark, iteration, traj_id));
CREATE TABLE IF NOT EXISTS gate_runs (
    benchmark VARCHAR, iteration INTEGER, candidates INTEGER, passed INTEGER, created_at TIMESTAMP,
    PRIMARY KEY (benchmark, iteration));
CREATE TABLE IF NOT EXISTS gate_checks (
    benchmark VARCHAR, iteration INTEGER, passed BOOLEAN, trajectories INTEGER, problems INTEGER,
    first_problem VARCHAR, created_at TIMESTAMP, PRIMARY KEY (benchmark, iteration));
CREATE TABLE IF NOT EXISTS checkpoints (
    checkpoint_id VARCHAR PRIMARY KEY, benchmark VARCHAR, iteration INTEGER, path VARCHAR,
    base_model VARCHAR, n_examples INTEGER, n_trajectories INTEGER, train_loss DOUBLE,
    lineage JSON, created_at TIMESTAMP, method VARCHAR DEFAULT 'bpo');
CREATE TABLE IF NOT EXISTS evaluations (
    benchmark VARCHAR, iteration INTEGER, split VARCHAR, checkpoint_id VARCHAR, episodes INTEGER,
    errored INTEGER, success_rate DOUBLE, avg_reward DOUBLE, mean_steps DOUBLE,
    tokens_per_step DOUBLE, prompt_tokens_per_step DOUBLE, invalid_action_rate DOUBLE,
    created_at TIMESTAMP, PRIMARY KEY (benchmark, iteration, split));
CREATE TABLE IF NOT EXISTS teacher_cache (
    key VARCHAR PRIMARY KEY, model VARCHAR, response VARCHAR, created_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS iterations (
    benchmark VARCHAR, iteration INTEGER, candidates INTEGER, new_unique_successes INTEGER,
    capped_dropped INTEGER, gated_total INTEGER, checkpoint_id VARCHAR, train_trajectories INTEGER,
    seen_success DOUBLE, unseen_success DOUBLE, gate_check_passed BOOLEAN, decision VARCHAR,
    reason VARCHAR, decided_by VARCHAR, next_run_key VARCHAR, gate_at TIMESTAMP, decided_at TIMESTAMP,
    PRIMARY KEY (benchmark, iteration));
CREATE TABLE IF NOT EXISTS loop_starts (
    benchmark VARCHAR, run_key VARCHAR, claimed_by VARCHAR, created_at TIMESTAMP, PRIMARY KEY (benchmark, run_key));
CREATE TABLE IF NOT EXISTS preference_pairs (
    benchmark VARCHAR, iteration INTEGER, position INTEGER, task_id VARCHAR, chosen_id VARCHAR,
    rejected_id VARCHAR, chosen_source VARCHAR, chosen_reward DOUBLE, rejected_reward DOUBLE,
    method VARCHAR, created_at TIMESTAMP, PRIMARY KEY (benchmark, iteration, position));
CREATE TABLE IF NOT EXISTS task_stats (
    benchmark VARCHAR, iteration INTEGER, task_id VARCHAR, attempts INTEGER, successes INTEGER,
    errored INTEGER, created_at TIMESTAMP, PRIMARY KEY (benchmark, iteration, task_id));
CREATE TABLE IF NOT EXISTS training_examples (
    checkpoint_id VARCHAR, position INTEGER, benchmark VARCHAR, iteration INTEGER, traj_id VARCHAR,
    task_id VARCHAR, t INTEGER, prompt JSON, completion JSON, kept BOOLEAN, created_at TIMESTAMP,
    PRIMARY KEY (checkpoint_id, position));
CREATE TABLE IF NOT EXISTS gate_cleaning (
    benchmark VARCHAR, iteration INTEGER, traj_id VARCHAR, task_id VARCHAR, steps_before INTEGER,
    steps_after INTEGER, kept JSON, outcome VARCHAR, admitted BOOLEAN, created_at TIMESTAMP,
    PRIMARY KEY (benchmark, iteration, traj_id));
CREATE TABLE IF NOT EXISTS promotions (
    benchmark VARCHAR, iteration INTEGER, checkpoint_id VARCHAR, predecessor_id VARCHAR, promoted_id VARCHAR,
    promoted BOOLEAN, verdict VARCHAR, validation_n INTEGER, successes INTEGER, predecessor_successes INTEGER,
    delta DOUBLE, ci_low DOUBLE, ci_high DOUBLE, margin DOUBLE, alpha DOUBLE, created_at TIMESTAMP,
    PRIMARY KEY (benchmark, iteration));
"""


# The curriculum's tables (written by flywheel/curriculum/tables.py), created beside these.
CURRICULUM_SCHEMA = """
CREATE TABLE IF NOT EXISTS curriculum_proposals (
    benchmark VARCHAR, proposal_id VARCHAR, proposer VARCHAR, kind VARCHAR, params JSON,
    rationale VARCHAR, status VARCHAR, reason VARCHAR, task_id VARCHAR, length INTEGER,
    created_at TIMESTAMP, PRIMARY KEY (benchmark, proposal_id));
CREATE TABLE IF NOT EXISTS curriculum (
    benchmark VARCHAR, traj_id VARCHAR, position INTEGER, length INTEGER, other_signal DOUBLE,
    score DOUBLE, bucket VARCHAR, source VARCHAR, task_id VARCHAR, other_signal_name VARCHAR,
    scorer VARCHAR, created_at TIMESTAMP, PRIMARY KEY (benchmark, traj_id));
CREATE TABLE IF NOT EXISTS training_order (
    benchmark VARCHAR, iteration INTEGER, position INTEGER, traj_id VARCHAR, source VARCHAR,
    length INTEGER, other_signal DOUBLE, score DOUBLE, bucket VARCHAR, mode VARCHAR,
    created_at TIMESTAMP, PRIMARY KEY (benchmark, iteration, position));
CREATE TABLE IF NOT EXISTS gold_lengths (
    benchmark VARCHAR, split VARCHAR, task_id VARCHAR, length INTEGER, error VARCHAR,
    created_at TIMESTAMP, PRIMARY KEY (benchmark, split, task_id));
CREATE TABLE IF NOT EXISTS eval_buckets (
    benchmark VARCHAR, iteration INTEGER, split VARCHAR, bucket VARCHAR, lo DOUBLE, hi DOUBLE,
    episodes INTEGER, successes INTEGER, success_rate DOUBLE, mean_gold_length DOUBLE,
    checkpoint_id VARCHAR, created_at TIMESTAMP, PRIMARY KEY (benchmark, iteration, split, bucket));
"""


def _wilson_sql(s: str, n: str, z: float = 1.959963984540054) -> str:
    """`ci_low, ci_high`: the 95% Wilson interval of s successes in n (flywheel.core.quality.wilson_interval), NULL when n = 0."""
    p, zz = f"(({s})::DOUBLE / ({n}))", z * z
    centre = f"(({p} + {zz} / (2 * ({n}))) / (1 + {zz} / ({n})))"
    half = f"({z} * sqrt({p} * (1 - {p}) / ({n}) + {zz} / (4 * ({n}) * ({n}))) / (1 + {zz} / ({n})))"
    return (f"CASE WHEN ({n}) > 0 THEN CASE WHEN ({s}) <= 0 THEN 0.0 ELSE round(greatest(0.0, {centre} - {half}), 4) END "
            f"END AS ci_low, CASE WHEN ({n}) > 0 THEN CASE WHEN ({s}) >= ({n}) THEN 1.0 "
            f"ELSE round(least(1.0, {centre} + {half}), 4) END END AS ci_high")


# Views for the common questions (README "Querying the store"). Re-created on every open; a view
# whose table does not exist yet (eval_buckets: created by the first evaluation) is skipped. A rate
# over no episode is NULL, not 0.
_SUCCESSES = "round(success_rate * episodes)::BIGINT"
VIEWS = {
    "success_by_iteration": f"""
        SELECT benchmark, iteration, split, checkpoint_id, episodes, errored, {_SUCCESSES} AS successes,
               CASE WHEN episodes > 0 THEN round(success_rate, 4) END AS success_rate,
               {_wilson_sql(_SUCCESSES, "episodes")},
               round(avg_reward, 4) AS avg_reward, round(mean_steps, 2) AS mean_steps,
               round(tokens_per_step, 1) AS tokens_per_step, round(invalid_action_rate, 4) AS invalid_action_rate
        FROM evaluations ORDER BY benchmark, iteration, split""",
    "success_by_task": """
        SELECT benchmark, split, iteration, task_id, count(*) AS episodes,
               count(*) FILTER (WHERE success) AS successes, round(avg(success::INTEGER), 4) AS success_rate,
               round(avg(reward), 4) AS avg_reward
        FROM trajectories WHERE source = 'policy' AND status = 'ok'
        GROUP BY benchmark, split, iteration, task_id ORDER BY benchmark, split, iteration, task_id""",
    "success_by_bucket": f"""
        SELECT benchmark, iteration, split, bucket, lo, hi, episodes, successes,
               CASE WHEN episodes > 0 THEN round(success_rate, 4) END AS success_rate, {_wilson_sql("successes", "episodes")}
        FROM eval_buckets ORDER BY benchmark, iteration, split, lo NULLS FIRST""",
    "gated_growth": """
        SELECT benchmark, iteration, candidates, passed AS new_unique_successes,
               (sum(passed) OVER (PARTITION BY benchmark ORDER BY iteration))::BIGINT AS gated_total,
               round(passed / nullif(candidates, 0), 4) AS pass_rate, created_at AS gate_at
        FROM gate_runs ORDER BY benchmark, iteration""",
}


ITERATION_DECISION_COLUMNS = [
    "checkpoint_id", "train_trajectories", "seen_success", "unseen_success", "gate_check_passed",
    "decision", "reason", "decided_by", "next_run_key",
]


TRAJ_COLUMNS = [
    "traj_id", "benchmark", "split", "iteration", "source", "task_id", "sample", "goal", "success",
    "reward", "steps", "status", "error", "prompt_tokens", "completion_tokens", "model_id", "created_at", "method",
]
# Columns added after the first release, with their DDL: a file without them gets them (default
# value for old rows) when a Store opens it; a file of another schema is still refused.
MIGRATIONS = {"trajectories": [("method", "VARCHAR DEFAULT 'bpo'")], "checkpoints": [("method", "VARCHAR DEFAULT 'bpo'")]}
# Columns renamed since a store was written: table -> [(old name, new name)] (e_t is `thought` everywhere).
RENAMES = {"steps": [("elaborate", "thought")]}
STEP_COLUMNS = [
    "traj_id", "t", "observation", "thought", "plan", "action", "next_observation", "reward",
    "done", "invalid", "prompt_tokens", "completion_tokens",
]


class ForeignStoreError(RuntimeError):
    """The DuckDB file holds another schema; nothing was written to it."""


class DamagedStoreError(ForeignStoreError):
    """The DuckDB file cannot be read whole (zero bytes, truncated, corrupt); nothing was written to it."""


STORE_FIX = "point the store at a new file (StoreResource.path / --runs-dir) or move this one aside"


@functools.cache
def expected_columns() -> dict[str, list[str]]:
    """Each table of SCHEMA (and the curriculum's) -> its column names, read from an in-memory database."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(SCHEMA + CURRICULUM_SCHEMA)
        rows = con.execute("SELECT table_name, column_name FROM information_schema.columns "
                           "ORDER BY table_name, ordinal_position").fetchall()
    finally:
        con.close()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def table_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """A table's column names in order ([] when it does not exist)."""
    return [r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' AND table_name = ? "
        "ORDER BY ordinal_position", [table]).fetchall()]


def migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Rename RENAMES' columns, then add MIGRATIONS' columns to a table that has exactly the columns before
    them (nothing else is touched)."""
    expected = expected_columns()
    for table, renames in RENAMES.items():
        have = table_columns(con, table)
        for old, new in renames:
            if old in have and new not in have:
                con.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
    for table, added in MIGRATIONS.items():
        have = table_columns(con, table)
        names = [name for name, _ in added]
        if have and have == [c for c in expected[table] if c not in names]:
            for name, ddl in added:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {name} {ddl}")


def _as_migrated(table: str, columns: list[str]) -> list[str]:
    """A table's columns as `migrate` will leave them (renamed, older columns completed)."""
    for old, new in RENAMES.get(table, []):
        if old in columns and new not in columns:
            columns = [new if c == old else c for c in columns]
    names = [name for name, _ in MIGRATIONS.get(table, [])]
    expected = expected_columns().get(table, [])
    if names and columns == [c for c in expected if c not in names]:
        return expected
    return columns


def check_schema(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse, before anything is written, a file that holds another schema or a newer version of ours."""
    rows = con.execute("SELECT c.table_name, c.column_name FROM information_schema.columns c "
                       "JOIN information_schema.tables t USING (table_schema, table_name) "
                       "WHERE c.table_schema = 'main' AND t.table_type = 'BASE TABLE' "
                       "ORDER BY c.table_name, c.ordinal_position").fetchall()
    if not rows:
        return  # a new, empty file
    have: dict[str, list[str]] = {}
    for table, column in rows:
        have.setdefault(table, []).append(column)
    expected = expected_columns()
    ours = [t for t in expected if t in have]
    if not ours:
        raise ForeignStoreError(
            f"{path} is a DuckDB file of another schema (tables: {', '.join(sorted(have)[:8])}) and holds none "
            f"of flywheel's tables; nothing was written to it: {STORE_FIX}.")
    newer = "(another schema, or a newer flywheel's); nothing was written to it: upgrade flywheel, or"
    extra = sorted(set(have) - set(expected))
    if extra:
        raise ForeignStoreError(f"{path}: table(s) {extra} are not flywheel's {newer} {STORE_FIX}.")
    for table in ours:
        if _as_migrated(table, have[table]) != expected[table]:
            raise ForeignStoreError(
                f"{path}: table {table!r} has columns {have[table]}, flywheel expects {expected[table]} "
                f"{newer} {STORE_FIX}.")


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    for name, sql in VIEWS.items():
        try:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
        except duckdb.CatalogException:  # its table is created later (eval_buckets)
            pass
