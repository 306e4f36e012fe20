"""The gate's cleaning rows in the store, and what SFT reads through them (flywheel.assets.training.gated_trajectories)."""

import pytest

from flywheel.assets.training import gated_trajectories
from flywheel.core.store import Store
from flywheel.core.trajectory import Step, Trajectory


def success(actions: list[str], *, invalid_at: int | None = None) -> Trajectory:
    steps = [Step(observation=f"o{i}", thought="t", plan="p", action=a, next_observation=f"o{i + 1}",
                  invalid=i == invalid_at) for i, a in enumerate(actions)]
    return Trajectory(benchmark="b", split="train", task_id="t", source="policy", steps=steps, success=True, reward=1.0)


def test_sft_reads_the_cut_and_a_changed_drop_setting_is_refused(tmp_path):
    db = Store(tmp_path / "fw.duckdb")
    tr = success(["a", "bad", "b", "c", "d"], invalid_at=1)
    db.write_trajectories([tr])
    # The gate compared the trajectory without its invalid step (4 steps) and cut its second step.
    db.write_gate_cleaning("b", 0, [{"traj_id": tr.traj_id, "task_id": "t", "steps_before": 4, "steps_after": 3,
                                     "kept": (0, 2, 3), "outcome": "cut", "admitted": True}])
    assert db.gate_cleaning("b", 0)[0]["kept"] == [0, 2, 3]
    [cut] = gated_trajectories(db, [tr.traj_id], drop_invalid_steps=True)
    assert cut.actions == ("a", "c", "d")
    with pytest.raises(ValueError, match="gate_drops_invalid_steps changed"):
        gated_trajectories(db, [tr.traj_id], drop_invalid_steps=False)


def test_a_rejected_cut_leaves_the_success_as_played(tmp_path):
    db = Store(tmp_path / "fw.duckdb")
    tr = success(["a", "b", "c"])
    db.write_trajectories([tr])
    db.write_gate_cleaning("b", 0, [{"traj_id": tr.traj_id, "task_id": "t", "steps_before": 3, "steps_after": 3,
                                     "kept": (0, 1, 2), "outcome": "rejected", "admitted": True}])
    [same] = gated_trajectories(db, [tr.traj_id], drop_invalid_steps=True)
    assert same.actions == ("a", "b", "c")
