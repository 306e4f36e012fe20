"""WebShop's published reward (`get_reward` in the original `engine/goal.py`), reimplemented.

r = r_type * (attr_matches + option_matches + [price ok]) / (n_attrs + n_goal_options + 1).
Success is r == 1.0. Two dependencies of the original are replaced by exact or
near-exact stand-ins so the reward needs no extra packages:

- `thefuzz.fuzz.token_set_ratio` -> `token_set_ratio` below: the same preprocessing
  (ASCII only, non-alphanumerics to spaces, lowercase) and the same Indel-based ratio,
  rounded to an int like thefuzz.
- spaCy `en_core_web_lg` noun tagging for the title score -> `type_tokens`: content
  words minus stopwords and numbers (no tagger model is available offline). This only
  changes r_type for products whose title shares few words with the target's; the
  target itself always scores 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

EXACT_MATCH_OPTS = ("size",)
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
FUZZY_THRESHOLD = 85

# The original normalize.py COLOR_SET, in its order: the first contained entry wins,
# so "navy blue" -> "blue" and "standard" -> "tan" (quirks kept on purpose).
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


def normalize_color(value: str) -> str:
    """First COLOR_SET entry contained in `value`, else `value` (original normalize_color)."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


# ---------------------------------------------------------------- fuzzy matching


def _full_process(text: str) -> str:
    """thefuzz full_process(force_ascii=True): ASCII only, non-alphanumerics -> space, lower, strip."""
    text = text.encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^0-9a-zA-Z]+", " ", text).lower().strip()


def _lcs_len(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for ch in a:
        cur = [0]
        for j, other in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if ch == other else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def ratio(a: str, b: str) -> float:
    """Normalized Indel similarity in [0, 100] (rapidfuzz/thefuzz `ratio` before rounding)."""
    total = len(a) + len(b)
    if total == 0:
        return 100.0
    return 100.0 * 2 * _lcs_len(a, b) / total


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz.fuzz.token_set_ratio: compare the shared token set against each side's extras."""
    t1, t2 = set(_full_process(s1).split()), set(_full_process(s2).split())
    if not t1 or not t2:
        return 0
    sect = " ".join(sorted(t1 & t2))
    diff12 = " ".join(sorted(t1 - t2))
    diff21 = " ".join(sorted(t2 - t1))
    comb12 = f"{sect} {diff12}".strip()
    comb21 = f"{sect} {diff21}".strip()
    scores = [ratio(comb12, comb21)]
    if sect:
        scores += [ratio(sect, comb12), ratio(sect, comb21)]
    return int(round(max(scores)))


# ---------------------------------------------------------------- reward parts


def type_tokens(name: str) -> list[str]:
    """Noun-like words of a product name (offline stand-in for spaCy NOUN/PROPN tags)."""
    words = re.findall(r"[a-z][a-z0-9]*", name.lower())
    return [w for w in words if len(w) > 1 and w not in _TYPE_STOPWORDS]


def _in_text(value: str, product: Mapping[str, Any]) -> bool:
    bullets = product.get("BulletPoints") or []
    if isinstance(bullets, str):
        bullets = [bullets]
    return (
        value in str(product.get("Title", "")).lower()
        or value in " ".join(bullets).lower()
        or value in str(product.get("Description", "")).lower()
    )


def get_type_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> dict[str, Any]:
    """Is the purchased product the same kind of thing (query, category path, title nouns)?"""
    query_match = purchased["query"] == goal["query"]
    p_cat = {x.strip() for x in purchased["product_category"].split("›")}
    g_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(p_cat & g_cat) >= 2

    p_type = type_tokens(purchased["name"])
    g_type = type_tokens(goal["name"])
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


def get_attribute_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """Fraction of goal attributes found (fuzzily) in the product's attributes, else in its text."""
    goal_attrs: Sequence[str] = goal["attributes"]
    matches = 0
    for g_attr in goal_attrs:
        if any(token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in purchased["Attributes"]):
            matches += 1
        elif _in_text(g_attr, purchased):
            matches += 1
    return matches / len(goal_attrs), matches


def get_option_reward(
    purchased: Mapping[str, Any], goal_options: Iterable[str], purchased_options: Mapping[str, str]
) -> tuple[float | None, int]:
    """Count purchased options that match a goal option (exact for size, fuzzy otherwise).

    Iterates the *purchased* options like the original, so an unselected goal option
    earns nothing and a wrong value whose text appears in the product page still counts.
    """
    chosen = {k: normalize_color(v) for k, v in purchased_options.items()}
    wanted = [normalize_color(o) for o in goal_options]
    matches = 0
    for key, value in chosen.items():
        if key.lower() in EXACT_MATCH_OPTS:
            matched = value in wanted
        else:
            matched = any(token_set_ratio(g, value) > FUZZY_THRESHOLD for g in wanted)
        if matched or _in_text(value, purchased):
            matches += 1
    return (matches / len(wanted) if wanted else None), matches


def goal_option_values(goal: Mapping[str, Any]) -> list[str]:
    opts = goal["goal_options"]
    return list(opts.values()) if isinstance(opts, Mapping) else list(opts)


def get_reward(
    purchased: Mapping[str, Any], goal: Mapping[str, Any], price: float, options: Mapping[str, str]
) -> tuple[float, dict[str, Any]]:
    """Total reward and the verbose breakdown the original logs."""
    r_type = get_type_reward(purchased, goal)
    r_price = price <= goal["price_upper"] if goal["price_upper"] > 0 else None
    r_att, n_att = get_attribute_reward(purchased, goal)
    goal_opts = goal_option_values(goal)
    r_option, n_opt = get_option_reward(purchased, goal_opts, options)

    denom = len(goal["attributes"]) + len(goal_opts) + 1
    total = (n_att + n_opt + int(bool(r_price))) / denom * r_type["r_type"]
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
    if r_price is not None:
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
