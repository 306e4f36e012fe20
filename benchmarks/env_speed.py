"""Environment step speed and memory. One function per benchmark section.

Usage: .venv/bin/python benchmarks/env_speed.py [--quick]
Writes benchmarks/results/env_speed.json. Other benchmarks (ALFWorld, WebShop) live in their
own scripts and can reuse `_common` for tables and JSON.

ScienceWorld sections
- speed: the same action sequences (gold paths of short tasks + random valid-action episodes)
  through the package's own reset()/step() ("stock") and the adapter's fast path; median
  ms/step, ratio, and an equality check of (observation, score, done, completed) per step.
  Both run in deterministic mode (see envs/scienceworld/adapter.py), where the engine is a
  function of the action sequence, so equality is exact; the fast path's cost of determinism
  is shown against a non-deterministic fast env.
- memory: peak JVM RSS of one env on one workload (gold paths + random episodes, valid actions
  listed every step), with the package's JVM options (no heap cap) vs the adapter's -Xmx512m
  (G1 and the default serial GC); and how many such envs fit in 24 GiB.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_ms, print_table, write_json  # noqa: E402

from envs.base import StepResult, Task  # noqa: E402
from envs.scienceworld import SPEC, ScienceWorldEnv  # noqa: E402

GOLD_TYPES = ("find-non-living-thing", "lifespan-longest-lived", "find-animal", "power-component",
              "chemistry-mix-paint-secondary-color", "use-thermometer", "boil")
RANDOM_TYPES = ("find-plant", "test-conductivity", "grow-plant", "melt")
BUDGET_GIB = 24


def _first_of_type(split: str, task_type: str) -> Task:
    return SPEC.load_tasks(split, limit=1, task_types=(task_type,))[0]


def _random_actions(env: ScienceWorldEnv, task: Task, steps: int, seed: int) -> list[str]:
    """Random valid actions, never focus (irreversible) or reset task (restarts the episode)."""
    rng = random.Random(seed)
    env.reset(task)
    actions: list[str] = []
    for _ in range(steps):
        action = rng.choice([a for a in env.valid_actions() if not a.startswith(("focus on", "reset"))])
        actions.append(action)
        if env.step(action).done:
            break
    return actions


def _play(env: ScienceWorldEnv, task: Task, actions: list[str]) -> tuple[list[float], list[tuple], float]:
    t0 = time.perf_counter()
    first = env.reset(task)
    reset_s = time.perf_counter() - t0
    times, trace = [], [(first,)]
    for action in actions:
        t0 = time.perf_counter()
        r = env.step(action)
        times.append(time.perf_counter() - t0)
        trace.append((r.observation, r.info["score"], r.done, r.info["completed"]))
    return times, trace, reset_s


class _PackageAsShipped:
    """`scienceworld.ScienceWorldEnv` exactly as pip ships it: its own JVM launch (default heap and
    GC, no determinism flags) and its own reset()/step(). Timed only: its worlds are not
    reproducible, so the equality check runs against the adapter's stock path instead."""

    def __init__(self) -> None:
        from scienceworld import ScienceWorldEnv as PackageEnv

        self.env = PackageEnv(envStepLimit=10**9)

    def reset(self, task: Task) -> str:
        meta = task.meta
        self.env.load(meta["task_name"], meta["variation"], meta.get("simplification", "easy"))
        obs, _ = self.env.reset()
        return obs

    def step(self, action: str) -> StepResult:
        obs, _, done, info = self.env.step(action)
        return StepResult(obs, info["score"] / 100, done, False, {"score": info["score"], "completed": done})

    def close(self) -> None:
        self.env.close()


def scienceworld_speed(quick: bool) -> dict[str, Any]:
    gold_types = GOLD_TYPES[:3] if quick else GOLD_TYPES
    random_types = RANDOM_TYPES[:1] if quick else RANDOM_TYPES
    random_steps = 15 if quick else 40
    variants = {
        "stock": ScienceWorldEnv(fast=False),
        "fast": ScienceWorldEnv(),
        "fast_nondeterministic": ScienceWorldEnv(deterministic=False),
        "package_as_shipped": _PackageAsShipped(),
    }
    fast = variants["fast"]
    try:
        episodes: list[tuple[str, Task, list[str]]] = []
        for task_type in gold_types:
            task = _first_of_type("seen", task_type)
            episodes.append(("gold", task, fast.expert_actions(task)))
        for i, task_type in enumerate(random_types):
            task = _first_of_type("seen", task_type)
            episodes.append(("random", task, _random_actions(fast, task, random_steps, seed=i)))
        for env in variants.values():  # JIT warm-up: one untimed pass over every episode
            for _, task, actions in episodes:
                _play(env, task, actions)

        times: dict[str, list[float]] = {name: [] for name in variants}
        resets: dict[str, list[float]] = {name: [] for name in variants}
        rows, per_episode = [], []
        all_equal = True
        for kind, task, actions in episodes:
            traces, medians = {}, {}
            for name, env in variants.items():  # interleaved, so drift hits all variants alike
                step_s, traces[name], reset_s = _play(env, task, actions)
                times[name] += step_s
                resets[name].append(reset_s)
                medians[name] = median_ms(step_s)
            equal = traces["stock"] == traces["fast"]
            traces.pop("package_as_shipped")
            all_equal &= equal
            per_episode.append({"task": task.task_id, "kind": kind, "steps": len(actions),
                                "median_ms": medians, "fast_equals_stock": equal})
            rows.append((task.task_id, kind, len(actions), *medians.values(), "pass" if equal else "FAIL"))
        print_table("ScienceWorld: ms/step per episode (median)",
                    ["task", "kind", "steps", "stock", "fast", "fast(nondet)", "package as shipped", "fast==stock"], rows)
        summary = {name: {"median_ms_per_step": median_ms(t), "mean_ms_per_step": round(1000 * sum(t) / len(t), 2),
                          "steps": len(t), "median_reset_ms": median_ms(resets[name])}
                   for name, t in times.items()}
        ratio = round(summary["stock"]["median_ms_per_step"] / summary["fast"]["median_ms_per_step"], 1)
        ratio_mean = round(summary["stock"]["mean_ms_per_step"] / summary["fast"]["mean_ms_per_step"], 1)
        print_table("ScienceWorld: all steps",
                    ["variant", "steps", "median ms/step", "mean ms/step", "median reset ms"],
                    [(n, s["steps"], s["median_ms_per_step"], s["mean_ms_per_step"], s["median_reset_ms"])
                     for n, s in summary.items()])
        shipped = round(summary["package_as_shipped"]["median_ms_per_step"] / summary["fast"]["median_ms_per_step"], 1)
        print(f"speed-up stock/fast: {ratio}x median, {ratio_mean}x mean; package as shipped/fast: {shipped}x median   "
              f"equality (obs, score, done, completed): {'PASS' if all_equal else 'FAIL'}")
        print("target >= 10x: " + ("met" if ratio >= 10 else f"MISSED ({ratio}x against the stock step on the same JVM)"))
        return {"summary": summary, "speedup_stock_over_fast": ratio, "speedup_mean": ratio_mean,
                "speedup_package_as_shipped_over_fast": shipped, "equal": all_equal, "episodes": per_episode}
    finally:
        for env in variants.values():
            env.close()


class _PeakRss:
    """Samples a process's RSS every 20 ms in a thread: catches peaks between steps too."""

    def __init__(self, pid: int) -> None:
        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _memory_workload(env: ScienceWorldEnv, tasks: list[Task], random_steps: int) -> None:
    """Gold path of each task, then a random episode listing valid actions every step."""
    for i, task in enumerate(tasks):
        gold = env.expert_actions(task)
        env.reset(task)
        for action in gold:
            env.step(action)
        _random_actions(env, task, random_steps, seed=i)


def scienceworld_memory(quick: bool) -> dict[str, Any]:
    types = ("boil", "grow-fruit", "find-animal") if quick else (
        "boil", "grow-fruit", "chemistry-mix", "find-animal", "power-component", "melt", "identify-life-stages-1")
    tasks = [_first_of_type("train", t) for t in types]
    random_steps = 10 if quick else 30
    configs = {
        "package JVM options (no -Xmx, G1), stock step": {"max_heap": None, "java_opts": (), "fast": False,
                                                          "deterministic": False},
        "-Xmx512m G1, stock step": {"fast": False, "java_opts": ()},
        "-Xmx512m serial GC, stock step": {"fast": False},
        "-Xmx512m serial GC, fast step (adapter default)": {},
    }
    rows, results = [], {}
    for label, options in configs.items():
        env = ScienceWorldEnv(**options)
        try:
            with _PeakRss(env.pid) as meter:
                t0 = time.time()
                _memory_workload(env, tasks, random_steps)
                wall = time.time() - t0
            peak_mib = round(meter.peak / 2**20)
        finally:
            env.close()
        fit = int(BUDGET_GIB * 1024 // peak_mib)
        results[label] = {"options": options, "peak_jvm_rss_mib": peak_mib, f"envs_in_{BUDGET_GIB}_gib": fit,
                          "wall_s": round(wall, 1)}
        rows.append((label, peak_mib, fit, round(wall, 1)))
    print_table(f"ScienceWorld: peak JVM RSS of one env ({len(tasks)} tasks: gold + random episodes)",
                ["launcher", "peak MiB", f"envs in {BUDGET_GIB} GiB", "wall s"], rows)
    print("(the Python side of an env is a few MB inside the host process; the JVM is the cost)")
    return {"tasks": [t.task_id for t in tasks], "configs": results}


SECTIONS = {"scienceworld_speed": scienceworld_speed, "scienceworld_memory": scienceworld_memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tasks and steps (about a minute)")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    args = parser.parse_args()
    started = time.time()
    report: dict[str, Any] = {"quick": args.quick}
    for name, section in SECTIONS.items():
        if not args.only or name in args.only:
            report[name] = section(args.quick)
    report["wall_s"] = round(time.time() - started, 1)
    print(f"\nwrote {write_json('env_speed', report)} ({report['wall_s']} s)")
    speed = report.get("scienceworld_speed")
    if speed is not None and not speed["equal"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
