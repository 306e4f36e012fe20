"""ALFWorld adapter speed and memory: step latency, and worker RSS with/without recycling.

Usage: python benchmarks/alfworld_speed.py [--latency-games 20] [--episodes 200] [--recycle-every 50]
Writes benchmarks/results/alfworld_speed.json (latencies in ms, memory in MiB).
Latency is measured through `AlfWorldEnv`, i.e. including the worker round trip,
with random admissible actions (seeded). Memory plays `--episodes` different
train games (reset + a few random actions each) and samples the worker's RSS.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

from envs.alfworld import SPEC, AlfWorldEnv
from envs.alfworld.data import alfworld_root

OUT = Path(__file__).resolve().parent / "results" / "alfworld_speed.json"


def _stats(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values_s)
    return {
        "n": len(ms),
        "mean_ms": round(statistics.mean(ms), 1),
        "p50_ms": round(ms[len(ms) // 2], 1),
        "p95_ms": round(ms[int(len(ms) * 0.95)], 1),
        "max_ms": round(ms[-1], 1),
    }


def latency(games: int, steps: int, seed: int) -> dict[str, Any]:
    """Reset and step times over `games` unseen games with random admissible actions."""
    rng = random.Random(seed)
    tasks = rng.sample(SPEC.load_tasks("unseen"), games)
    resets, step_times = [], []
    by_verb: dict[str, list[float]] = defaultdict(list)
    invalid = 0
    with AlfWorldEnv(admissible_commands=True) as env:
        env.reset(tasks[0])  # worker start-up is not a reset
        for task in tasks:
            started = time.perf_counter()
            env.reset(task)
            resets.append(time.perf_counter() - started)
            commands = env.admissible()
            for _ in range(steps):
                action = rng.choice(commands) if rng.random() > 0.1 else "jump around"
                started = time.perf_counter()
                result = env.step(action)
                elapsed = time.perf_counter() - started
                step_times.append(elapsed)
                by_verb["invalid" if result.info["invalid"] else action.split()[0]].append(elapsed)
                invalid += result.info["invalid"]
                commands = result.info["admissible_commands"]
                if result.done:
                    break
    return {
        "games": games,
        "reset": _stats(resets),
        "step_all": _stats(step_times),
        "step_by_verb": {verb: _stats(times) for verb, times in sorted(by_verb.items())},
        "invalid_steps": invalid,
    }


def memory(episodes: int, steps: int, recycle_every: int | None, seed: int) -> dict[str, Any]:
    """Worker RSS while playing `episodes` different train games."""
    rng = random.Random(seed)
    tasks = rng.sample(SPEC.load_tasks("train"), episodes)
    samples: list[tuple[int, float]] = []
    started = time.time()
    with AlfWorldEnv(admissible_commands=True, recycle_every=recycle_every, max_rss_mb=None) as env:
        for n, task in enumerate(tasks, 1):
            env.reset(task)
            commands = env.admissible()
            for _ in range(steps):
                result = env.step(rng.choice(commands))
                commands = result.info["admissible_commands"]
                if result.done:
                    break
            samples.append((n, round(env.worker.rss_mb(), 1)))
        recycles = env.worker.recycles
    rss = [mb for _, mb in samples]
    marks = {str(n): mb for n, mb in samples if n in (1, 10, 50, 100, 134, 150, 200) or n == episodes}
    return {
        "recycle_every": recycle_every,
        "episodes": episodes,
        "recycles": recycles,
        "rss_mb_at_episode": marks,
        "rss_mb_max": max(rss),
        "rss_mb_mean": round(statistics.mean(rss), 1),
        "parent_rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "wall_s": round(time.time() - started, 1),
        "rss_trace": samples[:: max(1, episodes // 40)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency-games", type=int, default=20)
    parser.add_argument("--latency-steps", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--memory-steps", type=int, default=5)
    parser.add_argument("--recycle-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.time()
    alfworld_root()  # unpack (if needed) outside the timings
    report: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(), "platform": platform.platform()},
        "latency": latency(args.latency_games, args.latency_steps, args.seed),
    }
    print(json.dumps(report["latency"]["step_all"]), json.dumps(report["latency"]["reset"]), flush=True)
    for label, every in (("without_recycling", None), ("with_recycling", args.recycle_every)):
        report[label] = memory(args.episodes, args.memory_steps, every, args.seed)
        print(label, json.dumps({k: v for k, v in report[label].items() if k != "rss_trace"}), flush=True)
    report["wall_s"] = round(time.time() - started, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
