"""Each checkpoint's evaluation per split, and its success by complexity bucket."""

from __future__ import annotations

from typing import Any

import duckdb

from flywheel.core.store.store_connection import StoreConnection, utc_now
from flywheel.core.store.store_schema import expected_columns


class EvaluationTables(StoreConnection):
    """Evaluations (and, read-only, the curriculum's eval buckets)."""

    def write_evaluation(self, row: dict[str, Any]) -> None:
        row = {**row, "created_at": utc_now()}
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
        numeric = [c for c in expected_columns()["evaluations"]
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
