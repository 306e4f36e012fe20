"""Step latency of the WebShop text env, replaying the expert on test and train goals.

Usage: python benchmarks/webshop_speed.py [--goals N]
Writes benchmarks/results/webshop_speed.json (latencies in milliseconds).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

from envs.webshop import WebShopSpec
from envs.webshop.env import parse_action as parse

OUT = Path(__file__).resolve().parent / "results" / "webshop_speed.json"


def _kind(action: str) -> str:
    name, arg = parse(action)
    if name == "search":
        return "search"
    return {"buy now": "buy", "next >": "next_page"}.get(arg or "", "click")


def _summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {
        "n": len(ms),
        "mean_ms": round(statistics.fmean(ms), 3),
        "p50_ms": round(ms[len(ms) // 2], 3),
        "p95_ms": round(ms[int(len(ms) * 0.95) - 1 if len(ms) > 1 else 0], 3),
        "max_ms": round(ms[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--goals", type=int, default=0, help="goals to replay (0 = all test + train)")
    args = parser.parse_args()

    spec = WebShopSpec()
    t0 = time.perf_counter()
    catalog = spec.catalog
    t_catalog = time.perf_counter() - t0
    t0 = time.perf_counter()
    _ = catalog.search_engine  # builds the index
    t_index = time.perf_counter() - t0

    tasks = spec.load_tasks("unseen") + spec.load_tasks("train")
    if args.goals:
        tasks = tasks[: args.goals]
    env = spec.make_env()
    resets: list[float] = []
    steps: dict[str, list[float]] = defaultdict(list)
    successes = 0
    for task in tasks:
        actions = spec.expert_actions(task)
        t0 = time.perf_counter()
        env.reset(task)
        resets.append(time.perf_counter() - t0)
        result = None
        for action in actions:
            t0 = time.perf_counter()
            result = env.step(action)
            steps[_kind(action)].append(time.perf_counter() - t0)
        successes += bool(result and result.success)

    all_steps = [v for vs in steps.values() for v in vs]
    report = {
        "catalog": catalog.name,
        "catalog_fingerprint": catalog.fingerprint,
        "products": len(catalog.products),
        "episodes": len(tasks),
        "expert_successes": successes,
        "expert_query_kinds": spec.expert_stats(),
        "catalog_load_s": round(t_catalog, 3),
        "index_build_s": round(t_index, 3),
        "reset": _summary(resets),
        "step_all": _summary(all_steps),
        "step_by_action": {k: _summary(v) for k, v in sorted(steps.items())},
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
