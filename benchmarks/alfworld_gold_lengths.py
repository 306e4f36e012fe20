"""Gold-path lengths of ALFWorld games per task type and split: what sizes a CPU preset (`cpu-alfworld`).

    .venv/bin/python benchmarks/alfworld_gold_lengths.py

The length is the game's shipped PDDL walkthrough (the planner's shortest winning path, the same number
`AlfWorldSpec.gold_length` grades complexity by); the ETO splits: seen = valid_seen (140), unseen = the 134
games of the ETO unseen list. Prints a table and writes benchmarks/results/alfworld_gold_lengths.json.

    .venv/bin/python benchmarks/alfworld_gold_lengths.py --expert [--types pick look clean] [--train 24]

`--expert` measures what an agent trained on the expert seeds actually walks: the handcoded expert's path
(it searches receptacles; the walkthrough knows where things are), per type on the seen and unseen games and
on the first `--train` training games of each type (the seeds a preset takes). These lengths size a preset's
`max_steps` and its SFT set (one example per step). About 1.5 s per game on the 2-core machine (a game's
reset dominates); paths are cached on disk. Writes benchmarks/results/alfworld_expert_lengths.json.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

from envs.alfworld.data import alfworld_root, load_index  # noqa: E402
from envs.alfworld.tasks import TASK_TYPES, eto_unseen_ids, task_type_of  # noqa: E402


def main() -> None:
    index = load_index(alfworld_root())
    unseen = set(eto_unseen_ids())
    splits = {"train": index["train"], "seen": index["valid_seen"],
              "unseen": {g: v for g, v in index["valid_unseen"].items() if g in unseen}}
    lengths: dict[tuple[str, str], list[int]] = defaultdict(list)
    for split, games in splits.items():
        for game_id, entry in games.items():
            lengths[(task_type_of(game_id), split)].append(len(entry["walkthrough"]))
    rows, out = [], []
    for kind in TASK_TYPES:
        for split in splits:
            xs = sorted(lengths[(kind, split)])
            if not xs:
                continue
            q = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
            row = {"type": kind, "split": split, "games": len(xs), "median": statistics.median(xs),
                   "p90": q[8], "max": xs[-1]}
            out.append(row)
            rows.append([kind, split, len(xs), row["median"], round(row["p90"], 1), row["max"]])
    print_table("ALFWorld gold-path (walkthrough) length per task type and split",
                ["type", "split", "games", "median", "p90", "max"], rows)
    write_json("alfworld_gold_lengths", {"rows": out})


def expert_lengths(types: list[str] | None, train: int, splits: tuple[str, ...] = ("train", "seen", "unseen"),
                   out_name: str = "alfworld_expert_lengths") -> None:
    from envs.alfworld import AlfWorldSpec
    from envs.alfworld.tasks import load_tasks, resolve_task_types

    wanted = resolve_task_types(types) or TASK_TYPES
    spec = AlfWorldSpec()
    unseen = set(eto_unseen_ids())
    rows, out = [], []
    try:
        for kind in wanted:
            for split in splits:
                tasks = load_tasks(split, task_types=(kind,), limit=train if split == "train" else None)
                if split == "unseen":
                    tasks = [t for t in tasks if t.task_id in unseen]
                records = [spec.expert_result(t) for t in tasks]
                xs = sorted(len(r["actions"]) for r in records)
                if not xs:
                    continue
                q = statistics.quantiles(xs, n=20) if len(xs) > 1 else [xs[0]] * 19
                row = {"type": kind, "split": split, "games": len(xs), "mean": round(statistics.mean(xs), 1),
                       "median": statistics.median(xs), "p90": q[17], "p95": q[18], "max": xs[-1],
                       "walkthrough_used": sum(r["source"] != "handcoded" for r in records)}
                out.append(row)
                rows.append([kind, split, len(xs), row["mean"], row["median"], round(row["p90"], 1),
                             round(row["p95"], 1), row["max"], row["walkthrough_used"]])
    finally:
        spec.close()
    print_table("ALFWorld expert path length (handcoded expert, walkthrough where it fails) per task type and split",
                ["type", "split", "games", "mean", "median", "p90", "p95", "max", "walkthrough used"], rows)
    write_json(out_name, {"train_games_per_type": train, "splits": list(splits), "rows": out})


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expert", action="store_true", help="the handcoded expert's path lengths (runs the games)")
    ap.add_argument("--types", nargs="*", default=None, help="task types or aliases (default: all six)")
    ap.add_argument("--train", type=int, default=24, help="training games per type, with --expert")
    ap.add_argument("--splits", nargs="*", default=["train", "seen", "unseen"], choices=["train", "seen", "unseen"],
                    help="splits measured, with --expert")
    ap.add_argument("--out", default="alfworld_expert_lengths", help="results file name (under benchmarks/results), "
                    "with --expert")
    args = ap.parse_args()
    expert_lengths(args.types, args.train, tuple(args.splits), args.out) if args.expert else main()
