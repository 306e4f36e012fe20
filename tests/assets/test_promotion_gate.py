"""The promotion gate on sft_checkpoint, on the test benchmark through Dagster (run_flywheel, as the demo):
a planted degraded checkpoint (k=1 never opens a door) is rejected on the validation task, rollouts of k=1 and
SFT k=2 go on from k=0, and a good k=2 is promoted against k=0. Env, store, SFT, gate and Dagster are real;
the policy is a test double that solves a task from its goal text, or only looks around at a planted k."""

import json
import re

import dagster as dg

from flywheel.assets.curriculum import CurriculumResource
from flywheel.core.prompting import format_response
from flywheel.core.store import Store
from flywheel.drivers.pipeline import run_flywheel
from flywheel.policy.inference import Generation
from flywheel.reports.dashboard import summary_rows
from flywheel.reports.render import render_promoted
from flywheel.reports.results import arm_results
from flywheel.resources import EnvResource, LoopResource, PolicyResource, StoreResource
from tests.tinybench import NAME, SPEC, shortest_path

REFS = {NAME: "tests.tinybench:SPEC"}


class Solver:
    """Plays the shortest path the goal text names; `broken`: looks around instead (a degraded checkpoint)."""

    def __init__(self, broken: bool, model_id: str) -> None:
        self.broken, self.model_id = broken, model_id

    def generate(self, prompts, *, temperature, max_new_tokens, seed=None):
        out = []
        for messages in prompts:
            user = messages[-1]["content"]
            step = int(re.findall(r"\[Step (\d+)\] Respond", user)[-1]) - 1
            door = int(re.search(r"Open the door in room (\d)\.", user).group(1))
            keys = [int(k) for k in re.findall(r"room (\d)", re.search(r"Keys: ([^.]*)\.", user).group(1))]
            path = shortest_path(keys, door)
            action = "look around" if self.broken or step >= len(path) else path[step]
            text = format_response("I know the way.", "Go on.", action)
            out.append(Generation(text, prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4))
        return out


class PlantedPolicy(PolicyResource):
    broken: list[int] = []  # the iterations whose checkpoints are degraded

    def generator(self, checkpoint_path, checkpoint_id):
        k = int(re.search(r"-k(\d+)-", checkpoint_id).group(1))
        return Solver(broken=k in self.broken, model_id=checkpoint_id)


def run_planted(tmp_path, tiny, instance: dg.DagsterInstance, **loop) -> Store:
    """K=2 on the test benchmark with k=1's checkpoint degraded; `loop`: LoopResource fields."""
    db_path = tmp_path / "fw.duckdb"
    resources = {
        "store": StoreResource(path=str(db_path)),
        "envs": EnvResource(benchmark_refs=REFS, train_limit=2, eval_limit=1, max_steps=10),
        "policy": PlantedPolicy(base_model_path=tiny, checkpoints_dir=str(tmp_path / "ck"), epochs=1, max_train_steps=1,
                                batch_size=2, history_window=2, samples_per_task=1, parallel_envs=1, broken=[1]),
        "curriculum": CurriculumResource(max_proposals=2),
        # The solver's successes repeat the seeds' paths: the gate admits none, and the loop goes on.
        "loop": LoopResource(benchmarks=[NAME], iterations=2, continue_on_empty_gate=True, **loop),
    }
    run_flywheel(NAME, resources=resources, iterations=2, instance=instance, benchmark_refs=REFS)
    return Store(db_path)


def test_the_gate_keeps_the_predecessor_over_a_degraded_checkpoint_and_promotes_a_good_one(tmp_path, tiny):
    instance = dg.DagsterInstance.ephemeral()
    db = run_planted(tmp_path, tiny, instance)
    db_path = tmp_path / "fw.duckdb"
    ckpts = {r["iteration"]: r for r in db.checkpoint_rows(NAME)}
    decisions = {r["iteration"]: r for r in db.promotions(NAME)}
    assert [decisions[k]["promoted"] for k in (0, 1, 2)] == [True, False, True]
    assert decisions[0]["verdict"] == "k=0 is promoted by definition"
    rejected = decisions[1]
    assert (rejected["checkpoint_id"], rejected["predecessor_id"], rejected["promoted_id"]) == (
        ckpts[1]["checkpoint_id"], ckpts[0]["checkpoint_id"], ckpts[0]["checkpoint_id"])
    assert (rejected["validation_n"], rejected["successes"], rejected["predecessor_successes"]) == (1, 0, 1)
    assert rejected["delta"] == -1 and rejected["margin"] == 0.1 and rejected["alpha"] == 0.05
    assert "rejected k=1" in rejected["verdict"] and "goes on from k=0" in rejected["verdict"]
    # k=2 is compared with the promoted k=0, not the rejected k=1.
    assert (decisions[2]["predecessor_id"], decisions[2]["promoted_id"]) == (ckpts[0]["checkpoint_id"], ckpts[2]["checkpoint_id"])

    # The UI: the check on sft_checkpoint, a WARN (the run goes on) with the decision's numbers.
    events = [r.event_log_entry.dagster_event for r in instance.get_event_records(
        dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION))]
    shown = {str(e.event_specific_data.partition): e.event_specific_data for e in events
             if e.event_specific_data.check_name == "checkpoint_is_promoted"}
    assert f"{NAME}|1" in shown, sorted(shown)
    check = shown[f"{NAME}|1"]
    assert check.asset_key == dg.AssetKey("sft_checkpoint") and not check.passed
    assert check.severity == dg.AssetCheckSeverity.WARN and shown[f"{NAME}|2"].passed
    meta = {k: v.value for k, v in check.metadata.items()}
    assert {k: meta[k] for k in ("validation_n", "successes", "predecessor_successes", "paired_difference",
                                 "margin", "alpha", "promoted")} == {
        "validation_n": 1, "successes": 0, "predecessor_successes": 1, "paired_difference": -1.0, "margin": 0.1,
        "alpha": 0.05, "promoted": ckpts[0]["checkpoint_id"]}
    assert meta["verdict"] == rejected["verdict"] and "lower bound" in meta["rule"]

    # The dashboard's row and the experiment report's per-iteration row say it too.
    rows, _ = summary_rows(db, NAME)
    assert [r["promotion"] for r in rows] == ["promoted", "rejected (0/1 vs 1/1): k=0 kept", "promoted (1/1 vs 1/1)"]
    res = arm_results(Store.reader(db_path), NAME, 2, {}, ("seen", "unseen"))
    assert [r.get("promotion", {}).get("promoted") for r in res["per_k"]] == [None, False, True]
    assert res["per_k"][1]["promotion"]["kept_k"] == 0
    assert "promoted checkpoint:** k=2" in render_promoted(res).lower() and "rejected: k=1" in render_promoted(res)

    # The next iteration starts from the promoted predecessor: rollouts of k=1 by k=0, SFT k=2 from k=0's weights.
    rollouts = db.load_trajectories(benchmark=NAME, iteration=1, source="policy", split="train")
    assert rollouts and all(t.model_id == ckpts[0]["checkpoint_id"] for t in rollouts)
    assert all(t.success for t in rollouts)  # k=0 solves them; the degraded k=1 would not
    assert json.loads(ckpts[2]["lineage"])["base_model"] == ckpts[0]["path"]
    assert ckpts[1]["base_model"] == ckpts[0]["path"]

    # The validation task is the training task set aside; each checkpoint played it once (k=0's episode is reused).
    validation = db.load_trajectories(benchmark=NAME, source="policy", split="validation")
    assert sorted((t.iteration, t.task_id) for t in validation) == [(0, "train-3"), (1, "train-3"), (2, "train-3")]
    assert "train-3" not in {t.task_id for t in db.load_trajectories(benchmark=NAME, source="teacher")}
    synthetic = db.load_trajectories(benchmark=NAME, source="synthetic")
    layouts = {(tuple(t.meta["keys"]), t.meta["door"]) for t in SPEC.load_tasks("train") if t.task_id == "train-3"}
    assert synthetic and not layouts & {(tuple(json.loads(r["meta"])["keys"]), json.loads(r["meta"])["door"])
                                        for r in db.query("SELECT meta FROM tasks WHERE task_id LIKE 'syn-%'")
                                        .iter_rows(named=True)}


def test_a_gate_that_only_selects_decides_the_same_but_the_loop_goes_on_from_k(tmp_path, tiny):
    """loop.promotion_steers: false (the equal-compute control's gate): the same decisions and the same promoted
    checkpoint for the report, but rollouts k=1 are played by the rejected k=1 and SFT k=2 continues from it."""
    db = run_planted(tmp_path, tiny, dg.DagsterInstance.ephemeral(), promotion_steers=False)
    ckpts = {r["iteration"]: r for r in db.checkpoint_rows(NAME)}
    decisions = {r["iteration"]: r for r in db.promotions(NAME)}
    assert [decisions[k]["promoted"] for k in (0, 1, 2)] == [True, False, True]
    assert decisions[1]["promoted_id"] == ckpts[0]["checkpoint_id"]
    assert "k=0 is the promoted checkpoint; the loop goes on from k=1" in decisions[1]["verdict"]
    assert decisions[2]["predecessor_id"] == ckpts[0]["checkpoint_id"]  # k=2 is judged against the promoted k=0
    rollouts = db.load_trajectories(benchmark=NAME, iteration=1, source="policy", split="train")
    assert rollouts and all(t.model_id == ckpts[1]["checkpoint_id"] for t in rollouts)
    assert not any(t.success for t in rollouts)  # the degraded k=1 played them
    assert json.loads(ckpts[2]["lineage"])["base_model"] == ckpts[1]["path"]
    res = arm_results(Store.reader(tmp_path / "fw.duckdb"), NAME, 2, {}, ("seen", "unseen"))
    assert res["per_k"][2]["promotion"]["kept_k"] == 2 and res["per_k"][1]["promotion"]["kept_k"] == 0


def test_the_gate_off_promotes_every_checkpoint_with_the_reason(tmp_path):
    from flywheel.assets._checkpoints import promoted_checkpoint

    db = Store(tmp_path / "fw.duckdb")
    for k in (0, 1):
        db.record_checkpoint({"checkpoint_id": f"c{k}", "benchmark": NAME, "iteration": k, "path": f"/ck/{k}",
                              "base_model": "base", "n_examples": 1, "n_trajectories": 1, "train_loss": 0.0,
                              "lineage": {}})
    assert promoted_checkpoint(db, NAME, 1)["checkpoint_id"] == "c1"  # no decision recorded: k itself
    db.record_promotion({"benchmark": NAME, "iteration": 1, "checkpoint_id": "c1", "promoted_id": "c0",
                         "promoted": False, "verdict": "rejected"})
    assert promoted_checkpoint(db, NAME, 1)["checkpoint_id"] == "c0"
    db.record_promotion({"benchmark": NAME, "iteration": 1, "checkpoint_id": "an-older-c1", "promoted_id": "c0",
                         "promoted": False, "verdict": "rejected"})
    assert promoted_checkpoint(db, NAME, 1)["checkpoint_id"] == "c1"  # a decision on another checkpoint k: stale
