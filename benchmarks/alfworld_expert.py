"""How many ALFWorld games each expert source solves: handcoded expert vs walkthrough.

    .venv/bin/python -m benchmarks.alfworld_expert --split train --sample 100 --jobs 2
    .venv/bin/python -m benchmarks.alfworld_expert --split train --all --jobs 2   # ~1.5 h on 2 cores

Writes benchmarks/results/alfworld_expert.json (one entry per split/sample
setting, so a full run and a sample run can live side by side). The expert is
run with and without the adapter's move-tracking fix when `--compare-unfixed`.
Per-game results are appended to <cache>/alfworld_expert_bench_*.jsonl, so an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from envs.alfworld.data import alfworld_root, game_file, load_index, load_traj_data
from envs.alfworld.tasks import DEFAULT_MAX_STEPS, split_folder, task_type_of
from envs.alfworld.worker import WorkerClient
from envs.data import cache_dir

RESULTS = Path(__file__).resolve().parent / "results" / "alfworld_expert.json"


def run_games(
    game_ids: list[str], folder: str, *, jobs: int, fix_move_tracking: bool, seed: int
) -> dict[str, dict[str, Any]]:
    """game id -> expert.solve result, computed in `jobs` recycled workers."""
    root = alfworld_root()
    index = load_index(root)[folder]
    local = threading.local()
    workers: list[WorkerClient] = []

    def one(game_id: str) -> tuple[str, dict[str, Any]]:
        if not hasattr(local, "worker"):
            local.worker = WorkerClient(recycle_every=50, timeout_s=900)
            workers.append(local.worker)
        path = game_file(root, folder, game_id)
        local.worker.begin_episode()
        result = local.worker.call(
            "expert",
            game_file=str(path),
            traj_data=load_traj_data(path),
            walkthrough=index[game_id]["walkthrough"],
            options={"seed": seed, "fix_move_tracking": fix_move_tracking},
        )
        return game_id, result

    log = cache_dir() / f"alfworld_expert_bench_{folder}_seed{seed}_fix{int(fix_move_tracking)}.jsonl"
    done = _read_log(log)
    todo = [game_id for game_id in game_ids if game_id not in done]
    random.Random(seed).shuffle(todo)  # so an interrupted run's games are a fair sample of all types
    print(f"  {len(game_ids) - len(todo)} games already in {log.name}, {len(todo)} to run", flush=True)
    started = time.time()
    with ThreadPoolExecutor(max_workers=jobs) as pool, log.open("a") as out:
        for n, (game_id, result) in enumerate(pool.map(one, todo), 1):
            done[game_id] = result
            out.write(json.dumps({"game_id": game_id, **result}) + "\n")
            out.flush()
            if n % 25 == 0:
                print(f"  {n}/{len(todo)} games, {time.time() - started:.0f}s", flush=True)
    for worker in workers:
        worker.stop()
    return {game_id: done[game_id] for game_id in game_ids}


def _read_log(log: Path) -> dict[str, dict[str, Any]]:
    """Per-game results of earlier (possibly interrupted) runs, so long runs can resume."""
    if not log.exists():
        return {}
    done = {}
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        done[record.pop("game_id")] = record
    return done


def summarize(results: dict[str, dict[str, Any]], walkthroughs: dict[str, Any], limit: int) -> dict[str, Any]:
    """Solve counts overall and per task type."""
    per_type: dict[str, Counter[str]] = defaultdict(Counter)
    lengths = []
    for game_id, result in results.items():
        expert, walk = result["handcoded"], walkthroughs[game_id]["walkthrough"]
        counts = per_type[task_type_of(game_id)]
        counts["games"] += 1
        counts["handcoded_won"] += expert["won"]
        counts[f"handcoded_won_within_{limit}"] += expert["won"] and len(expert["actions"]) <= limit
        counts["walkthrough_won"] += result["walkthrough_won"]
        ok_expert = expert["won"] and len(expert["actions"]) <= limit
        ok_walk = result["walkthrough_won"] and len(walk) <= limit
        counts["chosen_handcoded"] += ok_expert
        counts["chosen_walkthrough"] += (not ok_expert) and ok_walk
        counts["unsolved"] += not (ok_expert or ok_walk)
        if expert["won"]:
            lengths.append(len(expert["actions"]))
    total: Counter[str] = Counter()
    for counts in per_type.values():
        total.update(counts)
    return {
        "total": dict(total),
        "per_task_type": {k: dict(v) for k, v in sorted(per_type.items())},
        "handcoded_len_mean": round(statistics.mean(lengths), 2) if lengths else None,
        "handcoded_len_max": max(lengths) if lengths else None,
        "handcoded_failures": {
            game_id: r["handcoded"]["stopped"] for game_id, r in sorted(results.items()) if not r["handcoded"]["won"]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--split", default="train")
    parser.add_argument("--sample", type=int, default=100, help="random sample size (ignored with --all)")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-unfixed", action="store_true")
    parser.add_argument("--from-log", action="store_true", help="summarize only games already run (a partial run)")
    args = parser.parse_args()

    folder = split_folder(args.split)
    games = load_index(alfworld_root())[folder]
    ids = sorted(games)
    if not args.all:
        ids = sorted(random.Random(args.seed).sample(ids, min(args.sample, len(ids))))
    key = f"{args.split}:{'all' if args.all else f'sample{len(ids)}_seed{args.seed}'}"
    if args.from_log:
        logged = _read_log(cache_dir() / f"alfworld_expert_bench_{folder}_seed{args.seed}_fix1.jsonl")
        ids = [game_id for game_id in ids if game_id in logged]
        key += f":partial{len(ids)}"
    print(f"{key}: {len(ids)} games")

    started = time.time()
    entry: dict[str, Any] = {"games": len(ids), "step_limit": DEFAULT_MAX_STEPS}
    fixed = run_games(ids, folder, jobs=args.jobs, fix_move_tracking=True, seed=args.seed)
    entry["expert_with_move_fix"] = summarize(fixed, games, DEFAULT_MAX_STEPS)
    if args.compare_unfixed:
        raw = run_games(ids, folder, jobs=args.jobs, fix_move_tracking=False, seed=args.seed)
        entry["expert_as_shipped"] = summarize(raw, games, DEFAULT_MAX_STEPS)
    entry["wall_s"] = round(time.time() - started, 1)

    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing[key] = entry
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps({k: v for k, v in entry.items() if k != "per_task_type"}, indent=2)[:3000])


if __name__ == "__main__":
    main()
