"""The original WebShop data files, loaded the way WebShop's `engine.load_products` + `goal.get_goals` do (see
`catalog.py` for where they are looked up)."""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

from envs.data import data_dir
from envs.webshop.products import (
    CATALOG_ORIGINAL,
    GOAL_SHUFFLE_SEED,
    Catalog,
    Goal,
    Product,
    instructed_goal,
    make_goal,
    price_tag,
    read_json,
    split_indices,
)
from envs.webshop.reward import price_upper_for

PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTR_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_FILE = "items_human_ins.json"
REVIEW_FILE = "reviews.json"


def load_original(root: Path, product_file: Path, num_products: int | None = None) -> Catalog:
    """Load the original WebShop files the way `engine.load_products` + `goal.get_goals` do.

    Prices of ranged products and goal price bounds use seeded RNGs (the original left
    them to the unseeded global RNG), so the instruction's price clause is reproducible
    here but cannot equal any particular original run's.
    """
    raw = read_json(product_file)
    if num_products is not None:
        raw = raw[:num_products]
    attr_file = next((root / f for f in ATTR_FILES if (root / f).exists()), None)
    attrs = read_json(attr_file) if attr_file else {}
    human = read_json(root / HUMAN_FILE) if (root / HUMAN_FILE).exists() else None
    reviews = {}
    if (root / REVIEW_FILE).exists():
        reviews = {r["asin"]: r for r in read_json(root / REVIEW_FILE)}

    products: list[Product] = []
    raw_by_asin: dict[str, dict[str, Any]] = {}
    for p in raw:
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in raw_by_asin:
            continue
        raw_by_asin[asin] = p
        products.append(_original_product(p, attrs.get(asin, {}), reviews.get(asin)))

    price_rng = random.Random("webshop-product-prices")
    prices = {
        pr.asin: (pr.pricing[0] if len(pr.pricing) == 1 else price_rng.uniform(*pr.pricing[:2]))
        for pr in products
    }
    goal_rng = random.Random("webshop-goal-prices")
    if human is not None:
        goals = _human_goals(products, human, prices, goal_rng)
    else:
        goals = _synthetic_goals(products, attrs, prices, goal_rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    eto_dir = data_dir() / "splits" / "eto" if human is not None else None
    test, train = split_indices(len(goals), eto_dir)
    return Catalog(CATALOG_ORIGINAL, str(product_file), products, prices, goals, test, train)


def _original_product(p: dict[str, Any], attr: dict[str, Any], review: dict[str, Any] | None) -> Product:
    pricing_raw = p.get("pricing")
    if not pricing_raw:
        pricing = [100.0]
    else:
        pricing = [float(Decimal(re.sub(r"[^\d.]", "", x))) for x in pricing_raw.split("$")[1:]][:2]
    options: dict[str, list[str]] = {}
    for name, contents in (p.get("customization_options") or {}).items():
        if contents is None:
            continue
        options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    bullets = p.get("small_description") or []
    if not isinstance(bullets, list):
        bullets = [bullets]
    revs = []
    for r in (review or {}).get("reviews", []):
        revs.append(
            {
                "title": r.get("title", ""),
                "score": r.get("score", r.get("stars", "")),
                "body": r.get("review", r.get("body", "")),
            }
        )
    return Product(
        asin=p["asin"],
        title=p.get("name", ""),
        query=str(p.get("query", "")).lower().strip(),
        category=p.get("category", ""),
        product_category=p.get("product_category", ""),
        description=p.get("full_description") or "",
        bullet_points=[str(b) for b in bullets],
        attributes=list(attr.get("attributes", ["DUMMY_ATTR"])) if attr else ["DUMMY_ATTR"],
        options=options,
        pricing=pricing,
        price_tag=price_tag(pricing),
        reviews=revs,
        rating=str((review or {}).get("average_rating", "N.A.")),
    )


def _human_goals(
    products: list[Product], human: dict[str, Any], prices: dict[str, float], rng: random.Random
) -> list[Goal]:
    goals = []
    for product in products:
        for ins in human.get(product.asin, []):
            if not ins.get("instruction_attributes"):
                continue
            upper, price_text = price_upper_for(prices[product.asin], rng)
            text = ins["instruction"].strip(".") + price_text
            goals.append(
                make_goal(product, text, ins["instruction_attributes"], ins.get("instruction_options", []), upper)
            )
    return goals


def _synthetic_goals(
    products: list[Product], attrs: dict[str, Any], prices: dict[str, float], rng: random.Random
) -> list[Goal]:
    """One goal per option combination of each product with a synthetic instruction."""
    goals = []
    for product in products:
        info = attrs.get(product.asin, {})
        if not info.get("instruction"):
            continue
        upper, price_text = price_upper_for(prices[product.asin], rng)
        names = sorted(product.options)
        for combo in itertools.product(*(product.options[n] for n in names)):
            chosen = dict(zip(names, combo, strict=True))
            goals.append(instructed_goal(product, info, chosen, upper, price_text))
    return goals
