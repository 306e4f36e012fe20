"""Synthesized tasks round-trip through the real envs: proposed, instantiated, solved, annotated, stored.

Impossible or unparsable proposals are rejected with their reason, never an exception.
ALFWorld's full round trip (TextWorld compiles each new game, ~1 min) is marked slow.
"""

import pytest

from envs import configure_spec, get_benchmark
from flywheel.core.store import Store
from flywheel.curriculum.proposals import get_synthesizer
from flywheel.curriculum.solving import synthesize
from flywheel.curriculum.tables import write_proposals
from flywheel.rollout.seeds import collect_expert
from flywheel.teacher import ScriptedTeacher
from flywheel.teacher.base import apply_annotations


class ScriptedProposals(ScriptedTeacher):
    """The scripted teacher, proposing a fixed list (a test double for the *proposer* only)."""

    def __init__(self, describe, proposals):
        super().__init__(describe)
        self.proposals = proposals
        self.offered = []

    def propose_tasks(self, *, benchmark, instructions, schema, seeds, candidates, n):
        self.offered = candidates
        return [p(candidates) if callable(p) else p for p in self.proposals]


def seeds_of(benchmark, **load):
    spec = get_benchmark(benchmark)
    tasks = spec.load_tasks("train", **load)
    ok, failed = collect_expert(spec, tasks)
    assert not failed
    teacher = ScriptedTeacher(spec.describe_action)
    return spec, tasks, [apply_annotations(t, teacher.annotate(t, "")) for t in ok]


def run(benchmark, teacher, seed_tasks, seed_trajs, n, **options):
    spec = get_benchmark(benchmark)
    return synthesize(benchmark=benchmark, synthesizer=get_synthesizer(spec), teacher=teacher,
                      seed_tasks=seed_tasks, seed_trajs=seed_trajs,
                      holdout=spec.load_tasks("seen") + spec.load_tasks("unseen"),
                      instructions=spec.system_prompt(), n_proposals=n, **options)


def test_webshop_synthesized_goals_round_trip(tmp_path):
    spec, tasks, seeds = seeds_of("webshop", limit=3)
    result = run("webshop", ScriptedTeacher(spec.describe_action), tasks, seeds, n=4)
    assert result.counts() == {"proposals": 4, "valid": 4, "solved": 4, "kept": 4, "rejected": 0, "unsolved": 0,
                               "annotation_failed": 0}
    for traj, task in zip(result.trajectories, result.tasks, strict=True):
        assert traj.source == "synthetic" and traj.success and traj.reward == 1.0
        assert task.meta["synthetic_goal"]["instruction_text"] in traj.steps[0].observation  # the env shows the new goal
        assert traj.steps[-1].action == "click[Buy Now]" and all(s.thought and s.plan for s in traj.steps)
        seed_goals = {(t.meta["asin"], str(t.meta["goal_options"]), str(t.meta["attributes"])) for t in tasks}
        assert (task.meta["asin"], str(task.meta["goal_options"]), str(task.meta["attributes"])) not in seed_goals
    db = Store(tmp_path / "s.duckdb")
    db.write_trajectories(result.trajectories, replace_scope={"benchmark": "webshop", "source": "synthetic"})
    back = db.load_trajectories(benchmark="webshop", source="synthetic")
    assert sorted(t.traj_id for t in back) == sorted(t.traj_id for t in result.trajectories)
    assert {len(t.steps) for t in back} >= {5}


def test_webshop_impossible_proposals_are_rejected_with_reasons(tmp_path):
    spec, tasks, seeds = seeds_of("webshop", limit=2)
    good = lambda cands: {"kind": "k", "params": dict(cands[0]["params"])}  # noqa: E731
    change = lambda **kw: lambda cands: {"params": {**cands[0]["params"], **kw}}  # noqa: E731
    holdout_asin = spec.load_tasks("seen")[0].meta["asin"]
    teacher = ScriptedProposals(spec.describe_action, [
        "please make it harder",
        {"kind": "k"},
        change(asin="B000000000"),
        change(options={"color": "plaid tartan"}),
        change(attributes=["made of moon rock"]),
        change(price_upper=0.5),
        change(asin=holdout_asin),
        good,
        good,
    ])
    result = run("webshop", teacher, tasks, seeds, n=9)
    reasons = [(p.status, p.reason) for p in result.proposals]
    assert [s for s, _ in reasons] == ["rejected"] * 7 + ["solved", "rejected"]
    text = [r for _, r in reasons]
    assert "expected a JSON object" in text[0] and "no 'params'" in text[1]
    assert "unknown product asin" in text[2] and "offers no" in text[3] and "not a property" in text[4]
    assert "not above the product's price" in text[5] and "evaluation goal" in text[6]
    assert text[8].startswith("duplicate of proposal")
    db = Store(tmp_path / "s.duckdb")
    write_proposals(db, "webshop", [p.record() for p in result.proposals])
    rows = db.query("SELECT status, reason FROM curriculum_proposals ORDER BY proposal_id")
    assert rows.height == 9 and rows.filter(rows["status"] == "rejected")["reason"].str.len_chars().min() > 10


def test_scienceworld_synthesized_tasks_round_trip_and_rejections():
    spec, tasks, seeds = seeds_of("scienceworld", limit=2, task_types=("find-non-living-thing",))
    pick = lambda kind: lambda cands: next(c for c in cands if c["kind"] == kind)  # noqa: E731
    held = spec.load_tasks("unseen", task_types=("find-animal",))[0]
    teacher = ScriptedProposals(spec.describe_action, [
        pick("unused_variation"),
        pick("harder_task_type"),
        pick("harder_setting"),
        {"params": {"task_name": "find-animal", "variation": 99999}},
        {"params": {"task_name": "power-component", "variation": 1, "simplification": "noElectricalAction"}},
        {"params": {"task_name": "find-animal", "variation": held.meta["variation"]}},
        {"params": {"task_name": "bake-a-cake", "variation": 1}},
        {"params": {"task_name": tasks[0].meta["task_name"], "variation": tasks[0].meta["variation"]}},
    ])
    result = run("scienceworld", teacher, tasks, seeds, n=8)
    status = [p.status for p in result.proposals]
    assert status == ["solved"] * 3 + ["rejected"] * 5, [(p.status, p.reason) for p in result.proposals]
    reasons = [p.reason for p in result.proposals[3:]]
    assert "cannot instantiate" in reasons[0] and "exceeds the total number of variations" in reasons[0]
    assert "needs electrical actions" in reasons[1] and "evaluation task" in reasons[2]
    assert "Unknown ScienceWorld task" in reasons[3] and "already a seed" in reasons[4]
    by_kind = {p.kind: t for p, t in zip(result.proposals[:3], result.trajectories, strict=True)}
    assert all(t.success and t.source == "synthetic" for t in result.trajectories)
    seed_max = max(len(s.steps) for s in seeds)
    assert len(by_kind["harder_task_type"].steps) > seed_max  # a harder type: a longer gold path
    assert result.tasks[2].meta["simplification"] == "" and result.tasks[2].task_id.endswith("@none")
    assert "harder" in result.proposals[1].rationale or "steps" in result.proposals[1].rationale


def test_a_synthesized_task_takes_the_episode_cap_and_a_longer_expert_path_is_rejected():
    """Rollouts play every task under the envs resource's `max_steps`: a synthesized task longer than that
    would teach a path no episode can finish (cpu-comparison-scienceworld's first curricula held a 14-step
    synthetic path under an 8-step cap)."""
    spec, tasks, seeds = seeds_of("scienceworld", limit=2, task_types=("find-non-living-thing",))
    pick = lambda kind: lambda cands: next(c for c in cands if c["kind"] == kind)  # noqa: E731
    cap = max(len(s.steps) for s in seeds)
    teacher = ScriptedProposals(spec.describe_action, [pick("unused_variation"), pick("harder_task_type")])
    result = run("scienceworld", teacher, tasks, seeds, n=2, max_steps=cap)
    (fits, harder) = result.proposals
    assert fits.status == "solved" and harder.status == "unsolved", [(p.status, p.reason) for p in result.proposals]
    assert f"over the task's limit of {cap}" in harder.reason and harder.length > cap
    [task] = result.tasks
    assert task.max_steps == cap and len(result.trajectories[0].steps) <= cap
    uncapped = run("scienceworld", ScriptedProposals(spec.describe_action, [pick("harder_task_type")]), tasks, seeds, n=1)
    assert uncapped.proposals[0].status == "solved" and uncapped.tasks[0].max_steps > cap  # only the cap rejected it


def test_synthesized_tasks_get_their_spec_s_step_limit_and_catalog():
    alfworld = configure_spec(get_benchmark("alfworld"), {"max_steps": 12})
    seeds = alfworld.load_tasks("train", limit=2, task_types=("pick_and_place_simple",))
    holdout = alfworld.load_tasks("seen") + alfworld.load_tasks("unseen")
    synth = get_synthesizer(alfworld)
    cand = synth.candidates(seeds, holdout=holdout, limit=1)[0]
    assert seeds[0].max_steps == 12 and synth.instantiate(cand["params"], seeds=seeds, holdout=holdout,
                                                            write=False).max_steps == 12
    webshop = configure_spec(get_benchmark("webshop"), {"max_steps": 8})
    seeds = webshop.load_tasks("train", limit=2)
    holdout = webshop.load_tasks("seen")
    synth = get_synthesizer(webshop)
    elsewhere = configure_spec(get_benchmark("webshop"), {"data_path": "/data/webshop-full"})
    assert get_synthesizer(elsewhere).data_path == "/data/webshop-full"  # the spec's catalog, not the default one
    cand = synth.candidates(seeds, holdout=holdout, limit=1)[0]
    assert seeds[0].max_steps == 8 and synth.instantiate(cand["params"], seeds=seeds, holdout=holdout).max_steps == 8


def test_alfworld_synthetic_paths_drop_the_expert_s_looks_before_the_limit_is_checked(tmp_path):
    """As the seeds' paths (`expert.choose`): `look` changes nothing, and kept it taught the policy to spend
    steps on it. The limit applies to the path that is trained."""
    from dataclasses import replace

    from envs.base import Task

    actions = ["look", "go to desk 1", "look", "take book 1 from desk 1", "go to shelf 1", "move book 1 to shelf 1"]

    class Worker:
        def begin_episode(self):
            pass

        def call(self, name, **kwargs):
            return {"handcoded": {"won": True, "actions": list(actions), "stopped": "won"}}

    game = tmp_path / "game.tw-pddl"
    game.write_text('{"walkthrough": ["look"]}')
    synth = get_synthesizer(configure_spec(get_benchmark("alfworld"), {"max_steps": 4}))
    env = synth.make_env()
    env.worker = Worker()
    task = Task("alfworld", "synthetic", "synth/t", "put a book in shelf.", max_steps=synth.max_steps,
                meta={"game_file": str(game), "traj_data": {}})
    path = synth.solve(task, env)
    assert path == [a for a in actions if a != "look"] and len(path) == 4
    assert __import__("json").loads(game.read_text())["walkthrough"] == path  # the game carries its solution
    with pytest.raises(ValueError, match="needed 4 actions, over the limit of 3"):
        synth.solve(replace(task, max_steps=3), env)


def test_alfworld_proposals_are_checked_against_the_scene():
    spec = get_benchmark("alfworld")
    synth = get_synthesizer(spec)
    seeds = spec.load_tasks("train", limit=2, task_types=("pick_and_place_simple",))
    holdout = spec.load_tasks("seen") + spec.load_tasks("unseen")
    cands = synth.candidates(seeds, holdout=holdout, limit=6)
    assert cands and {c["params"]["base_game"] for c in cands} <= {t.task_id for t in seeds}
    task = synth.instantiate(cands[0]["params"], seeds=seeds, holdout=holdout)
    assert task.meta["game_file"].endswith("game.tw-pddl") and task.goal.endswith(".")
    game = __import__("json").loads(open(task.meta["game_file"]).read())
    assert task.goal in game["grammar"] and cands[0]["params"]["object"] in game["pddl_problem"].split("(:goal")[1]
    base = seeds[0].task_id  # a bedroom: an alarm clock on a desk
    bad = {
        "needs a Microwave": dict(task_type="pick_heat_then_place_in_recep", object="Book", receptacle="Desk"),
        "no object of type 'Giraffe'": dict(task_type="pick_and_place_simple", object="Giraffe", receptacle="Desk"),
        "same goal as its base game": dict(task_type="pick_and_place_simple", object="AlarmClock", receptacle="Desk"),
        "unknown task type": dict(task_type="juggle", object="AlarmClock"),
        "cannot hold": dict(task_type="pick_and_place_simple", object="Laptop", receptacle="GarbageCan"),
    }
    for reason, params in bad.items():
        with pytest.raises(ValueError, match=reason):
            synth.instantiate({"base_game": base, **params}, seeds=seeds, holdout=holdout)
    with pytest.raises(ValueError, match="not a training game"):
        synth.instantiate({"base_game": holdout[0].task_id, "task_type": "pick_and_place_simple", "object": "Apple",
                           "receptacle": "Fridge"}, seeds=seeds, holdout=holdout)


@pytest.mark.slow
def test_alfworld_synthesized_goal_round_trips_through_textworld():
    spec = get_benchmark("alfworld")
    tasks = spec.load_tasks("train", limit=1, task_types=("pick_and_place_simple",))
    seed = [apply_annotations(t, ScriptedTeacher(spec.describe_action).annotate(t, ""))
            for t in collect_expert(spec, tasks)[0]]
    teacher = ScriptedProposals(spec.describe_action, [
        lambda cands: next(c for c in cands if c["params"]["task_type"] == "look_at_obj_in_light"),
    ])
    result = run("alfworld", teacher, tasks, seed, n=1)
    assert result.counts()["kept"] == 1, [(p.status, p.reason) for p in result.proposals]
    [traj] = result.trajectories
    assert traj.success and traj.source == "synthetic" and traj.steps[-1].action.startswith("use ")
    assert "look" not in [s.action for s in traj.steps]  # the expert's no-op looks dropped, as in the seeds
    assert result.tasks[0].goal.rstrip(".") in traj.steps[0].observation
