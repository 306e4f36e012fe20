"""Arms that start from one k=0 share its episodes (`flywheel.drivers.experiment.share_k0_episodes`): which
arms may (`episode_siblings`, from the fields' `play` and `greedy` declarations), and the copy through a real
run."""

import dataclasses
import json
from types import SimpleNamespace

import yaml

from flywheel.core.store import Store
from flywheel.drivers.experiment import NOT_IN_GREEDY_PLAY, NOT_IN_PLAY, episode_siblings
from tests.helpers import TWO_ARMS, experiment_process


def test_arms_sharing_a_k0_share_its_episodes_unless_they_change_how_an_episode_plays():
    """`episode_siblings`: arms that start from the same arm and differ only in fields declared play=False (how
    k > 0 trains, how many episodes a task gets) or outside envs and policy (the loop) take each other's k=0
    episodes; a replicate (its own rollout_seed) or an arm that samples otherwise does not, except the greedy
    ones (validation games at eval_temperature 0), which only fields declared greedy=False may differ for."""
    start = {"policy": {"max_train_steps": -1}}
    arms = {
        "k0": {"policy": {"max_train_steps": -1}},
        "bpo": {**start, "method": {"name": "bpo", "start_from": "k0"}},
        "no-cleaning": {**start, "loop": {"clean_successes": False}, "method": {"name": "bpo", "start_from": "k0"}},
        "slow": {"policy": {"max_train_steps": -1, "refine_learning_rate": 5e-5, "refine_train_steps": 34,
                            "samples_per_task": 4}, "envs": {"train_limit": 10},
                 "method": {"name": "bpo", "start_from": "k0"}},
        "control": {**start, "method": {"name": "sft-control", "start_from": "k0", "controls": "bpo"}},
        "bpo-r2": {"policy": {"max_train_steps": -1, "rollout_seed": 2}, "method": {"name": "bpo", "start_from": "k0"}},
        "greedier": {"policy": {"max_train_steps": -1, "temperature": 0.3}, "method": {"start_from": "k0"}},
        "elsewhere": {**start, "method": {"start_from": "bpo-stage2"}},
        "shorter": {"policy": {"max_train_steps": -1, "rollout_seed": 3, "max_new_tokens": 64},
                    "method": {"start_from": "k0"}},
        "sampled-eval": {"policy": {"max_train_steps": -1, "eval_temperature": 0.5}, "method": {"start_from": "k0"}},
    }
    preset = SimpleNamespace(arms=arms, arm_sections=lambda arm: arms[arm])
    assert episode_siblings(preset, "no-cleaning") == ["bpo", "slow", "control"]
    assert episode_siblings(preset, "bpo") == ["no-cleaning", "slow", "control"]
    assert episode_siblings(preset, "bpo-r2") == episode_siblings(preset, "greedier") == []
    assert episode_siblings(preset, "k0") == [] and episode_siblings(preset, "elsewhere") == []
    # Greedy episodes (the validation games, eval_temperature 0): a replicate and an arm that samples its rollouts
    # otherwise play them as the others do; not an arm that plays them otherwise (max_new_tokens) or samples them.
    assert episode_siblings(preset, "bpo-r2", greedy=True) == ["bpo", "no-cleaning", "slow", "control", "greedier"]
    assert episode_siblings(preset, "shorter", greedy=True) == []
    assert "sampled-eval" not in episode_siblings(preset, "bpo", greedy=True)
    assert episode_siblings(preset, "sampled-eval", greedy=True) == []
    assert episode_siblings(preset, "sampled-eval") == []  # its eval_temperature plays the validation games
    # what changes an episode is never declared play=False; what changes a greedy one never greedy=False
    for field in ("temperature", "eval_temperature", "max_new_tokens", "rollout_seed", "stop_on_loop",
                  "history_window", "max_observation_chars", "max_model_len", "vllm_dtype"):
        assert field not in NOT_IN_PLAY["policy"]
        assert (field in NOT_IN_GREEDY_PLAY["policy"]) == (field in ("temperature", "rollout_seed"))
    assert "max_steps" not in NOT_IN_PLAY["envs"] and "spec_options" not in NOT_IN_PLAY["envs"]
    assert set(NOT_IN_GREEDY_PLAY["envs"]) == set(NOT_IN_PLAY["envs"])


def test_arms_from_one_k0_take_each_others_k0_episodes_in_one_runs_folder(tmp_path):
    """In one runs folder: `c` (another k > 0 learning rate) takes the k=0 rollouts and validation games `b`
    (no cleaning) played from the k=0 both start from, instead of playing them (`b` takes nothing: `a`, the arm
    they start from, played its own k=0 under its own checkpoint id). The report says whose rollouts an arm
    took."""
    spec = {**TWO_ARMS, "name": "siblings", "compare": [], "replicates": {}, "arms": {
        "a": {},
        "b": {"loop": {"clean_successes": False}, "method": {"start_from": "a", "evaluate_start": False}},
        "c": {"policy": {"refine_learning_rate": 1e-4}, "method": {"start_from": "a", "evaluate_start": False}},
        "d": {"loop": {"promotion_steers": False}, "method": {"start_from": "a", "evaluate_start": False}}}}
    preset = tmp_path / "siblings.yaml"
    preset.write_text(yaml.safe_dump(spec))
    runs, results = tmp_path / "runs", tmp_path / "results"
    run = experiment_process(preset, runs, results)
    assert run.returncode == 0, run.stderr[-3000:]

    def done(arm: str) -> dict:
        return json.loads((runs / arm / "progress.json").read_text())["done"]

    def k0_episodes(arm: str) -> dict:
        table = Store(runs / arm / "flywheel.duckdb", read_only=True).trajectory_table(
            benchmark="webshop", iteration=0, source="policy")
        return {r["traj_id"]: (r["success"], r["steps"], r["model_id"]) for r in table.iter_rows(named=True)}

    b, c = k0_episodes("b"), k0_episodes("c")
    splits = {tid.split("|")[1] for tid in b}
    assert splits == {"train", "validation"} and len(b) == 2 + 3  # 2 tasks x 1 sample, 3 validation games
    assert done("c")["rollouts:0"]["shared_episodes"] == {"b": len(b)} and c == b
    assert not any("shared_episodes" in s for arm in ("a", "b") for s in done(arm).values())
    assert done("c")["sft:1"].get("shared_episodes") is None  # all taken before rollouts:0, once
    arm_c = json.loads((results / "arms" / "c.json").read_text())
    assert arm_c["results"]["per_k"][0]["rollouts"]["shared_from"] == {"b": len(b)}
    assert "played by `b`" in (results / "report.md").read_text()


def test_an_arm_whose_gate_kept_k0_takes_a_siblings_k0_rollouts_of_that_k(tmp_path):
    """rollouts:k (k > 0) of an arm whose promotion gate rejected checkpoint k are played by k=0: a sibling whose
    gate kept k=0 too played the same episodes, so the arm takes them (only k=0's, only iteration k, only train);
    once its gate promotes k, k's own checkpoint plays and nothing is taken; nor where the gate only selects."""
    from flywheel.config.presets import arm_config, load_preset
    from flywheel.drivers.experiment import k0_plays_at, share_k0_episodes
    from tests.fakes import make_traj

    spec = {**TWO_ARMS, "name": "kept", "compare": [], "replicates": {}, "arms": {
        "a": {},
        "b": {"loop": {"clean_successes": False}, "method": {"start_from": "a", "evaluate_start": False}},
        "c": {"policy": {"refine_learning_rate": 1e-4}, "method": {"start_from": "a", "evaluate_start": False}},
        "d": {"loop": {"promotion_steers": False}, "method": {"start_from": "a", "evaluate_start": False}},
        "e": {"policy": {"rollout_seed": 5}, "method": {"start_from": "a", "evaluate_start": False}}}}
    (tmp_path / "kept.yaml").write_text(yaml.safe_dump(spec))
    preset = load_preset(str(tmp_path / "kept.yaml"))
    k0, bench = "b-k0@a", preset.benchmark

    def arm_store(arm: str, k1: str, promoted: bool) -> Store:
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "config.json").write_text(json.dumps(arm_config(preset, arm, "")))
        db = Store(tmp_path / arm / "flywheel.duckdb")
        db.record_checkpoint({"checkpoint_id": k0, "benchmark": bench, "iteration": 0, "path": "k0",
                              "lineage": {"imported_from_arm": "a"}})
        db.record_checkpoint({"checkpoint_id": k1, "benchmark": bench, "iteration": 1, "path": k1})
        db.record_promotion({"benchmark": bench, "iteration": 1, "checkpoint_id": k1, "promoted": promoted,
                             "promoted_id": k1 if promoted else k0})
        return db

    def episode(task: str, sample: int, iteration: int, model_id: str, split: str = "train"):
        traj = make_traj(task, sample, iteration)
        return dataclasses.replace(traj, benchmark=bench, model_id=model_id, split=split)

    b = arm_store("b", "b-k1", promoted=False)
    b.write_trajectories([episode("t1", 0, 1, k0), episode("t2", 0, 1, k0), episode("t1", 0, 0, k0),
                          episode("v1", 0, 1, "b-k1", "validation")])
    c = arm_store("c", "c-k1", promoted=False)
    c.write_trajectories([episode("t2", 0, 1, k0)])  # played before a stop: kept, not copied over
    stages = ["rollouts:0", "sft:1", "rollouts:1", "evaluation:1"]
    assert [k0_plays_at(s) for s in stages] == [0, 0, 1, None]
    assert share_k0_episodes(preset, "c", tmp_path / "c", c, stages, 1) == {"b": 1}
    got = c.trajectory_table(benchmark=bench, source="policy")
    assert sorted((r["task_id"], r["iteration"], r["model_id"]) for r in got.iter_rows(named=True)) == [
        ("t1", 1, k0), ("t2", 1, k0)]

    c.delete_trajectories(benchmark=bench, iteration=1)
    c.record_promotion({"benchmark": bench, "iteration": 1, "checkpoint_id": "c-k1", "promoted": True,
                        "promoted_id": "c-k1"})  # k=1 promoted: rollouts:1 are k=1's own to play
    assert share_k0_episodes(preset, "c", tmp_path / "c", c, stages, 1) == {}
    assert c.trajectory_table(benchmark=bench, iteration=1).is_empty()

    # A gate that only selects (loop.promotion_steers: false): rollouts k are k's own to play, rejected or not.
    d = arm_store("d", "d-k1", promoted=False)
    assert share_k0_episodes(preset, "d", tmp_path / "d", d, stages, 1, steers=False) == {}
    assert d.trajectory_table(benchmark=bench, iteration=1).is_empty()

    # A replicate (its own rollout_seed) takes k=0's validation games (greedy: the same weights play them the
    # same), never its rollouts, at k=0 or later; only those played under the settings its own gate keeps.
    from flywheel.assets.evaluation import eval_tag
    from flywheel.rollout.engine import RolloutConfig

    greedy = RolloutConfig(temperature=0.0, seed=5)
    b.write_trajectories([episode("v1", 0, 0, eval_tag(k0, RolloutConfig(temperature=0.0)), "validation"),
                          episode("v2", 0, 0, eval_tag(k0, RolloutConfig(temperature=0.0, max_steps=3)), "validation"),
                          episode("v3", 0, 0, k0, "validation")])
    e = arm_store("e", "e-k1", promoted=False)
    assert share_k0_episodes(preset, "e", tmp_path / "e", e, stages, 0, greedy_settings=greedy) == {"b": 1}
    got = e.trajectory_table(benchmark=bench, source="policy")
    assert [(r["task_id"], r["iteration"], r["split"], r["model_id"]) for r in got.iter_rows(named=True)] == [
        ("v1", 0, "validation", eval_tag(k0, greedy))]
    assert share_k0_episodes(preset, "e", tmp_path / "e", e, stages, 1, greedy_settings=greedy) == {}


def test_a_greedy_evaluations_tag_leaves_out_the_rollouts_seed():
    """`eval_tag`: at temperature 0 the seed (declared greedy=False) does not enter the settings hash, so a
    replicate keeps greedy episodes its siblings played; a seed-0 tag is what it always was; at a temperature
    above 0 the seed is part of the settings."""
    import hashlib

    from flywheel.assets.evaluation import eval_tag
    from flywheel.rollout.engine import RolloutConfig

    zero = RolloutConfig(temperature=0.0)
    assert eval_tag("c", RolloutConfig(temperature=0.0, seed=4)) == eval_tag("c", zero)
    assert eval_tag("c", zero) == f"c#{hashlib.sha256(repr(zero).encode()).hexdigest()[:8]}"
    assert eval_tag("c", RolloutConfig(temperature=0.0, max_new_tokens=64)) != eval_tag("c", zero)
    assert eval_tag("c", RolloutConfig(temperature=0.5, seed=4)) != eval_tag("c", RolloutConfig(temperature=0.5))
