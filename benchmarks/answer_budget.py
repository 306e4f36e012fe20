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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402
from _k0 import k0_set  # noqa: E402

from flywheel.core.metrics import answer_lengths  # noqa: E402
from flywheel.policy.models import load_tokenizer  # noqa: E402
from flywheel.policy.sft import answer_tokens, example_tokens  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", help="preset name (experiments/NAME.yaml) or path")
    ap.add_argument("--arm", default=None, help="the arm whose k=0 set to measure (default: the preset's first)")
    args = ap.parse_args(argv)
    k0 = k0_set(args.preset, args.arm)
    arm, examples = k0.arm, k0.examples
    tok = load_tokenizer(k0.model)
    lengths = [answer_tokens(tok, r) for r in examples]
    whole = [example_tokens(tok, r) for r in examples]
    cap = k0.max_new_tokens
    got = answer_lengths(lengths, cap)
    suggested = 32 * (math.floor(got["max"] / 32) + 1) if got["max"] is not None else cap
    print_table(f"{k0.preset} / {arm}: k=0 SFT answers in tokens ({got['n']} examples, {k0.trajectories} trajectories)",
                ["median", "p95", "max", "max_new_tokens", "at or over it", "suggested max_new_tokens"],
                [[got["median"], got["p95"], got["max"], cap, f"{got['at_cap']}/{got['n']}", suggested]])
    # Whole examples (prompt + answer) longer than policy.max_length are dropped by SFT, never truncated.
    limit = k0.cfg.max_length
    examples_got = answer_lengths(whole, limit)
    over = sum(n > limit for n in whole)  # SFT keeps an example of exactly max_length tokens
    print_table(f"{k0.preset} / {arm}: k=0 SFT examples (prompt + answer) in tokens",
                ["median", "p95", "max", "max_length", "over it (dropped by SFT)"],
                [[examples_got["median"], examples_got["p95"], examples_got["max"], limit, f"{over}/{len(whole)}"]])
    path = write_json(f"answer_budget_{k0.preset}", {"preset": k0.preset, "arm": arm, "trajectories": k0.trajectories,
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
