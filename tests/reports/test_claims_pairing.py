"""Every paired claim pairs a run with its own k=0 and its own control (flywheel.reports.results.reference_for),
checks by the k=0 weights' hash that they share a block, and states its power; arms whose code commit is not in
the repository's history are marked."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from flywheel.config.presets import RESULTS_DIR, load_preset, parse_claim
from flywheel.core.provenance import read_arm
from flywheel.core.settings import REPO_ROOT
from flywheel.core.validation import ConfigurationError
from flywheel.reports.results import claims, commits_in_history, design


def _committed(name: str, compare: list[str]):
    preset = load_preset(name)
    preset = dataclasses.replace(preset, compare=[parse_claim(c, preset.arms, where="test") for c in compare])
    records = {a: r for a in preset.arms if (r := read_arm(RESULTS_DIR / name, a)) is not None}
    return preset, records


def test_replicates_are_paired_with_their_own_k0_and_their_own_control():
    """bpo-r2 retrained its k=0 (27/100) and bpo-r3 started from it; bpo's k=0 solved 13/100. Against the k=0
    they are +15 and +25 (not +29 and +39 against bpo's); against the control, bpo-r2 and bpo-r3 pair with
    sft-control-r2 (bpo-r2's own control; the control from bpo-r3's k=0 weights), bpo with sft-control."""
    preset, records = _committed("cpu-comparison-scienceworld", ["bpo@2 vs bpo-stage2@0", "bpo@2 vs sft-control@2"])
    rows = {(r["reference"], r["split"]): r for r in claims(preset, records)}
    k0 = rows[("bpo-stage2", "all")]
    assert {m: d["paired_with"] for m, d in k0["replicates"].items()} == {
        "bpo": "bpo-stage2", "bpo-r2": "bpo-r2", "bpo-r3": "bpo-r2"}
    assert [round(100 * d["delta"]) for d in k0["replicates"].values()] == [30, 15, 25]
    assert all(d["block"].startswith("same k=0") for d in k0["replicates"].values())
    control = rows[("sft-control", "all")]
    assert {m: d["paired_with"] for m, d in control["replicates"].items()} == {
        "bpo": "sft-control", "bpo-r2": "sft-control-r2", "bpo-r3": "sft-control-r2"}
    assert [round(100 * d) for d in control["pooled"]["per_run"]] == [4, 1, 11]
    assert control["pooled"]["references"] == ["sft-control", "sft-control-r2"]


def test_a_control_on_other_k0_weights_is_another_block():
    """The WebShop control retrained its k=0 on another machine (another sha256): the claim says so."""
    preset, records = _committed("cpu-comparison-webshop", ["bpo@2 vs sft-control@2"])
    [row] = claims(preset, records)
    assert row["replicates"]["bpo"]["block"].startswith("**other blocks**")


def test_the_design_states_each_claims_power_and_says_underpowered():
    """From the committed ScienceWorld runs: evaluation of identical weights (eto-dpo and grpo at k=0) flips 3
    of 100 tasks, two runs from one k=0 disagree on 18; +7 points at 80% needs 12 runs per arm against the
    control (7.9 points sd of a run's difference), and three runs are underpowered."""
    preset, records = _committed("cpu-comparison-scienceworld", ["bpo@2 vs sft-control@2"])
    rows = claims(preset, records)
    des = design(preset, records, rows)
    ev = des["components"]["evaluation"]["pairs"]
    assert [(p["arms"], p["gained"] + p["lost"]) for p in ev] == [(["eto-dpo", "grpo"], 3)]
    assert {p["discordant"] for p in des["components"]["rollouts"]["pairs"]} == {0.18}
    row = next(r for r in rows if r["split"] == "all")
    assert row["power"]["runs_needed"] == 12 and round(100 * row["power"]["sd"], 1) == 7.9
    assert row["verdict"] == "underpowered" and row["power"]["power"] < 0.2


def test_the_controls_own_replicates_put_its_run_to_run_variance_in_the_power():
    """cpu-powered-scienceworld's first three pairs: the controls (no rollouts; each its own refine_seed) differ
    run to run (k=1 37, 46, 45; k=2 38, 47, 44), so their replicate pairs measure a component of their own
    (sft_order), not evaluation noise. With it, the claim against the control's gate-chosen checkpoint, whose
    three runs happen to agree (-3, +0, -2: sd 1.5), is underpowered at three runs rather than powered."""
    preset, records = _committed("cpu-powered-scienceworld", ["bpo-r1@promoted vs sft-control-r1@2",
                                                              "bpo-r1@promoted vs sft-control-r1@promoted"])
    first = {"bpo-stage2", *(f"{m}-r{i}" for m in ("bpo", "sft-control") for i in (1, 2, 3))}
    records = {a: r for a, r in records.items() if a in first}
    rows = claims(preset, records)
    des = design(preset, records, rows)
    order = des["components"]["sft_order"]["pairs"]
    assert {tuple(p["arms"]) for p in order} == {("sft-control-r1", "sft-control-r2"), ("sft-control-r1", "sft-control-r3"),
                                                 ("sft-control-r2", "sft-control-r3")}
    assert {p["k"] for p in order} == {1, 2}
    assert all(p["arms"][0].startswith("bpo") for p in des["components"]["rollouts"]["pairs"])
    for row in (r for r in rows if r["split"] == "all"):
        power = row["power"]
        assert power["sources"] == ["rollouts", "sft_order"] and power["runs"] == 3
        spread_and_tasks = (power["sd_spread"] ** 2 + power["task_variance"] / power["n"]) ** 0.5
        assert power["sd"] == max(power["sd_components"], spread_and_tasks) > power["sd_spread"]
        assert row["verdict"] == "underpowered" and power["power"] < 0.3
    second = next(r for r in rows if r["split"] == "all" and r["reference_k"] != 2)
    assert round(100 * second["power"]["sd_spread"], 1) == 1.5 and second["power"]["sd_components"] > 0.05


def test_a_replicated_reference_recipe_is_pooled_as_a_group_of_its_own():
    """A claim against another recipe that heads a `replicates` group of its own (no run is paired with one of
    its runs, as bpo's against RFT's): each run's row stays paired with the group's head, and the pooled
    difference is the two groups' means apart, with the reference runs named and their spread in the power.
    Here, from cpu-powered-scienceworld's committed arms, bpo-r1..r3 at k=1 against `bpo` and `bpo-lr5e5` at
    k=1 made a group (same k=0, other recipes)."""
    from flywheel.reports.results import at_k

    preset, records = _committed("cpu-powered-scienceworld", ["bpo-r1@1 vs bpo-lr5e5@1"])
    runs, refs = ["bpo-r1", "bpo-r2", "bpo-r3"], ["bpo-lr5e5", "bpo"]
    preset = dataclasses.replace(preset, replicates={"bpo-r1": runs, "bpo-lr5e5": refs})
    row = next(r for r in claims(preset, records) if r["split"] == "all")
    assert {d["paired_with"] for d in row["replicates"].values()} == {"bpo-lr5e5"}
    pooled = row["pooled"]
    assert pooled["references"] == refs and (pooled["runs"], pooled["reference_runs"]) == (3, 2)

    def rate(arm: str) -> float:
        got = at_k(records[arm], 1)
        return sum(got.values()) / len(got)

    expect = sum(map(rate, runs)) / 3 - sum(map(rate, refs)) / 2
    assert pooled["delta"] == pytest.approx(expect) and pooled["t_ci_low"] < expect < pooled["t_ci_high"]
    design(preset, records, [row])  # the reference group's spread counts in the power's spread estimate
    assert row["power"]["sd_spread"] > pooled["sd"]


def test_arms_whose_commit_is_not_in_history_are_marked():
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    got = commits_in_history([head, "0" * 40])
    if not got["checked"]:
        pytest.skip("no full git history here (a shallow clone or no git)")
    assert got["missing_commits"] == ["0" * 40]
    # a run with uncommitted edits records "<commit>+dirty": in history, and said to be dirty
    dirty = commits_in_history([head + "+dirty"])
    assert dirty["missing_commits"] == [] and dirty["dirty_commits"] == [head + "+dirty"]
    results = RESULTS_DIR / "cpu-comparison-scienceworld"
    for arm in ("react-sft", "react-sft-1pass"):  # ran at commits the history does not hold
        assert commits_in_history(read_arm(results, arm)["provenance"]["commits"])["missing_commits"]
    assert not commits_in_history(read_arm(results, "bpo")["provenance"]["commits"])["missing_commits"]


def test_minimal_effect_and_runs_are_checked_where_the_preset_is_built(tmp_path):
    base = (REPO_ROOT / "experiments" / "cpu-scienceworld-quick.yaml").read_text()
    for line, match in (("minimal_effect: 7", "minimal_effect must be a number > 0 and <= 1"),
                        ("runs: 0", "runs must be an integer in 1..1000")):
        path = tmp_path / "p.yaml"
        path.write_text(base + f"\n{line}\n")
        with pytest.raises(ConfigurationError, match=match):
            load_preset(str(path))
    path.write_text(base + "\nminimal_effect: 0.07\nruns: 12\n")
    preset = load_preset(str(path))
    assert (preset.minimal_effect, preset.runs) == (0.07, 12)


def test_the_report_shows_per_run_differences_the_pooled_interval_its_method_and_underpowered():
    from flywheel.reports.render import render_claims, render_design

    preset, records = _committed("cpu-comparison-scienceworld", ["bpo@2 vs sft-control@2"])
    rows = claims(preset, records)
    results = {"claims": rows, "design": design(preset, records, rows)}
    md = "\n".join(render_claims(rows) + render_design(results, preset))
    pooled = next(line for line in md.splitlines() if "| all | pooled over 3 runs" in line)
    assert "per run +4, +1, +11; sd 5.1, spread 10 pts" in pooled
    assert "+5.3 [-3.0, +15.0]; t over runs [-7.4, +18.1]" in pooled
    assert "underpowered (15% power for +7 at 3 run(s); 12 runs per arm for 80%)" in pooled
    assert "`sft-control`, `sft-control-r2`" in pooled
    assert "hierarchical bootstrap interval (runs with replacement, then the tasks" in md
    assert "| `eto-dpo` vs `grpo` | 0 | 100 | -1 | 3 (3%) |" in md


def test_a_claim_at_promoted_reads_the_checkpoint_the_gate_held(tmp_path):
    """`bpo@promoted` is the checkpoint the promotion gate holds after bpo's last k: here k=2 was rejected (k=1
    kept), so the claim pairs k=1's evaluation with k=0, while `bpo@2` beside it pairs the rejected k=2."""
    from flywheel.reports.render import render_claims

    (tmp_path / "p.yaml").write_text(
        "name: p\nbenchmark: scienceworld\niterations: 2\n"
        "arms:\n  bpo-stage2: {method: bpo-stage2}\n"
        "  bpo: {method: {name: bpo, start_from: bpo-stage2, evaluate_start: false}}\n"
        "compare: ['bpo@promoted vs bpo-stage2@0', 'bpo@2 vs bpo-stage2@0']\n")
    preset = load_preset(str(tmp_path / "p.yaml"))

    def evaluated(k: int, wins: int) -> dict:
        return {f"{k}|seen": {f"t{i}": [i < wins, float(i < wins)] for i in range(20)}}

    def decision(k: int, promoted: bool, kept: int) -> dict:
        return {"k": k, "promotion": {"promoted": promoted, "kept_k": kept}}

    records = {"bpo-stage2": {"outcomes": evaluated(0, 5)},
               "bpo": {"outcomes": {**evaluated(1, 10), **evaluated(2, 2)},
                       "results": {"per_k": [decision(1, True, 1), decision(2, False, 1)]}}}
    promoted, literal = claims(preset, records)
    assert (promoted["k"], promoted["replicates"]["bpo"]["delta"]) == (1, 0.25)  # 10/20 vs 5/20
    assert (literal["k"], literal["replicates"]["bpo"]["delta"]) == (2, -0.15)
    text = "\n".join(render_claims([promoted, literal]))
    assert "`bpo`@promoted (k=1) vs `bpo-stage2`@0" in text and "`bpo`@2 vs `bpo-stage2`@0" in text
    records["bpo"]["results"]["per_k"][1] = decision(2, True, 2)  # k=2 promoted: the claim follows it
    assert claims(preset, records)[0]["k"] == 2
    del records["bpo"]["results"]  # no gate ran: the last evaluated k
    assert claims(preset, records)[0]["k"] == 2
    # method.evaluate_rejected: false left the rejected k=2 unevaluated: @promoted still pairs k=1, and the literal
    # claim says which side was not evaluated instead of "not run yet"
    records["bpo"] = {"outcomes": evaluated(1, 10), "results": {"per_k": [decision(1, True, 1), decision(2, False, 1)]}}
    promoted, literal = claims(preset, records)
    assert promoted["k"] == 1 and (literal["status"], literal["missing"]) == ("not evaluated", ["bpo@2 not evaluated"])
    assert "| - | - | - | - | bpo@2 not evaluated |" in "\n".join(render_claims([promoted, literal]))


def test_a_claim_on_an_arm_still_running_says_so():
    """An arm file written while the arm runs (a stop mid-arm writes the report) resolves @promoted to what its
    gate holds so far: the claim's row names the arm that is not complete."""
    from flywheel.reports.render import render_claims

    preset, records = _committed("cpu-comparison-scienceworld", ["bpo@2 vs sft-control@2"])
    records["sft-control"] = {**records["sft-control"],
                              "provenance": {**records["sft-control"]["provenance"], "complete": False}}
    [row] = [r for r in claims(preset, records) if r["split"] == "all"]
    assert {m: d["in_progress"] for m, d in row["replicates"].items()} == {
        "bpo": ["sft-control"], "bpo-r2": [], "bpo-r3": []}
    text = "\n".join(render_claims([row]))
    assert "`bpo` (not complete: `sft-control`)" in text and "`bpo-r2` (not complete" not in text
