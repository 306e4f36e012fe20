"""Benchmark: packed SFT (`policy.packing: tree`) against one sequence per example (`per_step`), same steps.

For each preset, its k=0 SFT set is built by the project's own code (benchmarks/_k0.py: bootstrap, curriculum,
the easy -> hard order). Then, in one run on one machine:
- tokens computed per pass, counted exactly over one whole pass: per step, every example's prompt + answer;
  packed, the packs' tokens (each shared prefix once per pack);
- the same `--steps` optimizer steps (the same examples in each: batches spread evenly over the pass) trained
  from the base model both ways, each in a fresh process: wall time per step (steps 2..n; step 1 carries the
  warm-up), the pass's wall time at that rate, answer tokens/s, peak RSS and the per-step losses (the same
  batches both ways, so the losses must agree to float rounding);
- on the first preset, the packed steps once more in float32, against bf16 autocast (`bf16: null` turns it
  on where the CPU has AVX512-BF16 or AMX): what bf16 does to SFT wall time on this CPU.

    .venv/bin/python benchmarks/sft_packing.py [--presets cpu-comparison-scienceworld ...] [--steps 6]

Writes benchmarks/results/sft_packing.json (with the CPU's flags). The k=0 sets are cached under
.cache/bench/ (delete them to rebuild).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import print_table, write_json  # noqa: E402

PRESETS = ["cpu-comparison-scienceworld", "cpu-alfworld", "cpu-comparison-webshop"]
CACHE = HERE.parent / ".cache" / "bench"


def cpu_flags() -> dict:
    """What decides bf16 here: the CPU model and its bf16 instructions, and what `bf16: null` picks."""
    from flywheel.policy.models import cpu_has_bf16

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    import torch

    return {"cpu": model, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
            "avx512f": "avx512f" in flags, "bf16_auto": cpu_has_bf16(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def load_set(preset: str) -> dict:
    """The preset's k=0 set (cached): examples, model folder and the SFT config's fields."""
    path = CACHE / f"k0-{preset}.json"
    if not path.exists():
        from _k0 import k0_set

        k0 = k0_set(preset)
        CACHE.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.asdict(k0.cfg)
        path.write_text(json.dumps({"preset": preset, "model": k0.model, "trajectories": k0.trajectories,
                                    "examples": k0.examples, "cfg": cfg}))
    return json.loads(path.read_text())


def config(data: dict, **changes):
    from flywheel.core.prompting import PromptShape
    from flywheel.policy.sft import TrainConfig

    fields = dict(data["cfg"])
    fields["prompt"] = PromptShape(**fields["prompt"])
    fields.update(group_by_length=False, save_minutes=0)
    fields.update(changes)
    return TrainConfig(**fields)


def pass_tokens(data: dict) -> dict:
    """Exact token counts of one pass over the kept examples, both ways, and the pass's step batches."""
    from flywheel.policy.models import load_tokenizer
    from flywheel.policy.packing import example_ids
    from flywheel.policy.sft import packed_steps, packed_tokens_per_pass, planned_steps

    tok = load_tokenizer(data["model"])
    cfg = config(data, packing="tree")
    tokenized = [example_ids(tok, r) for r in data["examples"]]
    keep = [i for i, (ids, _) in enumerate(tokenized) if len(ids) <= cfg.max_length]
    rows, ids = [data["examples"][i] for i in keep], [tokenized[i] for i in keep]
    one_pass = dataclasses.replace(cfg, max_steps=1, whole_passes=True)  # rounds to exactly one pass
    items = packed_steps(rows, ids, one_pass)
    return {"examples": len(data["examples"]), "kept": len(rows), "steps_per_pass": planned_steps(len(rows), one_pass),
            "per_step_tokens": sum(len(t) for t, _ in ids), "packed_tokens": packed_tokens_per_pass(items, len(rows)),
            "answers": [len(t) - s for t, s in ids], "rows": rows, "batches": [it["examples"] for it in items]}


def sampled(counts: dict, steps: int) -> list[int]:
    """The examples (positions) of `steps` full batches spread evenly over the pass, in order: trained with order
    "given", both ways take exactly these batches as their steps."""
    full = [b for b in counts["batches"] if len(b) == len(counts["batches"][0])]
    picks = [full[round(i * (len(full) - 1) / max(steps - 1, 1))] for i in range(min(steps, len(full)))]
    return [i for b in picks for i in b]


def worker(spec_path: str) -> int:
    """One training in this fresh process: prints a JSON line (times, losses, peak RSS)."""
    from flywheel.policy.sft import train_sft

    spec = json.loads(Path(spec_path).read_text())
    data = {"cfg": spec["cfg"]}
    cfg = config(data, **spec["changes"])
    marks, losses = [], []

    def progress(line: str) -> None:
        if line.startswith("sft step"):
            marks.append(time.monotonic())
            losses.append(float(line.rsplit("loss=", 1)[1]))

    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        result = train_sft(spec["model"], spec["rows"], Path(tmp) / "ck", cfg, progress=progress)
        wall = time.monotonic() - started
    print(json.dumps({"wall_s": wall, "steps": result.steps, "losses": losses,
                      "step_s": [b - a for a, b in zip(marks, marks[1:], strict=False)],
                      "first_step_s": marks[0] - started if marks else None,
                      "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "computed_tokens_per_pass": result.computed_tokens_per_pass,
                      "tokens_per_pass": result.tokens_per_pass}))
    return 0


def train(data: dict, rows: list[dict], **changes) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"cfg": data["cfg"], "model": data["model"], "rows": rows,
                   "changes": {"order": "given", "whole_passes": False, "max_steps": -1, **changes}}, f)
    try:
        out = subprocess.run([sys.executable, __file__, "--worker", f.name], capture_output=True, text=True,
                             check=True, env={**os.environ, "TQDM_DISABLE": "1"})
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(preset: str, steps: int, bf16_too: bool) -> dict:
    data = load_set(preset)
    counts = pass_tokens(data)
    picked = sampled(counts, steps)
    rows = [counts["rows"][i] for i in picked]
    n = len(rows) // config(data).batch_size
    runs = {}
    for name, changes in [("per_step", {"packing": "per_step"}), ("tree", {"packing": "tree"})] + (
            [("tree_float32", {"packing": "tree", "bf16": False})] if bf16_too else []):
        runs[name] = r = train(data, rows, max_steps=n, **changes)
        r["mean_step_s"] = statistics.fmean(r["step_s"]) if r["step_s"] else r["wall_s"]
        r["pass_wall_s"] = r["mean_step_s"] * counts["steps_per_pass"]
        # answer tokens learned per second of training (the same answers both ways)
        r["answer_tokens_per_s"] = sum(counts["answers"][i] for i in picked) / max(r["wall_s"], 1e-9)
        print(f"{preset} {name}: {r['steps']} steps, {r['mean_step_s']:.1f} s a step, peak {r['peak_rss_gib']:.2f} "
              f"GiB, losses {[round(x, 4) for x in r['losses']]}", flush=True)
    per, tree = runs["per_step"], runs["tree"]
    return {"preset": preset, "trajectories": data["trajectories"], "examples": counts["kept"],
            "dropped": counts["examples"] - counts["kept"], "steps_per_pass": counts["steps_per_pass"],
            "batch_size": config(data).batch_size, "max_length": config(data).max_length,
            "history_mode": data["cfg"]["prompt"]["history_mode"],
            "tokens_per_pass": {"per_step": counts["per_step_tokens"], "tree": counts["packed_tokens"]},
            "token_ratio": counts["per_step_tokens"] / counts["packed_tokens"],
            "steps_timed": n, "runs": runs,
            "step_time_ratio": per["mean_step_s"] / tree["mean_step_s"],
            "max_loss_difference": max(abs(a - b) for a, b in zip(per["losses"], tree["losses"], strict=True)),
            **({"bf16_speedup_packed": runs["tree_float32"]["mean_step_s"] / tree["mean_step_s"]} if bf16_too else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps trained each way per preset")
    ap.add_argument("--no-float32", action="store_true", help="skip the float32 run (bf16's effect)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    flags = cpu_flags()
    print(f"CPU: {flags}", flush=True)
    results = [measure(p, args.steps, bf16_too=(i == 0 and not args.no_float32 and flags["bf16_auto"]))
               for i, p in enumerate(args.presets)]
    rows = []
    for r in results:
        for name in ("per_step", "tree"):
            run = r["runs"][name]
            rows.append([r["preset"], name, r["examples"], r["tokens_per_pass"][name], f"{run['mean_step_s']:.1f}",
                         f"{run['pass_wall_s'] / 60:.1f}", f"{run['answer_tokens_per_s']:.1f}",
                         f"{run['peak_rss_gib']:.2f}", f"{run['losses'][-1]:.4f}"])
    print_table(f"SFT per step vs packed: {results[0]['runs']['tree']['steps']} identical steps per preset "
                f"(bf16 autocast: {flags['bf16_auto']}; {flags['cpu']})",
                ["preset", "packing", "examples", "tokens/pass", "s/step", "min/pass", "answer tok/s", "peak GiB",
                 "last loss"], rows)
    print_table("Ratios (per step / packed; targets: >= 2x tokens, >= 1.8x wall on ScienceWorld and ALFWorld)",
                ["preset", "tokens", "wall per step", "max loss difference"],
                [[r["preset"], f"{r['token_ratio']:.2f}x", f"{r['step_time_ratio']:.2f}x",
                  f"{r['max_loss_difference']:.5f}"] for r in results])
    if "bf16_speedup_packed" in results[0]:
        print(f"\nbf16 autocast vs float32, packed, {results[0]['preset']}: "
              f"{results[0]['bf16_speedup_packed']:.2f}x faster per step")
    path = write_json("sft_packing", {"cpu_flags": flags, "results": results})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
