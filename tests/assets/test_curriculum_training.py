"""The curriculum order reaches the trainer: sft_checkpoint passes it, and the SFT dataloader keeps it."""

import dagster as dg

import flywheel.assets.training as training_assets
import flywheel.policy.sft as training
from flywheel.assets.curriculum import CurriculumResource
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.models import load_tokenizer
from flywheel.policy.sft import TrainConfig, TrainResult, sft_examples, train_sft
from flywheel.resources import EnvResource, LoopResource, StoreResource, TransformersPolicy
from tests.fakes import marked, store_with_seeds

BENCH = "scienceworld"




def _capture_steps(monkeypatch, factory: str, grab) -> list:
    """Patch the trainer class `factory` of flywheel.policy.sft to record `grab(inputs)` at every training step."""
    captured = []
    real = getattr(training, factory)

    def capturing_trainer():
        class Capturing(real()):
            def training_step(self, model, inputs, *args, **kwargs):
                captured.append(grab(inputs))
                return super().training_step(model, inputs, *args, **kwargs)

        return Capturing

    monkeypatch.setattr(training, factory, capturing_trainer)
    return captured


def test_given_order_reaches_the_trainer_batches(tmp_path, tiny, monkeypatch):
    """Capture the batches the SFT dataloader yields: they come in the given (curriculum) order."""
    captured = _capture_steps(monkeypatch, "_InOrderSFTTrainer", lambda inputs: inputs["input_ids"].clone())
    order = [3, 0, 5, 1, 4, 2]
    rows = sft_examples([marked(i) for i in order], lambda _t: "instr")
    train_sft(tiny, rows, tmp_path / "ck", TrainConfig(epochs=1, batch_size=2, learning_rate=1e-3, order="given",
                                                       packing="per_step"))
    tok = load_tokenizer(tiny)
    seen = []
    for batch in captured:
        for ids in batch:
            text = tok.decode(ids, skip_special_tokens=True)
            seen.append(int(text.split("zq", 1)[1].split("q", 1)[0]))
    assert seen == order


def test_given_order_reaches_the_packed_trainer_steps(tmp_path, tiny, monkeypatch):
    """Packed SFT walks the same order: each optimizer step's examples, step after step."""
    captured = _capture_steps(monkeypatch, "_packed_trainer_class", lambda inputs: list(inputs["examples"]))
    order = [3, 0, 5, 1, 4, 2]
    rows = sft_examples([marked(i) for i in order], lambda _t: "instr")
    train_sft(tiny, rows, tmp_path / "ck", TrainConfig(epochs=1, batch_size=2, learning_rate=1e-3, order="given"))
    assert captured == [[0, 1], [2, 3], [4, 5]]
    assert [int(rows[i]["task_id"].removeprefix("task")) for step in captured for i in step] == order


def _run_sft(tmp_path, monkeypatch, curriculum, k=0):
    calls = []

    def fake_train(base, examples, out, cfg, progress=None):
        calls.append((examples, cfg))
        return TrainResult(path=str(out), n_examples=len(examples), n_dropped=0, train_loss=1.0, steps=1)

    monkeypatch.setattr(training_assets, "train_sft", fake_train)
    result = dg.materialize(
        [training_assets.sft_checkpoint], partition_key=str(partition_key(BENCH, k)),
        instance=dg.DagsterInstance.ephemeral(),
        resources={"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": EnvResource(),
                   "policy": TransformersPolicy(base_model_path="unused", checkpoints_dir=str(tmp_path / "ck")),
                   "curriculum": curriculum, "loop": LoopResource()},
    )
    assert result.success
    [(examples, cfg)] = calls
    tasks = list(dict.fromkeys(r["task_id"] for r in examples))
    return tasks, cfg, result


def test_sft_checkpoint_trains_easy_to_hard_and_inserts_gated_by_complexity(tmp_path, monkeypatch):
    db = store_with_seeds(tmp_path / "fw.duckdb")
    tasks, cfg, _ = _run_sft(tmp_path, monkeypatch, CurriculumResource())
    assert cfg.order == "given"
    assert tasks == ["task11", "task1", "task3", "task0", "task12", "task2", "task10"]  # 1, 2, 4, 6, 7, 9, 12 steps
    recorded = db.query("SELECT traj_id, length, mode FROM training_order WHERE iteration = 0 ORDER BY position")
    assert recorded["length"].to_list() == [1, 2, 4, 6, 7, 9, 12] and set(recorded["mode"]) == {"curriculum"}

    gated = marked(20, 5, source="policy")
    db.write_trajectories([gated])
    db.write_gated(BENCH, 0, [(gated.traj_id, gated.task_id)], candidates=1)
    tasks, cfg, result = _run_sft(tmp_path, monkeypatch, CurriculumResource(), k=1)
    assert tasks == ["task11", "task1", "task3", "task20", "task0", "task12", "task2", "task10"]
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["order"].value.startswith("curriculum (easy to hard")
    assert meta["examples_never_trained"].value == 0  # no step cap: every pass reaches the hard end


def test_a_step_cap_below_one_pass_is_reported_as_the_hardest_examples_never_trained():
    from flywheel.policy.sft import examples_never_trained

    # The old exact cap (whole_passes off): cpu-scienceworld's replay-all k=1 left 109 of 237 untrained.
    cfg = TrainConfig(order="given", max_steps=16, batch_size=8, whole_passes=False)
    assert examples_never_trained(237, cfg) == 109
    assert examples_never_trained(237, TrainConfig(order="given", max_steps=16, batch_size=8)) == 0  # the default
    assert examples_never_trained(88, cfg) == 0 and examples_never_trained(237, cfg, world_size=2) == 0
    assert examples_never_trained(237, TrainConfig(order="shuffle", max_steps=16, batch_size=8)) == 0
    assert examples_never_trained(237, TrainConfig(order="given", max_steps=-1)) == 0


def test_ablation_off_shuffles_and_drops_synthetic(tmp_path, monkeypatch):
    store_with_seeds(tmp_path / "fw.duckdb")
    tasks, cfg, result = _run_sft(tmp_path, monkeypatch, CurriculumResource(synthesize=False, order="shuffle"))
    assert cfg.order == "shuffle" and sorted(tasks) == ["task0", "task1", "task2", "task3"]
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["order"].value == "shuffle" and meta["seed_or_curriculum_trajectories"].value == 4


def test_staged_order_goes_bucket_by_bucket(tmp_path, monkeypatch):
    db = store_with_seeds(tmp_path / "fw.duckdb")
    tasks, cfg, _ = _run_sft(tmp_path, monkeypatch, CurriculumResource(order="staged", train_bucket_edges={BENCH: [3, 7]}))
    assert cfg.order == "given"
    buckets = db.query("SELECT bucket FROM training_order WHERE iteration = 0 ORDER BY position")["bucket"].to_list()
    assert buckets == sorted(buckets, key=["easy", "medium", "hard"].index) and buckets.count("easy") == 2


def _sft_at(tmp_path, k, **policy):
    """Materialize sft_checkpoint k over the store in tmp_path, shuffled, with these policy fields."""
    return dg.materialize(
        [training_assets.sft_checkpoint], partition_key=str(partition_key(BENCH, k)),
        instance=dg.DagsterInstance.ephemeral(),
        resources={"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": EnvResource(),
                   "policy": TransformersPolicy(base_model_path="the-base", checkpoints_dir=str(tmp_path / "ck"),
                                                **policy),
                   "curriculum": CurriculumResource(order="shuffle"), "loop": LoopResource()})


def test_refine_from_previous_continues_from_checkpoint_k_minus_1_on_new_successes(tmp_path, monkeypatch):
    """policy.refine_from="previous": k=1 starts from checkpoint 0 and trains on gate 0's new
    successes plus as many replayed seed/curriculum trajectories, not on everything again."""
    db = store_with_seeds(tmp_path / "fw.duckdb")
    calls = []

    def fake_train(base, examples, out, cfg, progress=None):
        calls.append((base, examples))
        return TrainResult(path=str(out), n_examples=len(examples), n_dropped=0, train_loss=1.0, steps=1)

    monkeypatch.setattr(training_assets, "train_sft", fake_train)

    def sft(k, refine_from, replay="matched"):
        return _sft_at(tmp_path, k, refine_from=refine_from, replay=replay)

    assert sft(0, "previous").success
    base0, _ = calls[-1]
    assert base0 == "the-base"  # k=0 always starts from the base model
    ck0 = db.latest_checkpoint(BENCH, 0)["path"]
    new = [marked(20, 3, source="policy"), marked(21, 2, source="policy")]
    db.write_trajectories(new)
    db.write_gated(BENCH, 0, [(t.traj_id, t.task_id) for t in new], candidates=2)
    result = sft(1, "previous")
    assert result.success
    base1, examples = calls[-1]
    assert base1 == ck0
    tasks = {r["task_id"] for r in examples}
    assert {"task20", "task21"} <= tasks and len(tasks) == 4  # the 2 new successes + 2 replayed seeds
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["gated_trajectories"].value == 2 and meta["seed_or_curriculum_trajectories"].value == 2
    assert sft(1, "base").success  # the default: from the base model, on all 7 + 2 trajectories
    base_b, examples_b = calls[-1]
    assert base_b == "the-base" and len({r["task_id"] for r in examples_b}) == 9
    # replay "all": the warm start from checkpoint 0, but every seed, curriculum and gated trajectory
    result = sft(1, "previous", replay="all")
    assert result.success
    base_a, examples_a = calls[-1]
    assert base_a == ck0 and len({r["task_id"] for r in examples_a}) == 9
    assert sorted(map(str, examples_a)) == sorted(map(str, examples_b))  # the same pairs as from the base model
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["gated_trajectories"].value == 2 and meta["seed_or_curriculum_trajectories"].value == 7


def test_refine_train_steps_caps_every_k_above_0_and_leaves_k0_alone(tmp_path, monkeypatch):
    """policy.refine_train_steps: k=0 trains max_train_steps from the base model, each k > 0 the refine budget
    (null: max_train_steps at every k); the cap reaches the trainer's config."""
    db = store_with_seeds(tmp_path / "fw.duckdb")
    steps = []

    def fake_train(base, examples, out, cfg, progress=None):
        steps.append(cfg.max_steps)
        return TrainResult(path=str(out), n_examples=len(examples), n_dropped=0, train_loss=1.0, steps=cfg.max_steps)

    monkeypatch.setattr(training_assets, "train_sft", fake_train)

    def sft(k, **policy):
        return _sft_at(tmp_path, k, max_train_steps=30, **policy).success

    assert sft(0, refine_train_steps=10)
    new = [marked(20, 3, source="policy")]
    db.write_trajectories(new)
    db.write_gated(BENCH, 0, [(t.traj_id, t.task_id) for t in new], candidates=1)
    assert sft(1, refine_train_steps=10) and sft(1)
    assert steps == [30, 10, 30]
    assert '"train_steps": 30' in db.latest_checkpoint(BENCH, 1)["lineage"]  # the unset knob's run, recorded
