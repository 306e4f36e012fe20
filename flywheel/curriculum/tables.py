"""The curriculum's own DuckDB tables, created beside the store's (CREATE TABLE IF NOT EXISTS).

- curriculum_proposals: every teacher proposal with its status and, when it was not kept, why.
- curriculum: the benchmark's stage-2 training order (seeds + synthetic), with both signals.
- training_order: the exact trajectory order each sft_checkpoint(b, k) trained on.
- gold_lengths: cached gold/expert path length of evaluation tasks.
- eval_buckets: success by complexity bucket per evaluated checkpoint and split.

Every write replaces its partition in one transaction, like the store's own writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import polars as pl

from flywheel.core.store import CURRICULUM_SCHEMA as SCHEMA
from flywheel.core.store import Store
from flywheel.curriculum.complexity import Complexity


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def ensure_tables(db: Store) -> None:
    with db.connect() as con:
        con.execute(SCHEMA)


def _replace(db: Store, table: str, scope: dict[str, Any], df: pl.DataFrame) -> None:
    ensure_tables(db)
    where = " AND ".join(f"{k} = ?" for k in scope)
    with db.transaction() as con:
        con.execute(f"DELETE FROM {table} WHERE {where}", list(scope.values()))
        if df.height:
            con.register("new_rows", df.to_arrow())
            con.execute(f"INSERT INTO {table} ({', '.join(df.columns)}) SELECT * FROM new_rows")
            con.unregister("new_rows")


def write_proposals(db: Store, benchmark: str, records: Sequence[dict[str, Any]]) -> None:
    now = _now()
    df = pl.DataFrame(
        [{
            "benchmark": benchmark, "proposal_id": r["proposal_id"], "proposer": r.get("proposer", ""),
            "kind": r.get("kind", ""), "params": json.dumps(r.get("params"), default=str, sort_keys=True),
            "rationale": r.get("rationale", ""), "status": r["status"], "reason": r.get("reason", ""),
            "task_id": r.get("task_id", ""), "length": r.get("length"), "created_at": now,
        } for r in records],
        schema={"benchmark": pl.Utf8, "proposal_id": pl.Utf8, "proposer": pl.Utf8, "kind": pl.Utf8,
                "params": pl.Utf8, "rationale": pl.Utf8, "status": pl.Utf8, "reason": pl.Utf8,
                "task_id": pl.Utf8, "length": pl.Int32, "created_at": pl.Datetime("us")},
    )
    _replace(db, "curriculum_proposals", {"benchmark": benchmark}, df)


def replace_synthetic_tasks(db: Store, benchmark: str, tasks: Sequence[Any]) -> None:
    """The benchmark's synthesized tasks (split "synthetic" of the store's `tasks` table), replaced as a whole."""
    with db.transaction() as con:
        con.execute("DELETE FROM tasks WHERE benchmark = ? AND split = 'synthetic'", [benchmark])
    db.upsert_tasks([{"benchmark": t.benchmark, "split": t.split, "task_id": t.task_id, "goal": t.goal,
                      "max_steps": t.max_steps, "meta": t.meta} for t in tasks])


def _complexity_frame(rows: Sequence[Complexity], extra: dict[str, Any]) -> pl.DataFrame:
    now = _now()
    return pl.DataFrame(
        [{**extra, "position": i, "traj_id": c.traj_id, "source": c.source, "length": c.length,
          "other_signal": c.other_signal, "score": c.score, "bucket": c.bucket, "created_at": now}
         for i, c in enumerate(rows)],
        schema={**{k: (pl.Int32 if isinstance(v, int) else pl.Utf8) for k, v in extra.items()},
                "position": pl.Int32, "traj_id": pl.Utf8, "source": pl.Utf8, "length": pl.Int32,
                "other_signal": pl.Float64, "score": pl.Float64, "bucket": pl.Utf8,
                "created_at": pl.Datetime("us")},
    )


def write_curriculum(db: Store, benchmark: str, ordered: Sequence[Complexity], *, other_signal: str, scorer: str) -> None:
    df = _complexity_frame(ordered, {"benchmark": benchmark})
    df = df.with_columns(
        pl.Series("task_id", [c.task_id for c in ordered], dtype=pl.Utf8),
        pl.lit(other_signal, dtype=pl.Utf8).alias("other_signal_name"),
        pl.lit(scorer, dtype=pl.Utf8).alias("scorer"),
    )
    _replace(db, "curriculum", {"benchmark": benchmark}, df)


def write_training_order(db: Store, benchmark: str, iteration: int, ordered: Sequence[Complexity], *, mode: str) -> None:
    df = _complexity_frame(ordered, {"benchmark": benchmark, "iteration": iteration})
    df = df.with_columns(pl.lit(mode, dtype=pl.Utf8).alias("mode"))
    _replace(db, "training_order", {"benchmark": benchmark, "iteration": iteration}, df)


def cached_gold_lengths(db: Store, benchmark: str, split: str) -> dict[str, int | None]:
    ensure_tables(db)
    df = db.query("SELECT task_id, length FROM gold_lengths WHERE benchmark = ? AND split = ?", [benchmark, split])
    return dict(df.iter_rows())


def write_gold_lengths(db: Store, benchmark: str, split: str, rows: Sequence[tuple[str, int | None, str]]) -> None:
    """Add (task_id, length or None, error) rows; existing rows of those tasks are replaced."""
    if not rows:
        return
    ensure_tables(db)
    now = _now()
    df = pl.DataFrame(
        [{"benchmark": benchmark, "split": split, "task_id": t, "length": n, "error": e, "created_at": now} for t, n, e in rows],
        schema={"benchmark": pl.Utf8, "split": pl.Utf8, "task_id": pl.Utf8, "length": pl.Int32, "error": pl.Utf8,
                "created_at": pl.Datetime("us")},
    )
    with db.transaction() as con:
        con.register("new_gold", df.to_arrow())
        con.execute("DELETE FROM gold_lengths WHERE benchmark = ? AND split = ? AND task_id IN (SELECT task_id FROM new_gold)",
                    [benchmark, split])
        con.execute("INSERT INTO gold_lengths SELECT * FROM new_gold")
        con.unregister("new_gold")


def write_eval_buckets(db: Store, benchmark: str, iteration: int, split: str, rows: Sequence[dict[str, Any]], checkpoint_id: str) -> None:
    now = _now()
    df = pl.DataFrame(
        [{"benchmark": benchmark, "iteration": iteration, "split": split, "bucket": r["bucket"], "lo": r["lo"],
          "hi": r["hi"], "episodes": r["episodes"], "successes": r["successes"], "success_rate": r["success_rate"],
          "mean_gold_length": r["mean_gold_length"], "checkpoint_id": checkpoint_id, "created_at": now} for r in rows],
        schema={"benchmark": pl.Utf8, "iteration": pl.Int32, "split": pl.Utf8, "bucket": pl.Utf8, "lo": pl.Float64,
                "hi": pl.Float64, "episodes": pl.Int32, "successes": pl.Int32, "success_rate": pl.Float64,
                "mean_gold_length": pl.Float64, "checkpoint_id": pl.Utf8, "created_at": pl.Datetime("us")},
    )
    _replace(db, "eval_buckets", {"benchmark": benchmark, "iteration": iteration, "split": split}, df)
