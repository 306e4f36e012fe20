"""Rollouts on the Ray backend vs the local threaded backend: episodes/min, same tasks, same model.

Real ScienceWorld (find-non-living-thing), the same `run_rollouts` engine and generator; only
`RolloutConfig.backend` changes. Both are timed cold: the local backend starts its JVMs in the
timed region, the Ray backend starts its env actors (and their JVMs) there; the local Ray
cluster itself is started once, before timing (its start time is reported apart). Repeats
alternate the two backends. Per-episode costs (env seconds, generation seconds, steps, tokens)
come from the local runs and feed the scaling note in docs/ray.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import print_table, write_json

from envs import get_benchmark
from flywheel.core.prompting import PromptShape
from flywheel.core.settings import SMOLLM2_DIR
from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.models import build_tiny_model
from flywheel.policy.ray_session import RayOptions
from flywheel.rollout.engine import RolloutConfig, run_rollouts


class TimedGenerator:
    def __init__(self, inner) -> None:
        self.inner, self.model_id, self.seconds, self.calls = inner, inner.model_id, 0.0, 0

    def generate(self, prompts, **kw):
        t0 = time.perf_counter()
        try:
            return self.inner.generate(prompts, **kw)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def measure(spec, tasks, generator, backend: str, args) -> dict:
    cfg = RolloutConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, parallel_envs=args.parallel,
                        max_steps=args.max_steps, prompt=PromptShape(max_observation_chars=400), backend=backend,
                        ray=RayOptions(env_actor_cpus=args.actor_cpus, envs_per_actor=args.envs_per_actor))
    timed = TimedGenerator(generator)
    t0 = time.perf_counter()
    trajs = run_rollouts([(t, 0) for t in tasks], make_env=spec.make_env, generator=timed,
                         instructions=spec.system_prompt(), normalize_action=spec.normalize_action, cfg=cfg)
    wall = time.perf_counter() - t0
    steps = sum(len(t.steps) for t in trajs)
    return {"backend": backend, "episodes": len(trajs), "errored": sum(t.status != "ok" for t in trajs),
            "steps": steps, "wall_s": wall, "episodes_per_min": len(trajs) / wall * 60,
            "generate_s": timed.seconds, "ticks": timed.calls, "other_s": wall - timed.seconds,
            "prompt_tokens_per_step": sum(s.prompt_tokens for t in trajs for s in t.steps) / max(steps, 1),
            "completion_tokens_per_step": sum(s.completion_tokens for t in trajs for s in t.steps) / max(steps, 1)}


def step_cost_ms(n_resets: int = 40) -> dict:
    """One env step in-process vs through an env actor (WebShop: the env's own work is ~0.1 ms)."""
    from flywheel.rollout.ray_pool import RayEnvPool

    spec = get_benchmark("webshop")
    task = spec.load_tasks("train", limit=1)[0]
    actions = spec.expert_actions(task)

    def run(env) -> list[float]:
        times = []
        for _ in range(n_resets):
            env.reset(task)
            for a in actions:
                t0 = time.perf_counter()
                env.step(a)
                times.append(time.perf_counter() - t0)
        return times

    local = run(spec.make_env())
    pool = RayEnvPool(spec.make_env, RayOptions(env_actor_cpus=1, envs_per_actor=1), 1)
    try:
        remote = pool.make_env()
        remote.reset(task)  # actor and env start, untimed
        ray_times = run(remote)
    finally:
        pool.shutdown()
    return {"steps": len(local), "local_median_ms": statistics.median(local) * 1000,
            "ray_median_ms": statistics.median(ray_times) * 1000,
            "ray_overhead_median_ms": (statistics.median(ray_times) - statistics.median(local)) * 1000}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--envs-per-actor", type=int, default=2)
    ap.add_argument("--actor-cpus", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="tiny",
                    help="tiny (default: minutes on 2 busy cores) or smollm2 (SmolLM2-135M bf16, ~10x longer)")
    args = ap.parse_args(argv)
    import ray

    spec = get_benchmark("scienceworld")
    tasks = spec.load_tasks("train", task_types=("find-non-living-thing",))[: args.episodes]
    t0 = time.perf_counter()
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False)
    cluster_start_s = time.perf_counter() - t0
    runs: list[dict] = []
    try:
        step = step_cost_ms()
        with tempfile.TemporaryDirectory() as tmp:
            if args.model == "tiny":
                path, dtype = str(build_tiny_model(Path(tmp) / "tiny", vocab_size=1024, hidden_size=64)), "float32"
            else:
                path, dtype = str(SMOLLM2_DIR), "bfloat16"
            gen = TransformersGenerator(path, dtype=dtype, max_batch_size=args.parallel)
            for r in range(args.repeats):
                for backend in (["local", "ray"] if r % 2 == 0 else ["ray", "local"]):
                    res = measure(spec, tasks, gen, backend, args)
                    res["repeat"] = r
                    runs.append(res)
                    print(f"  {backend}: {res['episodes_per_min']:.2f} episodes/min ({res['wall_s']:.1f} s)", flush=True)
    finally:
        ray.shutdown()
    by = {b: [r for r in runs if r["backend"] == b] for b in ("local", "ray")}
    med = {b: statistics.median(r["episodes_per_min"] for r in rs) for b, rs in by.items()}
    ratios = [ray_r["episodes_per_min"] / loc["episodes_per_min"] for loc, ray_r in zip(by["local"], by["ray"], strict=True)]
    ratio = med["ray"] / med["local"]
    loc = by["local"]
    per_episode = {
        "steps": statistics.mean(r["steps"] / r["episodes"] for r in loc),
        "generate_s_per_tick": statistics.mean(r["generate_s"] / r["ticks"] for r in loc),
        "non_generation_s_per_episode_wall": statistics.mean(r["other_s"] / r["episodes"] for r in loc),
        "prompt_tokens_per_step": statistics.mean(r["prompt_tokens_per_step"] for r in loc),
        "completion_tokens_per_step": statistics.mean(r["completion_tokens_per_step"] for r in loc),
    }
    rows = [[r["backend"], r["repeat"], r["episodes"], r["errored"], r["steps"], f"{r['wall_s']:.1f}",
             f"{r['generate_s']:.1f}", f"{r['other_s']:.1f}", f"{r['episodes_per_min']:.2f}"] for r in runs]
    print_table(f"Ray vs local rollouts, ScienceWorld find-non-living-thing, {args.model}, {args.episodes} episodes x "
                f"{args.max_steps} steps, {args.parallel} envs ({args.envs_per_actor} per actor), cold envs; "
                f"local Ray cluster start {cluster_start_s:.1f} s (untimed)",
                ["backend", "repeat", "episodes", "errored", "steps", "wall s", "generate s", "other s", "episodes/min"],
                rows)
    print(f"Ray / local episodes/min: median {ratio:.2f}x (per repeat: {', '.join(f'{x:.2f}' for x in ratios)}); "
          f"per episode (local): {per_episode['steps']:.1f} steps, {per_episode['generate_s_per_tick']:.2f} s per "
          f"batched generate, {per_episode['prompt_tokens_per_step']:.0f}+{per_episode['completion_tokens_per_step']:.0f} tokens/step")
    print(f"one env step (WebShop, {step['steps']} steps): in-process {step['local_median_ms']:.2f} ms, through an env "
          f"actor {step['ray_median_ms']:.2f} ms (median)")
    write_json("ray_rollouts", {"step_cost": step, "runs": runs, "median_episodes_per_min": med, "ratio_ray_over_local": ratio,
                                "ratios_per_repeat": ratios, "cluster_start_s": cluster_start_s,
                                "per_episode_local": per_episode, "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
