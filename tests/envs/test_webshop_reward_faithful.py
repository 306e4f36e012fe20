"""The project's WebShop reward against a literal port of the published one (issue 17).

`webshop_reference_reward.py` restates WebShop's goal.py/normalize.py; every test here
compares envs/webshop/reward.py with it (exact floats and the verbose info dict) on
WebShop's own test_goal.py cases, hand-made quirk cases, generated cases and every goal
of the stand-in catalog. Title nouns use the same function on both sides
(`content_words`, the default flag); spaCy's tagger is compared only when installed.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from envs.data import data_dir
from envs.webshop import reward
from envs.webshop.reward import (
    content_words,
    get_attribute_reward,
    get_option_reward,
    get_reward,
    get_type_reward,
)
from tests.envs import webshop_reference_reward as ref

STANDIN_FILE = data_dir() / "webshop" / "items_ins_v2_1000.json"
needs_standin = pytest.mark.skipif(not STANDIN_FILE.exists(), reason=f"shared data missing: {STANDIN_FILE}")


def _spacy_ready() -> bool:
    if importlib.util.find_spec("spacy") is None:
        return False
    try:
        reward.spacy_model_name()
    except RuntimeError:
        return False
    return True


def both(product: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str]):
    """(project, reference) (reward, info) for one purchase."""
    return get_reward(product, goal, price, options), ref.get_reward(product, goal, price, options, nouns=content_words)


def assert_same(product, goal, price, options) -> float:
    (r, info), (r_ref, info_ref) = both(product, goal, price, options)
    assert r == r_ref, (r, r_ref, goal, options, product)
    assert info == info_ref
    assert 0.0 <= r <= 1.0
    return r


# ---------------------------------------------------------------- WebShop's own test_goal.py cases


def test_webshop_test_goal_attribute_cases():
    goal = {"attributes": ["tea tree", "essential oils", "natural ingredients"]}
    cases = [
        ({"Attributes": ["tea tree", "essential oil", "natural ingredients"]}, (1, 3)),
        ({"Attributes": ["essential oil", "natural ingredients"], "Title": "", "BulletPoints": [], "Description": ""}, (2 / 3, 2)),
        (
            {
                "Attributes": [],
                "Title": "",
                "BulletPoints": ["This shampoo has essential oils and smells like lemons"],
                "Description": "Best shampoo on the market, made with natural ingredients",
            },
            (2 / 3, 2),
        ),
        (
            {
                "Attributes": ["tea bag", "earl gray", "lipton"],
                "Title": "English tea for breakfast",
                "BulletPoints": ["Soothing aroma", "Calming, great feeling"],
                "Description": "Best tea made by Lipton, great to pair with breakfast",
            },
            (0, 0),
        ),
    ]
    for purchased, expected in cases:
        assert get_attribute_reward(purchased, goal) == expected == ref.get_attribute_reward(purchased, goal)


@pytest.mark.parametrize(
    ("goal", "purchased", "expected"),
    [
        (["grey", "XL", "pack of 12"], ["pack of 12", "grey", "XL"], (1, 3)),  # exact
        (["grey", "XL", "pack of 12"], ["pack of 12", "blue", "XL"], (2 / 3, 2)),  # partial
        (["cool powder snow", "XL", "pack of 12"], ["pack of 12", "powder snow", "XL"], (1, 3)),  # fuzzy
        ([], ["goal 1", "goal 2"], (None, 0)),  # no goal options
        (["goal 1", "goal 2"], [], (0, 0)),  # nothing chosen
    ],
)
def test_webshop_test_goal_option_cases(goal, purchased, expected):
    assert get_option_reward(purchased, goal) == expected == ref.get_option_reward(purchased, goal)


def test_webshop_test_goal_reward_cases():
    """test_get_reward: 1, 2/3 (string bullets joined char-wise), 0.5714, 0.2857."""
    goal = {
        "query": "Query 1",
        "product_category": "a › b › c",
        "name": "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
        "attributes": ["tea tree", "essential oils", "natural ingredients"],
        "goal_options": {"color": "grey", "size": "XL"},
        "price_upper": 40.00,
    }
    purchased = {
        "query": "Query 1",
        "product_category": "a › b › c",
        "name": goal["name"],
        "Attributes": ["tea tree", "essential oil", "natural ingredients"],
        "Title": "",
        "BulletPoints": [],
        "Description": "",
    }
    chosen = {"color": "grey", "size": "XL"}
    assert assert_same(purchased, goal, 35, chosen) == 1

    purchased.update(
        Attributes=[],
        BulletPoints="This shampoo has essential oils and smells like lemons",  # a string, not a list
        Description="Best shampoo on the market, made with natural ingredients",
    )
    r = assert_same(purchased, goal, 35, chosen)
    # the string's characters are joined ("T h i s ..."), so "essential oils" is not found:
    # (1 attribute + 2 options + price) / 6
    assert math.isclose(r, 4 / 6) and math.isclose(r, 2 / 3, abs_tol=1e-2)

    goal["goal_options"] = {"color": "grey", "size": "XL", "amount": "pack of 12"}
    r = assert_same(purchased, goal, 35, chosen)
    assert math.isclose(r, 4 / 7) and math.isclose(r, 0.5714, abs_tol=1e-2)

    goal["name"] = "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar"
    purchased.update(
        name="BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System",
        query="Query 2",
        product_category="a › d › e",
    )
    r = assert_same(purchased, goal, 35, chosen)
    assert math.isclose(r, 2 / 7) and math.isclose(r, 0.2857, abs_tol=1e-2)
    # the list form of the same bullets finds "essential oils": 5/6, not 2/3
    purchased.update(name=goal["name"], query="Query 1", BulletPoints=[purchased["BulletPoints"]])
    goal["goal_options"] = {"color": "grey", "size": "XL"}
    assert math.isclose(assert_same(purchased, goal, 35, chosen), 5 / 6)


def test_webshop_test_goal_type_cases_that_do_not_depend_on_the_tagger():
    goal = {"query": "Query 1", "product_category": "a › b › c", "name": "Name 1"}
    purchased = dict(goal)
    assert get_type_reward(purchased, goal) == {"r_type": 1.0, "query_match": True, "category_match": True, "title_score": 1.0}
    purchased["query"] = "Query 2"
    assert get_type_reward(purchased, goal)["query_match"] is False
    for path, match in [("b › c › a", True), ("d › e › f", False), ("a › d › b", True), ("a › a › b", True), ("a › a › d", False)]:
        purchased["product_category"] = path
        assert get_type_reward(purchased, goal)["category_match"] is match


# title scores of test_goal.py's product pairs, as (goal, purchased, spaCy 3.3 value asserted there)
TITLE_PAIRS = [
    (
        "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
        "PEAK High Top Mens Basketball Shoes Lou Williams Streetball Master Breathable Non Slip Outdoor Sneakers",
        0.333,
    ),
    (
        "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar Home Theater System Subwoofer",
        "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System",
        0.3,
    ),
    (
        "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar",
        "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System",
        0.15,
    ),
    (
        "Rusticware 921ORB Kitchen and Bath Cabinet Knob",
        "Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover Portable Makeup Tweezers (Silver)",
        0.0,
    ),
]


def _title_score(goal_name: str, purchased_name: str, title_nouns: str) -> float:
    base = {"query": "q", "product_category": "x › y"}
    return get_type_reward({**base, "name": purchased_name}, {**base, "name": goal_name}, title_nouns)["title_score"]


def test_title_scores_with_content_words():
    """The default flag on test_goal.py's pairs: the same r_type band as spaCy on all four."""
    scores = [_title_score(g, p, "content-words") for g, p, _ in TITLE_PAIRS]
    # mens, basketball, sneakers, shoes of 9 words ("D.O.N." is dropped); power, cord, home, theater,
    # system of 17 ("bar" twice: the denominator counts repeats, as the original's does); 2 of 13; none
    assert scores == [pytest.approx(4 / 9), pytest.approx(5 / 17), pytest.approx(2 / 13), 0.0]
    for score, (_, _, spacy_value) in zip(scores, TITLE_PAIRS, strict=True):
        # thresholds at 0.1 and 0.2 decide r_type; both taggers land on the same side
        assert (score > 0.2) == (spacy_value > 0.2) and (score < 0.1) == (spacy_value < 0.1)


def test_title_scores_with_spacy_flag():
    if not _spacy_ready():
        pytest.skip("spaCy or its small English model not installed (optional extra webshop-spacy)")
    scores = [_title_score(g, p, "spacy") for g, p, _ in TITLE_PAIRS]
    nouns = ref.spacy_nouns(reward.spacy_model_name())
    for (g, p, _), score in zip(TITLE_PAIRS, scores, strict=True):
        g_n, p_n = nouns(g), nouns(p)
        assert score == (len(set(g_n) & set(p_n)) / len(g_n) if g_n else 0.2)
    assert scores[3] < 0.05


def test_unknown_title_nouns_flag_is_a_clear_error():
    with pytest.raises(ValueError, match="title_nouns must be one of"):
        get_type_reward({"query": "", "product_category": "", "name": "a"}, {"query": "", "product_category": "", "name": "a"}, "nltk")


@needs_standin
def test_env_title_nouns_flag_fails_at_construction():
    from envs.webshop import SPEC

    with pytest.raises(ValueError, match="title_nouns must be one of"):
        SPEC.make_env(title_nouns="nltk")
    if _spacy_ready():
        assert SPEC.make_env(title_nouns="spacy").title_nouns == "spacy"
    else:
        with pytest.raises(RuntimeError, match="webshop-spacy"):
            SPEC.make_env(title_nouns="spacy")


def test_undefined_goals_are_clear_errors():
    product = {"query": "q", "product_category": "a › b", "name": "n", "Attributes": [], "Title": "", "BulletPoints": [], "Description": ""}
    goal = {"query": "q", "product_category": "a › b", "name": "n", "attributes": ["x"], "goal_options": [], "price_upper": 0}
    with pytest.raises(ValueError, match="price_upper"):
        get_reward(product, goal, 1.0, {})
    with pytest.raises(ValueError, match="at least one attribute"):
        get_attribute_reward(product, {"attributes": []})


# ---------------------------------------------------------------- the five divergences, one case each

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


def test_option_loop_over_goal_options_caps_at_one():
    # two chosen options both matching the goal's "grey": formerly option score 2.0, reward 1.25
    goal = {**GOAL, "goal_options": {"color": "grey", "size": "xl"}}
    r = assert_same(product(), goal, 35.0, {"color": "grey", "style": "dark grey"})
    assert r == 5 / 6
    goal = {**GOAL, "goal_options": ["grey"]}
    assert assert_same(product(), goal, 35.0, {"color": "grey", "style": "grey"}) == 1.0


def test_wrong_option_written_in_the_page_is_not_credited():
    r = assert_same(product(Description="a blue rack, also in grey"), GOAL, 35.0, {"color": "blue", "size": "xl"})
    assert r == 5 / 6  # formerly 1.0: "blue" appears in the description


def test_sizes_match_fuzzily_like_every_option():
    goal = {**GOAL, "goal_options": ["16 Fl Oz"]}
    assert assert_same(product(), goal, 35.0, {"size": "Size: 16 Fl Oz"}) == 1.0
    goal = {**GOAL, "goal_options": {"size": "XL"}}
    assert assert_same(product(), goal, 35.0, {"size": "xl"}) == 1.0
    # near numbers pass the > 85 threshold: "pack of 2" vs the pair ("size", "pack of 12")
    goal = {**GOAL, "goal_options": {"size": "pack of 12"}}
    assert assert_same(product(), goal, 35.0, {"size": "pack of 2"}) == 1.0
    assert reward.token_set_ratio("pack of 2", ("size", "pack of 12")) > 85


def test_dict_goal_options_are_matched_as_pairs():
    # the chosen "sandalwood" is colour-normalised to "sand"; the goal pair is not, so no match
    goal = {**GOAL, "goal_options": {"scent": "sandalwood"}, "attributes": ["tea tree"]}
    assert assert_same(product(), goal, 35.0, {"scent": "sandalwood"}) == 2 / 3
    # the same value in a list of goal options is normalised on both sides and matches
    assert assert_same(product(), {**goal, "goal_options": ["sandalwood"]}, 35.0, {"scent": "sandalwood"}) == 1.0
    # a pair whose value is exactly a colour name is normalised to it
    assert reward.normalize_color(("color", "navy")) == "navy"
    assert reward.normalize_color(("color", "navy blue")) == ("color", "navy blue")


def test_string_bullet_points_are_joined_character_wise():
    p = product(Attributes=[], BulletPoints="made with tea tree oil")
    goal = {**GOAL, "attributes": ["tea tree"], "goal_options": []}
    assert assert_same(p, goal, 35.0, {}) == 1 / 2
    assert assert_same({**p, "BulletPoints": ["made with tea tree oil"]}, goal, 35.0, {}) == 1.0


def test_price_bound_is_inclusive():
    goal = {**GOAL, "goal_options": []}
    assert assert_same(product(), goal, 40.0, {}) == 1.0
    assert assert_same(product(), goal, 40.01, {}) == 3 / 4


# ---------------------------------------------------------------- generated cases

OPTION_VALUES = {
    "color": ["grey", "gray", "dark grey", "navy", "navy blue", "light blue", "blue", "black", "black forest",
              "rose gold", "white", "standard", "multicolor", "02 light", "04 tan", "cherry", "oak"],
    "size": ["xl", "XL", "x-large", "xx-large", "small", "large", "pack of 2", "pack of 12", "16 Fl Oz",
             "Size: 16 Fl Oz", "8 ounce (pack of 1)", "4 ounce (pack of 1)", "6.5", "7", "24 inch", "king", "california king"],
    "scent": ["sandalwood", "peppermint", "lavender", "sea salt", "cashmere", "vanilla", "lemon", "unscented"],
    "style": ["basic", "pro", "with carrying case", "2-pack", "bundle", "plus"],
    "flavor name": ["original", "sea salt", "honey roasted", "strawberry", "cheddar"],
}  # fmt: skip
ATTRIBUTES = ["tea tree", "essential oils", "natural ingredients", "long lasting", "easy clean", "high heel",
              "gluten free", "wireless bluetooth", "stainless steel", "non slip", "machine wash", "dry skin"]  # fmt: skip
ATTR_VARIANTS = {"essential oils": "essential oil", "long lasting": "long-lasting", "non slip": "non-slip",
                 "gluten free": "gluten-free", "dry skin": "skin dry"}  # fmt: skip
NAMES = ["Stainless Steel Baker Rack Heavy Duty", "Walnut Baker Rack", "Wireless Earbuds with Charging Case",
         "Tea Tree Shampoo for Dry Skin", "Women's High Heel Pumps", "Rack Shelf", "Gluten Free Crackers Sea Salt"]  # fmt: skip
QUERIES = ["baker's racks", "earbuds", "shampoo", "pumps", "crackers"]
CATEGORIES = ["Home & Kitchen › Furniture › Baker's Racks", "Home & Kitchen › Furniture › Desks",
              "Electronics › Headphones › Earbuds", "Beauty & Personal Care › Hair Care › Shampoo",
              "Clothing, Shoes & Jewelry › Women › Shoes › Pumps", "Grocery & Gourmet Food › Crackers"]  # fmt: skip


def generated_case(rng: random.Random) -> tuple[dict, dict, float, dict[str, str]]:
    names = rng.sample(sorted(OPTION_VALUES), rng.choice((0, 1, 2, 2, 3)))
    wanted = {n: rng.choice(OPTION_VALUES[n]) for n in names}
    chosen: dict[str, str] = {}
    for n in names:
        u = rng.random()
        if u < 0.5:
            chosen[n] = wanted[n]
        elif u < 0.85:
            chosen[n] = rng.choice(OPTION_VALUES[n])  # often wrong
    if wanted and rng.random() < 0.25:  # an extra option repeating a goal value (the option-loop case)
        chosen["extra"] = rng.choice(list(wanted.values()))
    attrs = rng.sample(ATTRIBUTES, rng.randint(1, 3))
    p_attrs = [ATTR_VARIANTS.get(a, a) if rng.random() < 0.5 else a for a in attrs if rng.random() < 0.6]
    text_words = rng.sample(ATTRIBUTES + [v for vs in OPTION_VALUES.values() for v in vs], 6)
    bullets = [w.upper() + ": made to last" for w in text_words[:3]]
    bullet_field: Any = " ".join(bullets) if rng.random() < 0.3 else bullets
    goal_name, goal_query, goal_cat = rng.choice(NAMES), rng.choice(QUERIES), rng.choice(CATEGORIES)
    same_kind = rng.random() < 0.6
    goal = {
        "query": goal_query,
        "product_category": goal_cat,
        "name": goal_name,
        "attributes": attrs,
        "goal_options": wanted if rng.random() < 0.6 else list(wanted.values()),
        "price_upper": rng.choice((10.0, 20.0, 40.0, 100.0, 1000000)),
    }
    purchased = {
        "query": goal_query if same_kind else rng.choice(QUERIES),
        "product_category": goal_cat if same_kind else rng.choice(CATEGORIES),
        "name": goal_name if same_kind else rng.choice(NAMES),
        "Title": rng.choice(NAMES) + " " + text_words[3],
        "BulletPoints": bullet_field,
        "Description": "Meet it: " + ", ".join(text_words[4:]) + ".",
        "Attributes": p_attrs + rng.sample(ATTRIBUTES, rng.randint(0, 2)),
    }
    price = goal["price_upper"] + rng.choice((-5.0, -0.01, 0.0, 0.01, 5.0))
    return purchased, goal, price, chosen


def generated_cases(n: int = 3000, seed: int = 17) -> Iterator[tuple[dict, dict, float, dict[str, str]]]:
    rng = random.Random(seed)
    for _ in range(n):
        yield generated_case(rng)


def wrong_goal_options(goal: dict[str, Any], chosen: dict[str, str]) -> list[tuple[str, str]]:
    """Goal options (dict form) whose value was not chosen (under any option name)."""
    opts = goal["goal_options"]
    if not isinstance(opts, dict):
        return []
    return [(k, v) for k, v in opts.items() if v not in chosen.values()]


def test_generated_cases_match_the_reference_exactly():
    n = 0
    reached_one = wrong = 0
    for purchased, goal, price, chosen in generated_cases():
        r = assert_same(purchased, goal, price, chosen)
        n += 1
        reached_one += r == 1.0
        wrong += bool(wrong_goal_options(goal, chosen))
    # the generator reaches the interesting regions (not all zeros, not all successes)
    assert n == 3000 and 100 < reached_one < 2500 and wrong > 500


def test_no_reward_exceeds_one_and_wrong_options_pass_only_the_fuzzy_matcher():
    """Property: r <= 1 always. A purchase with a wrong (or missing) goal option reaches 1.0 only
    where the original's own matcher accepts some chosen value for that option (> 85) -- never
    through page text or a second chosen option; the reference port agrees on every case."""
    for purchased, goal, price, chosen in generated_cases(seed=1717):
        r = assert_same(purchased, goal, price, chosen)
        assert r <= 1.0
        if r < 1.0:
            continue
        for key, value in wrong_goal_options(goal, chosen):
            pair = reward.normalize_color((key, value))
            accepted = [c for c in chosen.values() if reward.token_set_ratio(reward.normalize_color(c), pair) > 85]
            assert accepted, (goal, chosen)


def test_the_original_itself_gives_one_for_a_wrong_option():
    """The published reward's quirk, reproduced on purpose: near values pass the fuzzy threshold."""
    goal = {**GOAL, "goal_options": {"size": "8 ounce (pack of 1)"}, "attributes": ["tea tree"]}
    for wanted, bought in [
        ({"size": "8 ounce (pack of 1)"}, {"size": "4 ounce (pack of 1)"}),  # 94 > 85
        ({"color": "navy blue"}, {"color": "light blue"}),  # "light blue" -> "blue", a token of the pair
        ({"color": "dark grey"}, {"color": "grey"}),
    ]:
        (r, _), (r_ref, _) = both(product(), {**goal, "goal_options": wanted}, 35.0, bought)
        assert r == r_ref == 1.0, (wanted, bought)
    # while a clearly different value does not pass
    (r, _), (r_ref, _) = both(product(), {**goal, "goal_options": {"color": "navy blue"}}, 35.0, {"color": "red"})
    assert r == r_ref == 2 / 3


# ---------------------------------------------------------------- the stand-in catalog's goals


def catalog_purchases(catalog) -> Iterator[tuple[str, Any, Any, dict[str, str]]]:
    """(kind, goal, product, chosen): the target with the goal options, with each single wrong
    value, with none, and the same-query near misses with the goal options."""
    by_query: dict[str, list] = {}
    for p in catalog.products:
        by_query.setdefault(p.query, []).append(p)
    for goal in catalog.goals:
        target = catalog.by_asin[goal.asin]
        opts = dict(goal.goal_options)
        yield "target", goal, target, opts
        yield "no options", goal, target, {}
        for name, value in opts.items():
            for other in target.options.get(name, []):
                if other != value:
                    yield "one wrong option", goal, target, {**opts, name: other}
        for p in by_query.get(target.query, [])[:4]:
            if p.asin != target.asin:
                yield "near miss", goal, p, {k: v[0] for k, v in p.options.items()}


@needs_standin
def test_standin_catalog_purchases_match_the_reference():
    from envs.webshop.catalog import load_catalog

    catalog = load_catalog()
    counts: dict[str, int] = {}
    for kind, goal, prod, chosen in catalog_purchases(catalog):
        r = assert_same(prod.as_reward_dict(), goal.as_reward_dict(), catalog.prices[prod.asin], chosen)
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "target":
            # a goal's own product with its goal options loses at most the option share
            assert r >= 1 - len(goal.goal_options) / (len(goal.attributes) + len(goal.goal_options) + 1)
    assert counts["target"] == 415 and counts["one wrong option"] > 415 and counts["near miss"] > 415


@needs_standin
def test_oracle_gets_the_best_reward_the_target_allows():
    """On every goal the expert's purchase scores the maximum over all option choices of the
    target; where that maximum is below 1, it is the dict-pair colour quirk (a correct value
    that normalize_color rewrites, e.g. sandalwood -> sand)."""
    from envs.webshop import SPEC

    catalog = SPEC.catalog
    env = SPEC.make_env()
    below = 0
    for task in SPEC.load_tasks("unseen") + SPEC.load_tasks("train"):
        goal = catalog.goals[task.meta["goal_index"]]
        target = catalog.by_asin[goal.asin]
        names = sorted(target.options)
        best = max(
            get_reward(target.as_reward_dict(), goal.as_reward_dict(), catalog.prices[goal.asin], dict(zip(names, combo, strict=True)))[0]
            for combo in itertools.product(*(target.options[n] for n in names))
        )
        env.reset(task)
        for action in SPEC.expert_actions(task):
            result = env.step(action)
        assert result.done and result.reward == best, (task.task_id, result.reward, best)
        assert result.success == (best == 1.0)
        if best < 1.0:
            below += 1
            lost = [(k, v) for k, v in goal.goal_options.items()
                    if reward.token_set_ratio(reward.normalize_color(v), reward.normalize_color((k, v))) <= 85]
            assert lost and all(reward.normalize_color(v) != v for _, v in lost), (task.task_id, lost)
    assert below < 415
