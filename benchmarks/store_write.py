"""Benchmark 5: write and read back one iteration's rollouts (10,000 steps) in DuckDB.

Store.write_trajectories (one Arrow batch per table, one transaction) vs a naive
row-by-row INSERT per step, in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import print_table, write_json

from flywheel.core.store import STEP_COLUMNS, Store
from flywheel.core.trajectory import Step, Trajectory


def rollouts(n_steps: int, steps_per_traj: int = 20) -> list[Trajectory]:
    obs = "This room is called the kitchen. In it, you see: a counter, a sink, a fridge. " * 4
    trajs = []
    for i in range(n_steps // steps_per_traj):
        steps = [Step(observation=obs, thought="A long thought about the kitchen. " * 6, plan="Open the fridge.",
                      action=f"open fridge {t}", next_observation=obs, prompt_tokens=700, completion_tokens=90)
                 for t in range(steps_per_traj)]
        trajs.append(Trajectory(benchmark="bench", split="train", task_id=f"task-{i}", source="policy",
                                iteration=1, sample=i % 4, goal="g", steps=steps, success=i % 3 == 0))
    return trajs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args(argv)
    trajs = rollouts(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        db = Store(Path(tmp) / "fast.duckdb")
        t0 = time.perf_counter()
        db.write_trajectories(trajs, replace_scope={"benchmark": "bench", "iteration": 1})
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = db.load_trajectories(benchmark="bench", iteration=1)
        read_s = time.perf_counter() - t0
        assert sum(len(t.steps) for t in back) == args.steps

        naive = Store(Path(tmp) / "naive.duckdb")
        _, steps_df = Store.frames(trajs)
        t0 = time.perf_counter()
        with naive.connect() as con:
            sql = f"INSERT INTO steps VALUES ({', '.join('?' for _ in STEP_COLUMNS)})"
            for row in steps_df.iter_rows():
                con.execute(sql, list(row))
        naive_s = time.perf_counter() - t0
    rows = [
        ["Store.write_trajectories (Arrow batch, 1 txn)", f"{write_s:.3f}", f"{args.steps / write_s:,.0f}"],
        ["naive row-by-row INSERT (steps only)", f"{naive_s:.3f}", f"{args.steps / naive_s:,.0f}"],
        ["read back (load_trajectories)", f"{read_s:.3f}", f"{args.steps / read_s:,.0f}"],
    ]
    print_table(f"DuckDB store: one iteration's rollouts ({args.steps:,} steps, {len(trajs)} trajectories)",
                ["operation", "seconds", "steps/s"], rows)
    print(f"speed-up vs naive: {naive_s / write_s:.1f}x; target: whole write < 1 s -> {'met' if write_s < 1 else 'MISSED'}")
    write_json("store_write", {"steps": args.steps, "write_s": write_s, "read_s": read_s, "naive_row_by_row_s": naive_s,
                               "speedup": naive_s / write_s, "target_write_under_1s": write_s < 1})
    return 0


if __name__ == "__main__":
    sys.exit(main())
