"""Benchmark: rollouts through the managed vLLM server vs transformers `generate`, real ScienceWorld.

Same checkpoint (SmolLM2-135M, `--dtype`: auto = bf16 only where native), same tasks, same step limit and generation budget, same
warm env pool (`rollout_throughput.measure`); only the generator changes:
- transformers: `TransformersGenerator` (left-padded batches, 1 torch thread), 1/4/8/16 envs;
- vLLM: `ManagedVLLMGenerator` on a server from `.venv-vllm` (`make vllm`), prefix caching on,
  the action-line stop done by closing the stream, 1/4/8/16 envs, in both rollout schedules
  (`--vllm-scheduling`): per episode (each env slot its own thread, one request per step: what
  `auto` picks for a server) and ticks (one batch of requests per tick, as for transformers).
Transformers runs first, with no server up; then the server starts (timed) and vLLM runs.
Then the swap costs: in-place weight reloads between two checkpoints of the same shape (n
alternations, and greedy output checked to follow the weights), and one restart (warm compile cache).

Target: vLLM at 8 envs >= 3x transformers at 8 envs and >= 6x sequential transformers (episodes/min).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import machine, print_table, write_json
from rollout_throughput import measure

from envs import get_benchmark
from flywheel.core.settings import REPO_ROOT, SMOLLM2_DIR
from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.vllm_client import ManagedVLLMGenerator
from flywheel.policy.vllm_server import DEFAULT_PYTHON, VLLMServer, VLLMServerConfig

PROBE = [[{"role": "user", "content": "You are in the kitchen. Your task is to find a non-living thing."}]]


def perturbed_copy(src: str, dst: Path, seed: int = 1) -> Path:
    """A second checkpoint of the same shape: the weights plus a little noise (what an SFT step does)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(seed)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        save_file({k: (v + 0.02 * v.std() * torch.randn(v.shape, generator=g, dtype=v.dtype)).contiguous()
                   for k, v in tensors.items()}, f, metadata={"format": "pt"})
    return dst


def row(name: str, r: dict) -> list:
    return [name, r["parallel_envs"], r["episodes"], r["steps"], f"{r['wall_s']:.1f}", f"{r['episodes_per_min']:.2f}",
            f"{r['gen_tokens_per_s']:.1f}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-steps", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--parallel", type=int, nargs="*", default=[1, 4, 8, 16])
    ap.add_argument("--model", default=str(SMOLLM2_DIR))
    ap.add_argument("--vllm-python", default=DEFAULT_PYTHON)
    ap.add_argument("--swaps", type=int, default=4, help="weight-reload swaps to time")
    ap.add_argument("--vllm-scheduling", nargs="*", default=["per_episode", "ticks"],
                    help="rollout schedules to time vLLM in (the first one carries the target ratios)")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--transformers-parallel", type=int, nargs="*", default=None,
                    help="transformers at these env counts only (default: --parallel)")
    ap.add_argument("--interleave", action="store_true",
                    help="server first, then transformers and vLLM back to back at each env count "
                         "(fairer on a machine whose load drifts)")
    ap.add_argument("--skip-restart", action="store_true", help="do not time a restart (~2 min on this CPU)")
    ap.add_argument("--out", default="vllm_rollouts")
    ap.add_argument("--dtype", default="auto",
                    help="both engines: auto (bf16 only where native, else float32), float32 or bfloat16")
    args = ap.parse_args(argv)
    if not Path(args.vllm_python).exists():
        print(f"vllm_rollouts: no vLLM environment at {args.vllm_python}: run `make vllm` first", file=sys.stderr)
        return 2
    spec = get_benchmark("scienceworld")
    tasks = spec.load_tasks("train", task_types=("find-non-living-thing",))[: args.episodes]
    results: dict = {"machine": machine(), "model": args.model, "episodes": len(tasks), "max_steps": args.max_steps,
                     "max_new_tokens": args.max_new_tokens, "transformers": [], "vllm": []}
    table = []

    def save() -> None:
        write_json(args.out, results)

    tf_parallel = [] if args.skip_transformers else (
        args.parallel if args.transformers_parallel is None else args.transformers_parallel)
    tf_gen = TransformersGenerator(args.model, dtype=args.dtype, max_batch_size=max(args.parallel), num_threads=1) \
        if tf_parallel else None

    def run_tf(p: int) -> None:
        r = measure(spec, tasks, tf_gen, p, args.max_steps, args.max_new_tokens, True)
        results["transformers"].append(r)
        table.append(row(f"transformers ({args.dtype}, 1 thread)", r))
        print(table[-1], flush=True)
        save()

    if not args.interleave:
        for p in tf_parallel:
            run_tf(p)

    with tempfile.TemporaryDirectory(dir=REPO_ROOT / ".cache") as tmp:
        k1 = perturbed_copy(args.model, Path(tmp) / "k1")
        cfg = VLLMServerConfig(python=args.vllm_python, log_dir=str(REPO_ROOT / "runs" / "bench_vllm"),
                               max_model_len=4096, dtype=args.dtype)
        results["dtype"] = {"requested": args.dtype, "vllm": cfg.server_dtype()}
        with VLLMServer(cfg) as server:
            gen = ManagedVLLMGenerator(server, args.model, "smollm2")
            results["server_start_s"] = server.events[0].seconds
            save()
            # Untimed warm-up: the first rollouts after a start ran ~20% slower than the next ones
            # (measured 2026-12-01: 8.9 vs 10.8-11.3 episodes/min, whichever schedule went first).
            measure(spec, tasks[: max(args.parallel)], gen, max(args.parallel), 1, args.max_new_tokens, True)
            for p in args.parallel:
                if args.interleave and p in tf_parallel:
                    run_tf(p)
                for scheduling in args.vllm_scheduling:
                    r = measure(spec, tasks, gen, p, args.max_steps, args.max_new_tokens, True, scheduling)
                    results["vllm"].append(r)
                    table.append(row(f"managed vLLM ({cfg.server_dtype()}, prefix cache, {scheduling})", r))
                    print(table[-1], flush=True)
                    save()
            # Swaps: alternate k1 / base; greedy probe output must follow the weights.
            greedy = dict(temperature=0.0, max_new_tokens=16, seed=0)
            base_text = gen.generate(PROBE, **greedy)[0].text
            reloads, follows = [], []
            for i in range(args.swaps):
                target, name = (str(k1), "k1") if i % 2 == 0 else (args.model, "smollm2")
                g = ManagedVLLMGenerator(server, target, name)
                ev = server.events[-1]
                reloads.append({"event": ev.event, "seconds": ev.seconds})
                if name == "smollm2":
                    follows.append(g.generate(PROBE, **greedy)[0].text == base_text)
            results["swaps"] = reloads
            results["reload_back_gives_same_greedy_output"] = follows
            if not args.skip_restart:
                server.restart("benchmark: timed restart")
                results["restart_s"] = server.events[-1].seconds
            results["server_events"] = [e.__dict__ for e in server.events]
            save()

    tf = {r["parallel_envs"]: r["episodes_per_min"] for r in results["transformers"]}
    vl = {r["parallel_envs"]: r["episodes_per_min"] for r in results["vllm"]
          if r["scheduling"] == args.vllm_scheduling[0]}
    ticks = {r["parallel_envs"]: r["episodes_per_min"] for r in results["vllm"] if r["scheduling"] == "ticks"}
    ratios = {}
    if 8 in vl and 8 in ticks and args.vllm_scheduling[0] != "ticks":
        ratios[f"vllm8_{args.vllm_scheduling[0]}_over_vllm8_ticks"] = round(vl[8] / ticks[8], 2)
    if 8 in vl and 8 in tf:
        ratios["vllm8_over_transformers8"] = round(vl[8] / tf[8], 2)
    if 8 in vl and 1 in tf:
        ratios["vllm8_over_transformers1"] = round(vl[8] / tf[1], 2)
    results["ratios"] = ratios
    results["target_met"] = bool(ratios) and ratios.get("vllm8_over_transformers8", 0) >= 3 \
        and ratios.get("vllm8_over_transformers1", 0) >= 6
    reload_s = [s["seconds"] for s in results.get("swaps", []) if s["event"] == "reload"]
    if reload_s:
        results["reload_s"] = {"n": len(reload_s), "min": min(reload_s), "median": statistics.median(reload_s),
                               "max": max(reload_s)}
    save()
    print_table(f"Rollouts on ScienceWorld find-non-living-thing ({len(tasks)} episodes, <= {args.max_steps} steps, "
                f"{args.max_new_tokens} new tokens, warm envs)",
                ["generator", "envs", "episodes", "steps", "wall s", "episodes/min", "gen tok/s"], table)
    print(f"server start {results.get('server_start_s', float('nan')):.1f} s; restart "
          f"{results.get('restart_s', float('nan')):.1f} s; weight reload {results.get('reload_s')}")
    print(f"ratios {ratios}; target (>= 3x tf@8 and >= 6x tf@1) {'met' if results['target_met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
