"""The rule that chooses how k > 0 trains (flywheel/reports/refine_choice.py; docs/method.md)."""

from __future__ import annotations

import json
import shutil

from flywheel.config.presets import RESULTS_DIR
from flywheel.reports import refine_choice as rc


def decided(wins: dict[str, tuple[int, int]]) -> dict:
    """Every candidate decided at k=1 and k=2 in every preset: `wins[arm]` = (k=1 games won, k=2 games won) in
    each preset, of 50."""
    return {p: {arm: {1: (w1, 50), 2: (w2, 50)} for arm, (w1, w2) in wins.items()} for p in rc.PRESETS}


def test_a_lead_below_the_stated_margin_keeps_the_incumbent():
    # bpo-lr5e5 leads by 2 per preset: 4 of 200 games, one short of the rule's 5
    d = rc.choose(decided({"bpo": (3, 3), "bpo-lr5e5": (4, 4), "bpo-from-base": (1, 1)}))
    assert d["chosen"] == "bpo" and d["pending"] == []
    assert d["totals"]["bpo-lr5e5"] == {"wins": 16, "games": 200} and d["totals"]["bpo"]["wins"] == 12
    assert "fewer than the 5" in d["reason"]


def test_a_lead_of_the_margin_moves_the_default_to_the_leader():
    d = rc.choose(decided({"bpo": (3, 3), "bpo-lr5e5": (4, 4), "bpo-from-base": (4, 5)}))
    assert d["chosen"] == "bpo-from-base"          # 18 against bpo's 12 and lr5e5's 16
    assert "by 6 games" in d["reason"]


def test_a_tie_at_the_top_keeps_the_incumbent():
    d = rc.choose(decided({"bpo": (9, 9), "bpo-lr5e5": (9, 9), "bpo-from-base": (0, 0)}), lead=0)
    assert d["chosen"] == "bpo"


def test_nothing_is_chosen_while_a_checkpoint_is_undecided():
    records = decided({"bpo": (0, 0), "bpo-lr5e5": (20, 20), "bpo-from-base": (0, 0)})
    del records[rc.PRESETS[1]]["bpo-from-base"][2]
    d = rc.choose(records)
    assert d["chosen"] is None and d["pending"] == [f"{rc.PRESETS[1]} bpo-from-base k=2"]
    assert "Pending" in rc.render(records, d) and "pending" in rc.render(records, d)


def test_the_validation_record_is_the_gates_own_for_each_k_it_decided():
    arm = {"results": {"per_k": [
        {"k": 0, "promotion": None},
        {"k": 1, "promotion": {"successes": 2, "validation_n": 50, "promoted": False}},
        {"k": 2, "promotion": {"successes": 5, "validation_n": 50, "promoted": True}},
        {"k": 3, "promotion": {"successes": 9, "validation_n": 50, "promoted": True}},  # beyond the rule's K
    ]}}
    assert rc.validation_wins(arm) == {1: (2, 50), 2: (5, 50)}
    assert rc.validation_wins(None) == {}


def test_main_reads_the_committed_arm_files(tmp_path):
    # the committed ALFWorld arms, copied: their records are the arm files' promotion rows; the rest is pending
    preset = "cpu-alfworld-horizon"
    src = RESULTS_DIR / preset / "arms"
    (tmp_path / "results" / preset).mkdir(parents=True)
    shutil.copytree(src, tmp_path / "results" / preset / "arms")
    assert rc.main(["--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "out")]) == 0
    out = json.loads((tmp_path / "out" / "choice.json").read_text())
    for arm in rc.CANDIDATES:
        if not (src / f"{arm}.json").is_file():
            continue
        rows = json.loads((src / f"{arm}.json").read_text())["results"]["per_k"]
        want = {str(r["k"]): [r["promotion"]["successes"], r["promotion"]["validation_n"]]
                for r in rows if r["k"] in rc.KS and r.get("promotion")}
        assert out["records"][preset][arm] == want
    assert out["chosen"] is None and any(p.startswith("cpu-powered-scienceworld") for p in out["pending"])
    assert (tmp_path / "out" / "choice.md").read_text().startswith("# How k > 0 trains")
