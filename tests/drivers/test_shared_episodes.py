"""Arms that start from one k=0 share its episodes (`flywheel.drivers.experiment.share_k0_episodes`): which
arms may (`episode_siblings`, from the fields' `play` declarations), and the copy through a real run."""

import json
from types import SimpleNamespace

import yaml

from flywheel.core.store import Store
from flywheel.drivers.experiment import NOT_IN_PLAY, episode_siblings
from tests.helpers import TWO_ARMS, experiment_process


def test_arms_sharing_a_k0_share_its_episodes_unless_they_change_how_an_episode_plays():
    """`episode_siblings`: arms that start from the same arm and differ only in fields declared play=False (how
    k > 0 trains, how many episodes a task gets) or outside envs and policy (the loop) take each other's k=0
    episodes; a replicate (its own rollout_seed) or an arm that samples otherwise does not."""
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
    }
    preset = SimpleNamespace(arms=arms, arm_sections=lambda arm: arms[arm])
    assert episode_siblings(preset, "no-cleaning") == ["bpo", "slow", "control"]
    assert episode_siblings(preset, "bpo") == ["no-cleaning", "slow", "control"]
    assert episode_siblings(preset, "bpo-r2") == episode_siblings(preset, "greedier") == []
    assert episode_siblings(preset, "k0") == [] and episode_siblings(preset, "elsewhere") == []
    # what changes an episode is never declared play=False
    for field in ("temperature", "eval_temperature", "max_new_tokens", "rollout_seed", "stop_on_loop",
                  "history_window", "max_observation_chars", "max_model_len", "vllm_dtype"):
        assert field not in NOT_IN_PLAY["policy"]
    assert "max_steps" not in NOT_IN_PLAY["envs"] and "spec_options" not in NOT_IN_PLAY["envs"]


def test_arms_from_one_k0_take_each_others_k0_episodes_in_one_runs_folder(tmp_path):
    """In one runs folder: `c` (another k > 0 learning rate) takes the k=0 rollouts and validation games `b`
    (no cleaning) played from the k=0 both start from, instead of playing them (`b` takes nothing: `a`, the arm
    they start from, played its own k=0 under its own checkpoint id). The report says whose rollouts an arm
    took."""
    spec = {**TWO_ARMS, "name": "siblings", "compare": [], "replicates": {}, "arms": {
        "a": {},
        "b": {"loop": {"clean_successes": False}, "method": {"start_from": "a", "evaluate_start": False}},
        "c": {"policy": {"refine_learning_rate": 1e-4}, "method": {"start_from": "a", "evaluate_start": False}}}}
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
