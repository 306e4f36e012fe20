"""Expert for WebShop: search, page to the target, pick the goal options, buy.

It plans offline with the same search index the env uses, so the plan it returns is
the one the env will replay. Queries are tried in order and the first whose path fits
the step budget wins: the instruction (minus its price clause), then category +
goal attributes, then the product title as a last resort. `query_kind` records which
one worked so callers can report how often the fallback was needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envs.webshop.products import Catalog, Goal, Product
from envs.webshop.reward import normalize_color, token_set_ratio
from envs.webshop.search import SearchEngine

QUERY_KINDS = ("instruction", "attributes", "title")
_PRICE_CLAUSE = re.compile(r",? and price lower than [\d.]+ dollars\s*$")


@dataclass(frozen=True)
class OraclePlan:
    actions: list[str]
    query_kind: str  # one of QUERY_KINDS, or "not_found" when no query fits the budget
    rank: int | None  # 0-based position of the target in the chosen query's results


def candidate_queries(goal: Goal, product: Product) -> list[tuple[str, str]]:
    instruction = _PRICE_CLAUSE.sub("", goal.instruction_text).lower()
    attributes = " ".join([goal.query, *goal.attributes]).lower()
    return [("instruction", instruction), ("attributes", attributes), ("title", product.title.lower())]


def option_clicks(product: Product, goal: Goal) -> list[str]:
    """Values to click so that every goal option is selected (exact first, then fuzzy)."""
    wanted = (
        list(goal.goal_options.items())
        if isinstance(goal.goal_options, dict)
        else [("", v) for v in goal.goal_options]
    )
    chosen: dict[str, str] = {}
    for name, value in wanted:
        if value in product.options.get(name, []):
            chosen[name] = value
            continue
        best, best_score = None, 85
        for opt_name, values in product.options.items():
            if opt_name in chosen:
                continue
            for v in values:
                score = 101 if v == value else token_set_ratio(normalize_color(v), normalize_color(value))
                if score > best_score:
                    best, best_score = (opt_name, v), score
        if best is not None:
            chosen[best[0]] = best[1]
    return [f"click[{v}]" for v in chosen.values()]


def plan(catalog: Catalog, engine: SearchEngine, goal: Goal, max_steps: int = 10) -> OraclePlan:
    product = catalog.by_asin[goal.asin]
    tail = [f"click[{goal.asin}]", *option_clicks(product, goal), "click[Buy Now]"]
    fallback: OraclePlan | None = None
    for kind, query in candidate_queries(goal, product):
        results = engine.search(query)
        if goal.asin not in results:
            continue
        rank = results.index(goal.asin)
        actions = [f"search[{query}]", *["click[Next >]"] * (rank // 10), *tail]
        if len(actions) <= max_steps:
            return OraclePlan(actions, kind, rank)
        fallback = fallback or OraclePlan(actions, "not_found", rank)
    return fallback or OraclePlan([f"search[{product.title.lower()}]", *tail], "not_found", None)
