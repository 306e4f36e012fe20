"""WebShop's pages as text, in the original's "simple" text mode.

The original renders HTML templates and flattens every visible text node joined by
" [SEP] ". These functions emit the same text nodes in the same order without HTML
(templates of the version agents were evaluated on: "Page 1 (Total results: 50)",
"< Prev" on item pages, "Next >" on every results page). Empty nodes are dropped.
Each page also carries its clickables the way the original's `get_available_actions`
sees them: lowercased button and product-link texts, then option values as written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from envs.webshop.products import Product

SEP = " [SEP] "
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
PRODUCT_WINDOW = 10


@dataclass(frozen=True)
class Clickable:
    kind: str  # "button" | "product" | "option"
    value: str  # button label, ASIN, or option value
    option_name: str = ""


@dataclass(frozen=True)
class Page:
    kind: str  # search | results | item | description | features | reviews | done
    text: str
    clickables: dict[str, Clickable] = field(default_factory=dict)
    has_search_bar: bool = False

    def available_actions(self) -> dict[str, object]:
        return {"has_search_bar": self.has_search_bar, "clickables": list(self.clickables)}


def _join(texts: Sequence[str]) -> str:
    return SEP.join(t.strip() for t in texts if t and t.strip())


def _buttons(*labels: str) -> dict[str, Clickable]:
    return {label.lower(): Clickable("button", label) for label in labels}


def _header(instruction: str) -> list[str]:
    return ["Instruction:", instruction]


def search_page(instruction: str) -> Page:
    return Page(
        "search", _join(["WebShop", *_header(instruction), "Search"]), _buttons("Search"), has_search_bar=True
    )


def results_page(instruction: str, products: Sequence[Product], page: int, total: int) -> Page:
    """One page of results: the original shows "Next >" even on the last page."""
    nav = [PREV_PAGE, NEXT_PAGE] if page > 1 else [NEXT_PAGE]
    texts = [*_header(instruction), BACK_TO_SEARCH, f"Page {page} (Total results: {total})", *nav]
    clickables = _buttons(BACK_TO_SEARCH, *nav)
    for p in products:
        texts += [p.asin, p.title, p.price_tag]
        clickables[p.asin.lower()] = Clickable("product", p.asin)
    return Page("results", _join(texts), clickables)


def item_page(instruction: str, product: Product) -> Page:
    texts = [*_header(instruction), BACK_TO_SEARCH, PREV_PAGE]
    for name, values in product.options.items():
        texts += [name, *values]
    texts += [product.title, f"Price: {product.price_tag}", f"Rating: {product.rating}", *SUB_PAGES, BUY_NOW]
    clickables = _buttons(BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, BUY_NOW)
    for name, values in product.options.items():
        for value in values:
            clickables[value] = Clickable("option", value, name)
    return Page("item", _join(texts), clickables)


def sub_page(instruction: str, product: Product, which: str) -> Page:
    """Description, Features (bullet points) or Reviews of the current product."""
    if which == "Description":
        body = [product.description]
    elif which == "Features":
        body = list(product.bullet_points)
    else:
        body = []
        for r in product.reviews:
            body += [f'"{r["title"]}"', str(r["score"]), str(r["body"])]
    texts = [*_header(instruction), BACK_TO_SEARCH, PREV_PAGE, *body]
    return Page(which.lower(), _join(texts), _buttons(BACK_TO_SEARCH, PREV_PAGE))


def done_page(asin: str, options: Mapping[str, str], reward: float) -> Page:
    """Purchase confirmation. The original's hidden "Target" block (the goal) is left out on purpose."""
    texts = [
        "Thank you for shopping with us!",
        "Your code:",
        "(Paste it in your MTurk interface.)",
        "Purchased",
        "asin",
        asin,
        "options",
        json.dumps(dict(options)),
        "Your score (min 0.0, max 1.0)",
        str(reward),
    ]
    return Page("done", _join(texts))


def page_slice(items: Sequence[str], page: int) -> Sequence[str]:
    return items[(page - 1) * PRODUCT_WINDOW : page * PRODUCT_WINDOW]
