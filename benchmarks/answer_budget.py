"""How long are the answers a preset teaches? Size `policy.max_new_tokens` from them before a run.

    .venv/bin/python benchmarks/answer_budget.py cpu-comparison-webshop [--arm bpo]

Runs the arm's bootstrap (expert paths, teacher annotation, curriculum: the k=0 SFT set, no training) into a
temporary folder, builds the k=0 SFT examples exactly as `sft_checkpoint` does, and counts each answer's tokens
with the preset's model tokenizer. An answer of `max_new_tokens` tokens or more is cut by generation, often
before its action line (`cpu-webshop` lost 54% of its evaluation steps' actions that way at 160): the
budget should sit above the longest trained answer. Prints the distribution against the preset's budget and
the smallest multiple of 32 above the longest answer; writes benchmarks/results/answer_budget_PRESET.json.
Also prints the whole examples' lengths (prompt + answer) against `policy.max_length`: SFT drops longer
ones. (Every SFT checkpoint records the same numbers in its lineage, and experiment reports show them with the
share of evaluation steps that reached the cap.)
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402
from _common import print_table, write_json  # noqa: E402

from flywheel.assets.training import training_set  # noqa: E402
from flywheel.config.methods import method_stages  # noqa: E402
from flywheel.config.presets import build_resources, load_preset  # noqa: E402
from flywheel.core.metrics import answer_lengths  # noqa: E402
from flywheel.definitions import build_defs  # noqa: E402
from flywheel.drivers.experiment import resolve_model  # noqa: E402
from flywheel.drivers.pipeline import run_stage  # noqa: E402
from flywheel.policy.models import load_tokenizer  # noqa: E402
from flywheel.policy.sft import answer_tokens, example_tokens, sft_examples  # noqa: E402
from flywheel.profile import Profile  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", help="preset name (experiments/NAME.yaml) or path")
    ap.add_argument("--arm", default=None, help="the arm whose k=0 set to measure (default: the preset's first)")
    args = ap.parse_args(argv)
    preset = load_preset(args.preset)
    arm = args.arm or next(iter(preset.arms))
    with tempfile.TemporaryDirectory(prefix="answer-budget-") as tmp:
        arm_dir = Path(tmp) / arm
        model = resolve_model(preset.model, Path(tmp))
        res = build_resources(preset, arm, arm_dir, model_path=model)
        defs = build_defs(res, profile=Profile(benchmarks=(preset.benchmark,), max_iteration=preset.max_iteration))
        [(_, key, selection)] = [s for s in method_stages(preset.benchmark, preset.iterations, preset.method(arm))
                                 if s[0] == "bootstrap"]
        run_stage(defs.resolve_job_def("bootstrap_job"), key or preset.benchmark, selection,
                  dg.DagsterInstance.ephemeral())
        policy, curriculum, loop = res["policy"], res["curriculum"], res["loop"]
        trajs, _ = training_set(res["store"].get(), preset.benchmark, 0, include_synthetic=curriculum.synthesize,
                                refine_from=policy.refine_from, seed=policy.seed, replay=policy.replay,
                                drop_invalid_steps=loop.gate_drops_invalid_steps)
        spec = res["envs"].spec(preset.benchmark)
        examples = sft_examples(trajs, lambda _t: spec.system_prompt(), policy.train_config().prompt)
        tok = load_tokenizer(model)
        lengths = [answer_tokens(tok, r) for r in examples]
        whole = [example_tokens(tok, r) for r in examples]
    cap = policy.max_new_tokens
    got = answer_lengths(lengths, cap)
    suggested = 32 * (math.floor(got["max"] / 32) + 1) if got["max"] is not None else cap
    print_table(f"{preset.name} / {arm}: k=0 SFT answers in tokens ({got['n']} examples, {len(trajs)} trajectories)",
                ["median", "p95", "max", "max_new_tokens", "at or over it", "suggested max_new_tokens"],
                [[got["median"], got["p95"], got["max"], cap, f"{got['at_cap']}/{got['n']}", suggested]])
    # Whole examples (prompt + answer) longer than policy.max_length are dropped by SFT, never truncated.
    limit = policy.max_length
    examples_got = answer_lengths(whole, limit)
    over = sum(n > limit for n in whole)  # SFT keeps an example of exactly max_length tokens
    print_table(f"{preset.name} / {arm}: k=0 SFT examples (prompt + answer) in tokens",
                ["median", "p95", "max", "max_length", "over it (dropped by SFT)"],
                [[examples_got["median"], examples_got["p95"], examples_got["max"], limit, f"{over}/{len(whole)}"]])
    path = write_json(f"answer_budget_{preset.name}", {"preset": preset.name, "arm": arm, "trajectories": len(trajs),
                                                       "answers": got, "suggested_max_new_tokens": suggested,
                                                       "histogram": _histogram(lengths),
                                                       "examples": {**examples_got, "max_length": limit,
                                                                    "over_max_length": over,
                                                                    "histogram": _histogram(whole, 128)}})
    print(f"\nwrote {path}")
    return 0


def _histogram(lengths: list[int], width: int = 32) -> dict[str, int]:
    """Answers per bin of `width` tokens ("0-31": ...), for the JSON."""
    out: dict[str, int] = {}
    for n in sorted(lengths):
        lo = width * (n // width)
        out[f"{lo}-{lo + width - 1}"] = out.get(f"{lo}-{lo + width - 1}", 0) + 1
    return out


if __name__ == "__main__":
    raise SystemExit(main())
