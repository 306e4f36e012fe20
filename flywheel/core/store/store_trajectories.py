"""The tasks, the trajectories and their steps: written in bulk, replaced by key or scope, read back whole or as
the counts reports and the loop need.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import duckdb
import polars as pl

from flywheel.core.store.store_connection import StoreConnection, encodable, utc_now, where_sql
from flywheel.core.trajectory import Step, Trajectory


def _delete_scope(con: duckdb.DuckDBPyConnection, scope: dict[str, Any]) -> None:
    """Delete a scope's trajectories and their steps, inside the caller's transaction."""
    if not scope:
        raise ValueError("refusing to delete with an empty scope (it would delete every trajectory)")
    where, params = where_sql(scope), list(scope.values())
    con.execute(f"DELETE FROM steps WHERE traj_id IN (SELECT traj_id FROM trajectories WHERE {where})", params)
    con.execute(f"DELETE FROM trajectories WHERE {where}", params)


class TrajectoryTables(StoreConnection):
    """Tasks, trajectories and steps."""

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

    @staticmethod
    def frames(trajs: Sequence[Trajectory], method: str = "bpo") -> tuple[pl.DataFrame, pl.DataFrame]:
        """Column-oriented frames for a bulk insert (one Arrow batch, not row-by-row)."""
        now = utc_now()
        traj_rows, step_rows = [], []
        for tr in trajs:
            tid = tr.traj_id
            traj_rows.append(
                (tid, tr.benchmark, tr.split, tr.iteration, tr.source, tr.task_id, tr.sample, encodable(tr.goal),
                 tr.success, float(tr.reward), len(tr.steps), tr.status, encodable(tr.error),
                 sum(s.prompt_tokens for s in tr.steps), sum(s.completion_tokens for s in tr.steps),
                 tr.model_id, now, method)
            )
            for t, s in enumerate(tr.steps):
                step_rows.append(
                    (tid, t, encodable(s.observation), encodable(s.thought), encodable(s.plan), encodable(s.action),
                     encodable(s.next_observation),
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

    def copy_episodes(self, src: TrajectoryTables, *, benchmark: str, iteration: int, checkpoint_id: str,
                      splits: Sequence[str], tag: str | None = None) -> int:
        """Copy `src`'s finished policy episodes of checkpoint `checkpoint_id` at `iteration` (under whatever
        settings tag: `id` or `id#hash`; only `tag` where given) in `splits` whose (split, task, sample) this
        store lacks; returns how many. Only for stores whose checkpoint `checkpoint_id` is the same weights
        (arms sharing a k=0 checkpoint): each copied episode keeps its tag, so a partition played under other
        settings still replays it (plan_resume)."""
        scope = "benchmark = ? AND iteration = ? AND source = 'policy'"
        here = self.query(f"SELECT split, task_id, sample FROM trajectories WHERE {scope}", [benchmark, iteration])
        mine = {(r["split"], r["task_id"], r["sample"]) for r in here.iter_rows(named=True)}
        played_by = "model_id = ?" if tag else "(model_id = ? OR starts_with(model_id, ?))"
        theirs = src.query(f"SELECT traj_id, split, task_id, sample FROM trajectories WHERE {scope} AND status = 'ok' "
                           f"AND {played_by} AND split IN (SELECT unnest(?))",
                           [benchmark, iteration, *([tag] if tag else [checkpoint_id, f"{checkpoint_id}#"]), list(splits)])
        wanted = [r["traj_id"] for r in theirs.iter_rows(named=True)
                  if (r["split"], r["task_id"], r["sample"]) not in mine]
        return self.write_trajectories(src.load_trajectories(wanted)) if wanted else 0

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
        where = where_sql(scope)
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

    def step_tokens(self, benchmark: str, iteration: int, split: str) -> list[dict[str, Any]]:
        """Per evaluation episode of checkpoint k (sample 0, not errored): steps, prompt and completion tokens."""
        df = self.query(
            "SELECT task_id, steps, prompt_tokens, completion_tokens, success FROM trajectories WHERE benchmark = ? "
            "AND iteration = ? AND split = ? AND source = 'policy' AND status = 'ok' AND sample = 0 ORDER BY task_id",
            [benchmark, iteration, split])
        return list(df.iter_rows(named=True))

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

    def trajectory_benchmarks(self) -> list[str]:
        """Benchmarks with at least one trajectory in the store."""
        return self.query("SELECT DISTINCT benchmark FROM trajectories ORDER BY 1")["benchmark"].to_list()
