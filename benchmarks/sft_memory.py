"""Benchmark: peak memory and step time of SFT by micro-batch size (`policy.micro_batch_size`), and packed.

The same examples, model, seed and optimizer steps of `--batch-size` examples; only the number of examples per
forward/backward pass changes (the rest of a step is gradient accumulation, the loss still the mean over every
completion token of the step). Each configuration trains in its own fresh process, so its peak resident memory
(the kernel's VmHWM) is its own. The examples are the `--store`'s training rows of a checkpoint, or, without
one, synthetic prompt/completion pairs at the length of cpu-comparison-scienceworld's longest k=0 examples
(850-1,000 tokens with the chat template: the batches that set the peak).

Micro-batches are per-step SFT's (`policy.packing: per_step`); "tree" is packed SFT (`packing: tree`), whose
passes are its packs. Synthetic examples share nothing, so packing gains nothing here: this measures that a
pack then holds one example, as micro-batch 1 does.

    .venv/bin/python benchmarks/sft_memory.py                 # synthetic, steps of 8, micro-batches 8, 2, 1, tree
    .venv/bin/python benchmarks/sft_memory.py --store runs/experiments/cpu-comparison-scienceworld/bpo-stage2/flywheel.duckdb
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import print_table, write_json

from flywheel.core.settings import SMOLLM2_DIR
from flywheel.policy.sft import TrainConfig, train_sft

TARGET_GIB = 8.0  # issue: peak SFT memory under 8 GiB on the 24 GiB machine that also holds JVMs and vLLM


def synthetic_examples(n: int, seed: int = 0) -> list[dict]:
    """`n` prompt/completion rows of about 850-1,000 tokens (prompt) and 60-110 words (completion)."""
    rng = random.Random(seed)
    words = ["look", "around", "open", "door", "to", "kitchen", "focus", "on", "animal", "plant", "the", "room",
             "hallway", "move", "living", "thing", "inventory", "pick", "up", "you", "see", "a", "green", "house"]
    rows = []
    for _ in range(n):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(720, 860)))
        answer = "Thought: " + " ".join(rng.choice(words) for _ in range(rng.randint(60, 110)))
        rows.append({"prompt": [{"role": "user", "content": prompt}],
                     "completion": [{"role": "assistant", "content": answer + "\nAction: look around"}]})
    return rows


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(args: argparse.Namespace) -> int:
    """Train once and print one JSON line: peak RSS, step times, loss."""
    examples = json.loads(Path(args.examples).read_text())
    marks: list[float] = []

    def progress(msg: str) -> None:
        if msg.startswith("sft step"):
            marks.append(time.monotonic())

    packed = args.micro == "tree"
    cfg = TrainConfig(epochs=1.0, learning_rate=2e-4, batch_size=args.batch_size,
                      micro_batch_size=None if packed else int(args.micro), max_length=args.max_length,
                      max_steps=args.steps, order="given", whole_passes=False, packing="tree" if packed else "per_step")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        result = train_sft(args.model, examples, Path(tmp) / "ck", cfg, progress=progress)
        wall = time.monotonic() - started
    steps = [b - a for a, b in zip(marks, marks[1:], strict=False)]  # the first step (warm-up) left out
    print(json.dumps({"micro_batch_size": args.micro, "steps": result.steps, "train_loss": round(result.train_loss, 5),
                      "step_s": [round(s, 1) for s in steps],
                      "median_step_s": round(statistics.median(steps), 1) if steps else None,
                      "wall_s": round(wall, 1), "peak_rss_mib": round(peak_rss_mib())}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default=None, help="an experiment arm's flywheel.duckdb (default: synthetic examples)")
    ap.add_argument("--benchmark", default="scienceworld")
    ap.add_argument("--model", default=str(SMOLLM2_DIR))
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per configuration (the first is warm-up)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--micro", nargs="+", default=["8", "2", "1", "tree"],
                    help="per-step micro-batch sizes to compare, and 'tree' for packed SFT")
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--examples", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.micro = args.micro[0]
        return child(args)

    need = args.steps * args.batch_size
    if args.store:
        from flywheel.core.store import Store

        db = Store(args.store)
        latest = db.latest_checkpoint(args.benchmark, 0)
        if latest is None:
            raise SystemExit(f"no k=0 checkpoint of {args.benchmark} in {args.store}")
        rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in db.training_examples(latest["checkpoint_id"])]
        # the longest examples: the batches that set the peak
        rows.sort(key=lambda r: -len(json.dumps(r)))
        examples, source = rows[:need], f"the {need} longest k=0 examples of {args.store}"
    else:
        examples, source = synthetic_examples(need), f"{need} synthetic examples of 850-1,000 tokens"
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "examples.json"
        path.write_text(json.dumps(examples))
        for micro in args.micro:
            cmd = [sys.executable, __file__, "--child", "--examples", str(path), "--model", args.model,
                   "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--micro", str(micro),
                   "--max-length", str(args.max_length)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
    from flywheel.policy.models import cpu_has_bf16

    dtype = "bf16 autocast" if cpu_has_bf16() else "float32"
    print_table(f"SFT steps of {args.batch_size} ({source}, max_length {args.max_length}, {dtype})",
                ["micro-batch", "peak RSS MiB", "step seconds (after the first)", "median", "train loss"],
                [[r["micro_batch_size"], r["peak_rss_mib"], r["step_s"], r["median_step_s"], r["train_loss"]]
                 for r in runs])
    whole = next((r for r in runs if str(r["micro_batch_size"]) == str(args.batch_size)), runs[0])
    best = min(runs, key=lambda r: r["peak_rss_mib"])
    speed = round(whole["median_step_s"] / best["median_step_s"], 2) if whole["median_step_s"] and best["median_step_s"] else None
    print(f"\nmicro-batch {best['micro_batch_size']}: peak {best['peak_rss_mib']} MiB "
          f"(target < {TARGET_GIB * 1024:.0f}); step time ratio whole-batch / micro-batch: {speed}x")
    write_json("sft_memory", {"source": source, "batch_size": args.batch_size, "max_length": args.max_length,
                              "dtype": dtype,
                              "runs": runs, "lowest_peak_micro_batch": best["micro_batch_size"],
                              "lowest_peak_mib": best["peak_rss_mib"], "speed_ratio_whole_over_micro": speed,
                              "target_mib": TARGET_GIB * 1024})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
