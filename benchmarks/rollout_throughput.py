"""Benchmark 3: batched multi-env rollouts vs the sequential one-episode-at-a-time loop.

Same model, same tasks, same step limit, same generation budget; only
`parallel_envs` (and so the generation batch) changes. Real ScienceWorld.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import print_table, write_json

from envs import get_benchmark
from flywheel.core.prompting import PromptShape
from flywheel.core.settings import SMOLLM2_DIR
from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.models import build_tiny_model
from flywheel.rollout.engine import RolloutConfig, resolve_scheduling, run_rollouts


def warm_pool(spec, n: int, task) -> tuple[list, float]:
    """n envs started side by side, each reset and stepped once (JVM start and JIT warm-up)."""
    def one():
        env = spec.make_env()
        env.reset(task)
        env.step("look around")
        return env

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        envs = list(pool.map(lambda _: one(), range(n)))
    return envs, time.perf_counter() - t0


def measure(spec, tasks, generator, parallel: int, max_steps: int, max_new_tokens: int, warm: bool,
            scheduling: str = "auto") -> dict:
    jobs = [(t, 0) for t in tasks]
    pool, start_s = warm_pool(spec, min(parallel, len(jobs)), tasks[-1]) if warm else ([], 0.0)
    make_env = (lambda: pool.pop() if pool else spec.make_env()) if warm else spec.make_env
    t0 = time.perf_counter()
    trajs = run_rollouts(jobs, make_env=make_env, generator=generator, instructions=spec.system_prompt(),
                         normalize_action=spec.normalize_action,
                         cfg=RolloutConfig(temperature=1.0, max_new_tokens=max_new_tokens, parallel_envs=parallel,
                                           max_steps=max_steps, prompt=PromptShape(max_observation_chars=400),
                                           scheduling=scheduling))
    wall = time.perf_counter() - t0
    steps = sum(len(t.steps) for t in trajs)
    tokens = sum(s.completion_tokens for t in trajs for s in t.steps)
    resolved = resolve_scheduling(RolloutConfig(scheduling=scheduling), generator)
    return {"parallel_envs": parallel, "scheduling": resolved, "warm_envs": warm, "env_start_s": start_s, "episodes": len(trajs),
            "steps": steps, "wall_s": wall,
            "episodes_per_min": len(trajs) / wall * 60, "gen_tokens_per_s": tokens / wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-steps", type=int, default=5)
    ap.add_argument("--parallel", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    ap.add_argument("--smollm-episodes", type=int, default=16)
    ap.add_argument("--smollm-parallel", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    ap.add_argument("--skip-smollm", action="store_true")
    ap.add_argument("--cold", action="store_true",
                    help="start the envs inside the timed region (default: a warm pool, start time reported apart)")
    args = ap.parse_args(argv)
    spec = get_benchmark("scienceworld")
    tasks = spec.load_tasks("train", task_types=("find-non-living-thing",))
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_model(Path(tmp) / "tiny", vocab_size=1024, hidden_size=64)
        models = [("tiny-random-llama", str(tiny), args.episodes, args.parallel, 48)]
        if not args.skip_smollm:
            models.append(("smollm2-135m (bf16)", str(SMOLLM2_DIR), args.smollm_episodes, args.smollm_parallel, 48))
        for name, path, n, parallels, new_tokens in models:
            gen = TransformersGenerator(path, dtype="bfloat16" if "smollm" in name else "float32", max_batch_size=max(parallels))
            results[name] = [measure(spec, tasks[:n], gen, p, args.max_steps, new_tokens, not args.cold) for p in parallels]
    rows, summary = [], {}
    for name, runs in results.items():
        base = runs[0]
        for r in runs:
            r["speedup_vs_sequential"] = r["episodes_per_min"] / base["episodes_per_min"]
            rows.append([name, r["parallel_envs"], r["episodes"], f"{r['env_start_s']:.1f}", f"{r['wall_s']:.1f}",
                         f"{r['episodes_per_min']:.2f}",
                         f"{r['gen_tokens_per_s']:.1f}", f"{r['speedup_vs_sequential']:.2f}x"])
        default = next((r for r in runs if r["parallel_envs"] == 8), runs[-1])
        summary[name] = default["speedup_vs_sequential"]
    mode = "cold: env starts timed" if args.cold else "warm envs: started and warmed before timing"
    print_table(f"Rollout throughput, ScienceWorld find-non-living-thing, {args.max_steps} steps/episode ({mode})",
                ["model", "parallel envs", "episodes", "env start s (untimed)", "wall s", "episodes/min", "gen tok/s", "vs sequential"], rows)
    print("target: >= 3x episodes/min at the default batch (8) -> "
          + ", ".join(f"{k}: {v:.2f}x ({'met' if v >= 3 else 'MISSED'})" for k, v in summary.items()))
    write_json("rollout_throughput_cold" if args.cold else "rollout_throughput",
               {"runs": results, "speedup_at_8": summary, "max_steps": args.max_steps, "warm_envs": not args.cold})
    return 0


if __name__ == "__main__":
    sys.exit(main())
