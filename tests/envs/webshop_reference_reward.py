"""Reference port of WebShop's published reward: the differential oracle for envs/webshop/reward.py.

Source: princeton-nlp/WebShop, `web_agent_site/engine/goal.py` (`get_type_reward`,
`get_attribute_reward`, `get_option_reward`, `get_reward`) and
`web_agent_site/engine/normalize.py` (`COLOR_SET`, `normalize_color`), MIT licence.
This file re-states that logic line for line, quirks included, so that the project's
reward can be compared against it; it is test code and nothing in `envs/` imports it.

Kept deliberately literal (do not "fix" anything here):
- the option score loops over the *goal* options and breaks at the first purchased
  option scoring > 85; one purchased option may satisfy several goal options;
- a dict of goal options is passed as its `.items()`, so each goal option is a
  (name, value) tuple: `normalize_color` then tests tuple membership (only a value
  exactly equal to a colour is normalised) and the fuzzy matcher sees `str(tuple)`;
- `' '.join(BulletPoints)` joins the characters of a string;
- `g_attr in Title.lower()` (the goal attribute itself is not lowercased);
- `r_price` is a bool added to the match counts.

Two dependencies are injected, because neither ships with the default install:
- `fuzz`: a `token_set_ratio(a, b) -> int`; default `thefuzz.fuzz.token_set_ratio` from
  the installed thefuzz. `token_set_ratio_thefuzz_019` below re-states thefuzz 0.19.0
  (the version WebShop pins) running without python-Levenshtein, i.e. on difflib's
  SequenceMatcher.
- `nouns`: a `name -> list[str]` stand-in for spaCy's NOUN/PROPN tokens (the original
  calls `spacy.load("en_core_web_sm")`); `spacy_nouns()` builds the real one when spaCy
  and the model are installed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from difflib import SequenceMatcher
from typing import Any

COLOR_SET = [
    'alabaster', 'apricot', 'aqua', 'ash', 'asphalt', 'azure',
    'banana', 'beige', 'black', 'blue', 'blush', 'bordeaux', 'bronze',
    'brown', 'burgundy', 'camel', 'camo', 'caramel', 'champagne',
    'charcoal', 'cheetah', 'chestnut', 'chocolate', 'christmas', 'coffee',
    'cognac', 'copper', 'coral', 'cranberry', 'cream', 'crystal', 'dark',
    'denim', 'eggplant', 'elephant', 'espresso', 'fuchsia', 'gold', 'granite',
    'grape', 'graphite', 'grass', 'gray', 'green', 'grey', 'heather', 'indigo',
    'ivory', 'ivy', 'khaki', 'lavender', 'lemon', 'leopard', 'light', 'lilac',
    'lime', 'magenta', 'maroon', 'mauve', 'merlot', 'midnight', 'mint', 'mocha',
    'multicolor', 'mushroom', 'mustard', 'natural', 'navy', 'nude', 'olive',
    'orange', 'peach', 'pewter', 'pink', 'plum', 'purple', 'rainbow', 'red',
    'rose', 'royal', 'rust', 'sand', 'sapphire', 'seashell', 'silver', 'skull',
    'slate', 'steel', 'stone', 'stonewash', 'sunflower', 'tan', 'taupe', 'teal',
    'tiger', 'turquoise', 'violet', 'walnut', 'wheat', 'white', 'wine', 'yellow',
]  # fmt: skip


def normalize_color(color_string: Any) -> Any:
    for norm_color in COLOR_SET:
        if norm_color in color_string:  # substring for a str, element equality for a tuple
            return norm_color
    return color_string


# ---------------------------------------------------------------- fuzzy matchers


def token_set_ratio_thefuzz(a: Any, b: Any) -> int:
    from thefuzz import fuzz

    return fuzz.token_set_ratio(a, b)


_LATIN1_HIGH = {i: None for i in range(128, 256)}  # thefuzz's "ascii dammit" table


def _full_process_019(s: Any) -> str:
    s = str(s).translate(_LATIN1_HIGH)
    return re.sub(r"(?ui)\W", " ", s).lower().strip()


def _ratio_019(s1: str, s2: str) -> int:
    if s1 == s2:
        return 100
    if not s1 or not s2:
        return 0
    return int(round(100 * SequenceMatcher(None, s1, s2).ratio()))


def token_set_ratio_thefuzz_019(s1: Any, s2: Any) -> int:
    """thefuzz 0.19.0 `fuzz.token_set_ratio` without python-Levenshtein (difflib)."""
    if s1 is None or s2 is None:
        return 0
    p1, p2 = _full_process_019(s1), _full_process_019(s2)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    c12 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    c21 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    sect = sect.strip()
    return max(_ratio_019(sect, c12), _ratio_019(sect, c21), _ratio_019(c12, c21))


def spacy_nouns(model: str = "en_core_web_sm") -> Callable[[str], list[str]]:
    import spacy

    nlp = spacy.load(model)

    def nouns(name: str) -> list[str]:
        return [t.text.lower() for t in nlp(name) if t.pos_ in ("PNOUN", "NOUN", "PROPN")]

    return nouns


# ---------------------------------------------------------------- goal.py, restated


def get_type_reward(purchased_product, goal, *, nouns):
    query_match = purchased_product["query"] == goal["query"]
    purchased_product_category = [x.strip() for x in purchased_product["product_category"].split("›")]
    goal_product_category = [x.strip() for x in goal["product_category"].split("›")]
    category_match = len(set(purchased_product_category) & set(goal_product_category)) >= 2

    purchased_type_parse = nouns(purchased_product["name"])
    desired_type_parse = nouns(goal["name"])
    n_intersect_type = len(set(purchased_type_parse) & set(desired_type_parse))
    if len(desired_type_parse) == 0:
        title_score = 0.2
    else:
        title_score = n_intersect_type / len(desired_type_parse)

    r_type = 1.0
    match = query_match or category_match or title_score > 0.2
    if not match:
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match, title_score=title_score)


def get_attribute_reward(purchased_product, goal, *, fuzz=token_set_ratio_thefuzz):
    purchased_attrs = purchased_product["Attributes"]
    goal_attrs = goal["attributes"]
    num_attr_matches = 0
    for g_attr in goal_attrs:
        matched = False
        for p_attr in purchased_attrs:
            score = fuzz(p_attr, g_attr)
            if score > 85:
                num_attr_matches += 1
                matched = True
                break
        if not matched and (
            g_attr in purchased_product["Title"].lower()
            or g_attr in " ".join(purchased_product["BulletPoints"]).lower()
            or g_attr in purchased_product["Description"].lower()
        ):
            num_attr_matches += 1
            matched = True
    r_attr = num_attr_matches / len(goal_attrs)
    return r_attr, num_attr_matches


def get_option_reward(purchased_options, goal_options, *, fuzz=token_set_ratio_thefuzz):
    purchased_options = [normalize_color(o) for o in purchased_options]
    goal_options = [normalize_color(o) for o in goal_options]
    num_option_matches = 0
    for g_option in goal_options:
        for p_option in purchased_options:
            score = fuzz(p_option, g_option)
            if score > 85:
                num_option_matches += 1
                break
    r_option = num_option_matches / len(goal_options) if len(goal_options) > 0 else None
    return r_option, num_option_matches


def get_reward(purchased_product, goal, price, options, *, nouns, fuzz=token_set_ratio_thefuzz):
    """(total_reward, verbose info) exactly as `get_reward(..., verbose=True)` returns them."""
    r_type_dict = get_type_reward(purchased_product, goal, nouns=nouns)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, num_attr_matches = get_attribute_reward(purchased_product, goal, fuzz=fuzz)
    r_option, num_option_matches = get_option_reward(
        list(options.values()),
        goal["goal_options"].items() if isinstance(goal["goal_options"], dict) else goal["goal_options"],
        fuzz=fuzz,
    )
    denom = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    total_reward = (num_attr_matches + num_option_matches + r_price) / denom
    total_reward *= r_type_dict["r_type"]
    info = {
        "r_type": r_type_dict["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denom,
        "query_match": r_type_dict["query_match"],
        "category_match": r_type_dict["category_match"],
        "title_score": r_type_dict["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal["goal_options"]) / denom
    if r_price is not None:
        info["r_price"] = r_price
        info["w_price"] = 1 / denom
    return total_reward, info
