"""`flywheel experiment`: a miniature preset end to end through the CLI, its report checked
against the DuckDB rows; a SIGKILLed experiment resumes without redoing finished stages."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest
import yaml

from flywheel.cli import main
from flywheel.config.presets import load_preset
from flywheel.core.provenance import CHECKSUM, arm_file
from flywheel.core.quality import mcnemar_exact_p, paired_difference
from flywheel.core.store import Store
from flywheel.core.validation import ConfigurationError
from flywheel.drivers.experiment import run_experiment
from flywheel.orchestration.methods import method_stages
from flywheel.resources import EnvResource

REPO = Path(__file__).resolve().parents[2]

MINI = {
    "name": "mini-webshop",
    "benchmark": "webshop",
    "iterations": 1,
    "model": "tiny",
    "description": "tiny model, 3 WebShop goals, K=1",
    # All five stand-in categories: the same goals as no filter, and the report gets its by-type table.
    # 3 goals set aside for the promotion gate (on by default): k=1 and k=0 play them after k=1's SFT.
    "envs": {"seed_limit": 2, "train_limit": 3, "eval_limit": 3, "max_steps": 3, "validation_tasks": 3,
             "task_types": {"webshop": ["beauty", "electronics", "fashion", "furniture", "grocery"]}},
    "policy": {"epochs": 1, "max_new_tokens": 24, "samples_per_task": 2, "parallel_envs": 3, "batch_size": 4,
               "temperature": 1.0},
    "curriculum": {"synthesize": False},
    "loop": {"adaptive_sampling": False},
    # A random tiny model solves nothing: go on to k=1 anyway, so the whole K=1 path is exercised.
    "continue_on_empty_gate": True,
}


def _write(tmp_path: Path, preset: dict) -> Path:
    path = tmp_path / f"{preset['name']}.yaml"
    path.write_text(yaml.safe_dump(preset))
    return path


def test_mini_preset_end_to_end_report_matches_store(tmp_path, capsys):
    preset = _write(tmp_path, MINI)
    runs, results = tmp_path / "runs", tmp_path / "results"
    rc = main(["experiment", str(preset), "--runs-dir", str(runs), "--results-dir", str(results)])
    assert rc == 0
    assert "success % [95% CI]" in capsys.readouterr().out
    data = json.loads((results / "results.json").read_text())
    for png in ("success_by_k.png", "gate_by_k.png", "rollout_pass_by_k.png"):
        assert (results / png).stat().st_size > 1000
    arm = data["arms"]["bpo"]
    assert arm["splits"] == ["unseen"]  # WebShop's one test set is played once
    db = Store(runs / "bpo" / "flywheel.duckdb")
    for row in arm["per_k"]:
        k = row["k"]
        got = row["splits"]["unseen"]
        rows = db.query("SELECT success FROM trajectories WHERE benchmark = 'webshop' AND iteration = ? "
                        "AND split = 'unseen' AND source = 'policy' AND status = 'ok'", [k])
        assert got["n"] == rows.height == 3
        assert got["successes"] == int(rows["success"].sum())
        assert got["ci_low"] <= got["rate"] <= got["ci_high"]
        ck = db.query("SELECT n_examples FROM checkpoints WHERE benchmark = 'webshop' AND iteration = ?", [k])
        assert row["checkpoint"]["examples"] == ck["n_examples"][0]
    r0 = arm["per_k"][0]
    played = db.query("SELECT count(*) AS n, count(*) FILTER (WHERE success) AS s FROM trajectories "
                      "WHERE iteration = 0 AND split = 'train' AND source = 'policy'").row(0, named=True)
    assert r0["rollouts"]["episodes"] == played["n"] == 6  # 3 tasks x 2 samples
    assert r0["rollouts"]["successes"] == played["s"]
    gated = db.query("SELECT count(*) AS n FROM gated WHERE benchmark = 'webshop' AND iteration = 0")["n"][0]
    assert r0["gate"]["new_unique_successes"] == gated
    # The gate's blocking check, as the store recorded it, and the report says why the arm went on anyway.
    check = db.query("SELECT passed, first_problem FROM gate_checks WHERE benchmark = 'webshop' AND iteration = 0")
    assert r0["gate"]["check"]["passed"] == check["passed"][0]
    if not check["passed"][0]:
        assert arm["empty_gates"] == ["rollouts:0"]
        assert f"first: `{check['first_problem'][0]}`" in (results / "report.md").read_text()
    assert arm["seed_tasks"] == 2  # seeds come from the first seed_limit train tasks only
    (cmp_,) = [c for c in arm["comparisons"] if c["new"] == 1 and c["old"] == 0]
    assert cmp_["n"] == 3
    # Per task type (asked of the spec, not parsed from ids): the types' counts add up to each split's.
    by_type = arm["by_task_type"]
    for row in arm["per_k"]:
        k = row["k"]
        typed = [r for r in by_type if r["k"] == k and r["split"] == "unseen"]
        assert sum(r["n"] for r in typed) == row["splits"]["unseen"]["n"] == 3
        assert sum(r["successes"] for r in typed) == row["splits"]["unseen"]["successes"]
    ro = arm["per_k"][0]["rollouts"]  # K=1: only checkpoint 0 rolls out
    train = [r for r in by_type if r["k"] == 0 and r["split"] == "train"]
    assert sum(r["n"] for r in train) == ro["episodes"] - ro["errored"] > 0
    assert sum(r["successes"] for r in train) == ro["successes"]
    played = EnvResource(**{k: v for k, v in MINI["envs"].items() if k != "task_types"}).tasks("webshop", "unseen")
    assert {r["type"]: r["n"] for r in by_type if r["k"] == 0 and r["split"] == "unseen"} == dict(
        Counter(t.meta["category"] for t in played))
    report = (results / "report.md").read_text()
    assert "k=1 vs k=0" in report and "(successes/n)" in report and "**By task type**" in report
    # The report is rebuilt from the store alone, identically, and without writing to it.
    before = (runs / "bpo" / "flywheel.duckdb").stat().st_mtime
    assert main(["experiment", str(preset), "--runs-dir", str(runs), "--results-dir", str(tmp_path / "r2"),
                 "--report-only"]) == 0
    assert json.loads((tmp_path / "r2" / "results.json").read_text())["arms"] == data["arms"]
    assert (runs / "bpo" / "flywheel.duckdb").stat().st_mtime == before
    # The runner signed the arm file; --report-only never rewrites a committed one, even one that the store's
    # record would change (here: edited, then re-signed on purpose).
    committed = arm_file(results, "bpo")
    edited = json.loads(committed.read_text())
    assert edited.pop(CHECKSUM)
    edited["provenance"]["hosts"] = ["elsewhere"]
    committed.write_text(json.dumps(edited))
    assert main(["resign-arm", str(committed)]) == 0
    signed = committed.read_text()
    assert main(["experiment", str(preset), "--runs-dir", str(runs), "--results-dir", str(results),
                 "--report-only"]) == 0
    assert committed.read_text() == signed


def test_killed_experiment_resumes_without_redoing_stages(tmp_path):
    preset = _write(tmp_path, {**MINI, "name": "mini-kill"})
    runs, results = tmp_path / "runs", tmp_path / "results"
    cmd = [sys.executable, "-m", "flywheel.cli", "experiment", str(preset), "--runs-dir", str(runs),
           "--results-dir", str(results)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DAGSTER_HOME", None)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    progress = runs / "bpo" / "progress.json"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if progress.exists() and "sft:0" in json.loads(progress.read_text())["done"]:
                break
            assert proc.poll() is None, "the experiment ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("sft:0 never finished")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done_before = json.loads(progress.read_text())["done"]
    assert "evaluation:1" not in done_before
    db = Store(runs / "bpo" / "flywheel.duckdb")
    ckpt0 = db.query("SELECT checkpoint_id FROM checkpoints WHERE iteration = 0")["checkpoint_id"].to_list()
    assert len(ckpt0) == 1
    assert subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=600).returncode == 0
    done_after = json.loads(progress.read_text())["done"]
    assert set(done_after) == {s for s, _, _ in method_stages("webshop", 1)}
    for stage, info in done_before.items():  # finished stages were not run again
        assert done_after[stage] == info
    for stage, info in done_after.items():  # each stage records the process's memory after it
        assert info["rss_gib"] > 0.1, (stage, info)
        assert info["peak_rss_gib"] >= info["rss_gib"], (stage, info)
    assert db.query("SELECT checkpoint_id FROM checkpoints WHERE iteration = 0")["checkpoint_id"].to_list() == ckpt0
    dup = db.query("SELECT task_id, sample, count(*) AS n FROM trajectories WHERE source = 'policy' "
                   "AND split = 'train' AND iteration = 0 GROUP BY 1, 2 HAVING count(*) > 1")
    assert dup.is_empty()
    assert (results / "report.md").exists()
    # Resuming with a changed configuration would mix two experiments: refused, nothing run.
    changed = _write(tmp_path, {**MINI, "name": "mini-kill", "policy": {**MINI["policy"], "temperature": 0.5}})
    with pytest.raises(ConfigurationError, match=r"another configuration \(changed: \['policy'\]\)"):
        run_experiment(load_preset(str(changed)), runs=runs, results=results, instance=dg.DagsterInstance.ephemeral())


def test_preset_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigurationError, match="available: .*cpu-webshop"):
        load_preset("no-such-preset")
    bad = _write(tmp_path, {**MINI, "name": "bad", "policy": {"learning_rat": 1e-4}})
    with pytest.raises(ConfigurationError, match="unknown policy field.*learning_rat"):
        load_preset(str(bad))
    bad = _write(tmp_path, {**MINI, "name": "bad2", "arms": {"x": {"polcy": {}}}})
    with pytest.raises(ConfigurationError, match="arm 'x' overrides unknown section"):
        load_preset(str(bad))
    bad = _write(tmp_path, {**MINI, "name": "bad3", "benchmark": "webshp"})
    with pytest.raises(ConfigurationError, match="webshp"):
        load_preset(str(bad))
    assert main(["experiment", str(bad)]) == 2


@pytest.mark.parametrize("name", ["cpu-scienceworld", "cpu-webshop", "gpu-8b"])
def test_shipped_presets_parse(name):
    preset = load_preset(name)
    assert preset.iterations >= 2 and preset.arms


def test_paired_difference_and_mcnemar():
    new = {f"t{i}": i < 30 for i in range(100)}
    old = {f"t{i}": i < 10 for i in range(100)}
    d = paired_difference(new, old, n_boot=2000)
    assert d["n"] == 100 and d["gained"] == 20 and d["lost"] == 0
    assert abs(d["delta"] - 0.2) < 1e-9 and 0 < d["ci_low"] < 0.2 < d["ci_high"] and d["significant"]
    assert mcnemar_exact_p(20, 0) == pytest.approx(2 * 0.5**20)
    assert mcnemar_exact_p(3, 3) == 1.0
    same = paired_difference(old, old, n_boot=200)
    assert same["delta"] == 0 and not same["significant"]


def test_arms_are_compared_with_the_first_evaluated_arm_paired_over_tasks():
    from flywheel.reports.results import compare_arms

    tasks = [f"t{i}" for i in range(20)]
    ref = {(0, "seen"): {t: i < 2 for i, t in enumerate(tasks)}, (0, "unseen"): {t: False for t in tasks}}
    better = {(0, "seen"): {t: i < 12 for i, t in enumerate(tasks)}, (0, "unseen"): {t: i < 5 for i, t in enumerate(tasks)},
              (1, "seen"): {t: True for t in tasks}}  # k=1: the reference has none, so no row
    rows = compare_arms({"not-run": {}, "bpo": ref, "fixed": better})
    assert [(r["arm"], r["reference"], r["k"], r["split"]) for r in rows] == [
        ("fixed", "bpo", 0, "seen"), ("fixed", "bpo", 0, "unseen"), ("fixed", "bpo", 0, "all")]
    seen, unseen, pooled = rows
    assert (seen["n"], seen["gained"], seen["lost"], seen["delta"]) == (20, 10, 0, 0.5) and seen["significant"]
    assert (unseen["gained"], pooled["n"], pooled["gained"]) == (5, 40, 15)
    assert compare_arms({"bpo": ref}) == []


def test_an_arm_that_starts_from_another_compares_with_its_k0_evaluation(tmp_path):
    """An arm with `method.start_from: A, evaluate_start: false` has no k=0 evaluation of its own: its k-vs-0
    rows are paired against A's k=0 evaluation of the same weights, and say so (`old_arm`)."""
    from flywheel.core.trajectory import Step, Trajectory
    from flywheel.reports.results import arm_results

    def evaluated(path: Path, k: int, solved: set[int]) -> Store:
        db = Store(path)
        db.write_trajectories([Trajectory(
            benchmark="b", split="unseen", task_id=f"t{i}", source="policy", iteration=k, sample=0, goal="g",
            steps=[Step(observation="o", thought="e", plan="p", action="a", next_observation="o2")],
            success=i in solved, reward=float(i in solved)) for i in range(10)])
        db.write_evaluation({"benchmark": "b", "iteration": k, "split": "unseen", "episodes": 10, "errored": 0,
                             "success_rate": len(solved) / 10, "avg_reward": len(solved) / 10})
        return db

    source = {"unseen": evaluated(tmp_path / "a.duckdb", 0, {0, 1}).policy_outcomes("b", 0, "unseen")}
    arm = evaluated(tmp_path / "b.duckdb", 2, {0, 1, 2, 3, 4, 5})
    res = arm_results(arm, "b", 2, {}, ("unseen",), k0_from=("a", source))
    [row] = res["comparisons"]
    assert (row["new"], row["old"], row["old_arm"], row["n"]) == (2, 0, "a", 10)
    assert (row["gained"], row["lost"], row["delta"]) == (4, 0, 0.4)
    assert [r["k"] for r in res["per_k"] if r["splits"]] == [2]  # the per-k table keeps the arm's own evaluations
    assert arm_results(arm, "b", 2, {}, ("unseen",))["comparisons"] == []  # without it: nothing to pair k=2 with
    own = evaluated(tmp_path / "b.duckdb", 0, set())  # an arm that did evaluate its k=0 is paired with its own
    [row] = arm_results(own, "b", 2, {}, ("unseen",), k0_from=("a", source))["comparisons"]
    assert "old_arm" not in row and row["gained"] == 6


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_preset_builds_every_arm(path: Path, tmp_path: Path):
    """Each preset in experiments/ names only fields its resources take, for its backend and every arm:
    a preset that would fail on its first stage fails here instead (the vLLM backend refuses transformers-only
    fields such as max_batch_size)."""
    from flywheel.config.presets import arm_resources

    preset = load_preset(str(path))
    for arm in preset.arms:
        resources = arm_resources(preset, arm, tmp_path / arm, model_path=str(tmp_path / "model"))
        assert {"policy", "envs", "store"} <= set(resources)


def test_each_arm_stops_the_servers_it_kept_warm(tmp_path):
    """Two arms on the managed vLLM backend with `keep_server` (the stub server of tests/vllm_stub_server.py
    as their "vLLM"): each arm's server is stopped when the arm ends, so arms never pile up servers (a
    baselines run was OOM-killed with three arms' servers left warm)."""
    from flywheel.policy.vllm_server import group_alive

    events = tmp_path / "stub.jsonl"
    stub = str(REPO / "tests" / "vllm_stub_server.py")
    preset = _write(tmp_path, {
        **MINI, "name": "mini-vllm", "policy_backend": "vllm",
        "policy": {**{k: v for k, v in MINI["policy"].items() if k != "batch_size"}, "keep_server": True,
                   "server_command": [sys.executable, stub], "server_env": {"STUB_EVENTS": str(events)},
                   "start_timeout_s": 120, "compile_cache_dir": str(tmp_path / "cache")},
        "arms": {"zero-shot": {"method": "base"}, "again": {"method": "base", "envs": {"eval_limit": 2}}}})
    with dg.instance_for_test() as instance:
        run_experiment(load_preset(str(preset)), runs=tmp_path / "runs", results=tmp_path / "results", instance=instance)
    starts = [json.loads(x) for x in events.read_text().splitlines() if json.loads(x)["kind"] == "start"]
    assert len(starts) == 2  # one server per arm (each logs beside its own runs)
    assert not any(group_alive(s["pid"]) for s in starts)
    for arm, n in (("zero-shot", 3), ("again", 2)):
        [row] = Store(tmp_path / "runs" / arm / "flywheel.duckdb").evaluation_rows("webshop")
        assert (row["episodes"], row["errored"]) == (n, 0)  # played through the server


def test_plots_name_the_experiment_and_n_use_integer_ticks_and_skip_empty_ones(tmp_path, monkeypatch):
    import flywheel.reports.render as ex

    seen = {}
    finish = ex._finish

    def spy(plt, fig, ax, path, ylabel, title, iterations):
        labels = ax.get_legend_handles_labels()[1]
        name = finish(plt, fig, ax, path, ylabel, title, iterations)
        seen[path.name] = (title, [float(t) for t in ax.get_xticks()], labels)
        return name

    monkeypatch.setattr(ex, "_finish", spy)
    rate = {"n": 10, "successes": 5, "rate": 0.5, "ci_low": 0.24, "ci_high": 0.76}
    results = {"preset": "mini", "iterations": 2, "arms": {
        "bpo": {"splits": ["seen"], "per_k": [{"k": 0, "splits": {"seen": rate}}, {"k": 1, "splits": {}}]},
        "idle": {"splits": ["seen"], "per_k": [{"k": 0, "splits": {}}]},  # evaluated nothing: not in the legend
        "skipped": {"status": "not run", "splits": [], "per_k": []}}}
    (tmp_path / "gate_by_k.png").write_bytes(b"stale")
    written = ex.render_plots(results, tmp_path)
    assert written == ["success_by_k.png"]  # no gate and no rollouts recorded: those plots are not written
    assert not (tmp_path / "gate_by_k.png").exists() and not (tmp_path / "rollout_pass_by_k.png").exists()
    title, ticks, labels = seen["success_by_k.png"]
    assert title.startswith("mini:") and ticks == [0.0, 1.0, 2.0] and labels == ["bpo seen (n=10)"]
    nothing = {**results, "arms": {"skipped": results["arms"]["skipped"]}}
    assert ex.render_plots(nothing, tmp_path) == [] and not (tmp_path / "success_by_k.png").exists()


def test_an_arm_that_does_not_evaluate_rejected_checkpoints_skips_only_those(tmp_path):
    """`method.evaluate_rejected: false`: evaluation:k is skipped where the promotion gate rejected k's latest
    checkpoint, run where it promoted it (or has not decided on a checkpoint retrained since); the report keeps the
    rejected k's row, says it was not evaluated, and the arm's @promoted names the checkpoint the loop went on from."""
    from flywheel.core.trajectory import Step, Trajectory
    from flywheel.drivers.experiment import rejected_evaluation
    from flywheel.reports.render import render_success_by_k
    from flywheel.reports.results import arm_results, promoted_k

    db = Store(tmp_path / "arm.duckdb")
    for k in range(3):
        db.record_checkpoint({"checkpoint_id": f"c{k}", "benchmark": "b", "iteration": k, "path": f"c{k}"})
    db.record_promotion({"benchmark": "b", "iteration": 1, "checkpoint_id": "c1", "promoted": True, "promoted_id": "c1",
                         "validation_n": 10, "successes": 4, "predecessor_successes": 3, "delta": 0.1, "ci_low": -0.1,
                         "margin": 0.1, "alpha": 0.05})
    db.record_promotion({"benchmark": "b", "iteration": 2, "checkpoint_id": "c2", "promoted": False, "promoted_id": "c1",
                         "validation_n": 10, "successes": 1, "predecessor_successes": 4, "delta": -0.3, "ci_low": -0.5,
                         "margin": 0.1, "alpha": 0.05})
    why = rejected_evaluation(db, "b", "evaluation:2")
    assert why and "rejected k=2 (k=1 went on)" in why
    assert [rejected_evaluation(db, "b", s) for s in ("evaluation:0", "evaluation:1", "sft:2", "rollouts:1")] == [None] * 4

    db.write_trajectories([Trajectory(
        benchmark="b", split="unseen", task_id=f"t{i}", source="policy", iteration=1, sample=0, goal="g",
        steps=[Step(observation="o", thought="e", plan="p", action="a", next_observation="o2")],
        success=i < 3, reward=float(i < 3)) for i in range(10)])
    db.write_evaluation({"benchmark": "b", "iteration": 1, "split": "unseen", "episodes": 10, "errored": 0,
                         "success_rate": 0.3, "avg_reward": 0.3})
    done = {"done": {"evaluation:2": {"seconds": 0.0, "skipped": why}}}
    res = {**arm_results(db, "b", 2, done, ("unseen",)), "splits": ["unseen"]}  # as the report reads an arm file
    table = "\n".join(render_success_by_k(res))
    assert "| 1 | 30.0" in table and "| 2 | not evaluated (rejected) | not evaluated (rejected) | **rejected**" in table
    assert "**Promoted checkpoint:** k=1" in table and promoted_k({"results": res}) == 1

    time.sleep(0.01)  # a k=2 retrained after the decision: the gate has not judged it, so it is evaluated
    db.record_checkpoint({"checkpoint_id": "c2-again", "benchmark": "b", "iteration": 2, "path": "c2-again"})
    assert rejected_evaluation(db, "b", "evaluation:2") is None
