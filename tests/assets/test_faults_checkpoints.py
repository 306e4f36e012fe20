"""Checkpoints: one directory per checkpoint id, published atomically, never deleted; a re-run reuses.

Before: every checkpoint of iteration k was written to `<checkpoints>/<b>/k<k>`, deleting the old
directory before renaming the new one in, so a kill in between lost the recorded checkpoint, and a
re-run (e.g. of a killed demo) trained from scratch.
"""

import json
from pathlib import Path

import dagster as dg
import pytest

import flywheel.assets.training as training_assets
from flywheel.assets.curriculum import CurriculumResource
from flywheel.orchestration.partitions import partition_key
from flywheel.policy.models import build_tiny_model
from flywheel.policy.sft import TrainResult, sft_examples, train_sft
from flywheel.resources import EnvResource, LoopResource, StoreResource, TransformersPolicy
from tests.fakes import BENCH, make_traj, store_with_seeds


def materialize_sft(tmp_path, calls, **policy):
    def fake_train(base, examples, out, cfg, progress=None):
        calls.append(Path(out))
        Path(out).mkdir(parents=True)  # a real, complete directory (what train_sft publishes)
        (Path(out) / "config.json").write_text("{}")
        return TrainResult(path=str(out), n_examples=len(examples), n_dropped=0, train_loss=1.0, steps=1)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(training_assets, "train_sft", fake_train)
        result = dg.materialize(
            [training_assets.sft_checkpoint], partition_key=str(partition_key(BENCH, 0)),
            instance=dg.DagsterInstance.ephemeral(),
            resources={"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": EnvResource(),
                       "policy": TransformersPolicy(base_model_path="unused", checkpoints_dir=str(tmp_path / "ck"),
                                                    **policy),
                       "curriculum": CurriculumResource(), "loop": LoopResource()},
        )
    assert result.success
    return result.get_asset_materialization_events()[0].materialization.metadata


def materialize_killed(tmp_path, killed_train, **policy):
    """A run of sft_checkpoint whose training dies (`killed_train` raises)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(training_assets, "train_sft", killed_train)
        result = dg.materialize(
            [training_assets.sft_checkpoint], partition_key=str(partition_key(BENCH, 0)),
            instance=dg.DagsterInstance.ephemeral(), raise_on_error=False,
            resources={"store": StoreResource(path=str(tmp_path / "fw.duckdb")), "envs": EnvResource(),
                       "policy": TransformersPolicy(base_model_path="unused", checkpoints_dir=str(tmp_path / "ck"),
                                                    **policy),
                       "curriculum": CurriculumResource(), "loop": LoopResource()})
    assert not result.success


def test_rerun_reuses_the_recorded_checkpoint_and_new_training_never_touches_it(tmp_path):
    db = store_with_seeds(tmp_path / "fw.duckdb")
    calls: list[Path] = []
    first = materialize_sft(tmp_path, calls)
    assert len(calls) == 1 and first["reused"].value is False
    ck1 = calls[0]
    assert ck1.parent == tmp_path / "ck" / BENCH and ck1.name == first["checkpoint_id"].value  # unique, by id

    again = materialize_sft(tmp_path, calls)  # e.g. the demo re-run after a kill: same data and config
    assert len(calls) == 1 and again["reused"].value is True
    assert again["checkpoint_id"].value == first["checkpoint_id"].value

    changed = materialize_sft(tmp_path, calls, max_train_steps=3)  # another config: trains anew, elsewhere
    assert len(calls) == 2 and changed["reused"].value is False and calls[1] != ck1
    assert (ck1 / "config.json").exists()  # the recorded checkpoint is still there
    rows = db.query("SELECT checkpoint_id, path FROM checkpoints ORDER BY created_at").rows()
    assert [r[1] for r in rows] == [str(ck1), str(calls[1])]

    (calls[1] / "config.json").unlink()  # a recorded checkpoint that is gone is not reused
    materialize_sft(tmp_path, calls, max_train_steps=3)
    assert len(calls) == 3


def test_train_sft_never_overwrites_a_checkpoint_directory(tmp_path):
    tiny = build_tiny_model(tmp_path / "tiny", vocab_size=300)
    out = tmp_path / "ck" / "scienceworld-k0-x"
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"recorded": true}')
    rows = sft_examples([make_traj(n=2)], lambda t: "instr")
    with pytest.raises(FileExistsError, match="never overwritten"):
        train_sft(tiny, rows, out)
    assert json.loads((out / "config.json").read_text()) == {"recorded": True}
    fresh = tmp_path / "ck" / "scienceworld-k0-y"
    from flywheel.policy.sft import TrainConfig

    res = train_sft(tiny, rows, fresh, TrainConfig(max_steps=1, batch_size=2))
    assert res.path == str(fresh) and (fresh / "config.json").exists()
    assert sorted(p.name for p in fresh.parent.iterdir()) == ["scienceworld-k0-x", "scienceworld-k0-y"]  # no .partial


def test_a_checkpoint_and_its_training_pairs_are_recorded_together(tmp_path):
    db = store_with_seeds(tmp_path / "fw.duckdb")
    pairs = [{"prompt": [{"role": "user", "content": "p"}], "completion": [{"role": "assistant", "content": "c"}]}]
    with pytest.raises(Exception, match="many"):  # the checkpoint row fails after its pairs were written: neither stays
        db.record_checkpoint({"checkpoint_id": "c", "benchmark": BENCH, "iteration": 0, "n_examples": "many"},
                             training_examples=pairs)
    assert db.query("SELECT count(*) FROM training_examples").item() == 0
    assert db.latest_checkpoint(BENCH, 0) is None

    calls: list[Path] = []
    first = materialize_sft(tmp_path, calls)
    ck = first["checkpoint_id"].value
    assert db.has_training_examples(ck)
    # What a kill between the two writes left before (a checkpoint without its pairs) is not reused: retrained.
    db.query("DELETE FROM training_examples WHERE checkpoint_id = ?", [ck])
    again = materialize_sft(tmp_path, calls)
    assert len(calls) == 2 and again["reused"].value is False and db.has_training_examples(again["checkpoint_id"].value)


def test_a_killed_sfts_leftovers_are_removed_by_the_next_run_and_recorded_ones_kept(tmp_path):
    store_with_seeds(tmp_path / "fw.duckdb")
    calls: list[Path] = []
    kept = Path(materialize_sft(tmp_path, calls, max_train_steps=3)["path"].value)  # recorded: never removed
    folder = kept.parent
    foreign = folder / f"{BENCH}-k0-other-store"  # no marker of this store: not ours to remove
    foreign.mkdir()
    killed: list[Path] = []

    def killed_train(base, examples, out, cfg, progress=None):  # dies after publishing, before the record
        killed.append(Path(out))
        Path(str(out) + ".partial").mkdir()
        Path(out).mkdir()
        raise RuntimeError("killed")

    materialize_killed(tmp_path, killed_train)
    [left] = killed
    assert left.is_dir() and Path(str(left) + ".partial").is_dir()

    materialize_sft(tmp_path, calls)  # the next run cleans up what the killed one left
    assert not left.exists() and not Path(str(left) + ".partial").exists()
    assert (kept / "config.json").is_file() and foreign.is_dir() and calls[-1].is_dir()
    assert not list(folder.glob("*.started"))


def test_a_killed_sft_of_the_same_training_is_resumed_in_its_own_folder(tmp_path):
    """The next run trains into the killed attempt's folder (where the trainer saved its state, laid out as
    `train_sft` lays it out), not a new one; after a config change it starts anew and the leftovers go."""
    from flywheel.policy.sft import training_fingerprint, unpublished_dirs

    store_with_seeds(tmp_path / "fw.duckdb")
    killed: list[Path] = []

    def killed_train(base, examples, out, cfg, progress=None):  # killed after saving its state at step 1
        killed.append(Path(out))
        _, work = unpublished_dirs(out, resumable=training_fingerprint(base, examples, cfg))
        (work / "trainer" / "checkpoint-1").mkdir(parents=True)
        (work / "trainer" / "checkpoint-1" / "trainer_state.json").write_text("{}")
        raise RuntimeError("killed")

    materialize_killed(tmp_path, killed_train)
    calls: list[Path] = []
    resumed = materialize_sft(tmp_path, calls, save_minutes=10.0)  # the same training: save_minutes is not part of it
    assert calls == killed and resumed["checkpoint_id"].value == killed[0].name

    materialize_killed(tmp_path, killed_train, max_train_steps=5)
    left = Path(str(killed[-1]) + ".partial")
    assert left.is_dir()
    materialize_sft(tmp_path, calls, max_train_steps=7)  # another training: a new folder; the leftovers go
    assert calls[-1] != killed[-1] and not left.exists()
    assert not list(left.parent.glob("*.started"))


def test_one_run_never_mixes_packed_and_per_step_sft(tmp_path):
    """Checkpoint k trains the way checkpoint k-1 did: a lineage without the field was trained per step."""
    from flywheel.assets._checkpoints import packing_mismatch
    from flywheel.core.store import Store

    db = Store(tmp_path / "fw.duckdb")
    assert packing_mismatch(db, BENCH, 1, "tree") is None  # nothing before it
    db.record_checkpoint({"checkpoint_id": "old-k0", "benchmark": BENCH, "iteration": 0, "path": "p", "base_model": "b",
                          "n_examples": 1, "n_trajectories": 1, "train_loss": 1.0, "lineage": {"fingerprint": "f"}},
                         training_examples=[])
    refusal = packing_mismatch(db, BENCH, 1, "tree")
    assert "old-k0" in refusal and "set policy.packing: per_step" in refusal
    assert packing_mismatch(db, BENCH, 1, "per_step") is None
    db.record_checkpoint({"checkpoint_id": "new-k1", "benchmark": BENCH, "iteration": 1, "path": "p", "base_model": "b",
                          "n_examples": 1, "n_trajectories": 1, "train_loss": 1.0, "lineage": {"packing": "tree"}},
                         training_examples=[])
    assert packing_mismatch(db, BENCH, 2, "tree") is None and "per_step" in packing_mismatch(db, BENCH, 2, "per_step")
