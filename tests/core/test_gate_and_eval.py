from dataclasses import replace

from flywheel.core.gate import dataset_problems, reward_gate
from flywheel.core.metrics import markdown_table, md_table, success_cell, summarize
from flywheel.core.quality import rate
from tests.fakes import make_traj


def test_gate_keeps_only_new_successes():
    ok = make_traj(task="a")
    fail = make_traj(task="b", success=False)
    err = replace(make_traj(task="c"), status="errored")
    dup = make_traj(task="a", sample=1)  # same actions as `ok`
    seeded = make_traj(task="d")
    passed, stats = reward_gate([ok, fail, err, dup, seeded], already=[("d", seeded.actions)])
    assert [t.task_id for t in passed] == ["a"]
    assert (stats.candidates, stats.passed, stats.failed, stats.errored, stats.duplicates) == (5, 1, 1, 1, 2)


def test_dataset_problems():
    assert dataset_problems([]) == ["dataset is empty"]
    good = make_traj()
    assert dataset_problems([good]) == []
    bad = replace(good, steps=[replace(good.steps[0], plan=" ")])
    assert any("empty plan" in p for p in dataset_problems([bad]))
    assert dataset_problems([bad], needs_plans=False) == []  # a ReAct policy's successes carry no plan
    assert any("not a successful" in p for p in dataset_problems([make_traj(success=False)]))


def test_summarize_excludes_errored_from_rates():
    trajs = [make_traj(task="a"), make_traj(task="b", success=False), replace(make_traj(task="c"), status="errored")]
    s = summarize(trajs)
    assert s["episodes"] == 2 and s["errored"] == 1
    assert s["success_rate"] == 0.5
    assert s["mean_steps"] == 3
    assert s["prompt_tokens_per_step"] == 11.0
    assert "| 0.500 |" in markdown_table([s], ["success_rate"])


def test_one_success_cell_and_one_table_writer():
    """Every report, the paper's tables and the demo write a success rate and a table through these two."""
    r = rate(57, 105)
    assert success_cell(r) == "54.3 [44.8, 63.5] (57/105)"
    assert success_cell(r, counts=False) == "54.3 [44.8, 63.5] (n=105)"
    assert success_cell(rate(0, 0), counts=False) == success_cell(None, counts=False) == "-"
    assert md_table(["k", "x"], [[0, "a"], [1, None]]) == "| k | x |\n|---|---|\n| 0 | a |\n| 1 | None |"


def _with_invalid(tr, at: int, action: str):
    """`tr` with a rejected action inserted before step `at` (the page stays as it was)."""
    s = tr.steps[at]
    bad = replace(s, action=action, plan="p?", invalid=True, next_observation=s.observation)
    return replace(tr, steps=[*tr.steps[:at], bad, *tr.steps[at:]])


def test_without_invalid_steps_keeps_what_the_agent_saw():
    from flywheel.core.gate import without_invalid_steps

    clean = make_traj(n=3)
    assert without_invalid_steps(clean) is clean
    # Two rejected actions in a row before step 1, the second one seeing an error message.
    tr = _with_invalid(_with_invalid(clean, 1, "click[B0"), 2, "")
    tr.steps[2] = replace(tr.steps[2], observation="Invalid action!")
    tr.steps[3] = replace(tr.steps[3], observation="Invalid action!")
    out = without_invalid_steps(tr)
    assert out.actions == clean.actions and out.steps[1].observation == clean.steps[1].observation
    assert len(tr.steps) == 5  # the input is not modified


def materialize_gate_and_check(db, loop, policy):
    """gated_dataset(scienceworld, 0) and its blocking check on `db`, with these loop and policy resources."""
    import dagster as dg

    from flywheel.assets import refinement
    from flywheel.orchestration.partitions import flywheel_partitions, partition_key
    from flywheel.resources import EnvResource, StoreResource

    return dg.materialize(
        [refinement.gated_dataset, refinement.gated_dataset_check(flywheel_partitions)],
        partition_key=str(partition_key("scienceworld", 0)), instance=dg.DagsterInstance.ephemeral(),
        resources={"store": StoreResource(path=str(db.path)), "loop": loop, "policy": policy, "envs": EnvResource()},
        raise_on_error=False)


def test_gate_drops_invalid_steps_before_it_compares_and_before_sft(tmp_path):
    """A success that is a seed's path plus a rejected detour adds nothing once the detour is gone; a new path
    keeps its valid steps only, in the gate's check and in the SFT set. Off (the default): both pass as played,
    and the check fails on the empty action."""
    from flywheel.assets.training import training_set
    from flywheel.core.store import Store
    from flywheel.resources import LoopResource, PolicyResource

    def bench(tr):
        return replace(tr, benchmark="scienceworld")

    seed = bench(make_traj(task="a", source="teacher"))
    detour = bench(_with_invalid(make_traj(task="a"), 1, "click[B0"))
    new = bench(_with_invalid(replace(make_traj(task="b"), steps=[replace(s, action=f"b{i}") for i, s in
                                                                   enumerate(make_traj().steps)]), 2, ""))
    for drop, gated_tasks, check_passed in ((False, ["a", "b"], False), (True, ["b"], True)):
        db = Store(tmp_path / f"fw-{drop}.duckdb")
        db.write_trajectories([seed, detour, new])
        result = materialize_gate_and_check(db, LoopResource(gate_drops_invalid_steps=drop), PolicyResource())
        assert sorted(t for _, t in db.query("SELECT traj_id, task_id FROM gated").iter_rows()) == gated_tasks
        assert db.gate_check_passed("scienceworld", 0) is check_passed
        assert result.success is check_passed  # the blocking check fails the run on the empty action
        trajs, _ = training_set(db, "scienceworld", 1, include_synthetic=False, drop_invalid_steps=drop)
        b = next(t for t in trajs if t.task_id == "b")
        assert b.actions == (("b0", "b1", "b2") if drop else ("b0", "b1", "", "b2"))


def test_gate_check_asks_for_plans_only_from_a_policy_that_writes_them(tmp_path):
    """RFT from a ReAct policy gates successes with no plan: the check passes them for `history_mode: react`
    and fails them for the default (fused) policy, whose SFT set would be malformed."""
    from flywheel.core.store import Store
    from flywheel.resources import LoopResource, PolicyResource

    planless = replace(make_traj(task="a"), benchmark="scienceworld")
    planless = replace(planless, steps=[replace(s, plan="") for s in planless.steps])
    for mode, passed in (("react", True), ("fused", False)):
        db = Store(tmp_path / f"fw-{mode}.duckdb")
        db.write_trajectories([planless])
        result = materialize_gate_and_check(db, LoopResource(), PolicyResource(history_mode=mode))
        assert db.gate_check_passed("scienceworld", 0) is passed and result.success is passed
        problems = db.query("SELECT first_problem FROM gate_checks")["first_problem"][0]
        assert ("empty plan" in (problems or "")) is not passed
