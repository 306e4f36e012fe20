"""Is SFT bit-for-bit deterministic here? The same examples, config and seed trained in fresh processes,
with the same and with another torch thread count; compares the sha256 of the weights and the final loss.

    .venv/bin/python benchmarks/sft_determinism.py [--steps 2] [--model .cache/models/smollm2-135m]

Why it matters: arms that share a k=0 across sittings and machines check the recorded weights' hash
(`flywheel experiment --accept-k0-drift`). Writes benchmarks/results/sft_determinism.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
from flywheel.policy.sft import TrainConfig, train_sft
from flywheel.core.provenance import weights_sha256
examples = [{"prompt": [{"role": "system", "content": "You are an agent in a text world. " * 20},
                        {"role": "user", "content": f"Task {i}: find the animal. You see: " + "a door, a table, " * 30}],
             "completion": [{"role": "assistant", "content": f"Thought: look first {i}.\\nPlan: look\\nAction: look around"}]}
            for i in range(16)]
cfg = TrainConfig(batch_size=4, max_steps=int(sys.argv[3]), learning_rate=2e-4, max_length=1024, order="given", bf16=False)
r = train_sft(sys.argv[1], examples, sys.argv[2], cfg, progress=lambda _l: None)
print(json.dumps({"sha256": weights_sha256(r.path), "loss": r.train_loss, "steps": r.steps}))
"""


def run(model: str, out: Path, steps: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", CHILD, model, str(out), str(steps)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    return {"threads": threads, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / ".cache/models/smollm2-135m"))
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(args.model, Path(tmp) / f"m{i}", args.steps, t) for i, t in enumerate((2, 2, 1))]
    rows = [[i, r["threads"], r["steps"], f"{r['loss']:.6f}", r["sha256"][:16]] for i, r in enumerate(runs)]
    print_table("SFT twice with 2 threads, once with 1 (SmolLM2-135M, float32, batch 4)",
                ["run", "threads", "steps", "train loss", "weights sha256"], rows)
    same = runs[0]["sha256"] == runs[1]["sha256"]
    across = runs[0]["sha256"] == runs[2]["sha256"]
    print(f"\nsame thread count: {'identical' if same else 'DIFFERENT'} weights; "
          f"2 vs 1 threads: {'identical' if across else 'different'} weights "
          f"(loss difference {abs(runs[0]['loss'] - runs[2]['loss']):.2e})")
    write_json("sft_determinism", {"model": Path(args.model).name, "steps": args.steps, "runs": runs,
                                   "same_threads_identical": same, "other_threads_identical": across})


if __name__ == "__main__":
    main()
