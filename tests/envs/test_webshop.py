"""WebShop text env: reward arithmetic, search, pages, invalid input, splits, data loading, oracle."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from envs.base import BenchmarkSpec, Env, EnvError, StepResult, Task
from envs.data import MissingDataError, data_dir
from envs.webshop import CATALOG_ORIGINAL, CATALOG_STANDIN, SPEC, WebShopEnv, WebShopSpec
from envs.webshop.catalog import load_catalog
from envs.webshop.reward import (
    get_option_reward,
    get_reward,
    get_type_reward,
    normalize_color,
    token_set_ratio,
)
from envs.webshop.search import K1, B, SearchEngine, analyze, porter_stem
from envs.webshop.standin import build_standin, parse_instruction_category

STANDIN_FILE = data_dir() / "webshop" / "items_ins_v2_1000.json"
needs_standin = pytest.mark.skipif(not STANDIN_FILE.exists(), reason=f"shared data missing: {STANDIN_FILE}")


# ---------------------------------------------------------------- reward (hand-computed)

GOAL = {
    "query": "baker's racks",
    "product_category": "Home & Kitchen › Furniture › Baker's Racks",
    "name": "Stainless Steel Baker Rack Heavy Duty",
    "attributes": ["tea tree", "essential oils", "natural ingredients"],
    "goal_options": {"color": "grey", "size": "xl"},
    "price_upper": 40.0,
}


def product(**overrides):
    base = {
        "query": GOAL["query"],
        "product_category": GOAL["product_category"],
        "name": GOAL["name"],
        "Title": "",
        "BulletPoints": [],
        "Description": "",
        "Attributes": ["tea tree", "essential oil", "natural ingredients"],
    }
    return {**base, **overrides}


def test_token_set_ratio_matches_thefuzz_values():
    # sect "essential", comb "essential oils"/"essential oil": 2*13/27 -> 96
    assert token_set_ratio("essential oils", "essential oil") == 96
    assert token_set_ratio("Cool Powder-Snow!", "powder snow") == 100  # processed, subset -> 100
    # "pack of 2" vs "pack of 12": sorted "of pack 2"/"of pack 12", LCS 9 -> 2*9/19 = 94.7 -> 95
    assert token_set_ratio("pack of 2", "pack of 12") == 95
    assert token_set_ratio("grey", "blue") < 50
    assert token_set_ratio("", "blue") == 0


def test_normalize_color_keeps_original_quirks():
    assert normalize_color("navy blue") == "blue"  # "blue" precedes "navy" in COLOR_SET
    assert normalize_color("standard") == "tan"
    assert normalize_color("black forest") == "black"
    assert normalize_color("webshop") == "webshop"


def test_reward_full_match_is_one():
    r, info = get_reward(product(), GOAL, price=35.0, options={"color": "grey", "size": "xl"})
    assert r == 1.0
    assert info["r_att"] == 1.0 and info["r_option"] == 1.0 and info["r_price"] is True


@pytest.mark.parametrize(
    ("overrides", "options", "price", "expected"),
    [
        # 2 of 3 attributes: "essential oil" fuzzy-matches, "natural ingredients" found in the description.
        (
            {"Attributes": ["essential oil"], "Description": "made with natural ingredients"},
            {"color": "grey", "size": "xl"},
            35.0,
            5 / 6,
        ),
        # wrong color: 3 attrs + size + price = 5 of 6
        ({}, {"color": "blue", "size": "xl"}, 35.0, 5 / 6),
        # color never selected: same 5 of 6
        ({}, {"size": "xl"}, 35.0, 5 / 6),
        # over the price bound: 3 + 2 + 0
        ({}, {"color": "grey", "size": "xl"}, 45.0, 5 / 6),
        # wrong color and wrong size and no attributes anywhere: only the price
        ({"Attributes": []}, {"color": "blue", "size": "l"}, 35.0, 1 / 6),
        # wrong color although "blue" is written in the description: still 5 of 6 (issue 17; was 1.0)
        ({"Description": "a blue rack"}, {"color": "blue", "size": "xl"}, 35.0, 5 / 6),
    ],
)
def test_reward_partial_fractions(overrides, options, price, expected):
    r, _ = get_reward(product(**overrides), GOAL, price=price, options=options)
    assert math.isclose(r, expected, rel_tol=1e-9)


def test_options_are_fuzzy_including_sizes():
    # the original's signature: chosen values, goal options (a dict goal gives (name, value) pairs)
    _, n = get_option_reward(["pack of 2"], [("size", "pack of 12")])
    assert n == 1  # near numbers pass the > 85 threshold (issue 17: sizes were matched exactly)
    _, n = get_option_reward(["XL"], [("size", "xl")])
    assert n == 1
    # "dark blue" and "light blue" both normalize to "blue"
    r, n = get_option_reward(["light blue"], ["dark blue"])
    assert (r, n) == (1.0, 1)
    r, n = get_option_reward(["grey"], [])
    assert r is None
    r, n = get_option_reward(["grey", "grey"], ["grey", "xl"])  # each goal option counts once
    assert (r, n) == (0.5, 1)


def test_type_reward_levels():
    other_cat = "Electronics › Accessories & Supplies › Mounts"
    base = product(query="mounts", product_category=other_cat)
    # shares "baker", "rack" of 6 goal nouns: 2/6 > 0.2 -> full type reward
    assert get_type_reward({**base, "name": "Walnut Baker Rack"}, GOAL)["r_type"] == 1.0
    # 1/6: no query/category match, title_score <= 0.2 -> 0.5
    assert get_type_reward({**base, "name": "Rack Shelf"}, GOAL)["r_type"] == 0.5
    # nothing in common -> 0, so the whole reward is 0
    assert get_type_reward({**base, "name": "Wireless Earbuds"}, GOAL)["r_type"] == 0.0
    r, _ = get_reward(
        {**base, "name": "Wireless Earbuds"}, GOAL, price=35.0, options={"color": "grey", "size": "xl"}
    )
    assert r == 0.0
    # category paths sharing two levels count as a category match
    shared = product(query="x", product_category="Home & Kitchen › Furniture › Desks", name="Rack Shelf")
    assert get_type_reward(shared, GOAL)["category_match"] is True


# ---------------------------------------------------------------- search


def test_analyzer_and_porter_stemmer():
    assert [porter_stem(w) for w in ("ponies", "relational", "hopping", "generalizations", "sky")] == [
        "poni", "relat", "hop", "gener", "sky",
    ]  # fmt: skip
    assert analyze("Women's T-Shirts, 3.5 oz, and the D.O.N. Issue") == [
        "women",
        "t",
        "shirt",
        "3.5",
        "oz",
        "d.o.n",
        "issu",
    ]


def test_bm25_scores_follow_lucene_formula(tmp_path):
    from envs.webshop.products import Product

    def p(asin, title):
        return Product(asin, title, "q", "c", "a › b", "", [], [], {}, [1.0], "$1.0")

    docs = [
        p("A1", "red shoes"),
        p("A2", "red red hat"),
        p("A3", "blue shoes for running"),
        p("A4", "green lamp"),
    ]
    engine = SearchEngine(docs)
    lens = [2, 3, 3, 2]  # analyzed lengths ("for" is a stopword)
    avg = sum(lens) / 4
    idf = math.log(1 + (4 - 2 + 0.5) / (2 + 0.5))  # "red" in 2 of 4 docs
    expected_a1 = idf * 1 / (1 + K1 * (1 - B + B * lens[0] / avg))
    expected_a2 = idf * 2 / (2 + K1 * (1 - B + B * lens[1] / avg))
    scores = engine.scores("Red")
    assert scores[0] == pytest.approx(expected_a1, rel=1e-5)
    assert scores[1] == pytest.approx(expected_a2, rel=1e-5)
    assert engine.search("red") == ["A2", "A1"]
    assert engine.search("shoes") == ["A1", "A3"]  # equal tf, shorter doc first
    assert engine.search("purple") == []


# ---------------------------------------------------------------- stand-in catalog, splits, oracle


@needs_standin
def test_standin_is_deterministic_and_labelled():
    a, b = build_standin(STANDIN_FILE), build_standin(STANDIN_FILE)
    assert a is not b and a.to_json() == b.to_json()
    assert a.name == CATALOG_STANDIN == "stand-in catalog (built from items_ins_v2_1000.json)"
    assert len(a.products) == 1000 + 2 * 415 and len({p.asin for p in a.products}) == len(a.products)
    assert len(a.goals) == 415
    for g in a.goals:
        target = a.by_asin[g.asin]
        assert a.prices[g.asin] <= g.price_upper
        for name, value in g.goal_options.items():
            assert value in target.options[name]


@needs_standin
def test_standin_bytes_do_not_depend_on_the_process():
    code = "from envs.webshop.catalog import load_catalog; print(load_catalog().fingerprint)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == load_catalog().fingerprint


def test_instruction_category_parser():
    ins = "Find me knee high, open toe women's loafers & slip-ons with steel toe, high heel"
    assert (
        parse_instruction_category(ins, ["knee high", "open toe", "steel toe", "high heel"])
        == "women's loafers & slip-ons"
    )
    assert parse_instruction_category(
        "Find me home office furniture sets for dining room, living room", ["dining room", "living room"]
    ) == ("home office furniture sets")


@needs_standin
def test_splits_have_200_test_goals_disjoint_from_train():
    assert isinstance(SPEC, BenchmarkSpec) and SPEC.name == "webshop"
    unseen, seen, train = SPEC.load_tasks("unseen"), SPEC.load_tasks("seen"), SPEC.load_tasks("train")
    assert len(unseen) == 200 and len(train) == 415 - 200
    assert [t.task_id for t in seen] == [t.task_id for t in unseen]
    assert not {t.task_id for t in unseen} & {t.task_id for t in train}
    assert all(t.max_steps == 10 and t.benchmark == "webshop" for t in unseen + train)
    assert unseen[0].meta["catalog"] == CATALOG_STANDIN and unseen[0].task_id.startswith("goal-")
    assert len(SPEC.load_tasks("train", limit=7)) == 7
    fashion = SPEC.load_tasks("unseen", task_types=("fashion",))
    assert fashion and all(t.meta["category"] == "fashion" for t in fashion)
    with pytest.raises(ValueError):
        SPEC.load_tasks("valid")


def run_episode(env: Env, task: Task, actions: list[str]) -> StepResult:
    env.reset(task)
    result = None
    for action in actions:
        result = env.step(action)
        assert not result.info["invalid"], (task.task_id, action, result.info["invalid_reason"])
    assert result is not None
    return result


@needs_standin
def test_oracle_buys_the_target_on_every_goal():
    """Success wherever the published reward allows it (see the comment below)."""
    spec = WebShopSpec()
    env = spec.make_env()
    assert isinstance(env, Env)
    tasks = spec.load_tasks("unseen") + spec.load_tasks("train")
    for task in tasks:
        actions = spec.expert_actions(task)
        assert len(actions) <= task.max_steps
        result = run_episode(env, task, actions)
        assert result.info["catalog"] == CATALOG_STANDIN
        if result.success:
            assert result.done and result.reward == 1.0
            continue
        # The published reward cannot reach 1.0 when a correct option value is rewritten by
        # normalize_color while the goal's (name, value) pair is not (sandalwood -> sand):
        # issue 17. The oracle then loses exactly that option's share (best achievable:
        # test_webshop_reward_faithful.py).
        goal = task.meta["goal_options"]
        rewritten = [v for v in goal.values() if normalize_color(v) != v and normalize_color(v) not in v.split()]
        assert result.done and rewritten, (task.task_id, result.info)
        denom = len(task.meta["attributes"]) + len(goal) + 1
        assert math.isclose(result.reward, 1 - len(rewritten) / denom), (task.task_id, result.info)
    stats = spec.expert_stats()
    assert sum(stats.values()) == len(tasks) and stats.get("not_found", 0) == 0


@needs_standin
def test_buying_a_near_miss_scores_below_one():
    env = SPEC.make_env()
    task = next(t for t in SPEC.load_tasks("unseen") if t.meta["goal_options"])
    actions = SPEC.expert_actions(task)
    # the expert's path without its option clicks: the option share of the reward is lost
    opened = actions.index(f"click[{task.meta['asin']}]")
    no_options = actions[: opened + 1] + [actions[-1]]
    result = run_episode(env, task, no_options)
    assert result.done and not result.success and 0 < result.reward < 1


# ---------------------------------------------------------------- pages and invalid input


@needs_standin
def test_pages_and_navigation_text_format():
    env = SPEC.make_env()
    task = SPEC.load_tasks("unseen", limit=1)[0]
    obs = env.reset(task)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {task.goal} [SEP] Search"
    assert env.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    r = env.step("search[" + " ".join(task.meta["attributes"]) + "]")
    assert r.reward == 0.0 and not r.done and not r.info["invalid"]
    assert r.observation.startswith(
        f"Instruction: [SEP] {task.goal} [SEP] Back to Search [SEP] Page 1 (Total results: "
    )
    assert "[SEP] Next > [SEP]" in r.observation and "< Prev" not in r.observation
    clickables = env.available_actions()["clickables"]
    assert clickables[:2] == ["back to search", "next >"] and len(clickables) == 12
    r = env.step("click[Next >]")
    assert "Page 2 (Total results:" in r.observation and "[SEP] < Prev [SEP] Next > [SEP]" in r.observation
    first = env.available_actions()["clickables"][3]
    r = env.step(f"click[{first.upper()}]")
    assert r.info["page"] == "item" and r.observation.endswith(
        "Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert "[SEP] Back to Search [SEP] < Prev [SEP]" in r.observation
    assert env.step("click[features]").info["page"] == "features"
    assert env.step("click[< prev]").info["page"] == "item"
    r = env.step("click[< Prev]")
    assert r.info["page"] == "results" and "Page 2 (Total results:" in r.observation
    assert env.step("click[Back to Search]").observation == obs


@needs_standin
def test_invalid_actions_keep_the_page_and_are_counted():
    env = SPEC.make_env()
    task = SPEC.load_tasks("unseen", limit=1)[0]
    start = env.reset(task)
    bad = [
        "",
        "jump",
        "search[]",
        "click[search]",
        "click[buy now]",
        "click[B000000000]",
        "search [unclosed",
        "click][",
    ]
    for i, action in enumerate(bad, 1):
        r = env.step(action)
        assert r.observation == start and r.reward == 0.0 and not r.done
        assert r.info["invalid"] and r.info["invalid_reason"] and r.info["invalid_count"] == i
    env.step("search[rack]")
    r = env.step("search[shoes]")
    assert r.info["invalid"] and "search page" in r.info["invalid_reason"] and r.info["page"] == "results"
    rng = random.Random(0)
    for _ in range(200):  # garbage never raises
        junk = "".join(rng.choice("click[]search bu y now<>\n") for _ in range(rng.randint(0, 20)))
        assert isinstance(env.step(junk), StepResult)


@needs_standin
def test_invalid_feedback_search_anywhere_and_after_done():
    env = SPEC.make_env(invalid_feedback=True, search_anywhere=True)
    task = SPEC.load_tasks("unseen", limit=1)[0]
    env.reset(task)
    assert env.step("hello").observation.startswith("Invalid action! malformed action")
    env.step("search[rack]")
    assert not env.step("search[shoes]").info["invalid"]  # allowed with search_anywhere
    result = run_episode(env, task, SPEC.expert_actions(task))
    assert result.success
    after = env.step("click[Buy Now]")
    assert after.done and after.info["invalid"] and after.reward == 0.0 and after.success
    with pytest.raises(EnvError):
        WebShopEnv(catalog=env.catalog).step("click[x]")


@needs_standin
def test_task_from_other_catalog_is_refused():
    env = SPEC.make_env()
    task = SPEC.load_tasks("unseen", limit=1)[0]
    wrong = Task(
        "webshop", "unseen", task.task_id, task.goal, meta={**task.meta, "catalog": CATALOG_ORIGINAL}
    )
    with pytest.raises(EnvError):
        env.reset(wrong)


def test_normalize_and_describe_action():
    cases = {
        "Action: click[Buy Now]": "click[Buy Now]",
        "  Click [ b09abc1234 ] ": "click[b09abc1234]",
        "search[red shoes size 9]": "search[red shoes size 9]",
        "`search[lamp]`.": "search[lamp]",
        "click buy now": "click[buy now]",
        "search: blue rug": "search[blue rug]",
        "click[Next >] then click[B000000001]": "click[Next >]",
        "I don't know": "I don't know",
    }
    for raw, expected in cases.items():
        assert SPEC.normalize_action(raw) == expected, raw
    assert SPEC.describe_action("click[B09ABC1234]") == "open product B09ABC1234"
    assert SPEC.describe_action("click[Buy Now]").startswith("buy")
    assert SPEC.describe_action("search[lamp]") == "search the store for 'lamp'"
    assert SPEC.describe_action("click[x-large]") == "select the option 'x-large'"
    prompt = SPEC.system_prompt()
    assert "search[" in prompt and "click[" in prompt and "Thought" not in prompt


# ---------------------------------------------------------------- original-format files


def write_original_fixture(root: Path, human: bool = True) -> None:
    products = [
        {
            "asin": "B000000001",
            "name": "Earth Mama Bright Citrus Deodorant for Sensitive Skin",
            "full_description": "Natural deodorant, aluminum free.",
            "small_description": ["CALENDULA: soothing", "Aluminum free formula"],
            "pricing": "$10.99",
            "customization_options": {
                "Scent": [
                    {"value": "Bright Citrus", "image": None},
                    {"value": "Calming Lavender", "image": None},
                ],
                "Size": [
                    {"value": "3 Ounce (Pack of 1)", "image": None},
                    {"value": "Travel Set/4-Pack", "image": None},
                ],
            },
            "images": ["x.jpg"],
            "query": "Deodorant ",
            "category": "beauty",
            "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
        },
        {
            "asin": "B000000002",
            "name": "Classic Leather Men's Oxford Shoes",
            "full_description": "Lace-up dress shoes with rubber sole.",
            "small_description": "Rubber sole",
            "pricing": "$35.00 - $45.50",
            "customization_options": {
                "Color": [{"value": "Black", "image": None}, {"value": "Dark Brown", "image": None}]
            },
            "images": ["y.jpg"],
            "query": "men's oxfords",
            "category": "fashion",
            "product_category": "Clothing, Shoes & Jewelry › Men › Shoes › Oxfords",
        },
        {
            "asin": "B000000003",
            "name": "Wooden Coffee Table with Storage",
            "full_description": "Mid-century coffee table.",
            "small_description": ["Solid wood"],
            "pricing": "",
            "customization_options": None,
            "images": ["z.jpg"],
            "query": "coffee tables",
            "category": "furniture",
            "product_category": "Home & Kitchen › Furniture › Living Room Furniture › Tables",
        },
        {
            "asin": "nan",
            "name": "skipped",
            "images": [""],
            "query": "",
            "category": "",
            "product_category": "",
        },
    ]
    attrs = {
        "B000000001": {
            "attributes": ["sensitive skin", "aluminum free"],
            "instruction": "Find me aluminum free deodorants for sensitive skin",
            "instruction_attributes": ["aluminum free", "sensitive skin"],
        },
        "B000000002": {"attributes": ["rubber sole", "leather"]},
        "B000000003": {
            "attributes": ["solid wood", "storage space"],
            "instruction": "Find me coffee tables with solid wood",
            "instruction_attributes": ["solid wood"],
        },
    }
    human_ins = {
        "B000000001": [
            {
                "instruction": "i want an aluminum free deodorant for sensitive skin, bright citrus scent.",
                "instruction_attributes": ["aluminum free", "sensitive skin"],
                "instruction_options": ["bright citrus", "3 ounce (pack of 1)"],
            }
        ],
        "B000000002": [
            {
                "instruction": "i need men's oxford shoes with rubber sole in dark brown",
                "instruction_attributes": ["rubber sole"],
                "instruction_options": ["dark brown"],
            },
            {
                "instruction": "no attributes: skipped like the original",
                "instruction_attributes": [],
                "instruction_options": [],
            },
        ],
        "B000000003": [
            {
                "instruction": "a solid wood coffee table",
                "instruction_attributes": ["solid wood"],
                "instruction_options": [],
            }
        ],
    }
    (root / "items_shuffle_1000.json").write_text(json.dumps(products))
    (root / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    if human:
        (root / "items_human_ins.json").write_text(json.dumps(human_ins))


def test_original_loader_parses_fixture_and_oracle_wins(tmp_path):
    write_original_fixture(tmp_path)
    catalog = load_catalog(tmp_path)
    assert catalog.name == CATALOG_ORIGINAL
    assert [p.asin for p in catalog.products] == ["B000000001", "B000000002", "B000000003"]
    deo, shoes, table = catalog.products
    assert deo.options == {
        "scent": ["bright citrus", "calming lavender"],
        "size": ["3 ounce (pack of 1)", "travel set | 4-pack"],
    }
    assert (
        deo.price_tag == "$10.99"
        and deo.query == "deodorant"
        and deo.bullet_points[0] == "CALENDULA: soothing"
    )
    assert shoes.price_tag == "$35.0 to $45.5" and 35.0 <= catalog.prices[shoes.asin] <= 45.5
    assert shoes.bullet_points == ["Rubber sole"]
    assert table.price_tag == "$100.0" and table.options == {}
    assert sorted(g.asin for g in catalog.goals) == [
        "B000000001",
        "B000000002",
        "B000000003",
    ]  # empty-attribute one skipped

    spec = WebShopSpec(data_path=tmp_path)
    tasks = spec.load_tasks("test") + spec.load_tasks("train")
    assert len(tasks) == 3 and {t.meta["catalog"] for t in tasks} == {CATALOG_ORIGINAL}
    env = spec.make_env()
    for task in tasks:
        assert task.goal.startswith(catalog.goals[task.meta["goal_index"]].instruction_text[:10])
        result = run_episode(env, task, spec.expert_actions(task))
        assert result.success and result.reward == 1.0 and result.info["catalog"] == CATALOG_ORIGINAL


def test_loader_env_var_synthetic_goals_and_missing_data(tmp_path, monkeypatch):
    write_original_fixture(tmp_path, human=False)
    monkeypatch.setenv("FLYWHEEL_WEBSHOP_DIR", str(tmp_path))
    catalog = load_catalog()
    assert catalog.name == CATALOG_ORIGINAL
    # synthetic goals: one per option combination (2 scents x 2 sizes) + 1 for the table
    assert len(catalog.goals) == 5
    assert any(
        "with scent: calming lavender, and size: travel set | 4-pack" in g.instruction_text
        for g in catalog.goals
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingDataError, match="FLYWHEEL_WEBSHOP_DIR"):
        load_catalog(empty)


def test_compact_prompt_is_a_spec_option():
    from envs import configure_spec, get_benchmark

    base = get_benchmark("webshop")
    compact = configure_spec(base, {"prompt": "compact"})
    assert "search[keywords]" in compact.system_prompt() and "click[Buy Now]" in compact.system_prompt()
    assert len(compact.system_prompt()) < len(base.system_prompt()) / 2
    assert base.prompt == "full"  # the registered spec is not changed by configuring a copy
    with pytest.raises(ValueError, match="Valid: full, compact"):
        configure_spec(base, {"prompt": "tiny"})
    with pytest.raises(ValueError, match="Valid: data_path, max_steps, prompt"):
        configure_spec(base, {"promt": "compact"})
