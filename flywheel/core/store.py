"""DuckDB store for tasks, trajectories, steps, checkpoints, evaluations and the loop's record.

Every write replaces rows by natural key inside one transaction, so re-running a
partition overwrites it and a killed run leaves either the old rows or the new.
Connections are short-lived and retried on DuckDB's single-writer file lock, so
several processes (Dagster's multiprocess executor) can share one file.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from flywheel.core.trajectory import Step, Trajectory

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


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


log = logging.getLogger(__name__)
SAY_WAIT_AFTER_S = 1.0  # a wait on another process's lock longer than this is said, once


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()  # not "lock" alone: a corrupt block's error says "block"
    return "set lock" in text or "conflict" in text


class StoreBusyError(RuntimeError):
    """Another process held the store's file lock for longer than the store waits."""


class ForeignStoreError(RuntimeError):
    """The DuckDB file holds another schema; nothing was written to it."""


class DamagedStoreError(ForeignStoreError):
    """The DuckDB file cannot be read whole (zero bytes, truncated, corrupt); nothing was written to it."""


def _lock_holder(message: str) -> str:
    """The process DuckDB names in its lock error ("... (PID 123) ..."), described with psutil."""
    match = re.search(r"PID (\d+)", message)
    if not match:
        return "another process"
    pid = int(match.group(1))
    try:
        import psutil

        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline()) or proc.name()
        return f"process {pid} ({cmd[:160]}, user {proc.username()})"
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect: the PID alone still names it
        return f"process {pid}"


_SURROGATES = re.compile("[\ud800-\udfff]")


def _text(value: Any) -> Any:
    """A string DuckDB and Arrow can encode: lone surrogates (from a model's bytes) become U+FFFD."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATES.sub("\ufffd", value)
    return value


@functools.cache
def _expected_columns() -> dict[str, list[str]]:
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


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """A table's column names in order ([] when it does not exist)."""
    return [r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' AND table_name = ? "
        "ORDER BY ordinal_position", [table]).fetchall()]


def _migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Rename RENAMES' columns, then add MIGRATIONS' columns to a table that has exactly the columns before
    them (nothing else is touched)."""
    expected = _expected_columns()
    for table, renames in RENAMES.items():
        have = _columns(con, table)
        for old, new in renames:
            if old in have and new not in have:
                con.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
    for table, added in MIGRATIONS.items():
        have = _columns(con, table)
        names = [name for name, _ in added]
        if have and have == [c for c in expected[table] if c not in names]:
            for name, ddl in added:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {name} {ddl}")


def _as_migrated(table: str, columns: list[str]) -> list[str]:
    """A table's columns as `_migrate` will leave them (renamed, older columns completed)."""
    for old, new in RENAMES.get(table, []):
        if old in columns and new not in columns:
            columns = [new if c == old else c for c in columns]
    names = [name for name, _ in MIGRATIONS.get(table, [])]
    expected = _expected_columns().get(table, [])
    if names and columns == [c for c in expected if c not in names]:
        return expected
    return columns


# A DuckDB file: 3 headers of 4 KiB, then blocks of `block_size` bytes (at least its `used_blocks`).
_HEADERS_BYTES = 3 * 4096
STORE_FIX = "point the store at a new file (StoreResource.path / --runs-dir) or move this one aside"


def check_store(path: str | Path, *, whole: bool = True, lock_timeout_s: float = 120.0) -> None:
    """Refuse a store file flywheel cannot use as it is, opening it read-only (nothing is written to it):
    one that cannot be read whole (zero bytes, truncated; with `whole`, every table is read, so a corrupt
    block fails here too) or that holds another schema or a newer version of flywheel's (a table or a
    column this flywheel does not know). A missing file is fine (a new store)."""
    path = Path(path)
    if not path.exists():
        return
    if path.is_dir():
        raise ForeignStoreError(f"the store {path} is a folder, not a DuckDB file: {STORE_FIX}.")
    size = path.stat().st_size
    damaged = f"nothing was written to it: restore it from a backup, or {STORE_FIX}"
    try:
        with Store._open(path, read_only=True, lock_timeout_s=lock_timeout_s) as con:
            _, _, block_size, _, used_blocks, *_ = con.execute("PRAGMA database_size").fetchone()
            size = path.stat().st_size  # now: no writer can grow it while this connection is open
            if size < (need := _HEADERS_BYTES + int(used_blocks) * int(block_size)):
                raise DamagedStoreError(f"{path} is truncated ({size:,} bytes, its used blocks need at least "
                                        f"{need:,}); {damaged}.")
            _check_schema(con, path)
            if whole:
                for (table,) in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                            "table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall():
                    con.execute(f'SELECT bit_xor(hash(COLUMNS(*))) FROM "{table}"').fetchall()
    except duckdb.Error as exc:
        raise DamagedStoreError(f"{path} ({size:,} bytes) cannot be read whole as a DuckDB store "
                                f"({' '.join(str(exc).split())[:200]}); {damaged}.") from None


def _check_schema(con: duckdb.DuckDBPyConnection, path: Path) -> None:
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
    expected = _expected_columns()
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


def _where(scope: dict[str, Any]) -> str:
    """`col = ? AND ...` for a column scope (TRUE when empty); values go as parameters."""
    return " AND ".join(f"{k} = ?" for k in scope) or "TRUE"


def _delete_scope(con: duckdb.DuckDBPyConnection, scope: dict[str, Any]) -> None:
    """Delete a scope's trajectories and their steps, inside the caller's transaction."""
    if not scope:
        raise ValueError("refusing to delete with an empty scope (it would delete every trajectory)")
    where, params = _where(scope), list(scope.values())
    con.execute(f"DELETE FROM steps WHERE traj_id IN (SELECT traj_id FROM trajectories WHERE {where})", params)
    con.execute(f"DELETE FROM trajectories WHERE {where}", params)


def _write_examples(con: duckdb.DuckDBPyConnection, checkpoint_id: str, benchmark: str, iteration: int,
                    rows: Sequence[dict[str, Any]]) -> None:
    """Replace a checkpoint's training pairs, inside the caller's transaction."""
    df = pl.DataFrame(
        {"checkpoint_id": [checkpoint_id] * len(rows), "position": list(range(len(rows))),
         "benchmark": [benchmark] * len(rows), "iteration": [iteration] * len(rows),
         "traj_id": [r.get("traj_id") for r in rows], "task_id": [r.get("task_id") for r in rows],
         "t": [r.get("t") for r in rows],
         "prompt": [_text(json.dumps(r["prompt"], ensure_ascii=False)) for r in rows],
         "completion": [_text(json.dumps(r["completion"], ensure_ascii=False)) for r in rows],
         "kept": [bool(r.get("kept", True)) for r in rows], "created_at": [_now()] * len(rows)},
        schema={"checkpoint_id": pl.Utf8, "position": pl.Int32, "benchmark": pl.Utf8, "iteration": pl.Int32,
                "traj_id": pl.Utf8, "task_id": pl.Utf8, "t": pl.Int32, "prompt": pl.Utf8, "completion": pl.Utf8,
                "kept": pl.Boolean, "created_at": pl.Datetime("us")},
    )
    con.execute("DELETE FROM training_examples WHERE checkpoint_id = ?", [checkpoint_id])
    con.register("new_examples", df.to_arrow())
    con.execute("INSERT INTO training_examples SELECT * FROM new_examples")
    con.unregister("new_examples")


def _create_views(con: duckdb.DuckDBPyConnection) -> None:
    for name, sql in VIEWS.items():
        try:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
        except duckdb.CatalogException:  # its table is created later (eval_buckets)
            pass


# How long a reader (`Store.reader`: report, export, paper) waits for a writer: a run's connections are short-lived
# (one write each), so a few seconds see them through; a writer that holds the file longer is named at once.
READER_WAIT_S = 3.0


def _busy_message(path: Path, error: str, *, read_only: bool, lock_timeout_s: float) -> str:
    holder = _lock_holder(error)
    if read_only and lock_timeout_s <= READER_WAIT_S:
        return (f"The store {path} is open for writing by {holder} (DuckDB lets readers in only when no writer "
                "holds the file): wait for that run to finish, or close that connection (a notebook or `duckdb` shell "
                "left open read-write? open it with read_only=True), then re-run.")
    return (f"The store {path} stayed locked for {lock_timeout_s:.0f} s by {holder}. Close that connection (a "
            "notebook or `duckdb` shell left open?) or stop that process, then re-run.")


class Store:
    """Plain DuckDB store; the Dagster resource only builds one of these."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 120.0, method: str = "bpo",
                 read_only: bool = False) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        # The training method (experiment arm) this store's writer belongs to: every trajectory and
        # checkpoint it writes carries it in the `method` column (flywheel.orchestration.methods names them).
        self.method = method
        # A reader (reports) opens DuckDB read-only and never creates, migrates or touches the file.
        self.read_only = read_only
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no store at {self.path}: nothing to read")
            check_store(self.path, whole=False, lock_timeout_s=lock_timeout_s)
            return
        check_store(self.path, whole=False, lock_timeout_s=lock_timeout_s)  # read-only: refused before any write
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as con:
            _migrate(con)
            con.execute(SCHEMA)
            _create_views(con)

    @classmethod
    def reader(cls, path: str | Path, *, lock_timeout_s: float = READER_WAIT_S) -> Store:
        """The store opened read-only, as every report reads it (report, export, paper, the dashboard): nothing is
        created, migrated or written, so the file's bytes never change; any number of readers share it, and a
        writer that holds it is named at once (StoreBusyError) instead of waited for. A missing file is a
        FileNotFoundError naming it."""
        return cls(path, read_only=True, lock_timeout_s=lock_timeout_s)

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._open(self.path, read_only=self.read_only, lock_timeout_s=self.lock_timeout_s) as con:
            yield con

    @staticmethod
    @contextmanager
    def _open(path: Path, *, read_only: bool, lock_timeout_s: float) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection to `path`, retried while another process holds DuckDB's file lock."""
        started = time.monotonic()
        deadline = started + lock_timeout_s
        delay, said = 0.05, False
        while True:
            try:
                con = duckdb.connect(str(path), read_only=read_only)
                break
            except duckdb.IOException as exc:  # another process holds the write lock
                if not _is_lock_error(exc):
                    raise
                now = time.monotonic()
                if not said and now - started >= SAY_WAIT_AFTER_S and now < deadline:  # once, not for a brief wait
                    said = True
                    log.warning("store %s is locked by %s; waiting up to %.0f s more, then this %s fails with "
                                "StoreBusyError naming it (a retried step waits again). Close that connection or "
                                "stop that process to go on now", path, _lock_holder(str(exc)), deadline - now,
                                "read" if read_only else "write")
                if now > deadline:
                    raise StoreBusyError(_busy_message(path, str(exc), read_only=read_only,
                                                       lock_timeout_s=lock_timeout_s)) from None
                time.sleep(delay + random.random() * delay)
                delay = min(delay * 2, 2.0)
        try:
            yield con
        finally:
            con.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pl.DataFrame:
        with self.connect() as con:
            return pl.from_arrow(con.sql(sql, params=params or None).to_arrow_table())  # type: ignore[return-value]

    # -- tasks ---------------------------------------------------------------
    def upsert_tasks(self, rows: list[dict[str, Any]]) -> int:
        if not rows:
            return 0
        df = pl.DataFrame(
            [
                {
                    "benchmark": r["benchmark"], "split": r["split"], "task_id": r["task_id"],
                    "goal": r.get("goal", ""), "max_steps": int(r.get("max_steps", 0)),
                    "meta": json.dumps(r.get("meta", {}), default=str),
                }
                for r in rows
            ]
        )
        with self.transaction() as con:
            con.register("new_tasks", df.to_arrow())
            con.execute(
                "DELETE FROM tasks USING new_tasks WHERE tasks.benchmark = new_tasks.benchmark "
                "AND tasks.split = new_tasks.split AND tasks.task_id = new_tasks.task_id"
            )
            con.execute("INSERT INTO tasks SELECT * FROM new_tasks")
        return len(rows)

    # -- trajectories ----------------------------------------------------------
    @staticmethod
    def frames(trajs: Sequence[Trajectory], method: str = "bpo") -> tuple[pl.DataFrame, pl.DataFrame]:
        """Column-oriented frames for a bulk insert (one Arrow batch, not row-by-row)."""
        now = _now()
        traj_rows, step_rows = [], []
        for tr in trajs:
            tid = tr.traj_id
            traj_rows.append(
                (tid, tr.benchmark, tr.split, tr.iteration, tr.source, tr.task_id, tr.sample, _text(tr.goal),
                 tr.success, float(tr.reward), len(tr.steps), tr.status, _text(tr.error),
                 sum(s.prompt_tokens for s in tr.steps), sum(s.completion_tokens for s in tr.steps),
                 tr.model_id, now, method)
            )
            for t, s in enumerate(tr.steps):
                step_rows.append(
                    (tid, t, _text(s.observation), _text(s.thought), _text(s.plan), _text(s.action),
                     _text(s.next_observation),
                     float(s.reward), s.done, s.invalid, s.prompt_tokens, s.completion_tokens)
                )
        traj_schema = {
            "traj_id": pl.Utf8, "benchmark": pl.Utf8, "split": pl.Utf8, "iteration": pl.Int32,
            "source": pl.Utf8, "task_id": pl.Utf8, "sample": pl.Int32, "goal": pl.Utf8,
            "success": pl.Boolean, "reward": pl.Float64, "steps": pl.Int32, "status": pl.Utf8,
            "error": pl.Utf8, "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64,
            "model_id": pl.Utf8, "created_at": pl.Datetime("us"), "method": pl.Utf8,
        }
        step_schema = {
            "traj_id": pl.Utf8, "t": pl.Int32, "observation": pl.Utf8, "thought": pl.Utf8,
            "plan": pl.Utf8, "action": pl.Utf8, "next_observation": pl.Utf8, "reward": pl.Float64,
            "done": pl.Boolean, "invalid": pl.Boolean, "prompt_tokens": pl.Int32,
            "completion_tokens": pl.Int32,
        }
        return (
            pl.DataFrame(traj_rows, schema=traj_schema, orient="row"),
            pl.DataFrame(step_rows, schema=step_schema, orient="row"),
        )

    def write_trajectories(
        self, trajs: Sequence[Trajectory], *, replace_scope: dict[str, Any] | None = None
    ) -> int:
        """Insert trajectories, replacing same-key rows (and the whole `replace_scope`, if given).

        `replace_scope` (e.g. benchmark/iteration/source/split) deletes a partition's
        previous rows first, so a re-run replaces the partition instead of adding to it.
        """
        traj_df, step_df = self.frames(trajs, self.method)
        with self.transaction() as con:
            if replace_scope:
                _delete_scope(con, replace_scope)
            con.register("new_traj", traj_df.to_arrow())
            con.register("new_steps", step_df.to_arrow())
            con.execute("DELETE FROM steps WHERE traj_id IN (SELECT traj_id FROM new_traj)")
            con.execute("DELETE FROM trajectories WHERE traj_id IN (SELECT traj_id FROM new_traj)")
            con.execute("INSERT INTO trajectories SELECT * FROM new_traj")
            con.execute("INSERT INTO steps SELECT * FROM new_steps")
        return len(trajs)

    def delete_trajectories(self, **scope: Any) -> None:
        with self.transaction() as con:
            _delete_scope(con, scope)

    def delete_trajectory_ids(self, traj_ids: Sequence[str]) -> None:
        if not traj_ids:
            return
        with self.transaction() as con:
            con.execute("DELETE FROM steps WHERE traj_id IN (SELECT unnest(?))", [list(traj_ids)])
            con.execute("DELETE FROM trajectories WHERE traj_id IN (SELECT unnest(?))", [list(traj_ids)])

    def trajectory_table(self, **scope: Any) -> pl.DataFrame:
        where = _where(scope)
        return self.query(f"SELECT * FROM trajectories WHERE {where} ORDER BY traj_id", list(scope.values()))

    def load_trajectories(self, traj_ids: Sequence[str] | None = None, **scope: Any) -> list[Trajectory]:
        """Trajectories with their steps, by id list or by column scope."""
        if traj_ids is not None:
            meta = self.query(
                "SELECT * FROM trajectories WHERE traj_id IN (SELECT unnest(?)) ORDER BY traj_id",
                [list(traj_ids)],
            )
        else:
            meta = self.trajectory_table(**scope)
        if meta.is_empty():
            return []
        steps = self.query(
            "SELECT * FROM steps WHERE traj_id IN (SELECT unnest(?)) ORDER BY traj_id, t",
            [meta["traj_id"].to_list()],
        )
        by_id: dict[str, list[Step]] = {}
        for row in steps.iter_rows(named=True):
            by_id.setdefault(row["traj_id"], []).append(
                Step(
                    observation=row["observation"], thought=row["thought"], plan=row["plan"],
                    action=row["action"], next_observation=row["next_observation"],
                    reward=row["reward"], done=row["done"], invalid=row["invalid"],
                    prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"],
                )
            )
        return [
            Trajectory(
                benchmark=r["benchmark"], split=r["split"], task_id=r["task_id"], source=r["source"],
                iteration=r["iteration"], sample=r["sample"], goal=r["goal"],
                steps=by_id.get(r["traj_id"], []), success=r["success"], reward=r["reward"],
                status=r["status"], error=r["error"], model_id=r["model_id"],
            )
            for r in meta.iter_rows(named=True)
        ]

    # -- gate ----------------------------------------------------------------
    def write_gated(
        self, benchmark: str, iteration: int, rows: list[tuple[str, str]], *, candidates: int = 0
    ) -> None:
        """Replace iteration k's gated rows and log that the gate ran (even when nothing passed)."""
        df = pl.DataFrame(
            {"benchmark": [benchmark] * len(rows), "iteration": [iteration] * len(rows),
             "traj_id": [r[0] for r in rows], "task_id": [r[1] for r in rows]},
            schema={"benchmark": pl.Utf8, "iteration": pl.Int32, "traj_id": pl.Utf8, "task_id": pl.Utf8},
        )
        with self.transaction() as con:
            con.execute("DELETE FROM gated WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
            con.register("new_gated", df.to_arrow())
            con.execute("INSERT INTO gated SELECT * FROM new_gated")
            con.execute("DELETE FROM gate_runs WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
            con.execute("INSERT INTO gate_runs VALUES (?, ?, ?, ?, ?)", [benchmark, iteration, candidates, len(rows), _now()])

    def record_gate_check(self, benchmark: str, iteration: int, *, passed: bool, trajectories: int,
                          problems: Sequence[str]) -> None:
        """The verdict of the blocking check `gated_dataset_is_usable` on gate k (replaces an earlier one).

        Kept here, not only in Dagster's event log, so the loop and `sft_checkpoint(b, k+1)` read it
        through the store instead of the instance's private check-execution records.
        """
        with self.transaction() as con:
            con.execute("DELETE FROM gate_checks WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
            con.execute("INSERT INTO gate_checks VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [benchmark, iteration, bool(passed), int(trajectories), len(problems),
                         _text(problems[0]) if problems else None, _now()])

    def clear_gate_check(self, benchmark: str, iteration: int) -> None:
        """Forget gate k's verdict: the gate is re-running with its check, which will judge the new rows."""
        with self.transaction() as con:
            con.execute("DELETE FROM gate_checks WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])

    def gate_check_passed(self, benchmark: str, iteration: int) -> bool | None:
        """The latest verdict of gate k's check; None when it was never evaluated or is about to be again."""
        df = self.query("SELECT passed FROM gate_checks WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
        return None if df.is_empty() else bool(df["passed"][0])

    def gate_check_rows(self, benchmark: str) -> dict[int, dict[str, Any]]:
        """Gate k's latest check verdict by k: passed, problems (count) and the first problem."""
        df = self.query("SELECT iteration, passed, problems, first_problem FROM gate_checks WHERE benchmark = ?",
                        [benchmark])
        return {r["iteration"]: r for r in df.iter_rows(named=True)}

    def traj_ids_gated_up_to(self, benchmark: str, iteration: int) -> list[str]:
        """The trajectories gates 0..k let through, all of them (what SFT k+1 replays)."""
        df = self.query(
            "SELECT traj_id FROM gated WHERE benchmark = ? AND iteration <= ? ORDER BY iteration, traj_id",
            [benchmark, iteration],
        )
        return df["traj_id"].to_list()

    def traj_ids_gated_at(self, benchmark: str, iteration: int) -> list[str]:
        """The trajectories gate k itself let through (not the earlier gates')."""
        df = self.query("SELECT traj_id FROM gated WHERE benchmark = ? AND iteration = ? ORDER BY traj_id",
                        [benchmark, iteration])
        return df["traj_id"].to_list()

    def gated_iterations(self, benchmark: str) -> list[int]:
        """Iterations whose gate has run, whether or not anything passed."""
        df = self.query("SELECT iteration FROM gate_runs WHERE benchmark = ? ORDER BY 1", [benchmark])
        return df["iteration"].to_list()

    # -- the exact training pairs of each checkpoint ----------------------------
    def write_training_examples(self, checkpoint_id: str, benchmark: str, iteration: int,
                                rows: Sequence[dict[str, Any]]) -> None:
        """Replace a checkpoint's (prompt, completion) pairs; `kept` False = dropped as too long."""
        with self.transaction() as con:
            _write_examples(con, checkpoint_id, benchmark, iteration, rows)

    def has_training_examples(self, checkpoint_id: str) -> bool:
        return bool(self.query("SELECT count(*) FROM training_examples WHERE checkpoint_id = ?", [checkpoint_id]).item())

    def training_examples(self, checkpoint_id: str, *, kept_only: bool = True) -> list[dict[str, Any]]:
        """A checkpoint's training pairs in training order (prompt/completion as chat messages)."""
        df = self.query(
            "SELECT * FROM training_examples WHERE checkpoint_id = ?" + (" AND kept" if kept_only else "")
            + " ORDER BY position", [checkpoint_id])
        return [{**r, "prompt": json.loads(r["prompt"]), "completion": json.loads(r["completion"])}
                for r in df.iter_rows(named=True)]

    # -- checkpoints and evaluations -------------------------------------------
    def record_checkpoint(self, row: dict[str, Any], training_examples: Sequence[dict[str, Any]] | None = None) -> None:
        """Record a checkpoint; with `training_examples` (its pairs, as `write_training_examples` takes them) in
        the same transaction: a kill leaves both or neither."""
        row = {"method": self.method, **row, "lineage": json.dumps(row.get("lineage", {}), default=str),
               "created_at": _now()}
        cols = ["checkpoint_id", "benchmark", "iteration", "path", "base_model", "n_examples",
                "n_trajectories", "train_loss", "lineage", "created_at", "method"]
        with self.transaction() as con:
            if training_examples is not None:
                _write_examples(con, row["checkpoint_id"], row["benchmark"], row["iteration"], training_examples)
            con.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", [row["checkpoint_id"]])
            con.execute(
                f"INSERT INTO checkpoints ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                [row.get(c) for c in cols],
            )

    def checkpoint_recorded(self, checkpoint_id: str, path: str | Path) -> bool:
        """Whether a checkpoint row has this id or this directory."""
        return bool(self.query("SELECT count(*) FROM checkpoints WHERE checkpoint_id = ? OR path = ?",
                               [checkpoint_id, str(path)]).item())

    def latest_checkpoint(self, benchmark: str, iteration: int) -> dict[str, Any] | None:
        df = self.query(
            "SELECT * FROM checkpoints WHERE benchmark = ? AND iteration = ? ORDER BY created_at DESC LIMIT 1",
            [benchmark, iteration],
        )
        return None if df.is_empty() else df.row(0, named=True)

    def write_evaluation(self, row: dict[str, Any]) -> None:
        row = {**row, "created_at": _now()}
        cols = list(row)
        with self.transaction() as con:
            con.execute(
                "DELETE FROM evaluations WHERE benchmark = ? AND iteration = ? AND split = ?",
                [row["benchmark"], row["iteration"], row["split"]],
            )
            con.execute(
                f"INSERT INTO evaluations ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                [row[c] for c in cols],
            )

    # -- the living flywheel: per-iteration record and per-task attempt stats -------------
    def record_gate_stats(
        self, benchmark: str, iteration: int, *, candidates: int, new_unique_successes: int,
        gated_total: int, capped_dropped: int = 0,
    ) -> None:
        """What the gate of (benchmark, k) added. A new gate result clears k's decision: the
        loop decides again on the new data."""
        cols = ["benchmark", "iteration", "candidates", "new_unique_successes", "capped_dropped", "gated_total", "gate_at"]
        vals = [benchmark, iteration, candidates, new_unique_successes, capped_dropped, gated_total, _now()]
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols[2:])
        clear = ", ".join(f"{c} = NULL" for c in ITERATION_DECISION_COLUMNS + ["decided_at"])
        with self.transaction() as con:
            con.execute(
                f"INSERT INTO iterations ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
                f"ON CONFLICT (benchmark, iteration) DO UPDATE SET {updates}, {clear}",
                vals,
            )

    def claim_decision(self, benchmark: str, iteration: int, row: dict[str, Any]) -> bool:
        """Record k's decision unless one is already recorded; True when this call recorded it.

        The sensor and the schedule both decide; only the one that claims k launches k+1.
        """
        row = {k: v for k, v in row.items() if k in ITERATION_DECISION_COLUMNS}
        with self.transaction() as con:
            got = con.execute(
                "SELECT decision FROM iterations WHERE benchmark = ? AND iteration = ?", [benchmark, iteration]
            ).fetchall()
            if got and got[0][0] is not None:
                return False
            if not got:
                con.execute("INSERT INTO iterations (benchmark, iteration) VALUES (?, ?)", [benchmark, iteration])
            sets = ", ".join(f"{c} = ?" for c in row)
            con.execute(
                f"UPDATE iterations SET {sets}, decided_at = ? WHERE benchmark = ? AND iteration = ?",
                [*row.values(), _now(), benchmark, iteration],
            )
        return True

    def claim_start(self, benchmark: str, run_key: str, claimed_by: str) -> bool:
        """Claim the launch of iteration 0 (run_key names the bootstrap it follows); True once."""
        with self.transaction() as con:
            if con.execute("SELECT 1 FROM loop_starts WHERE benchmark = ? AND run_key = ?", [benchmark, run_key]).fetchall():
                return False
            con.execute("INSERT INTO loop_starts VALUES (?, ?, ?, ?)", [benchmark, run_key, claimed_by, _now()])
        return True

    def clear_decision(self, benchmark: str, iteration: int) -> None:
        clear = ", ".join(f"{c} = NULL" for c in ITERATION_DECISION_COLUMNS + ["decided_at"])
        with self.transaction() as con:
            con.execute(f"UPDATE iterations SET {clear} WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])

    def iterations(self, benchmark: str) -> pl.DataFrame:
        return self.query("SELECT * FROM iterations WHERE benchmark = ? ORDER BY iteration", [benchmark])

    def gate_run(self, benchmark: str, iteration: int) -> dict[str, Any] | None:
        df = self.query("SELECT * FROM gate_runs WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
        return None if df.is_empty() else df.row(0, named=True)

    def gated_counts_by_task(self, benchmark: str, *, up_to_iteration: int) -> dict[str, int]:
        df = self.query(
            "SELECT task_id, count(*) AS n FROM gated WHERE benchmark = ? AND iteration <= ? GROUP BY 1",
            [benchmark, up_to_iteration],
        )
        return {r["task_id"]: r["n"] for r in df.iter_rows(named=True)}

    def write_task_stats(self, benchmark: str, iteration: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace (benchmark, k)'s per-task attempts/successes/errored."""
        df = pl.DataFrame(
            {"benchmark": [benchmark] * len(rows), "iteration": [iteration] * len(rows),
             "task_id": [r["task_id"] for r in rows], "attempts": [int(r["attempts"]) for r in rows],
             "successes": [int(r["successes"]) for r in rows], "errored": [int(r.get("errored", 0)) for r in rows],
             "created_at": [_now()] * len(rows)},
            schema={"benchmark": pl.Utf8, "iteration": pl.Int32, "task_id": pl.Utf8, "attempts": pl.Int32,
                    "successes": pl.Int32, "errored": pl.Int32, "created_at": pl.Datetime("us")},
        )
        with self.transaction() as con:
            con.execute("DELETE FROM task_stats WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
            con.register("new_stats", df.to_arrow())
            con.execute("INSERT INTO task_stats SELECT * FROM new_stats")

    def task_stats(self, benchmark: str, *, before_iteration: int | None = None) -> pl.DataFrame:
        where, params = "benchmark = ?", [benchmark]
        if before_iteration is not None:
            where += " AND iteration < ?"
            params.append(before_iteration)
        return self.query(f"SELECT * FROM task_stats WHERE {where} ORDER BY iteration, task_id", params)

    # -- baselines: DPO preference pairs (chosen vs rejected trajectory of one task) -------------
    def write_preference_pairs(self, benchmark: str, iteration: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace (benchmark, k)'s pairs; rows carry task_id, chosen_id, rejected_id, chosen_source and rewards."""
        now = _now()
        with self.transaction() as con:
            con.execute("DELETE FROM preference_pairs WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
            for i, r in enumerate(rows):
                con.execute("INSERT INTO preference_pairs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [benchmark, iteration, i, r["task_id"], r["chosen_id"], r["rejected_id"],
                             r["chosen_source"], r["chosen_reward"], r["rejected_reward"], self.method, now])

    def preference_pairs(self, benchmark: str, iteration: int) -> list[dict[str, Any]]:
        df = self.query("SELECT * FROM preference_pairs WHERE benchmark = ? AND iteration = ? ORDER BY position",
                        [benchmark, iteration])
        return list(df.iter_rows(named=True))

    def step_tokens(self, benchmark: str, iteration: int, split: str) -> list[dict[str, Any]]:
        """Per evaluation episode of checkpoint k (sample 0, not errored): steps, prompt and completion tokens."""
        df = self.query(
            "SELECT task_id, steps, prompt_tokens, completion_tokens, success FROM trajectories WHERE benchmark = ? "
            "AND iteration = ? AND split = ? AND source = 'policy' AND status = 'ok' AND sample = 0 ORDER BY task_id",
            [benchmark, iteration, split])
        return list(df.iter_rows(named=True))

    # -- teacher cache ---------------------------------------------------------
    def cache_get(self, key: str) -> str | None:
        df = self.query("SELECT response FROM teacher_cache WHERE key = ?", [key])
        return None if df.is_empty() else df["response"][0]

    def cache_put(self, key: str, model: str, response: str) -> None:
        with self.transaction() as con:
            con.execute("DELETE FROM teacher_cache WHERE key = ?", [key])
            con.execute("INSERT INTO teacher_cache VALUES (?, ?, ?, ?)", [key, model, _text(response), _now()])

    # -- reports: what experiments and comparisons read ---------------------------
    def policy_outcomes(self, benchmark: str, iteration: int, split: str) -> dict[str, tuple[bool, float]]:
        """(success, reward) per task of checkpoint k's evaluation episodes (sample 0, not errored)."""
        df = self.query(
            "SELECT task_id, success, reward FROM trajectories WHERE benchmark = ? AND iteration = ? AND split = ? "
            "AND source = 'policy' AND status = 'ok' AND sample = 0",
            [benchmark, iteration, split],
        )
        return {r["task_id"]: (bool(r["success"]), float(r["reward"] or 0.0)) for r in df.iter_rows(named=True)}

    def policy_answer_tokens(self, benchmark: str, iteration: int, split: str) -> list[int]:
        """Tokens the policy generated at each step of checkpoint k's evaluation episodes on `split` (the same
        episodes as `policy_outcomes`), in no particular order."""
        df = self.query(
            "SELECT s.completion_tokens AS n FROM steps s JOIN trajectories t USING (traj_id) WHERE t.benchmark = ? "
            "AND t.iteration = ? AND t.split = ? AND t.source = 'policy' AND t.status = 'ok' AND t.sample = 0",
            [benchmark, iteration, split],
        )
        return [int(n or 0) for n in df["n"].to_list()] if df.height else []

    def evaluation_rows(self, benchmark: str) -> list[dict[str, Any]]:
        df = self.query("SELECT * FROM evaluations WHERE benchmark = ? ORDER BY iteration, split", [benchmark])
        return list(df.iter_rows(named=True))

    def evaluations_at(self, benchmark: str, iteration: int) -> dict[str, dict[str, Any]]:
        """Checkpoint k's evaluation rows by split (only the splits evaluated so far)."""
        df = self.query("SELECT * FROM evaluations WHERE benchmark = ? AND iteration = ? ORDER BY split",
                        [benchmark, iteration])
        return {r["split"]: r for r in df.iter_rows(named=True)}

    def evaluation_values(self, metric: str) -> dict[tuple[str, str, int], float | None]:
        """One column of `evaluations` for every benchmark: (benchmark, split, iteration) -> value."""
        numeric = [c for c in _expected_columns()["evaluations"]
                   if c not in {"benchmark", "iteration", "split", "checkpoint_id", "created_at"}]
        if metric not in numeric:
            raise ValueError(f"unknown evaluation metric {metric!r}: one of {', '.join(numeric)}")
        df = self.query(f"SELECT benchmark, split, iteration, {metric} AS v FROM evaluations ORDER BY iteration")
        return {(r["benchmark"], r["split"], r["iteration"]): r["v"] for r in df.iter_rows(named=True)}

    def evaluated_benchmarks(self) -> list[str]:
        """Benchmarks with at least one evaluation row, in name order."""
        return self.query("SELECT DISTINCT benchmark FROM evaluations ORDER BY 1")["benchmark"].to_list()

    def eval_buckets_of(self, benchmark: str, iteration: int) -> list[dict[str, Any]]:
        """Checkpoint k's success by complexity bucket, per split (split, bucket, lo, hi, episodes,
        successes), easiest bucket first; [] before the first evaluation creates `eval_buckets`."""
        try:
            df = self.query("SELECT split, bucket, lo, hi, episodes, successes FROM eval_buckets WHERE benchmark = ? "
                            "AND iteration = ? ORDER BY split, lo NULLS FIRST", [benchmark, iteration])
        except duckdb.CatalogException:  # the table is the evaluation's (flywheel/curriculum/tables.py)
            return []
        return list(df.iter_rows(named=True))

    def checkpoint_rows(self, benchmark: str) -> list[dict[str, Any]]:
        """The latest recorded checkpoint of each iteration."""
        df = self.query(
            "SELECT * FROM checkpoints WHERE benchmark = ? QUALIFY row_number() OVER "
            "(PARTITION BY iteration ORDER BY created_at DESC) = 1 ORDER BY iteration",
            [benchmark],
        )
        return list(df.iter_rows(named=True))

    def rollout_summary(self, benchmark: str) -> list[dict[str, Any]]:
        """Per iteration k: training rollouts played, successes, errored, tasks tried and solved."""
        df = self.query(
            "SELECT iteration, count(*) AS episodes, count(*) FILTER (WHERE status = 'ok' AND success) AS successes, "
            "count(*) FILTER (WHERE status <> 'ok') AS errored, count(DISTINCT task_id) AS tasks, "
            "count(DISTINCT task_id) FILTER (WHERE status = 'ok' AND success) AS tasks_solved, "
            "sum(prompt_tokens + completion_tokens) AS tokens "
            "FROM trajectories WHERE benchmark = ? AND source = 'policy' AND split = 'train' "
            "GROUP BY iteration ORDER BY iteration",
            [benchmark],
        )
        return list(df.iter_rows(named=True))

    def rollout_task_outcomes(self, benchmark: str, iteration: int) -> dict[str, tuple[int, int]]:
        """(attempts, successes) per training task in iteration k's rollouts (errored excluded)."""
        df = self.query(
            "SELECT task_id, count(*) AS attempts, count(*) FILTER (WHERE success) AS successes FROM trajectories "
            "WHERE benchmark = ? AND iteration = ? AND source = 'policy' AND split = 'train' AND status = 'ok' "
            "GROUP BY task_id",
            [benchmark, iteration],
        )
        return {r["task_id"]: (int(r["attempts"]), int(r["successes"])) for r in df.iter_rows(named=True)}

    def seed_task_ids(self, benchmark: str) -> list[str]:
        """Training tasks covered by a teacher (seed) trajectory."""
        df = self.query(
            "SELECT DISTINCT task_id FROM trajectories WHERE benchmark = ? AND source = 'teacher' ORDER BY 1", [benchmark]
        )
        return df["task_id"].to_list()

    def gated_growth(self, benchmark: str) -> list[dict[str, Any]]:
        """The `gated_growth` view for one benchmark: candidates, new successes and running total per gate."""
        return list(self.query("SELECT * FROM gated_growth WHERE benchmark = ? ORDER BY iteration",
                               [benchmark]).iter_rows(named=True))

    def trajectory_benchmarks(self) -> list[str]:
        """Benchmarks with at least one trajectory in the store."""
        return self.query("SELECT DISTINCT benchmark FROM trajectories ORDER BY 1")["benchmark"].to_list()

    def teacher_models(self) -> list[str]:
        """The models whose answers the teacher cache holds (none for a scripted teacher)."""
        df = self.query("SELECT DISTINCT model FROM teacher_cache WHERE model IS NOT NULL ORDER BY 1")
        return df["model"].to_list()

    def task_ids_gated_at(self, benchmark: str, iteration: int) -> list[str]:
        """Distinct tasks of the trajectories gate k let through."""
        df = self.query(
            "SELECT DISTINCT task_id FROM gated WHERE benchmark = ? AND iteration = ? ORDER BY 1", [benchmark, iteration]
        )
        return df["task_id"].to_list()
