"""The promotion gate's validation set (EnvResource.validation_set): training-split tasks that no seed,
rollout or curriculum task uses and no evaluation split holds, one test per benchmark on its real task lists
(the preset's settings), and the test benchmark's. Synthesized curriculum tasks hold the validation tasks out
(tests/assets/test_promotion_gate.py checks it on a run)."""

import pytest

from envs import get_benchmark
from flywheel.resources import EnvResource
from flywheel.resources.envs import TYPE_KEYS
from tests.tinybench import NAME as TINY

REFS = {TINY: "tests.tinybench:SPEC"}


def kind(task) -> str:
    return next(str(task.meta[k]) for k in TYPE_KEYS if k in task.meta)


def check_disjoint(benchmark: str, expected: int, **fields) -> list:
    envs = EnvResource(benchmark_refs=REFS, **fields)
    aside = envs.validation_set(benchmark)
    ids = {t.task_id for t in aside}
    assert len(aside) == len(ids) == expected
    assert all(t.split == "train" for t in aside)  # training-split tasks, played from the train split's data
    assert not ids & {t.task_id for t in envs.tasks(benchmark, "train")}  # rollouts (and the curriculum's seeds)
    assert not ids & {t.task_id for t in envs.seed_tasks(benchmark)}  # expert seeds
    spec = envs.spec(benchmark)
    for split in ("seen", "unseen"):  # no test split holds them: game, variation or goal ids differ
        assert not ids & {t.task_id for t in spec.load_tasks(split)}
    assert envs.validation_set(benchmark) == aside  # deterministic
    return aside


def test_the_alfworld_validation_set_is_disjoint_and_covers_every_type():
    pytest.importorskip("alfworld")
    preset = {"task_types": {"alfworld": ["pick", "look", "heat"]}, "seed_limit": 36, "train_limit": 54}
    aside = check_disjoint("alfworld", 50, **preset)
    assert {kind(t) for t in aside} == {"pick_and_place_simple", "look_at_obj_in_light", "pick_heat_then_place_in_recep"}
    # Set aside from the end: the preset's seeds and rollout games are the ones it played without the gate.
    before = EnvResource(validation_tasks=0, **preset)
    after = EnvResource(**preset)
    assert [t.task_id for t in after.tasks("alfworld", "train")] == [t.task_id for t in before.tasks("alfworld", "train")]
    every = check_disjoint("alfworld", 50, train_limit=None)  # all 3,553 training games: the 50 are taken out
    assert len(EnvResource().tasks("alfworld", "train")) == 3553 - len(every)


def test_the_scienceworld_validation_set_is_training_variations_disjoint_from_every_other_set():
    aside = check_disjoint("scienceworld", 50)
    assert len({kind(t) for t in aside}) > 10  # task types in turn, not the last type's variations
    check_disjoint("scienceworld", 20, validation_tasks=20, train_limit=1483 - 10)  # a limit that reaches the end
    # ETO's train index shares 54 [task, variation] pairs with its dev ("seen") index: training never plays them.
    seen = {t.task_id for t in EnvResource().spec("scienceworld").load_tasks("seen")}
    every = EnvResource(validation_tasks=0).tasks("scienceworld", "train")
    assert len(every) == 1483 - 54 and not seen & {t.task_id for t in every}
    five = ["find-animal", "find-living-thing", "find-non-living-thing", "find-plant", "lifespan-shortest-lived"]
    powered = check_disjoint("scienceworld", 50, task_types={"scienceworld": five}, seed_limit=21, train_limit=40)
    assert {kind(t) for t in powered} == set(five)  # experiments/cpu-powered-scienceworld.yaml's gate


def test_the_webshop_validation_set_is_training_goals_disjoint_from_every_other_set():
    aside = check_disjoint("webshop", 50)
    assert all(t.task_id.startswith("goal-") for t in aside)
    indices = {t.meta["goal_index"] for t in aside}
    test = {t.meta["goal_index"] for t in EnvResource().spec("webshop").load_tasks("unseen")}
    assert not indices & test


def test_the_test_benchmark_sets_aside_at_most_a_quarter_and_none_when_told():
    aside = check_disjoint(TINY, 1)  # 4 training tasks: 50 asked, a quarter kept
    assert [t.task_id for t in aside] == ["train-3"]
    assert EnvResource(benchmark_refs=REFS, validation_tasks=0).validation_set(TINY) == []
    assert len(EnvResource(benchmark_refs=REFS, validation_tasks=0).tasks(TINY, "train")) == 4
    assert len(get_benchmark(TINY, REFS).load_tasks("train")) == 4
