"""The tables across benchmarks (`flywheel report --all-benchmarks`, the paper's Table 1) are built from the specs."""

import dataclasses
from types import SimpleNamespace
from typing import ClassVar

import pytest

from envs import REGISTRY
from flywheel.config.presets import RESULTS_DIR, load_preset
from flywheel.core import quality
from flywheel.core.store import Store
from flywheel.reports import paper
from flywheel.reports.dashboard import all_benchmarks_table
from flywheel.reports.render import render_committed
from tests.fakes import BareSpec
from tests.helpers import paper_arm as _arm
from tests.helpers import paper_checkpoint as _ck


@dataclasses.dataclass(frozen=True)
class ReportedSpec(BareSpec):
    """A registered benchmark with every optional attribute the tables read."""

    name: str = "bare"
    display_name: ClassVar[str] = "Bare Bench"
    eval_splits: ClassVar[tuple[str, ...]] = ("unseen",)
    primary_metric: ClassVar[str] = "avg_reward"
    paper_notes: ClassVar[tuple[str, ...]] = ("Bare Bench is a test double.",)


REPORTED = ReportedSpec()


def _evaluate(db: Store, bench: str, split: str, v: float, k: int = 0) -> None:
    db.write_evaluation({"benchmark": bench, "iteration": k, "split": split, "checkpoint_id": "c",
                         "episodes": 4, "errored": 0, "success_rate": v, "avg_reward": v / 2, "mean_steps": 1.0,
                         "tokens_per_step": 1.0, "prompt_tokens_per_step": 1.0, "invalid_action_rate": 0.0})


def test_all_benchmarks_table_layout_and_average(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    for bench, split, v in [("alfworld", "seen", 0.5), ("alfworld", "unseen", 0.25), ("scienceworld", "seen", 1.0),
                            ("scienceworld", "unseen", 0.0), ("webshop", "seen", 0.4), ("webshop", "unseen", 0.4)]:
        db.write_evaluation({"benchmark": bench, "iteration": 0, "split": split, "checkpoint_id": "c",
                             "episodes": 4, "errored": 0, "success_rate": v, "avg_reward": v, "mean_steps": 1.0,
                             "tokens_per_step": 1.0, "prompt_tokens_per_step": 1.0, "invalid_action_rate": 0.0})
    db.write_evaluation({"benchmark": "scienceworld", "iteration": 1, "split": "seen", "checkpoint_id": "c",
                         "episodes": 4, "errored": 0, "success_rate": 0.75, "avg_reward": 0.8, "mean_steps": 1.0,
                         "tokens_per_step": 1.0, "prompt_tokens_per_step": 1.0, "invalid_action_rate": 0.0})
    table = all_benchmarks_table(db).splitlines()
    assert table[0].startswith("| k | ALFWorld seen | ALFWorld unseen | ScienceWorld seen | ScienceWorld unseen | WebShop | average")
    assert table[2] == "| 0 | 50.0 | 25.0 | 100.0 | 0.0 | 40.0 | 43.0 |"
    assert table[3] == "| 1 | - | - | 75.0 | - | - | 75.0 (1/5 cols) |"


def test_paper_table1_titles_the_registered_benchmarks_by_their_specs():
    header, rows = paper.table1({"arms": []})
    assert header == ["method", "ALFWorld seen", "ALFWorld unseen", "ScienceWorld seen", "ScienceWorld unseen",
                      "WebShop avg reward", "WebShop success %"] and rows == []
    notes = paper.paper_notes()
    assert len(notes) == 2 and "211-task" in notes[0] and "stand-in catalog" in notes[1]


def test_a_registered_benchmark_gets_its_columns_from_its_spec(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, "bare", "tests.reports.test_report:REPORTED")
    db = Store(tmp_path / "s.duckdb")
    _evaluate(db, "bare", "unseen", 0.5)
    _evaluate(db, "bare", "seen", 0.9)  # not an evaluation split of this benchmark: no column
    _evaluate(db, "webshop", "unseen", 0.25)
    table = all_benchmarks_table(db).splitlines()
    assert table[0] == ("| k | ALFWorld seen | ALFWorld unseen | Bare Bench | ScienceWorld seen | ScienceWorld unseen "
                        "| WebShop | average |")  # registry names in order: alfworld, bare, scienceworld, webshop
    assert table[2] == "| 0 | - | - | 50.0 | - | - | 25.0 | 37.5 (2/6 cols) |"
    assert all_benchmarks_table(db, metric="avg_reward").splitlines()[2] == "| 0 | - | - | 25.0 | - | - | 12.5 | 18.8 (2/6 cols) |"

    ck = {"k": 1, "checkpoint_id": "c", "buckets": [], "splits": {"unseen": {
        "success": quality.rate(1, 2), "reward": quality.bootstrap_ratio([0.5, 1.0], [1.0, 1.0]),
        "prompt_tokens_per_step": quality.bootstrap_ratio([], []), "tokens_per_step": quality.bootstrap_ratio([], []),
        "mean_steps": quality.bootstrap_ratio([], []), "outcomes": {"t0": True, "t1": False}}}}
    data = {"presets": ["bare-mini"], "fig2": {}, "figures": {}, "arms": [
        {"preset": "bare-mini", "arm": "bpo", "benchmark": "bare", "method": "bpo", "history_mode": "fused",
         "checkpoints": {1: ck}}]}
    header, [row] = paper.table1(data)
    assert header[3] == "Bare Bench avg reward" and row[3].startswith("0.750 [") and row[3].endswith("(n=2) k=1")
    # A benchmark whose primary metric is not success also gets its success rate, beside it.
    assert header[4] == "Bare Bench success %" and row[4].startswith("50.0 [") and row[4].endswith("(n=2) k=1")
    assert row[1] == row[5] == row[7] == row[8] == "not run"
    md = paper.render(data, [SimpleNamespace(benchmark="bare", notes=["preset note"])])
    assert "; Bare Bench and WebShop average reward, tokens per step" in md
    assert "## Table 4: SFT vs SFT+DPO vs SFT+GRPO vs BPO (bare)\n\n(No ScienceWorld experiment given" in md
    notes = md.split("## What differs from the paper")[1]
    assert notes.index("- Bare Bench is a test double.") < notes.index("211-task") < notes.index("- preset note")


@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS_DIR.iterdir() if (p / "results.json").exists()))
def test_each_committed_report_is_a_rendering_of_its_results(name):
    """Computing results and rendering them are separate: report.md comes from results.json (and the plots
    beside it) alone, with no store."""
    committed = (RESULTS_DIR / name / "report.md").read_text()
    assert render_committed(load_preset(name), RESULTS_DIR / name) == committed
    assert committed.count("## Arm `") >= 1


def test_the_report_counts_answers_cut_by_the_generation_budget(tmp_path):
    """An arm's results carry, per checkpoint, its trained answers' lengths (from the SFT lineage) and, per
    evaluated split, how many evaluation answers reached max_new_tokens; the report renders them as a table."""
    from flywheel.core.metrics import answer_lengths
    from flywheel.core.trajectory import Step, Trajectory
    from flywheel.reports.render import render_answer_lengths
    from flywheel.reports.results import arm_results

    db = Store(tmp_path / "a.duckdb")
    db.record_checkpoint({"checkpoint_id": "c0", "benchmark": "b", "iteration": 0, "path": "p", "base_model": "m",
                          "n_examples": 4, "n_trajectories": 1, "train_loss": 0.5,
                          "lineage": {"answer_tokens": answer_lengths([50, 60, 70, 200], cap=160)}})
    db.write_trajectories([Trajectory(
        benchmark="b", split="unseen", task_id=f"t{i}", source="policy", iteration=0, sample=0, goal="g",
        steps=[Step(observation="o", thought="e", plan="p", action="a", completion_tokens=n) for n in tokens])
        for i, tokens in enumerate([[40, 160], [30], [160, 160, 20]])])
    _evaluate(db, "b", "unseen", 0.0)
    res = arm_results(db, "b", 0, {}, ("unseen",), max_new_tokens=160)
    [row] = res["per_k"]
    assert row["checkpoint"]["answer_tokens"]["at_cap"] == 1
    assert {k: row["splits"]["unseen"]["answer_tokens"][k] for k in ("n", "at_cap", "max")} == {
        "n": 6, "at_cap": 3, "max": 160}
    table = "\n".join(render_answer_lengths({**res, "splits": ["unseen"]}))
    assert "`max_new_tokens` = 160" in table and "| 0 | 60 / 200 / 200 | 1/4 | 3/6 (50.0%) |" in table
    # an arm that recorded neither (older results) renders no table
    assert render_answer_lengths({"splits": ["unseen"], "per_k": [{"k": 0, "splits": {"unseen": {}}}]}) == []


def test_the_report_gives_invalid_actions_and_steps_per_episode_per_split(tmp_path):
    """Beside success, what the greedy evaluation did: the share of rejected (invalid) actions and the steps per
    episode, per checkpoint and split, from the evaluation's summary; arms that recorded neither get no table."""
    from flywheel.core.metrics import summarize
    from flywheel.core.trajectory import Step, Trajectory
    from flywheel.reports.render import render_behaviour
    from flywheel.reports.results import arm_results

    db = Store(tmp_path / "a.duckdb")
    trajs = [Trajectory(benchmark="b", split="unseen", task_id=f"t{i}", source="policy", iteration=0, sample=0,
                        goal="g", steps=[Step(observation="o", thought="e", plan="p", action="a", invalid=bad)
                                         for bad in flags])
             for i, flags in enumerate([[True, False, False], [True]])]  # 2 of 4 actions rejected, 2 steps/episode
    db.write_trajectories(trajs)
    db.write_evaluation({"benchmark": "b", "iteration": 0, "split": "unseen", "checkpoint_id": "c",
                         **summarize(trajs)})
    res = {**arm_results(db, "b", 0, {}, ("unseen",)), "splits": ["seen", "unseen"]}
    table = "\n".join(render_behaviour(res))
    assert "| k | seen invalid / steps | unseen invalid / steps |" in table and "| 0 | - | 50.0% / 2.0 |" in table
    assert render_behaviour({"splits": ["unseen"], "per_k": [{"k": 0, "splits": {"unseen": {}}}]}) == []


def test_the_report_gives_average_reward_an_interval_and_a_paired_difference(tmp_path):
    """Average reward (WebShop's metric) gets a bootstrap interval over episodes per checkpoint and a paired
    bootstrap difference between checkpoints, beside the success rate's; the report renders both."""
    from flywheel.core.trajectory import Step, Trajectory
    from flywheel.reports.render import render_markdown
    from flywheel.reports.results import arm_results

    db = Store(tmp_path / "a.duckdb")
    rewards = {0: [0.0, 0.5, 0.5, 1.0], 1: [0.5, 0.5, 1.0, 1.0]}
    for k, rs in rewards.items():
        db.write_trajectories([Trajectory(
            benchmark="b", split="unseen", task_id=f"t{i}", source="policy", iteration=k, sample=0, goal="g",
            steps=[Step(observation="o", thought="e", plan="p", action="a")], success=r == 1.0, reward=r)
            for i, r in enumerate(rs)])
        _evaluate(db, "b", "unseen", sum(r == 1.0 for r in rs) / 4, k=k)
    res = arm_results(db, "b", 1, {}, ("unseen",))
    r0, r1 = (row["splits"]["unseen"]["reward"] for row in res["per_k"])
    assert (r0["n"], r0["value"], r1["value"]) == (4, 0.5, 0.75)
    assert 0.0 <= r0["ci_low"] < 0.5 < r0["ci_high"] <= 1.0
    [c] = res["comparisons"]
    assert (c["new"], c["old"], c["reward"]["n"], c["reward"]["delta"]) == (1, 0, 4, 0.25)
    assert c["reward"]["ci_low"] >= 0.0 and c["reward"]["ci_high"] <= 0.5  # every task gained or held
    preset = SimpleNamespace(name="p", benchmark="b", iterations=1, model="m", description="", notes=[])
    md = render_markdown({"arms": {"a": {**res, "splits": ["unseen"], "config": {}, "provenance": {}}},
                          "arm_comparisons": [], "claims": []}, preset)
    assert f"| 0.500 [{r0['ci_low']:.3f}, {r0['ci_high']:.3f}] |" in md and "| +0.250 [" in md


def test_the_stage_ablation_pairs_each_run_with_its_own_previous_stage():
    """A replicate's k=1 is compared with the k=0 it continued from (its own, or its start_from arm's), not
    with the last row of the run listed above it; Table 4 compares against `react-sft`, not a variant."""
    data = {"arms": [
        _arm("base", "base", {0: _ck(0, 0)}),
        _arm("bpo-stage2", "bpo-stage2", {0: _ck(0, 1)}),
        _arm("bpo", "bpo", {1: _ck(1, 2), 2: _ck(2, 4)}, start_from="bpo-stage2"),
        _arm("bpo-r2", "bpo", {0: _ck(0, 3), 1: _ck(1, 5), 2: _ck(2, 6)}, start_from="bpo-stage2"),
        _arm("bpo-r3", "bpo", {1: _ck(1, 7), 2: _ck(2, 5)}, start_from="bpo-r2"),
        _arm("react-sft-1pass", "react-sft", {0: _ck(0, 0)}),
        _arm("react-sft", "react-sft", {0: _ck(0, 3)}),
    ]}
    header, rows = paper.table2(data, "scienceworld")
    got = {r[0]: r[-1].split(" [")[0] for r in rows}
    assert header[-1].startswith("vs the stage before")
    assert got == {"base": "-", "+ stage 2": "+10.0",
                   "+ stage 3, k=1": "+10.0", "+ stage 3, k=2": "+20.0",  # bpo: from bpo-stage2's k=0 (1 of 10)
                   "+ stage 2 (`bpo-r2`), its own k=0": "+30.0",  # against base, the stage before
                   "+ stage 3, k=1 (`bpo-r2`)": "+20.0", "+ stage 3, k=2 (`bpo-r2`)": "+10.0",
                   "+ stage 3, k=1 (`bpo-r3`)": "+40.0",  # from bpo-r2's k=0 (3 of 10)
                   "+ stage 3, k=2 (`bpo-r3`)": "-20.0"}
    header, rows = paper.table4(data, "scienceworld")
    got = {r[0]: r[-1].split(" [")[0] for r in rows}
    assert header[-1].startswith("vs SFT (`react-sft`)")
    assert got == {"SFT (ReAct) (`react-sft-1pass`), k=0": "-30.0", "SFT (ReAct), k=0": "-",
                   "BPO, k=2": "+10.0", "BPO (`bpo-r2`), k=2": "+30.0", "BPO (`bpo-r3`), k=2": "+20.0"}

    # DPO and GRPO from a replicate ReAct SFT: that one is the reference.
    data["arms"] += [_arm("react-sft-r2", "react-sft", {0: _ck(0, 2)}),
                     _arm("eto-dpo", "eto-dpo", {1: _ck(1, 4)}, start_from="react-sft-r2"),
                     _arm("grpo", "grpo", {1: _ck(1, 1)}, start_from="react-sft-r2")]
    header, rows = paper.table4(data, "scienceworld")
    got = {r[0]: r[-1].split(" [")[0] for r in rows}
    assert header[-1].startswith("vs SFT (`react-sft-r2`)")
    assert got["SFT + DPO (ETO), k=1"] == "+20.0" and got["SFT + GRPO, k=1"] == "-10.0"
    assert got["SFT (ReAct), k=0"] == "+10.0" and got["SFT (ReAct) (`react-sft-r2`), k=0"] == "-"

    # An arm that starts from one of them (GRPO again from grpo's k=0) keeps that same reference.
    data["arms"].append(_arm("grpo-lr", "grpo", {1: _ck(1, 0)}, start_from="grpo"))
    header, rows = paper.table4(data, "scienceworld")
    got = {r[0]: r[-1].split(" [")[0] for r in rows}
    assert header[-1].startswith("vs SFT (`react-sft-r2`)")
    assert got["SFT + GRPO (`grpo-lr`), k=1"] == "-20.0" and got["SFT + GRPO, k=1"] == "-10.0"


def test_table5_compares_a_fused_k0_with_react_sft_on_each_benchmark(tmp_path):
    """Table 5 takes bpo-stage1's k=0 as the fused one, else bpo-stage2's (WebShop ran no bpo-stage1), read from
    the committed results."""
    presets = [(load_preset(n), tmp_path / n) for n in ("cpu-comparison-scienceworld", "cpu-comparison-webshop")]
    data = paper.collect(presets)
    for bench, fused in (("scienceworld", "fused (plan + action history)"),
                         ("webshop", "fused (plan + action history), with stage 2's synthetic tasks")):
        _, rows = paper.table5(data, bench)
        modes = {r[1] for r in rows}
        assert modes == {fused, "full history (ReAct, long thoughts)"}, (bench, modes)


def test_sft_rates_count_only_the_steps_the_timed_attempt_trained(tmp_path):
    """An SFT resumed after a kill (from its state at step 30 of 40) is timed over its last 10 steps: its
    examples/s and tokens/s are those 10 steps' over its seconds, not all 40 steps' (4x too fast)."""
    from flywheel.reports.results import arm_results

    db = Store(tmp_path / "a.duckdb")
    lineage = {"train_steps": 40, "batch_size": 8, "train_seconds": 100.0, "tokens_trained": 40_000}
    for k, resumed in ((0, 0), (1, 30)):
        db.record_checkpoint({"checkpoint_id": f"c{k}", "benchmark": "b", "iteration": k, "path": "p",
                              "base_model": "m", "n_examples": 80, "n_trajectories": 1, "train_loss": 0.5,
                              "lineage": {**lineage, "resumed_at_step": resumed}})
    rows = {r["k"]: r["checkpoint"] for r in arm_results(db, "b", 1, {}, ("unseen",))["per_k"]}
    assert (rows[0]["sft_examples_per_s"], rows[0]["sft_tokens_per_s"]) == (3.2, 400.0)
    assert (rows[1]["sft_examples_per_s"], rows[1]["sft_tokens_per_s"]) == (0.8, 100.0)
