"""Benchmark: SFT step time with random batches vs length-grouped batches (`policy.group_by_length`).

The same SFT examples (read back from an experiment's store: the `training_examples` rows a checkpoint was
trained on), the same model, batch size and seed; only the sampler changes. Each configuration trains
`--steps` steps from the base model into a temporary folder; the time between consecutive step logs is a
step's time (the first step, with warm-up, is left out of the median).

    .venv/bin/python benchmarks/sft_batching.py --store runs/experiments/cpu-scienceworld-quick/bpo/flywheel.duckdb
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import print_table, write_json

from flywheel.core.settings import SMOLLM2_DIR
from flywheel.core.store import Store
from flywheel.policy.sft import TrainConfig, train_sft


def load_examples(store: str, benchmark: str, iteration: int, checkpoint_id: str | None) -> tuple[str, list[dict]]:
    """The kept training examples of `checkpoint_id` (default: the store's latest checkpoint of that iteration)."""
    db = Store(store)
    if checkpoint_id is None:
        latest = db.latest_checkpoint(benchmark, iteration)
        if latest is None:
            raise SystemExit(f"no checkpoint of {benchmark} iteration {iteration} in {store}")
        checkpoint_id = latest["checkpoint_id"]
    rows = db.training_examples(checkpoint_id)
    return checkpoint_id, [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]


def time_steps(examples: list[dict], model: str, cfg: TrainConfig) -> dict:
    marks: list[float] = []

    def progress(msg: str) -> None:
        if msg.startswith("sft step"):
            marks.append(time.monotonic())

    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        result = train_sft(model, examples, Path(tmp) / "ck", cfg, progress=progress)
        wall = time.monotonic() - started
    steps = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    return {"group_by_length": cfg.group_by_length, "steps": result.steps, "train_loss": round(result.train_loss, 4),
            "step_s": [round(s, 1) for s in steps], "median_step_s": round(statistics.median(steps), 1) if steps else None,
            "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True, help="an experiment arm's flywheel.duckdb")
    ap.add_argument("--benchmark", default="scienceworld")
    ap.add_argument("--iteration", type=int, default=0)
    ap.add_argument("--checkpoint-id", default=None, help="whose examples (default: the latest of --iteration)")
    ap.add_argument("--model", default=str(SMOLLM2_DIR))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=1536)
    args = ap.parse_args(argv)
    checkpoint_id, examples = load_examples(args.store, args.benchmark, args.iteration, args.checkpoint_id)
    runs = []
    for grouped in (False, True):
        cfg = TrainConfig(epochs=3.0, learning_rate=2e-4, batch_size=args.batch_size, max_length=args.max_length,
                          max_steps=args.steps, group_by_length=grouped)
        runs.append(time_steps(examples, args.model, cfg))
    print_table(f"SFT steps of {args.batch_size}, {len(examples)} examples of {checkpoint_id}",
                ["sampler", "steps", "step seconds (after the first)", "median", "wall s"],
                [["length-grouped" if r["group_by_length"] else "random", r["steps"], r["step_s"], r["median_step_s"],
                  r["wall_s"]] for r in runs])
    random_s, grouped_s = runs[0]["median_step_s"], runs[1]["median_step_s"]
    ratio = round(random_s / grouped_s, 2) if random_s and grouped_s else None
    print(f"\nrandom / length-grouped median step time: {ratio}x")
    write_json("sft_batching", {"checkpoint_id": checkpoint_id, "examples": len(examples),
                                "batch_size": args.batch_size, "runs": runs, "speedup": ratio})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
