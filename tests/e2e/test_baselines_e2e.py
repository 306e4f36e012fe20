"""Every method as an arm of one experiment (tiny model, 3 WebShop goals, K=1), through the same Dagster
jobs and the same evaluation; its rows carry the arm's method; `flywheel paper` tables them with n and
intervals. The stage plans and the methods' implied settings are checked on their own."""

import json
from pathlib import Path

import pytest
import yaml

from flywheel.cli import main
from flywheel.config.presets import load_preset
from flywheel.core.prompting import build_messages, parse_response
from flywheel.core.store import Store
from flywheel.orchestration.methods import METHODS, method_stages

REPO = Path(__file__).resolve().parents[2]

MINI = {
    "name": "mini-baselines",
    "benchmark": "webshop",
    "iterations": 1,
    "model": "tiny",
    "envs": {"seed_limit": 2, "train_limit": 3, "eval_limit": 3, "max_steps": 3},
    "policy": {"epochs": 1, "max_new_tokens": 24, "samples_per_task": 2, "parallel_envs": 3, "batch_size": 4,
               "temperature": 1.0, "max_observation_chars": 200, "history_window": 2, "max_length": 8192},
    "curriculum": {"synthesize": False},
    "loop": {"adaptive_sampling": False},
    "method": {"dpo_max_steps": 2, "dpo_batch_size": 2, "grpo_group_size": 2, "grpo_tasks": 2},
    "continue_on_empty_gate": True,
    "arms": {m: {"method": m} for m in METHODS if m != "bpo"},
}
# Continuing arms take the identical k=0 SFT of an earlier arm instead of training it again.
MINI["arms"].update({m: {"method": {"name": m, "start_from": "react-sft"}} for m in ("eto-dpo", "grpo")})
MINI["arms"]["bpo-stage3"] = {"method": {"name": "bpo-stage3", "start_from": "bpo-stage2"}}
# The equal-compute control: bpo-stage3's k=0, then as many SFT steps as bpo-stage3 trains at k=1, no gate data.
MINI["arms"]["sft-control"] = {"method": {"name": "sft-control", "start_from": "bpo-stage2", "controls": "bpo-stage3"}}


def test_methods_imply_their_settings_and_stages(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**MINI, "arms": {**MINI["arms"], "mine": {"method": "react-sft",
                                                                              "policy": {"history_window": 5}}}}))
    preset = load_preset(str(path))
    react = preset.arm_sections("react-sft")
    assert react["policy"]["history_mode"] == "react" and react["policy"]["history_window"] is None
    assert react["curriculum"] == {"synthesize": False, "order": "shuffle"}
    assert preset.arm_sections("mine")["policy"]["history_window"] == 5  # the arm's own override wins
    assert preset.arm_sections("bpo-stage2")["policy"].get("history_mode", "fused") == "fused"
    assert preset.arm_sections("rft")["loop"]["gate_drops_seed_repeats"] is False
    assert preset.method("grpo") == "grpo" and preset.arm_sections("grpo")["method"]["grpo_group_size"] == 2
    names = {m: [s for s, _, _ in method_stages("webshop", 2, m)] for m in METHODS}
    assert names["base"] == ["bootstrap", "base:0", "evaluation:0"]
    assert names["react-sft"] == names["bpo-stage1"] == ["bootstrap", "sft:0", "evaluation:0"]
    assert names["bpo-stage3"] == names["rft"] == names["bpo"] == [s for s, _, _ in method_stages("webshop", 2)]
    assert names["eto-dpo"][3:6] == ["rollouts:0", "dpo:1", "evaluation:1"] and names["eto-dpo"][-1] == "evaluation:2"
    assert names["grpo"][3:] == ["grpo:1", "evaluation:1", "grpo:2", "evaluation:2"]
    # Continuing arms may skip evaluating their k=0 SFT (another arm trains and evaluates the same one).
    assert [s for s, _, _ in method_stages("webshop", 1, "grpo", evaluate_start=False)] == [
        "bootstrap", "sft:0", "grpo:1", "evaluation:1"]
    assert "evaluation:0" not in [s for s, _, _ in method_stages("webshop", 1, "rft", evaluate_start=False)]
    # ... and so does a plain flywheel arm (method.start_from without a method name: bpo).
    assert [s for s, _, _ in method_stages("webshop", 1, "bpo", evaluate_start=False)] == [
        "bootstrap", "sft:0", "rollouts:0", "sft:1", "evaluation:1"]
    assert [s for s, _, _ in method_stages("webshop", 1, "react-sft", evaluate_start=False)][-1] == "evaluation:0"
    from flywheel.drivers.experiment import import_start_checkpoint

    with pytest.raises(Exception, match=r"cannot start from arm 'bpo-stage1'.*\['policy\.history_mode', "
                                        r"'policy\.history_window'\] differ"):
        import_start_checkpoint(preset, "rft", "bpo-stage1", tmp_path / "runs" / "rft", Store(tmp_path / "x.duckdb"))
    # Rollout and evaluation sizes cannot change the k=0 SFT: such an arm may share it (here: not trained yet).
    sized = tmp_path / "sized.yaml"
    sized.write_text(yaml.safe_dump({**MINI, "arms": {"a": {}, "b": {"envs": {"train_limit": 3, "eval_limit": 2},
                                                                     "policy": {"samples_per_task": 4},
                                                                     "method": {"start_from": "a"}}}}))
    with pytest.raises(Exception, match="has not finished"):
        import_start_checkpoint(load_preset(str(sized)), "b", "a", tmp_path / "runs" / "b", Store(tmp_path / "y.duckdb"))
    with pytest.raises(Exception, match="has not finished"):
        import_start_checkpoint(preset, "grpo", "react-sft", tmp_path / "runs" / "grpo", Store(tmp_path / "x.duckdb"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**MINI, "arms": {"x": {"method": "ppo"}}}))
    with pytest.raises(Exception, match="unknown method 'ppo'"):
        load_preset(str(bad))


def test_react_prompt_is_a_growing_transcript():
    from flywheel.core.prompting import HistoryItem

    h = [HistoryItem(plan="p", action="search[x]", observation="results", thought="long thought one")]
    m1 = build_messages("Shop.", "Goal: buy x", [], history_mode="react")
    m2 = build_messages("Shop.", "Goal: buy x", h, history_mode="react")
    assert m2[: len(m1)] == m1 and [m["role"] for m in m2] == ["system", "user", "assistant", "user"]
    assert m2[2]["content"] == "Thought: long thought one\nAction: search[x]"  # no short plan in ReAct
    assert "Plan:" not in m1[0]["content"] and parse_response(m2[2]["content"]).action == "search[x]"
    fused = build_messages("Shop.", "Goal: buy x", h)
    assert len(fused) == 2 and "long thought one" not in fused[1]["content"]  # the default is unchanged


def test_every_method_end_to_end_and_the_paper_tables(tmp_path, capsys):
    preset = tmp_path / "mini-baselines.yaml"
    preset.write_text(yaml.safe_dump(MINI))
    runs, results = tmp_path / "runs", tmp_path / "results"
    assert main(["experiment", str(preset), "--runs-dir", str(runs), "--results-dir", str(results)]) == 0
    data = json.loads((results / "results.json").read_text())
    for arm in MINI["arms"]:
        db = Store(runs / arm / "flywheel.duckdb")
        evals = {(r["iteration"], r["split"]) for r in db.evaluation_rows("webshop")}
        ks = [0, 1] if arm in ("bpo-stage3", "rft", "eto-dpo", "grpo", "sft-control") else [0]
        assert evals == {(k, "unseen") for k in ks}, arm
        assert set(db.query("SELECT DISTINCT method FROM trajectories")["method"]) == {arm}
        assert set(db.query("SELECT DISTINCT method FROM checkpoints")["method"]) == {arm}
        assert data["arms"][arm]["per_k"][0]["splits"]["unseen"]["n"] == 3
    react0 = Store(runs / "react-sft" / "flywheel.duckdb").latest_checkpoint("webshop", 0)
    for arm in ("eto-dpo", "grpo"):  # the same k=0 weights, labelled with the arm's method, lineage says whence
        ck0 = Store(runs / arm / "flywheel.duckdb").latest_checkpoint("webshop", 0)
        assert ck0["path"] == react0["path"] and ck0["method"] == arm
        assert json.loads(ck0["lineage"])["imported_from_arm"] == "react-sft"
    # The control trains exactly as many SFT steps as the arm it controls, on seeds and curriculum only, from the
    # same k=0 weights, and plays no rollouts.
    stage3, control = (Store(runs / a / "flywheel.duckdb") for a in ("bpo-stage3", "sft-control"))
    steps = [json.loads(db.latest_checkpoint("webshop", 1)["lineage"]) for db in (stage3, control)]
    assert steps[0]["train_steps"] == steps[1]["train_steps"] > 0 and steps[1]["dataset"]["gated"] == 0
    assert steps[1]["base_model"] == control.latest_checkpoint("webshop", 0)["path"]
    assert control.query("SELECT count(*) AS n FROM trajectories WHERE split = 'train' AND source = 'policy'")["n"][0] == 0
    base = Store(runs / "base" / "flywheel.duckdb").checkpoint_rows("webshop")
    assert len(base) == 1 and base[0]["n_examples"] == 0 and "tiny-model" in base[0]["path"]
    # ReAct arms play full-history transcripts: each step's prompt is the last one plus an answer and an observation.
    react = Store(runs / "react-sft" / "flywheel.duckdb")
    tokens = react.query("SELECT s.traj_id, s.t, s.prompt_tokens FROM steps s JOIN trajectories t USING (traj_id) "
                         "WHERE t.source = 'policy' ORDER BY 1, 2").rows()
    grew = [b[2] > a[2] for a, b in zip(tokens, tokens[1:], strict=False) if a[0] == b[0]]
    assert grew and all(grew)
    dpo = Store(runs / "eto-dpo" / "flywheel.duckdb")
    pairs = dpo.preference_pairs("webshop", 1)
    assert pairs and all(p["chosen_source"] == "teacher" for p in pairs)  # the random policy fails every goal
    ck1 = dpo.latest_checkpoint("webshop", 1)
    lineage = json.loads(ck1["lineage"])
    assert lineage["pairs"] == len(pairs) and lineage["starts_from"] == dpo.latest_checkpoint("webshop", 0)["checkpoint_id"]
    assert (Path(ck1["path"]) / "config.json").exists()
    grpo = Store(runs / "grpo" / "flywheel.duckdb")
    played = grpo.query("SELECT task_id, count(*) AS n FROM trajectories WHERE source = 'policy' AND split = 'train' "
                        "AND iteration = 0 GROUP BY 1")
    assert sorted(played["n"].to_list()) == [2, 2]  # G=2 episodes on each of grpo_tasks=2 goals
    glin = json.loads(grpo.latest_checkpoint("webshop", 1)["lineage"])
    assert glin["episodes"] == 4 and "updated" in glin  # equal rewards: no update, recorded as such
    capsys.readouterr()

    assert main(["paper", str(preset), "--runs-dir", str(runs), "--results-dir", str(tmp_path / "paper")]) == 0
    md = (tmp_path / "paper" / "paper.md").read_text()
    for title in ("Table 1", "Table 2", "Table 4", "Table 5", "Fig. 2", "211"):
        assert title in md
    paper = json.loads((tmp_path / "paper" / "paper.json").read_text())
    assert {a["method"] for a in paper["arms"]} == set(MINI["arms"])  # each arm is named after its method
    assert (tmp_path / "paper" / "fig2_success_by_complexity.png").stat().st_size > 1000
    t1 = md.split("## Table 1")[1].split("##")[0]
    assert t1.count("(n=3)") == 2 * len(MINI["arms"])  # WebShop's average reward and success per method, with n
    assert "not run" in t1  # the benchmarks this experiment did not play
    t5 = md.split("## Table 5")[1].split("##")[0]
    assert "fused" in t5 and "full history" in t5
    # The paper_report asset (what the UI materializes) writes and shows the same tables.
    import dagster as dg

    from flywheel.assets.baselines import paper_report

    res = dg.materialize([paper_report], run_config={"ops": {"paper_report": {"config": {
        "experiment": str(preset), "runs_dir": str(runs), "results_dir": str(tmp_path / "asset")}}}})
    assert res.success
    assert (tmp_path / "asset" / "paper.md").read_text() == md
    shown = res.asset_materializations_for_node("paper_report")[0].metadata["tables"].value
    assert shown.startswith(md.strip()[:200]) and "data:image/png;base64," in shown


def test_shipped_baselines_preset_names_every_method():
    preset = load_preset("cpu-baselines-scienceworld")  # its results predate the equal-compute control
    assert preset.benchmark == "scienceworld"
    assert sorted(preset.method(a) for a in preset.arms) == sorted(m for m in METHODS if m not in ("bpo", "sft-control"))
    assert preset.arm_sections("grpo")["method"]["grpo_group_size"] == 4
    comparison = load_preset("cpu-comparison-scienceworld")
    assert {comparison.method(a) for a in comparison.arms} == set(METHODS) - {"bpo-stage3"}  # stage 3 is bpo


def test_a_store_from_before_the_method_column_gains_it(tmp_path):
    import duckdb

    from flywheel.core.store import SCHEMA, ForeignStoreError

    old = SCHEMA.replace(",\n    method VARCHAR DEFAULT 'bpo');", ");").replace(", method VARCHAR DEFAULT 'bpo');", ");")
    assert old != SCHEMA
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    con.execute(old)
    con.execute("INSERT INTO checkpoints (checkpoint_id, benchmark, iteration) VALUES ('c0', 'webshop', 0)")
    con.close()
    db = Store(tmp_path / "old.duckdb", method="grpo")
    db.record_checkpoint({"checkpoint_id": "c1", "benchmark": "webshop", "iteration": 1})
    assert db.query("SELECT checkpoint_id, method FROM checkpoints ORDER BY 1").rows() == [("c0", "bpo"), ("c1", "grpo")]
    # A table with other columns is still another schema: refused, untouched.
    con = duckdb.connect(str(tmp_path / "foreign.duckdb"))
    con.execute("CREATE TABLE trajectories (traj_id VARCHAR, x INTEGER)")
    con.close()
    with pytest.raises(ForeignStoreError):
        Store(tmp_path / "foreign.duckdb")
