"""The stand-in catalog, synthesized deterministically from WebShop's instruction-attribute file when the
original catalog file is not there (see `catalog.py`).

Built only from items_ins_v2_1000.json: 1,000 ASINs with TF-IDF attributes, 415 of
them with a synthetic instruction "Find me <attrs> <category> with <attrs>". The
category phrase becomes the product's `query`; titles, descriptions, options,
prices and reviews are synthesized with RNGs seeded by ASIN, so the same input
gives the same bytes. Each goal product also gets two near misses in its category
(one lacking goal attributes, one over the price bound), with overlapping options,
so that choosing the right item, not just running the right search, matters.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

from envs.webshop.products import (
    CATALOG_STANDIN,
    GOAL_SHUFFLE_SEED,
    Catalog,
    Product,
    instructed_goal,
    price_tag,
    read_json,
    split_indices,
)
from envs.webshop.reward import normalize_color, price_upper_for, token_set_ratio

STANDIN_SOURCE = "items_ins_v2_1000.json"

FAMILIES: dict[str, dict[str, Any]] = {
    "fashion": {"top": "Clothing, Shoes & Jewelry", "price": (9.0, 60.0)},
    "beauty": {"top": "Beauty & Personal Care", "price": (4.0, 45.0)},
    "grocery": {"top": "Grocery & Gourmet Food", "price": (3.0, 35.0)},
    "electronics": {"top": "Electronics", "price": (12.0, 220.0)},
    "furniture": {"top": "Home & Kitchen", "price": (25.0, 380.0)},
}
_FAMILY_WORDS = {
    "fashion": "men's women's shirt shoe dress jean pant short sock sweater hoodie jacket coat sneaker boot "
    "sandal slipper pump flat loafer oxford clog mule swimsuit underwear lingerie blazer activewear polo henley "
    "footwear tops bodysuit jumpsuit suit",
    "beauty": "makeup hair skin body bath tooth dental tongue floss orthodontic deodorant fragrance lip eye nail "
    "shave scrub cotton refillable piercing tattoo wig shampoo conditioner styling palette remover toothpick "
    "serum lotion beauty",
    "grocery": "food snack meat seafood cheese beverage candy chocolate fruit milk pantry frozen wasabi granola "
    "meal applesauce cracker raisin gluten sugar",
    "electronics": "camera speaker headphone headset hdmi cable charger protector mount lens flash tripod projector "
    "player receiver amplifier soundbar surveillance vcr video virtual wearable iphone printer scanner power signal "
    "television turntable game streaming wireless surround binocular photography bluetooth mac usb",
    "furniture": "table bed mattress lamp sconce pendant chandelier chair desk cabinet stool ottoman mirror pillow "
    "blanket candle plant wall window rack bookcase nightstand vanit armoire island hall stand living dining "
    "bedroom sofa shelf storage furniture",
}
_FAMILY_OVERRIDES = {
    "men's fragrance": "beauty",
    "women's fragrance": "beauty",
    "sets fragrance": "beauty",
    "coat racks": "furniture",
    "car accessories": "electronics",
}
_PALETTE = (
    "black", "white", "grey", "navy", "red", "green", "beige", "brown", "pink", "purple", "khaki",
    "ivory", "teal", "olive", "burgundy", "silver", "gold", "charcoal", "coral", "mint", "yellow",
)  # fmt: skip
_OPTION_POOLS: dict[str, dict[str, tuple[str, ...]]] = {
    "clothing": {"color": _PALETTE, "size": ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large")},
    "shoes": {"color": _PALETTE, "size": ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")},
    "makeup": {"color": ("01 fair", "02 light", "03 medium", "04 tan", "05 deep", "rose", "coral", "nude", "plum", "mocha")},
    "beauty": {
        "scent": ("lavender", "vanilla", "eucalyptus", "unscented", "coconut", "lemon", "sandalwood", "peppermint", "jasmine"),
        "size": ("1 fl oz (pack of 1)", "2 fl oz (pack of 1)", "3.4 fl oz (pack of 1)", "8 fl oz (pack of 1)", "pack of 2", "pack of 3"),
    },
    "grocery": {
        "flavor name": ("original", "sea salt", "barbecue", "honey roasted", "cinnamon", "spicy", "garlic herb", "strawberry", "cheddar"),
        "size": ("4 ounce (pack of 1)", "8 ounce (pack of 1)", "12 ounce (pack of 2)", "pack of 6", "pack of 12", "24 count"),
    },
    "electronics": {
        "color": ("black", "white", "silver", "grey", "blue", "red"),
        "style": ("basic", "pro", "with carrying case", "2-pack", "bundle", "plus"),
    },
    "furniture": {
        "color": ("white", "black", "walnut", "espresso", "grey", "oak", "cherry", "natural", "navy", "green"),
        "size": ("small", "medium", "large", "24 inch", "32 inch", "40 inch", "47 inch"),
    },
    "bedding": {"color": ("white", "grey", "beige", "navy", "brown"), "size": ("twin", "full", "queen", "king", "california king")},
}  # fmt: skip
_SHOE_WORDS = (
    "shoe",
    "sneaker",
    "boot",
    "sandal",
    "slipper",
    "pump",
    "flats",
    "loafer",
    "oxford",
    "clog",
    "footwear",
)
_MAKEUP_WORDS = ("makeup", "lip", "eyes", "palette", "wig", "hair extension", "coloring")
_BRAND_SYLLABLES = ("lu", "ma", "ve", "ro", "ka", "zen", "tri", "no", "vi", "sol", "ar", "bel", "cor", "da", "el", "fi", "gra", "ha", "jo", "ke", "lo", "mi", "pra", "qu", "sa", "to", "ul", "wen", "xa", "yo")  # fmt: skip
_CLOSERS = (
    "Backed by a friendly customer service team.",
    "A thoughtful pick for everyday life.",
    "Designed and tested by our team.",
    "Makes a great gift for family and friends.",
    "Quality you can count on, order after order.",
)
_BULLET_TAILS = (
    "thoughtfully designed for daily use",
    "made to last",
    "easy to love",
    "checked by our quality team",
    "a favorite of our customers",
)
_REVIEW_TITLES = (
    "Great value",
    "Works as described",
    "Not bad",
    "Love it",
    "Would buy again",
    "Decent quality",
    "Okay for the price",
)


def parse_instruction_category(instruction: str, attributes: list[str]) -> str:
    """The category phrase of "Find me <attrs> <category> with|for <attrs>"."""
    rest = instruction[len("Find me ") :] if instruction.startswith("Find me ") else instruction
    for attr in attributes:
        if rest.startswith(attr + ", ") or rest.startswith(attr + " "):
            rest = rest[len(attr) :].lstrip(",").lstrip()
    for m in re.finditer(r" (with|for) ", rest):
        tail = re.split(r", | for | with ", rest[m.end() :])
        if all(part in attributes for part in tail):
            return rest[: m.start()].strip() or "products"
    return rest.strip() or "products"


def family_of(query: str, attributes: list[str]) -> str:
    """Broad WebShop category of a narrow category phrase (query words weigh 3x attributes)."""
    if query in _FAMILY_OVERRIDES:
        return _FAMILY_OVERRIDES[query]
    text_q, text_a = query.lower(), " ".join(attributes).lower()
    best, best_score = "beauty", -1
    for fam, words in _FAMILY_WORDS.items():
        score = sum(3 * (w in text_q) + (w in text_a) for w in words.split())
        if score > best_score:
            best, best_score = fam, score
    return best


def _product_category(query: str, fam: str) -> str:
    mid = {
        "beauty": "Personal Care",
        "grocery": "Pantry",
        "electronics": "Accessories & Supplies",
        "furniture": "Furniture",
    }
    if fam == "fashion":
        middle = (
            "Men"
            if query.startswith("men's")
            else "Women"
            if query.startswith("women's")
            else "Novelty & More"
        )
    else:
        middle = mid[fam]
    return f"{FAMILIES[fam]['top']} › {middle} › {_titlecase(query)}"


def _titlecase(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


def _option_kind(query: str, fam: str) -> str:
    if fam == "fashion":
        return "shoes" if any(w in query for w in _SHOE_WORDS) else "clothing"
    if fam == "beauty":
        return "makeup" if any(w in query for w in _MAKEUP_WORDS) else "beauty"
    if fam == "furniture" and any(w in query for w in ("bed", "mattress", "blanket")):
        return "bedding"
    return fam


def _brand(rng: random.Random) -> str:
    name = "".join(rng.choice(_BRAND_SYLLABLES) for _ in range(rng.choice((2, 2, 3))))
    return name.upper() if rng.random() < 0.2 else name.capitalize()


def _distinct_values(pool: tuple[str, ...], k: int, rng: random.Random, must: str | None = None) -> list[str]:
    """Up to k values whose color-normalized forms differ and are not fuzzy matches of each other."""
    picked: list[str] = [must] if must else []
    for value in rng.sample(pool, len(pool)):
        if len(picked) >= k:
            break
        if value in picked:
            continue
        norm = normalize_color(value)
        if any(normalize_color(v) == norm or token_set_ratio(normalize_color(v), norm) > 85 for v in picked):
            continue
        picked.append(value)
    return [v for v in pool if v in picked]  # pool order, like a product page


def _options(
    kind: str, rng: random.Random, text: str, like: dict[str, list[str]] | None = None
) -> dict[str, list[str]]:
    """Option types and values; values that occur in the page text are excluded (see reward fallback)."""
    pools = _OPTION_POOLS[kind]
    if like is not None:
        names = list(like)
    else:
        n_types = rng.choice((0, 1, 2, 2, 2)) if len(pools) > 1 else rng.choice((0, 1, 1))
        names = sorted(rng.sample(sorted(pools), n_types))
    options = {}
    for name in names:
        pool = tuple(v for v in pools[name] if v not in text)
        must = rng.choice(like[name]) if like is not None and rng.random() < 0.5 else None
        values = _distinct_values(pool, rng.randint(2, 5), rng, must if must in pool else None)
        if len(values) >= 2:
            options[name] = values
    return options


def _price(fam: str, rng: random.Random) -> list[float]:
    lo, hi = FAMILIES[fam]["price"]
    base = round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 2)
    base = math.floor(base) + rng.choice((0.99, 0.95, 0.49, 0.0, 0.5))
    if rng.random() < 0.15:
        return [round(base, 2), round(base * rng.uniform(1.1, 1.6), 2)]
    return [round(base, 2)]


def _text(brand: str, query: str, attrs: list[str], rng: random.Random) -> tuple[str, str, list[str]]:
    """Title, description and bullet points that mention exactly `attrs` (plus the category)."""
    shown = attrs[: rng.randint(1, 3)] if attrs else []
    pre, post = shown[:1], shown[1:]
    title = " ".join([brand, *(_titlecase(a) for a in pre), _titlecase(query)])
    if post:
        title += " with " + ", ".join(_titlecase(a) for a in post)
    if attrs:
        listed = ", ".join(attrs[:-1]) + (" and " if len(attrs) > 1 else "") + attrs[-1]
        description = f"Meet the {brand} {query}: {listed}. {rng.choice(_CLOSERS)}"
    else:
        description = f"{brand} {query}. {rng.choice(_CLOSERS)}"
    bullets = [f"{a.upper()}: {rng.choice(_BULLET_TAILS)}" for a in attrs] or [f"{brand} {query}"]
    return title, description, bullets


def _reviews(attrs: list[str], rng: random.Random) -> tuple[list[dict[str, Any]], str]:
    reviews = []
    for _ in range(rng.choice((0, 0, 1, 2, 3))):
        score = rng.choice((2, 3, 4, 4, 5, 5))
        about = f" The {rng.choice(attrs)} part is as described." if attrs else ""
        reviews.append(
            {"title": rng.choice(_REVIEW_TITLES), "score": score, "body": f"Arrived on time.{about}"}
        )
    rating = f"{sum(r['score'] for r in reviews) / len(reviews):.1f}" if reviews else "N.A."
    return reviews, rating


def _synth_product(
    asin: str,
    query: str,
    fam: str,
    attrs: list[str],
    text_attrs: list[str],
    rng: random.Random,
    like: Product | None = None,
) -> Product:
    brand = _brand(rng)
    title, description, bullets = _text(brand, query, text_attrs, rng)
    page_text = " ".join([title, description, *bullets]).lower()
    options = _options(_option_kind(query, fam), rng, page_text, like.options if like else None)
    pricing = _price(fam, rng)
    reviews, rating = _reviews(text_attrs, rng)
    return Product(
        asin=asin,
        title=title,
        query=query,
        category=fam,
        product_category=_product_category(query, fam),
        description=description,
        bullet_points=bullets,
        attributes=list(attrs),
        options=options,
        pricing=pricing,
        price_tag=price_tag(pricing),
        reviews=reviews,
        rating=rating,
    )


def _new_asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def build_standin(ins_path: Path) -> Catalog:
    """Synthesize the stand-in catalog and goals from WebShop's instruction-attribute file."""
    items: dict[str, dict[str, Any]] = read_json(ins_path)
    seed = "webshop-standin-v1"
    queries = {
        a: parse_instruction_category(v["instruction"], v["instruction_attributes"])
        for a, v in items.items()
        if v.get("instruction")
    }
    instructed = list(queries)
    all_queries = sorted(set(queries.values()))
    attrs_by_query: dict[str, list[str]] = {}
    for asin in instructed:
        pool = attrs_by_query.setdefault(queries[asin], [])
        pool.extend(a for a in items[asin]["attributes"] if a not in pool)

    family = {q: family_of(q, pool) for q, pool in attrs_by_query.items()}
    products: list[Product] = []
    taken = set(items)
    goal_products: dict[str, Product] = {}
    for asin, info in items.items():
        rng = random.Random(f"{seed}:{asin}")
        attrs = list(info.get("attributes", []))
        if asin in queries:
            query = queries[asin]
        else:
            query = _nearest_query(attrs, instructed, items, queries, all_queries, rng)
        text_attrs = attrs or rng.sample(
            attrs_by_query[query], min(len(attrs_by_query[query]), rng.randint(1, 3))
        )
        product = _synth_product(asin, query, family[query], attrs, text_attrs, rng)
        products.append(product)
        if asin in queries:
            goal_products[asin] = product

    # Two near misses per goal product, shuffled in beside it: one lacks goal attributes,
    # one has them all but is over any goal price bound.
    final: list[Product] = []
    for product in products:
        if product.asin not in goal_products:
            final.append(product)
            continue
        rng = random.Random(f"{seed}:distractor:{product.asin}")
        group = [
            product,
            _distractor(
                product,
                items[product.asin]["instruction_attributes"],
                attrs_by_query[product.query],
                taken,
                rng,
            ),
            _overpriced(product, taken, rng),
        ]
        rng.shuffle(group)
        final.extend(group)

    prices = {}
    for p in final:
        rng = random.Random(f"{seed}:price:{p.asin}")
        prices[p.asin] = p.pricing[0] if len(p.pricing) == 1 else round(rng.uniform(*p.pricing[:2]), 2)

    goals = []
    for asin in instructed:
        product, info = goal_products[asin], items[asin]
        rng = random.Random(f"{seed}:goal:{asin}")
        chosen = {name: rng.choice(values) for name, values in sorted(product.options.items())}
        upper, price_text = price_upper_for(prices[asin], rng)
        goals.append(instructed_goal(product, info, chosen, upper, price_text))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    test, train = split_indices(len(goals))
    return Catalog(CATALOG_STANDIN, str(ins_path), final, prices, goals, test, train)


def _nearest_query(
    attrs: list[str],
    instructed: list[str],
    items: dict[str, Any],
    queries: dict[str, str],
    all_queries: list[str],
    rng: random.Random,
) -> str:
    """Category of the instructed product sharing most attributes (random on ties or none)."""
    best, best_overlap = [], 0
    for other in instructed:
        overlap = len(set(attrs) & set(items[other]["attributes"]))
        if overlap > best_overlap:
            best, best_overlap = [queries[other]], overlap
        elif overlap == best_overlap and overlap > 0:
            best.append(queries[other])
    return rng.choice(sorted(set(best))) if best else rng.choice(all_queries)


def _overpriced(product: Product, taken: set[str], rng: random.Random) -> Product:
    """Same attributes and category, but priced at least $45 above the product's top price.

    Goal bounds are at most the fourth multiple of ten above the price, so this one
    always fails the price check.
    """
    twin = _synth_product(
        _new_asin(rng, taken),
        product.query,
        product.category,
        product.attributes,
        product.attributes,
        rng,
        like=product,
    )
    twin.pricing = [round(max(product.pricing) + rng.uniform(45.0, 90.0), 2)]
    twin.price_tag = price_tag(twin.pricing)
    return twin


def _distractor(
    product: Product, goal_attrs: list[str], query_attrs: list[str], taken: set[str], rng: random.Random
) -> Product:
    """Same category, about half the goal attributes dropped, overlapping options, new brand."""
    drop = set(rng.sample(goal_attrs, max(1, len(goal_attrs) // 2)))
    kept = [a for a in product.attributes if a not in drop]
    borrowed = [
        a
        for a in query_attrs
        if a not in kept and not any(d in a or a in d or token_set_ratio(a, d) > 85 for d in drop)
    ]
    attrs = kept + rng.sample(borrowed, min(len(borrowed), rng.randint(0, 2)))
    return _synth_product(
        _new_asin(rng, taken), product.query, product.category, attrs, attrs, rng, like=product
    )
