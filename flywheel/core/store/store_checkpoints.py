"""Checkpoints and what each trained on: its exact (prompt, completion) pairs, and the baselines' DPO preference pairs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from flywheel.core.store.store_connection import StoreConnection, encodable, utc_now
from flywheel.core.store.store_schema import expected_columns


def _write_examples(con: duckdb.DuckDBPyConnection, checkpoint_id: str, benchmark: str, iteration: int,
                    rows: Sequence[dict[str, Any]]) -> None:
    """Replace a checkpoint's training pairs, inside the caller's transaction."""
    df = pl.DataFrame(
        {"checkpoint_id": [checkpoint_id] * len(rows), "position": list(range(len(rows))),
         "benchmark": [benchmark] * len(rows), "iteration": [iteration] * len(rows),
         "traj_id": [r.get("traj_id") for r in rows], "task_id": [r.get("task_id") for r in rows],
         "t": [r.get("t") for r in rows],
         "prompt": [encodable(json.dumps(r["prompt"], ensure_ascii=False)) for r in rows],
         "completion": [encodable(json.dumps(r["completion"], ensure_ascii=False)) for r in rows],
         "kept": [bool(r.get("kept", True)) for r in rows], "created_at": [utc_now()] * len(rows)},
        schema={"checkpoint_id": pl.Utf8, "position": pl.Int32, "benchmark": pl.Utf8, "iteration": pl.Int32,
                "traj_id": pl.Utf8, "task_id": pl.Utf8, "t": pl.Int32, "prompt": pl.Utf8, "completion": pl.Utf8,
                "kept": pl.Boolean, "created_at": pl.Datetime("us")},
    )
    con.execute("DELETE FROM training_examples WHERE checkpoint_id = ?", [checkpoint_id])
    con.register("new_examples", df.to_arrow())
    con.execute("INSERT INTO training_examples SELECT * FROM new_examples")
    con.unregister("new_examples")


class CheckpointTables(StoreConnection):
    """Checkpoints, their training pairs, and preference pairs."""

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

    def record_checkpoint(self, row: dict[str, Any], training_examples: Sequence[dict[str, Any]] | None = None) -> None:
        """Record a checkpoint; with `training_examples` (its pairs, as `write_training_examples` takes them) in
        the same transaction: a kill leaves both or neither."""
        row = {"method": self.method, **row, "lineage": json.dumps(row.get("lineage", {}), default=str),
               "created_at": utc_now()}
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

    def checkpoint_rows(self, benchmark: str) -> list[dict[str, Any]]:
        """The latest recorded checkpoint of each iteration."""
        df = self.query(
            "SELECT * FROM checkpoints WHERE benchmark = ? QUALIFY row_number() OVER "
            "(PARTITION BY iteration ORDER BY created_at DESC) = 1 ORDER BY iteration",
            [benchmark],
        )
        return list(df.iter_rows(named=True))

    def write_preference_pairs(self, benchmark: str, iteration: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace (benchmark, k)'s pairs; rows carry task_id, chosen_id, rejected_id, chosen_source and rewards."""
        now = utc_now()
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

    # -- the promotion gate (flywheel.assets.checks.check_promotion) ------------------------------
    def record_promotion(self, row: dict[str, Any]) -> None:
        """The promotion gate's decision on checkpoint k (one row per (benchmark, k), replaced on a re-run)."""
        cols = expected_columns()["promotions"]
        values = {**row, "created_at": utc_now()}
        with self.transaction() as con:
            con.execute("DELETE FROM promotions WHERE benchmark = ? AND iteration = ?", [row["benchmark"], row["iteration"]])
            con.execute(f"INSERT INTO promotions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [values.get(c) for c in cols])

    def promotions(self, benchmark: str) -> list[dict[str, Any]]:
        """The promotion gate's decisions by iteration ([] in a store written before the gate existed)."""
        try:
            df = self.query("SELECT * FROM promotions WHERE benchmark = ? ORDER BY iteration", [benchmark])
        except duckdb.CatalogException:  # a reader of an older store: the table is created by writers
            return []
        return list(df.iter_rows(named=True))
