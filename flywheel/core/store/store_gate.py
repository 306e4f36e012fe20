"""The reward gate's record: the trajectories each gate k let through, that it ran, its blocking check's verdict,
and what its cleaning cut of each success."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import duckdb
import polars as pl

from flywheel.core.store.store_connection import StoreConnection, encodable, utc_now


class GateTables(StoreConnection):
    """Gated trajectories, gate runs, gate checks and gate cleaning."""

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
            con.execute("INSERT INTO gate_runs VALUES (?, ?, ?, ?, ?)", [benchmark, iteration, candidates, len(rows), utc_now()])

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
                         encodable(problems[0]) if problems else None, utc_now()])

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

    def task_ids_gated_at(self, benchmark: str, iteration: int) -> list[str]:
        """Distinct tasks of the trajectories gate k let through."""
        df = self.query(
            "SELECT DISTINCT task_id FROM gated WHERE benchmark = ? AND iteration = ? ORDER BY 1", [benchmark, iteration]
        )
        return df["task_id"].to_list()

    def gated_iterations(self, benchmark: str) -> list[int]:
        """Iterations whose gate has run, whether or not anything passed."""
        df = self.query("SELECT iteration FROM gate_runs WHERE benchmark = ? ORDER BY 1", [benchmark])
        return df["iteration"].to_list()

    # -- cleaned successes: what the gate cut of each success (flywheel.core.cleaning) ----------------
    def write_gate_cleaning(self, benchmark: str, iteration: int, rows: Sequence[dict[str, Any]]) -> None:
        """Replace gate k's cleaning rows: traj_id, task_id, steps_before, steps_after, kept (the original's step
        indices SFT trains on), outcome (unchanged / cut / rejected) and admitted (it passed the gate)."""
        now = utc_now()
        with self.transaction() as con:
            con.execute("DELETE FROM gate_cleaning WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
            for r in rows:
                con.execute("INSERT INTO gate_cleaning VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [benchmark, iteration, r["traj_id"], r["task_id"], r["steps_before"], r["steps_after"],
                             json.dumps(list(r["kept"])), r["outcome"], bool(r["admitted"]), now])

    def gate_cleaning(self, benchmark: str, iteration: int) -> list[dict[str, Any]]:
        """Gate k's cleaning rows ([] for a gate that did not clean, or a store from before cleaning)."""
        try:
            df = self.query("SELECT traj_id, task_id, steps_before, steps_after, kept, outcome, admitted FROM gate_cleaning "
                            "WHERE benchmark = ? AND iteration = ? ORDER BY traj_id", [benchmark, iteration])
        except duckdb.CatalogException:  # a reader on a store written before the table existed
            return []
        return [{**r, "kept": json.loads(r["kept"])} for r in df.iter_rows(named=True)]

    def kept_steps(self, traj_ids: Sequence[str]) -> dict[str, tuple[int, list[int]]]:
        """traj_id -> (steps before, the step indices kept) of the gate's cleaning, for the admitted ones it cut."""
        if not traj_ids:
            return {}
        try:
            df = self.query("SELECT traj_id, steps_before, kept FROM gate_cleaning WHERE admitted AND outcome = 'cut' "
                            "AND traj_id IN (SELECT unnest(?))", [list(traj_ids)])
        except duckdb.CatalogException:
            return {}
        return {r["traj_id"]: (r["steps_before"], json.loads(r["kept"])) for r in df.iter_rows(named=True)}

    def gate_run(self, benchmark: str, iteration: int) -> dict[str, Any] | None:
        df = self.query("SELECT * FROM gate_runs WHERE benchmark = ? AND iteration = ?", [benchmark, iteration])
        return None if df.is_empty() else df.row(0, named=True)

    def gated_counts_by_task(self, benchmark: str, *, up_to_iteration: int) -> dict[str, int]:
        df = self.query(
            "SELECT task_id, count(*) AS n FROM gated WHERE benchmark = ? AND iteration <= ? GROUP BY 1",
            [benchmark, up_to_iteration],
        )
        return {r["task_id"]: r["n"] for r in df.iter_rows(named=True)}

    def gated_growth(self, benchmark: str) -> list[dict[str, Any]]:
        """The `gated_growth` view for one benchmark: candidates, new successes and running total per gate."""
        return list(self.query("SELECT * FROM gated_growth WHERE benchmark = ? ORDER BY iteration",
                               [benchmark]).iter_rows(named=True))
