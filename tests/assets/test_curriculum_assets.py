"""The stage-2 assets through Dagster on the real envs with the scripted teacher, checked in DuckDB.

- synthetic_curriculum materializes for a small ScienceWorld and a small WebShop partition:
  proposals recorded with status/reason, synthetic trajectories stored, every training
  trajectory graded and ordered; re-running replaces; the ablation switch removes synthesis.
- evaluation reports success by gold-length bucket (eval_buckets, gold_lengths cached).
"""

import json
import re

import dagster as dg

from envs.scienceworld import SPEC as SCIENCEWORLD
from envs.scienceworld import ScienceWorldEnv
from flywheel.assets.curriculum import CurriculumResource
from flywheel.core.prompting import format_response
from flywheel.core.store import Store
from flywheel.definitions import stage_assets
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.inference import Generation
from flywheel.resources import EnvResource, PolicyResource, ScriptedTeacherResource, StoreResource

STAGES = ["expert_trajectories", "teacher_quaternions", "synthetic_curriculum"]


def materialize(assets, key, resources, tmp_path):
    """Materialize just these assets (their own resources only; deps outside the list are read from the store)."""
    chosen = [a for a in stage_assets if a.key.to_user_string() in assets]
    resources = {"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "teacher": ScriptedTeacherResource(), **resources}
    result = dg.materialize(chosen, partition_key=key, resources=resources, instance=dg.DagsterInstance.ephemeral(),
                            raise_on_error=False)
    assert result.success, [str(e.event_specific_data.error) for e in result.all_events if e.is_step_failure]
    return result


def bootstrap(tmp_path, benchmark, envs, curriculum, assets=STAGES):
    result = materialize(assets, benchmark, {"envs": envs, "curriculum": curriculum}, tmp_path)
    mats = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    return Store(tmp_path / "fw.duckdb"), mats.get("synthetic_curriculum")


def check_curriculum_table(db, benchmark, n_total):
    cur = db.query("SELECT * FROM curriculum WHERE benchmark = ? ORDER BY position", [benchmark])
    assert cur["position"].to_list() == list(range(n_total))
    assert cur["score"].to_list() == sorted(cur["score"].to_list())  # easy to hard
    assert set(cur["bucket"]) <= {"easy", "medium", "hard"} and (cur["other_signal"] > 0).all()
    assert set(cur["source"]) <= {"teacher", "synthetic"} and (cur["length"] == cur["score"]).all()
    return cur


def test_synthetic_curriculum_scienceworld(tmp_path):
    envs = EnvResource(task_types={"scienceworld": ["find-non-living-thing"]}, train_limit=2)
    db, meta = bootstrap(tmp_path, "scienceworld", envs, CurriculumResource(proposals_per_seed=2.0))
    assert meta["proposals"].value == 4 and meta["teacher"].value == "scripted"
    solved = meta["solved"].value
    assert meta["valid"].value == 4 and solved == 4 and meta["synthesized_trajectories"].value == solved
    props = db.query("SELECT * FROM curriculum_proposals WHERE benchmark = 'scienceworld'")
    assert props.height == 4 and set(props["status"]) == {"solved"}
    assert {"unused_variation", "harder_task_type", "harder_setting"} <= set(props["kind"])
    syn = db.trajectory_table(benchmark="scienceworld", source="synthetic")
    assert syn.height == solved and syn["success"].all()
    # harder on purpose: the longest synthetic task is longer than every seed
    assert meta["synthetic_length"].value["max"] > meta["seed_length"].value["max"]
    cur = check_curriculum_table(db, "scienceworld", 2 + solved)
    assert cur["source"].to_list()[-1] == "synthetic"  # the hardest item is a synthesized one
    tasks = db.query("SELECT task_id, meta FROM tasks WHERE split = 'synthetic'")
    assert tasks.height == solved and all('"synthetic": true' in m for m in tasks["meta"])

    # Re-running replaces the partition; turning synthesis off (ablation) removes it.
    db, _ = bootstrap(tmp_path, "scienceworld", envs, CurriculumResource(proposals_per_seed=2.0), ["synthetic_curriculum"])
    assert db.trajectory_table(benchmark="scienceworld", source="synthetic").height == solved
    db, meta = bootstrap(tmp_path, "scienceworld", envs, CurriculumResource(synthesize=False, order="shuffle"),
                         ["synthetic_curriculum"])
    assert meta["synthesized_trajectories"].value == 0 and meta["synthesize"].value is False
    assert db.trajectory_table(benchmark="scienceworld", source="synthetic").height == 0
    assert db.query("SELECT count(*) FROM curriculum_proposals WHERE benchmark = 'scienceworld'").item() == 0
    check_curriculum_table(db, "scienceworld", 2)


def test_synthetic_curriculum_webshop(tmp_path):
    envs = EnvResource(train_limit=4)
    db, meta = bootstrap(tmp_path, "webshop", envs, CurriculumResource(proposals_per_seed=1.5))
    assert (meta["proposals"].value, meta["valid"].value, meta["solved"].value, meta["kept"].value) == (6, 6, 6, 6)
    assert "seed" in meta["curriculum"].value and meta["other_signal"].value == "locations"
    check_curriculum_table(db, "webshop", 4 + 6)
    goals = db.query("SELECT goal FROM trajectories WHERE source = 'synthetic'")["goal"].to_list()
    assert all(g.startswith("Find me ") and "price lower than" in g for g in goals)


class GoldPolicy(PolicyResource):
    """A test double for the *policy*: plays the gold path of the tasks listed in `answers` (by first observation)."""

    answers: str

    def generator(self, checkpoint_path, checkpoint_id):
        return GoldGenerator(json.loads(self.answers))


class GoldGenerator:
    model_id = "gold"

    def __init__(self, answers):
        self.answers = answers

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        out = []
        for messages in prompts:
            user = messages[-1]["content"]
            step = int(re.findall(r"\[Step (\d+)\] Respond", user)[-1]) - 1
            actions = next((a for obs, a in self.answers.items() if user.startswith(obs)), [])
            action = actions[step] if step < len(actions) else "look around"
            text = format_response("I follow the plan.", "Keep going.", action)
            out.append(Generation(text, prompt_tokens=10, completion_tokens=5))
        return out


def test_evaluation_reports_success_by_gold_length_bucket(tmp_path):
    bench = "scienceworld"
    envs = EnvResource(task_types={bench: ["find-non-living-thing"]}, eval_limit=3, max_steps=10)
    seen = envs.tasks(bench, "seen")
    solve = seen[1:2]  # the policy knows the gold path of one seen task only
    env = ScienceWorldEnv()
    try:
        answers = {}
        for task in solve:
            actions = env.expert_actions(task)
            answers[env.reset(task).strip()] = actions
    finally:
        env.close()
    db = Store(tmp_path / "fw.duckdb")
    db.record_checkpoint({"checkpoint_id": "fake-k0", "benchmark": bench, "iteration": 0, "path": "unused",
                          "base_model": "unused", "n_examples": 0, "n_trajectories": 0, "train_loss": 0.0})
    curriculum = CurriculumResource(eval_bucket_edges={bench: [5, 9]})
    result = materialize(["evaluation"], str(partition_key(bench, 0)), {
        "envs": envs, "policy": GoldPolicy(answers=json.dumps(answers), parallel_envs=1), "curriculum": curriculum,
    }, tmp_path)
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["buckets"].value == "easy <= 5, 5 < medium <= 9, hard > 9"
    assert {"split": "seen", "bucket": "easy"}.items() <= meta["success_by_bucket"].records[0].data.items()
    gold = dict(db.query("SELECT task_id, length FROM gold_lengths WHERE split = 'seen'").iter_rows())
    assert set(gold) == {t.task_id for t in seen} and all(n and n > 0 for n in gold.values())
    expected = {len(SCIENCEWORLD.expert_actions(t)) for t in solve}
    assert gold[solve[0].task_id] in expected
    rows = db.query("SELECT bucket, episodes, successes FROM eval_buckets WHERE split = 'seen' ORDER BY bucket")
    assert sum(rows["episodes"]) == len(seen) and sum(rows["successes"]) == 1
    bucket_of_solved = "easy" if gold[solve[0].task_id] <= 5 else "medium" if gold[solve[0].task_id] <= 9 else "hard"
    assert dict(zip(rows["bucket"], rows["successes"], strict=True))[bucket_of_solved] == 1
    assert meta[f"seen_{bucket_of_solved}_success_rate"].value > 0
