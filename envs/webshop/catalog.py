"""WebShop products and goals: the original data files when given, else a stand-in.

Original files (from WebShop's own setup), looked up in `data_path`, else
`$FLYWHEEL_WEBSHOP_DIR`, else `<data_dir>/webshop`:

- `items_shuffle.json` or `items_shuffle_1000.json`: the product catalog,
- `items_ins_v2.json` / `items_ins_v2_1000.json`: attributes (+ synthetic instructions),
- `items_human_ins.json`: human instructions (the goals ETO/BPO evaluate on), optional,
- `reviews.json`: optional.

Only `items_ins_v2_1000.json` exists on the project's machines, so without a catalog
file a deterministic stand-in is synthesized from it (see `build_standin`). Every
report must name which one ran: `Catalog.name` is `CATALOG_STANDIN` or `CATALOG_ORIGINAL`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import re
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.data import MissingDataError, data_dir
from envs.webshop.reward import normalize_color, price_upper_for, token_set_ratio

ENV_VAR = "FLYWHEEL_WEBSHOP_DIR"
CATALOG_STANDIN = "stand-in catalog (built from items_ins_v2_1000.json)"
CATALOG_ORIGINAL = "original WebShop data"
PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTR_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_FILE = "items_human_ins.json"
REVIEW_FILE = "reviews.json"
STANDIN_SOURCE = "items_ins_v2_1000.json"
GOAL_SHUFFLE_SEED = 233  # the original shuffles its goal list with random.seed(233)
N_TEST = 200

if TYPE_CHECKING:
    from envs.webshop.search import SearchEngine


@dataclass
class Product:
    """One product, with the fields the pages and the reward read (original key names in comments)."""

    asin: str
    title: str  # Title / name
    query: str
    category: str
    product_category: str
    description: str  # Description
    bullet_points: list[str]  # BulletPoints
    attributes: list[str]  # Attributes
    options: dict[str, list[str]]  # option type -> values, lowercased, '/' -> ' | '
    pricing: list[float]
    price_tag: str  # Price, e.g. "$12.99" or "$10.0 to $15.5"
    reviews: list[dict[str, Any]] = field(default_factory=list)  # {title, score, body}
    rating: str = "N.A."

    def as_reward_dict(self) -> dict[str, Any]:
        """The product in the original's dict shape, as `get_reward` expects."""
        return {
            "asin": self.asin,
            "name": self.title,
            "Title": self.title,
            "query": self.query,
            "category": self.category,
            "product_category": self.product_category,
            "Description": self.description,
            "BulletPoints": self.bullet_points,
            "Attributes": self.attributes,
        }


@dataclass
class Goal:
    """One shopping instruction and what satisfies it (the original goal dict)."""

    asin: str
    instruction_text: str
    attributes: list[str]
    goal_options: dict[str, str] | list[str]
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str

    def as_reward_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Catalog:
    name: str
    source: str
    products: list[Product]
    prices: dict[str, float]  # the price the reward compares with price_upper
    goals: list[Goal]  # already in the original's seed-233 shuffled order
    test_indices: list[int]
    train_indices: list[int]
    by_asin: dict[str, Product] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}

    def to_json(self) -> bytes:
        """Canonical bytes of everything an episode can see or be scored on."""
        payload = {
            "name": self.name,
            "products": [asdict(p) for p in self.products],
            "prices": self.prices,
            "goals": [asdict(g) for g in self.goals],
            "test": self.test_indices,
            "train": self.train_indices,
        }
        return json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()

    @cached_property
    def search_engine(self) -> SearchEngine:
        """This catalog's BM25 index, built on first use (about a second) and kept with the catalog."""
        from envs.webshop.search import SearchEngine

        return SearchEngine(self.products)

    @cached_property
    def fingerprint(self) -> str:
        """Short content hash, so reports can tell two catalogs apart."""
        return hashlib.sha256(self.to_json()).hexdigest()[:12]


# ---------------------------------------------------------------- lookup


def webshop_dir(data_path: str | os.PathLike[str] | None = None) -> Path:
    if data_path:
        return Path(data_path).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return data_dir() / "webshop"


def load_catalog(data_path: str | os.PathLike[str] | None = None, num_products: int | None = None) -> Catalog:
    """The catalog at `data_path` (original files if present, else the stand-in), cached."""
    return _load_cached(str(webshop_dir(data_path).resolve()), num_products)


@lru_cache(maxsize=4)
def _load_cached(folder: str, num_products: int | None) -> Catalog:
    root = Path(folder)
    product_file = next((root / f for f in PRODUCT_FILES if (root / f).exists()), None)
    if product_file is not None:
        return load_original(root, product_file, num_products=num_products)
    if (root / STANDIN_SOURCE).exists():
        return build_standin(root / STANDIN_SOURCE)
    raise MissingDataError(
        f"No WebShop data in {root}: expected {' or '.join(PRODUCT_FILES)} (original catalog) or "
        f"{STANDIN_SOURCE} (to build the stand-in). Pass data_path=... or set {ENV_VAR}."
    )


def split_indices(n_goals: int, eto_dir: Path | None = None) -> tuple[list[int], list[int]]:
    """Test/train goal indices: ETO's index files when they fit, else the first 200 shuffled goals."""
    if eto_dir is not None:
        test_f, train_f = eto_dir / "webshop_test_indices.json", eto_dir / "webshop_train_indices.json"
        if test_f.exists() and train_f.exists():
            test, train = json.loads(test_f.read_text()), json.loads(train_f.read_text())
            if max(test + train) < n_goals:
                return test, train
    n_test = min(N_TEST, max(1, n_goals // 2))
    return list(range(n_test)), list(range(n_test, n_goals))


def price_tag(pricing: list[float]) -> str:
    return f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"


# ---------------------------------------------------------------- original files


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_original(root: Path, product_file: Path, num_products: int | None = None) -> Catalog:
    """Load the original WebShop files the way `engine.load_products` + `goal.get_goals` do.

    Prices of ranged products and goal price bounds use seeded RNGs (the original left
    them to the unseeded global RNG), so the instruction's price clause is reproducible
    here but cannot equal any particular original run's.
    """
    raw = _read_json(product_file)
    if num_products is not None:
        raw = raw[:num_products]
    attr_file = next((root / f for f in ATTR_FILES if (root / f).exists()), None)
    attrs = _read_json(attr_file) if attr_file else {}
    human = _read_json(root / HUMAN_FILE) if (root / HUMAN_FILE).exists() else None
    reviews = {}
    if (root / REVIEW_FILE).exists():
        reviews = {r["asin"]: r for r in _read_json(root / REVIEW_FILE)}

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


def _goal(product: Product, text: str, attributes: list[str], options: Any, upper: float) -> Goal:
    return Goal(
        asin=product.asin,
        instruction_text=text,
        attributes=list(attributes),
        goal_options=options,
        price_upper=upper,
        query=product.query,
        category=product.category,
        product_category=product.product_category,
        name=product.title,
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
                _goal(product, text, ins["instruction_attributes"], ins.get("instruction_options", []), upper)
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
            goals.append(
                _goal(
                    product,
                    _instruction(info["instruction"], chosen, price_text),
                    info["instruction_attributes"],
                    chosen,
                    upper,
                )
            )
    return goals


def _instruction(base: str, options: dict[str, str], price_text: str) -> str:
    option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
    return f"{base}{' with ' + option_text if option_text else ''}{price_text}"


# ---------------------------------------------------------------- stand-in catalog
#
# Built only from items_ins_v2_1000.json: 1,000 ASINs with TF-IDF attributes, 415 of
# them with a synthetic instruction "Find me <attrs> <category> with <attrs>". The
# category phrase becomes the product's `query`; titles, descriptions, options,
# prices and reviews are synthesized with RNGs seeded by ASIN, so the same input
# gives the same bytes. Each goal product also gets two near misses in its category
# (one lacking goal attributes, one over the price bound), with overlapping options,
# so that choosing the right item, not just running the right search, matters.

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
    items: dict[str, dict[str, Any]] = _read_json(ins_path)
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
        goals.append(
            _goal(
                product,
                _instruction(info["instruction"], chosen, price_text),
                info["instruction_attributes"],
                chosen,
                upper,
            )
        )
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
