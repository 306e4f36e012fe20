"""How k > 0 trains, chosen by the rule docs/method.md states ("How k > 0 trains"), from committed arm files.

`python -m flywheel.reports.refine_choice` reads each candidate arm's promotion-gate rows in each preset
(`experiments/results/PRESET/arms/ARM.json`), counts the validation games its k=1 and k=2 checkpoints won (a
rejected checkpoint counts: its validation games are its record), sums them over the presets, and applies the
rule: the default moves from `bpo` (continue from k-1 at k=0's rate) to the candidate with the most wins only if
it leads `bpo` by at least `LEAD` games; otherwise `bpo` stays. The test split plays no part. It prints the
table and writes experiments/results/refine-choice/choice.md and choice.json. Until every candidate has both
k in every preset the decision is "pending", with what is missing named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flywheel.config.presets import RESULTS_DIR
from flywheel.core.metrics import md_table
from flywheel.core.provenance import read_arm

# The rule, as stated before the choice arms finished (docs/method.md).
PRESETS = ("cpu-alfworld-horizon", "cpu-powered-scienceworld")
CANDIDATES = {  # arm -> how its k > 0 trains
    "bpo": "continue from k-1 at k=0's learning rate",
    "bpo-lr5e5": "continue from k-1 at a quarter of it (5e-5)",
    "bpo-from-base": "retrain from the base model, k=0's budget over the grown set",
}
INCUMBENT = "bpo"
KS = (1, 2)
LEAD = 5  # games of the 2 presets x 2 k x 50 validation games: a lead smaller than this keeps the incumbent
OUT = RESULTS_DIR / "refine-choice"


def validation_wins(arm: dict[str, Any] | None) -> dict[int, tuple[int, int]]:
    """Checkpoint k's promotion-gate validation record, {k: (games won, games played)}, for each k in KS the
    arm's gate decided (promoted or rejected)."""
    rows = (arm or {}).get("results", {}).get("per_k", [])
    return {r["k"]: (r["promotion"]["successes"], r["promotion"]["validation_n"])
            for r in rows if r["k"] in KS and r.get("promotion")}


def choose(records: dict[str, dict[str, dict[int, tuple[int, int]]]], *, lead: int = LEAD) -> dict[str, Any]:
    """The rule over `records` ({preset: {arm: validation_wins(arm)}}): each candidate's summed wins, and the
    decision. `pending` names each (preset, arm, k) not decided yet; then no candidate is chosen."""
    missing = [f"{preset} {arm} k={k}" for preset in PRESETS for arm in CANDIDATES for k in KS
               if k not in records.get(preset, {}).get(arm, {})]
    played = {arm: [wn for p in PRESETS for wn in records.get(p, {}).get(arm, {}).values()] for arm in CANDIDATES}
    totals = {arm: {"wins": sum(w for w, _ in wn), "games": sum(n for _, n in wn)} for arm, wn in played.items()}
    if missing:
        return {"totals": totals, "pending": missing, "chosen": None, "reason": "not every checkpoint is decided yet"}
    best = max(CANDIDATES, key=lambda a: (totals[a]["wins"], a == INCUMBENT))  # a tie keeps the incumbent
    margin = totals[best]["wins"] - totals[INCUMBENT]["wins"]
    if best != INCUMBENT and margin >= lead:
        chosen, reason = best, f"leads {INCUMBENT} by {margin} games (the rule asks for {lead})"
    else:
        chosen = INCUMBENT
        reason = (f"{INCUMBENT} has the most wins" if best == INCUMBENT else
                  f"{best} leads {INCUMBENT} by {margin} games, fewer than the {lead} the rule asks for")
    return {"totals": totals, "pending": [], "chosen": chosen, "reason": reason}


def collect(results_dir: Path = RESULTS_DIR) -> dict[str, dict[str, dict[int, tuple[int, int]]]]:
    """Every candidate's validation record in every preset, from the committed (checked) arm files."""
    return {p: {arm: validation_wins(read_arm(results_dir / p, arm)) for arm in CANDIDATES} for p in PRESETS}


def render(records: dict[str, dict[str, dict[int, tuple[int, int]]]], decision: dict[str, Any]) -> str:
    """The table (one row per candidate: each preset's k=1 and k=2 validation games won, the sum) and the decision."""
    header = ["arm", "k > 0 trains by"] + [f"{p} k={k}" for p in PRESETS for k in KS] + ["won (of played)"]
    rows = []
    for arm, how in CANDIDATES.items():
        cells = []
        for p in PRESETS:
            for k in KS:
                won = records.get(p, {}).get(arm, {}).get(k)
                cells.append(f"{won[0]}/{won[1]}" if won else "pending")
        t = decision["totals"][arm]
        rows.append([f"`{arm}`", how, *cells, f"{t['wins']} ({t['games']})"])
    verdict = (f"**Chosen: `{decision['chosen']}`**: {decision['reason']}." if decision["chosen"] else
               f"**Pending**: {len(decision['pending'])} checkpoint(s) not decided yet "
               f"({', '.join(decision['pending'])}).")
    return "\n".join([
        "# How k > 0 trains: the rule's choice",
        "",
        "Validation games won by each candidate's k=1 and k=2 checkpoints (the promotion gate's, greedy, 50 "
        "training tasks set aside per preset; a rejected checkpoint counts), summed over the presets. The default "
        f"moves from `{INCUMBENT}` only for a lead of at least {LEAD} games (docs/method.md, \"How k > 0 "
        "trains\"). One run per candidate per preset: a best guess, not a measured difference.",
        "",
        md_table(header, rows),
        "",
        verdict,
        "",
        "Regenerate: `python -m flywheel.reports.refine_choice`.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flywheel.reports.refine_choice", description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="the committed results (PRESET/arms/ARM.json)")
    parser.add_argument("--out", type=Path, default=OUT, help="where choice.md and choice.json go")
    args = parser.parse_args(argv)
    records = collect(args.results_dir)
    decision = choose(records)
    text = render(records, decision)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "choice.md").write_text(text)
    data = {"presets": list(PRESETS), "lead": LEAD, "ks": list(KS),
            "records": {p: {a: {str(k): list(v) for k, v in r.items()} for a, r in arms.items()}
                        for p, arms in records.items()}, **decision}
    (args.out / "choice.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
