"""WebShop's complexity signals for the curriculum (`WebShopSpec.complexity_signals`).

- `locations`: the pages a trajectory went to: each distinct search and product page.
- `subgoals`: the choices made on a product page: each distinct option click, and the purchase
  (product, paging and back-to-search clicks only navigate).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.base import StepView

INVALID_PREFIX = "Invalid action!"  # how envs/webshop/env.py answers an action it refuses
_PRODUCT = re.compile(r"click\[b0[0-9a-z]{8}\]")
_NAVIGATION = re.compile(r"click\[(b0[0-9a-z]{8}|next >|< prev|back to search)\]")


def _valid_actions(steps: Sequence[StepView]) -> list[str]:
    return [s.action.strip().lower() for s in steps
            if not s.invalid and not s.next_observation.lstrip().startswith(INVALID_PREFIX)]


def pages_visited(steps: Sequence[StepView]) -> float:
    """Distinct searches and product pages."""
    return float(len({a for a in _valid_actions(steps) if a.startswith("search[") or _PRODUCT.match(a)}))


def choices_made(steps: Sequence[StepView]) -> float:
    """Distinct option clicks, plus the purchase."""
    return float(len({a for a in _valid_actions(steps) if a.startswith("click[") and not _NAVIGATION.match(a)}))
