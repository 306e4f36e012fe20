"""`flywheel export` writes JSONL and Hugging Face `datasets` folders that round-trip; the SQL views;
`report` reads the profile's runs_dir ($FLYWHEEL_PROFILE), warns on an empty store and never creates one; help shows defaults."""

import json

import pytest
from datasets import load_from_disk

from flywheel.cli import build_parser, main
from flywheel.core.store import Store


def test_export_round_trips_through_jsonl_and_load_from_disk(store, tmp_path, capsys):
    runs, db, seeds, passed, examples = store
    out = tmp_path / "exports"
    assert main(["export", "--runs-dir", str(runs), "--out", str(out)]) == 0
    base = out / "b"
    # The exact training pairs of the checkpoint, dropped one left out, in order, TRL's format.
    sft = load_from_disk(str(base / "hf" / "sft_k0"))
    kept = [ex for i, ex in enumerate(examples) if i != 1]
    assert sft["prompt"] == [ex["prompt"] for ex in kept] and sft["completion"] == [ex["completion"] for ex in kept]
    lines = [json.loads(line) for line in (base / "sft_k0.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in lines] == sft["prompt"]
    # Gated set k=0: exactly the gated trajectories, steps nested.
    gated = load_from_disk(str(base / "hf" / "gated_k0"))
    assert sorted(gated["traj_id"]) == sorted(t.traj_id for t in passed)
    assert all(row["success"] for row in gated) and gated[0]["steps"][0]["action"] == "a0"
    # Quaternions: one row per teacher step, (o, e, p, a).
    quats = load_from_disk(str(base / "hf" / "quaternions"))
    assert len(quats) == sum(len(t.steps) for t in seeds) and set(quats["thought"]) == {"e0", "e1"}
    trajs = load_from_disk(str(base / "hf" / "trajectories"))
    assert len(trajs) == len(db.trajectory_table(benchmark="b"))
    # Each folder carries a dataset card naming benchmark, iteration, teacher and split.
    card = (base / "hf" / "sft_k0" / "README.md").read_text()
    for line in ("| benchmark | b |", "| iteration | 0 |", "| teacher | scripted |", "| split | train |"):
        assert line in card
    assert "b-k0-x" in card and "sft_k0" in capsys.readouterr().out


def test_the_sft_card_says_which_pairs_were_never_trained(store, tmp_path):
    runs, db, seeds, _, examples = store
    for k, never in ((1, 2), (2, 0)):
        db.record_checkpoint({"checkpoint_id": f"b-k{k}-x", "benchmark": "b", "iteration": k, "path": "/nowhere",
                              "n_examples": len(examples), "train_loss": 1.0, "lineage": {"examples_never_trained": never}})
        db.write_training_examples(f"b-k{k}-x", "b", k, [{**ex, "traj_id": "x", "kept": True} for ex in examples])
    assert main(["export", "--runs-dir", str(runs), "--out", str(tmp_path / "out"), "--benchmark", "b"]) == 0
    cards = {k: " ".join((tmp_path / "out" / "b" / "hf" / f"sft_k{k}" / "README.md").read_text().split()) for k in range(3)}
    n = len(examples)
    assert f"Only the first {n - 2} were trained on" in cards[1] and f"the last 2 of these {n}" in cards[1]
    assert "The exact (prompt, completion) pairs checkpoint `b-k2-x` trained on" in cards[2]
    assert "does not record whether" in cards[0] and "trained on," not in cards[0]  # an older store: no claim


def test_views_answer_the_common_questions(store):
    _, db, _, passed, _ = store
    growth = db.query("SELECT * FROM gated_growth").row(0, named=True)
    assert growth["new_unique_successes"] == len(passed) and growth["gated_total"] == len(passed)
    by_k = db.query("SELECT * FROM success_by_iteration").row(0, named=True)
    assert by_k["success_rate"] == 0.5 and by_k["split"] == "seen"
    by_task = {r["task_id"]: r["successes"] for r in db.query("SELECT * FROM success_by_task").iter_rows(named=True)}
    assert by_task == {"t0": 1, "t1": 1, "t2": 1}


def test_report_never_creates_a_store_and_warns_when_empty(tmp_path, monkeypatch, capsys):
    (tmp_path / "profile.yaml").write_text(f"runs_dir: {tmp_path / 'runs'}\n")  # report reads the profile's runs_dir
    monkeypatch.setenv("FLYWHEEL_PROFILE", str(tmp_path / "profile.yaml"))
    assert main(["report"]) == 2
    assert "no store" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    Store(tmp_path / "runs" / "flywheel.duckdb")  # what a UI run leaves before any evaluation
    assert main(["report"]) == 0
    err = capsys.readouterr().err
    assert "holds no evaluation yet" in err and str(tmp_path / "runs" / "flywheel.duckdb") in err
    assert not (tmp_path / "runs" / "demo").exists()


def test_report_reads_the_profiles_benchmark_says_which_and_gives_intervals(tmp_path, monkeypatch, capsys):
    (tmp_path / "profile.yaml").write_text(f"runs_dir: {tmp_path / 'runs'}\nbenchmarks: [webshop]\n")
    monkeypatch.setenv("FLYWHEEL_PROFILE", str(tmp_path / "profile.yaml"))
    db = Store(tmp_path / "runs" / "flywheel.duckdb")
    db.write_evaluation({"benchmark": "scienceworld", "iteration": 0, "split": "seen", "checkpoint_id": "s0",
                         "episodes": 4, "success_rate": 0.5})
    assert main(["report"]) == 1  # the profile's benchmark has no evaluation: said, not an empty table
    assert "webshop: no evaluation" in capsys.readouterr().err
    db.write_evaluation({"benchmark": "webshop", "iteration": 0, "split": "unseen", "checkpoint_id": "w0",
                         "episodes": 10, "success_rate": 0.5})
    assert main(["report"]) == 0
    out, err = capsys.readouterr()
    assert "benchmark: webshop (the profile's" in err
    assert "50.0 [23.7, 76.3] (5/10)" in out


def test_every_option_has_help_and_shows_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = " ".join(p.format_help().split())
        if name == "demo":
            assert "else 8)" in text and "(default: scienceworld)" in text  # flags name the profile, then the demo default


def test_missing_model_hint_is_a_valid_command(tmp_path):
    from flywheel.policy.models import ModelNotFoundError, require_model

    with pytest.raises(ModelNotFoundError) as err:
        require_model(tmp_path / "nope")
    hint = str(err.value).split("`python -m flywheel.cli ")[1].split("`")[0].replace("PATH", str(tmp_path / "m"))
    args = build_parser().parse_args(hint.split())  # the parser accepts the hint as written
    assert args.tiny and args.out == str(tmp_path / "m")


def test_paper_without_stores_says_where_it_looked(tmp_path, monkeypatch, capsys):
    (tmp_path / "profile.yaml").write_text(f"runs_dir: {tmp_path / 'runs'}\n")
    monkeypatch.setenv("FLYWHEEL_PROFILE", str(tmp_path / "profile.yaml"))
    assert main(["paper", "cpu-scienceworld-quick", "--results-dir", str(tmp_path / "paper")]) == 2
    err = capsys.readouterr().err
    assert "no experiment store or committed arm results found" in err and str(tmp_path / "runs" / "experiments" / "cpu-scienceworld-quick") in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "paper").exists()


def test_report_gives_prompt_tokens_per_split_and_one_row_per_iteration(tmp_path, capsys):
    runs = tmp_path / "runs"
    db = Store(runs / "flywheel.duckdb")
    for split, tokens in (("seen", 300.0), ("unseen", 450.0)):
        db.write_evaluation({"benchmark": "webshop", "iteration": 0, "split": split, "checkpoint_id": "w0",
                             "episodes": 4, "success_rate": 0.25, "prompt_tokens_per_step": tokens})
    db.record_checkpoint({"checkpoint_id": "w0", "benchmark": "webshop", "iteration": 0, "path": "/nowhere",
                          "n_examples": 8, "train_loss": 1.25, "lineage": {"train_steps": 6}})
    db.write_gated("webshop", 0, [], candidates=8)
    db.record_gate_stats("webshop", 0, candidates=8, new_unique_successes=0, gated_total=0, capped_dropped=0)
    assert main(["report", "--runs-dir", str(runs), "--benchmark", "webshop"]) == 0
    header, _, row = capsys.readouterr().out.strip().splitlines()
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")],
                     strict=True))
    assert cells["seen prompt tok/step"] == "300.0" and cells["unseen prompt tok/step"] == "450.0"
    assert cells["seen success % [95% CI] (s/n)"].endswith("(1/4)")
    assert cells["gate admitted/candidates"] == "0/8" and cells["gate verdict"].startswith("empty")
    assert cells["train loss"] == "1.2500" and cells["train steps"] == "6"


def test_an_empty_gate_exports_a_loadable_set_and_identical_sets_say_why(store, tmp_path):
    runs, db, _, _, examples = store
    db.write_gated("b", 1, [], candidates=6)  # gate 1 admitted nothing
    db.record_gate_stats("b", 1, candidates=6, new_unique_successes=0, gated_total=3, capped_dropped=0)
    lineage = {"examples_sha256": "same", "train_steps": 6, "batch_size": 4, "base_model": "/models/base",
               "dataset": {"seeds": 3, "gated": 0}, "gated_iterations": [0, 1], "examples_never_trained": 0}
    for k in (1, 2):
        db.record_checkpoint({"checkpoint_id": f"b-k{k}-x", "benchmark": "b", "iteration": k, "path": "/nowhere",
                              "base_model": "/models/base", "n_examples": len(examples), "train_loss": 0.5,
                              "lineage": lineage})
        db.write_training_examples(f"b-k{k}-x", "b", k, [{**ex, "traj_id": "x", "kept": True} for ex in examples])
    out = tmp_path / "out"
    assert main(["export", "--runs-dir", str(runs), "--out", str(out), "--benchmark", "b"]) == 0
    empty = load_from_disk(str(out / "b" / "hf" / "gated_k1"))
    assert len(empty) == 0 and {"traj_id", "success", "steps"} <= set(empty.column_names)
    card = " ".join((out / "b" / "hf" / "gated_k1" / "README.md").read_text().split())
    assert "This dataset is empty" in card and "admitted none of its 6 rollouts" in card and "load_from_disk" in card
    assert (out / "b" / "gated_k1.jsonl").read_text() == ""
    k2 = " ".join((out / "b" / "hf" / "sft_k2" / "README.md").read_text().split())
    assert "| base model | `/models/base` |" in k2 and "train_steps=6, batch_size=4" in k2
    assert "| trained on | seeds: 3, gated: 0 |" in k2 and "| train loss | 0.5 |" in k2
    assert "Identical to `sft_k1`" in k2 and "reward gate(s) k=1 admitted no new trajectory" in k2
    assert "Identical" not in (out / "b" / "hf" / "sft_k1" / "README.md").read_text()
