"""The living loop's record: what each iteration's gate added, the one decision claimed per iteration, the
claimed start of iteration 0, and per-task attempt stats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from flywheel.core.store.store_connection import StoreConnection, utc_now
from flywheel.core.store.store_schema import ITERATION_DECISION_COLUMNS


class LoopTables(StoreConnection):
    """Iterations, loop starts and task stats."""

    def record_gate_stats(
        self, benchmark: str, iteration: int, *, candidates: int, new_unique_successes: int,
        gated_total: int, capped_dropped: int = 0,
    ) -> None:
        """What the gate of (benchmark, k) added. A new gate result clears k's decision: the
        loop decides again on the new data."""
        cols = ["benchmark", "iteration", "candidates", "new_unique_successes", "capped_dropped", "gated_total", "gate_at"]
        vals = [benchmark, iteration, candidates, new_unique_successes, capped_dropped, gated_total, utc_now()]
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
                [*row.values(), utc_now(), benchmark, iteration],
            )
        return True

    def claim_start(self, benchmark: str, run_key: str, claimed_by: str) -> bool:
        """Claim the launch of iteration 0 (run_key names the bootstrap it follows); True once."""
        with self.transaction() as con:
            if con.execute("SELECT 1 FROM loop_starts WHERE benchmark = ? AND run_key = ?", [benchmark, run_key]).fetchall():
                return False
            con.execute("INSERT INTO loop_starts VALUES (?, ?, ?, ?)", [benchmark, run_key, claimed_by, utc_now()])
        return True

    def clear_decision(self, benchmark: str, iteration: int) -> None:
        clear = ", ".join(f"{c} = NULL" for c in ITERATION_DECISION_COLUMNS + ["decided_at"])
        with self.transaction() as con:
            con.execute(f"UPDATE iterations SET {clear} WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])

    def iterations(self, benchmark: str) -> pl.DataFrame:
        return self.query("SELECT * FROM iterations WHERE benchmark = ? ORDER BY iteration", [benchmark])

    def write_task_stats(self, benchmark: str, iteration: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace (benchmark, k)'s per-task attempts/successes/errored."""
        df = pl.DataFrame(
            {"benchmark": [benchmark] * len(rows), "iteration": [iteration] * len(rows),
             "task_id": [r["task_id"] for r in rows], "attempts": [int(r["attempts"]) for r in rows],
             "successes": [int(r["successes"]) for r in rows], "errored": [int(r.get("errored", 0)) for r in rows],
             "created_at": [utc_now()] * len(rows)},
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
