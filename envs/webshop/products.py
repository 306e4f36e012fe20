"""What a WebShop catalog is made of, whichever data it was built from (`catalog.load_catalog` picks):
products, goals (a shopping instruction and what satisfies it), the catalog itself and its test/train split."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

CATALOG_STANDIN = "stand-in catalog (built from items_ins_v2_1000.json)"
CATALOG_ORIGINAL = "original WebShop data"
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


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def make_goal(product: Product, text: str, attributes: list[str], options: Any, upper: float) -> Goal:
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


def instruction_with(base: str, options: dict[str, str], price_text: str) -> str:
    option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
    return f"{base}{' with ' + option_text if option_text else ''}{price_text}"


def instructed_goal(product: Product, item: dict[str, Any], chosen: dict[str, str], upper: float,
                    price_text: str) -> Goal:
    """The goal of an instructed item (its `instruction` and `instruction_attributes`) with the options chosen
    and a price bound: how both the original data's goals and the stand-in's are written."""
    return make_goal(product, instruction_with(item["instruction"], chosen, price_text),
                     item["instruction_attributes"], chosen, upper)
