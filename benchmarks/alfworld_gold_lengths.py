"""Gold-path lengths of ALFWorld games per task type and split: what sizes a CPU preset (`cpu-alfworld`).

    .venv/bin/python benchmarks/alfworld_gold_lengths.py

The length is the game's shipped PDDL walkthrough (the planner's shortest winning path, the same number
`AlfWorldSpec.gold_length` grades complexity by); the ETO splits: seen = valid_seen (140), unseen = the 134
games of the ETO unseen list. Prints a table and writes benchmarks/results/alfworld_gold_lengths.json.
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


if __name__ == "__main__":
    main()
