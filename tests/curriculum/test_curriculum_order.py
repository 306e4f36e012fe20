"""Complexity signals, buckets, the easy-to-hard sampler, and proposal parsing (no envs, fast)."""

import itertools

import pytest

from envs import get_benchmark
from flywheel.core.trajectory import Step, Trajectory
from flywheel.curriculum.buckets import Buckets, eval_buckets, quantile_buckets, success_by_bucket
from flywheel.curriculum.complexity import ComplexityScorer, register_signal
from flywheel.curriculum.order import CurriculumSampler, grade
from flywheel.curriculum.proposals import read_proposal
from flywheel.teacher.openai_teacher import OpenAITeacher, parse_proposals
from tests.openai_stub import StubServer


def traj(benchmark, actions, *, task="t", rewards=None, first_obs="", source="teacher"):
    steps = []
    for i, a in enumerate(actions):
        steps.append(Step(observation=first_obs if i == 0 else f"o{i}", thought="e", plan="p", action=a,
                          next_observation=f"o{i + 1}", reward=(rewards or [0.0] * len(actions))[i]))
    return Trajectory(benchmark=benchmark, split="train", task_id=task, source=source, steps=steps, success=True)


def test_signals_length_locations_subgoals():
    sw = traj("scienceworld", ["open door to kitchen", "go to kitchen", "look around", "go to hallway", "go to kitchen",
                               "focus on cup"], rewards=[0.0, 0.08, 0.08, 0.08, 0.08, 1.0],
              first_obs="Your task is...\n\nThis room is called the hallway. In it, you see:")
    SW, ALF, WS = (get_benchmark(b) for b in ("scienceworld", "alfworld", "webshop"))
    c = ComplexityScorer(other="locations").score(sw, SW)
    assert (c.length, c.other_signal, c.score) == (6, 2.0, 6.0)  # hallway (start) + kitchen
    assert ComplexityScorer(other="subgoals").score(sw, SW).other_signal == 2.0  # two score increases
    alf = traj("alfworld", ["look", "go to cabinet 1", "open cabinet 1", "go to countertop 1",
                            "take apple 1 from countertop 1", "go to fridge 1", "move apple 1 to fridge 1"])
    assert ComplexityScorer(other="locations").score(alf, ALF).other_signal == 4.0  # start + 3 receptacles
    assert ComplexityScorer(other="subgoals").score(alf, ALF).other_signal == 3.0  # open, take, move
    ws = traj("webshop", ["search[red shirt]", "click[B0ABCDEFGH]", "click[< Prev]", "click[B0ZZZZZZZZ]",
                          "click[red]", "click[large]", "click[Buy Now]"])
    assert ComplexityScorer(other="locations").score(ws, WS).other_signal == 3.0  # one search, two products
    assert ComplexityScorer(other="subgoals").score(ws, WS).other_signal == 3.0  # two options, buy


def test_scorer_is_pluggable_and_checks_names():
    register_signal("constant_two", lambda t: 2.0)
    t = traj("alfworld", ["look", "go to desk 1"])
    assert ComplexityScorer({"length": 1.0, "constant_two": 3.0}).score(t, get_benchmark("alfworld")).score == 8.0
    with pytest.raises(ValueError, match="Unknown complexity signal"):
        ComplexityScorer({"nope": 1.0})


def test_buckets_edges_and_quantiles():
    b = Buckets((10, 17))
    assert [b.of(x) for x in (3, 10, 11, 17, 18, None)] == ["easy", "easy", "medium", "medium", "hard", "unknown"]
    assert b.describe() == "easy <= 10, 10 < medium <= 17, hard > 17"
    assert eval_buckets(get_benchmark("scienceworld")).edges == (10.0, 17.0)  # paper Fig. 2: hard > 17
    assert eval_buckets(get_benchmark("scienceworld"), [5, 6]).edges == (5.0, 6.0)
    q = quantile_buckets([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert q.edges == (3.0, 6.0)
    with pytest.raises(ValueError):
        Buckets((5, 3))
    rows = success_by_bucket([(3, True), (4, False), (12, True), (30, False), (None, True)], b)
    assert [(r["bucket"], r["episodes"], r["successes"]) for r in rows] == [
        ("easy", 2, 1), ("medium", 1, 1), ("hard", 1, 0), ("unknown", 1, 1)]


def _scored(lengths):
    trajs = [traj("alfworld", ["look"] * n, task=f"t{i}") for i, n in enumerate(lengths)]
    return trajs, ComplexityScorer().score_all(trajs, get_benchmark("alfworld"))


def test_curriculum_sampler_yields_non_decreasing_complexity():
    trajs, scored = _scored([9, 2, 5, 2, 14, 7, 3, 11, 5, 1])
    ordered_trajs, ordered, buckets = grade(trajs, scored, mode="curriculum", seed=3)
    scores = [c.score for c in ordered]
    assert scores == sorted(scores) and len(ordered) == len(trajs)
    assert [t.traj_id for t in ordered_trajs] == [c.traj_id for c in ordered]
    ranks = [buckets.rank(c.bucket) for c in ordered]
    assert ranks == sorted(ranks)


def test_staged_sampler_is_non_decreasing_stage_by_stage():
    trajs, scored = _scored([9, 2, 5, 2, 14, 7, 3, 11, 5, 1, 6, 8])
    _, bucketed, buckets = grade(trajs, scored, edges=[4, 8], mode="curriculum")
    by_id = {c.traj_id: c for c in bucketed}
    bucketed = [by_id[c.traj_id] for c in scored]
    sampler = CurriculumSampler([c.score for c in bucketed], [c.bucket for c in bucketed], buckets.names, "staged", seed=1)
    stages = sampler.stages()
    assert [{bucketed[i].bucket for i in s} for s in stages] == [{"easy"}, {"medium"}, {"hard"}]
    for earlier, later in itertools.pairwise(stages):  # every item of a stage is at most as hard as the next stage's
        assert max(bucketed[i].score for i in earlier) <= min(bucketed[i].score for i in later)
    assert sorted(sampler) == list(range(len(bucketed)))
    assert list(sampler) == list(CurriculumSampler([c.score for c in bucketed], [c.bucket for c in bucketed],
                                                   buckets.names, "staged", seed=1))  # seeded
    shuffled = list(CurriculumSampler([c.score for c in bucketed], [c.bucket for c in bucketed], buckets.names, "shuffle"))
    assert sorted(shuffled) == list(range(len(bucketed)))
    with pytest.raises(ValueError, match="Unknown curriculum order"):
        CurriculumSampler([1.0], ["easy"], buckets.names, "backwards")


def test_unparsable_proposals_are_rejected_with_reasons():
    assert read_proposal("make it harder", 0, "t").reason.startswith("unparsable proposal: expected a JSON object")
    assert read_proposal({"kind": "x"}, 1, "t").status == "rejected"
    bad = read_proposal({"_unparsable": "lol", "_error": "not JSON"}, 2, "t")
    assert (bad.status, bad.reason) == ("rejected", "unparsable teacher answer: not JSON")
    ok = read_proposal({"kind": "k", "params": {"a": 1}, "rationale": "r"}, 3, "t")
    assert (ok.status, ok.params, ok.kind) == ("proposed", {"a": 1}, "k")
    flat = read_proposal({"asin": "B0", "options": {}}, 4, "t")
    assert flat.params == {"asin": "B0", "options": {}}


def test_openai_teacher_proposals_and_garbage(tmp_path):
    assert parse_proposals("no json here")[0]["_unparsable"] == "no json here"
    assert parse_proposals('{"tasks": [{"params": {"a": 1}}, "junk"]}') == [{"params": {"a": 1}}, "junk"]
    answer = '```json\n{"tasks": [{"kind": "k", "params": {"task_name": "boil", "variation": 3}}]}\n```'
    with StubServer([(200, answer)]) as srv:
        teacher = OpenAITeacher(base_url=srv.base_url, model="m", api_key="sk-test")
        out = teacher.propose_tasks(benchmark="scienceworld", instructions="instr", schema="schema",
                                    seeds=[{"goal": "g", "length": 5}], candidates=[{"kind": "k", "params": {}}], n=2)
        assert out == [{"kind": "k", "params": {"task_name": "boil", "variation": 3}}]
        prompt = srv.requests[0]["messages"][1]["content"]
        assert "schema" in prompt and "N = 2" in prompt and "(5 expert steps)" in prompt
