"""WebShop text environment: the original `WebAgentTextEnv` + `SimServer` state machine, in process.

Actions (as in the original): `search[keywords]` and `click[value]`, where value is one
of the page's clickables (case-insensitive: the original lowercases the argument).

Where this differs from the original, on purpose:
- `search[...]` is accepted only on the search page (the original ran a search from
  any page); pass `search_anywhere=True` for the original behaviour.
- An invalid action (malformed, unknown clickable, search off the search page, any
  action after the purchase) changes nothing and returns the *same page text*, as the
  original does; `info["invalid"]` is True, `info["invalid_reason"]` says why and
  `info["invalid_count"]` counts them. With `invalid_feedback=True` the observation
  is prefixed with "Invalid action! <reason>." instead.
- The env never raises on an action; `EnvError` only for a task from another catalog
  or a step before reset.
- The title score's nouns come from `title_nouns="content-words"` by default; the
  original's spaCy tagger is `title_nouns="spacy"` (optional extra `webshop-spacy`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from envs.base import EnvError, StepResult, Task
from envs.webshop import pages
from envs.webshop.catalog import load_catalog
from envs.webshop.products import Catalog, Goal
from envs.webshop.reward import get_reward, spacy_model_name, title_noun_function

_ACTION_RE = re.compile(r"^\s*([A-Za-z_]+)\s*\[(.*)\]\s*$", re.S)


def parse_action(action: str) -> tuple[str, str | None]:
    """("search"|"click"|other, lowercased stripped argument or None)."""
    m = _ACTION_RE.match(action or "")
    if m is None:
        return (action or "").strip(), None
    arg = m.group(2).strip().lower()
    return m.group(1).lower(), (arg or None)


def goal_index(task: Task) -> int:
    if "goal_index" in task.meta:
        return int(task.meta["goal_index"])
    m = re.fullmatch(r"goal-(\d+)", task.task_id)
    if m is None:
        raise EnvError(f"WebShop task id {task.task_id!r} is not of the form 'goal-<index>'")
    return int(m.group(1))


class WebShopEnv:
    """One shopping session at a time over a shared catalog and search index."""

    def __init__(
        self,
        data_path: str | os.PathLike[str] | None = None,
        *,
        catalog: Catalog | None = None,
        num_products: int | None = None,
        search_anywhere: bool = False,
        invalid_feedback: bool = False,
        title_nouns: str = "content-words",
    ) -> None:
        title_noun_function(title_nouns)  # unknown name -> ValueError now, not at the first purchase
        if title_nouns == "spacy":
            spacy_model_name()  # spaCy or its model missing -> RuntimeError now, with the install hint
        self.title_nouns = title_nouns
        self.catalog = catalog if catalog is not None else load_catalog(data_path, num_products)
        self.engine = self.catalog.search_engine
        self.search_anywhere = search_anywhere
        self.invalid_feedback = invalid_feedback
        self._page: pages.Page | None = None

    @property
    def catalog_name(self) -> str:
        return self.catalog.name

    # ------------------------------------------------------------ protocol

    def reset(self, task: Task) -> str:
        meta_catalog = task.meta.get("catalog")
        if meta_catalog is not None and meta_catalog != self.catalog.name:
            raise EnvError(
                f"Task {task.task_id} is from {meta_catalog!r} but this env serves {self.catalog.name!r}"
            )
        idx = goal_index(task)
        if not 0 <= idx < len(self.catalog.goals):
            raise EnvError(
                f"Task {task.task_id}: goal index {idx} out of range (catalog has {len(self.catalog.goals)} goals)"
            )
        goal = self.catalog.goals[idx]
        if task.meta.get("asin") not in (None, goal.asin):
            raise EnvError(
                f"Task {task.task_id} targets {task.meta['asin']} but goal {idx} here is {goal.asin}: different data"
            )
        self.goal: Goal = goal
        self.instruction = goal.instruction_text
        self._results: list[str] = []
        self._page_no = 1
        self._asin: str | None = None
        self._options: dict[str, str] = {}
        self._done = False
        self._reward = 0.0
        self._steps = 0
        self._invalid_count = 0
        self._final_info: dict[str, Any] = {}
        self._page = pages.search_page(self.instruction)
        return self._page.text

    def step(self, action: str) -> StepResult:
        if self._page is None:
            raise EnvError("step() called before reset()")
        self._steps += 1
        if self._done:
            return self._invalid("the episode is over (already purchased)")
        name, arg = parse_action(action)
        if name == "search" and arg:
            if not (self._page.has_search_bar or self.search_anywhere):
                return self._invalid(
                    "search is only available on the search page (click 'Back to Search' first)"
                )
            self._search(arg)
            return self._result()
        if name == "click" and arg is not None and arg != "search" and arg in self._page.clickables:
            return self._click(arg)
        if name in ("search", "click") and arg is not None:
            return self._invalid(f"'{arg}' is not a clickable on this page")
        return self._invalid("malformed action: expected search[keywords] or click[value]")

    def close(self) -> None:
        self._page = None

    # ------------------------------------------------------------ helpers for callers

    def available_actions(self) -> dict[str, Any]:
        """The original's `get_available_actions()`: search bar present, clickable texts."""
        if self._page is None:
            raise EnvError("available_actions() called before reset()")
        return self._page.available_actions()

    @property
    def observation(self) -> str:
        return self._page.text if self._page is not None else ""

    # ------------------------------------------------------------ transitions

    def _search(self, keywords: str) -> None:
        self._results = self.engine.search(keywords)
        self._show_results(1)

    def _show_results(self, page_no: int) -> None:
        self._page_no = page_no
        self._asin, self._options = None, {}
        shown = [self.catalog.by_asin[a] for a in pages.page_slice(self._results, page_no)]
        self._page = pages.results_page(self.instruction, shown, page_no, len(self._results))

    def _show_item(self) -> None:
        assert self._asin is not None
        self._page = pages.item_page(self.instruction, self.catalog.by_asin[self._asin])

    def _click(self, arg: str) -> StepResult:
        page, target = self._page, self._page.clickables[arg]
        if arg == pages.BUY_NOW.lower():
            return self._buy()
        if arg == pages.BACK_TO_SEARCH.lower():
            self._results, self._asin, self._options = [], None, {}
            self._page = pages.search_page(self.instruction)
        elif arg == pages.NEXT_PAGE.lower() and page.kind == "results":
            self._show_results(self._page_no + 1)
        elif arg == pages.PREV_PAGE.lower() and page.kind == "results":
            self._show_results(self._page_no - 1)
        elif arg == pages.PREV_PAGE.lower() and page.kind == "item":
            self._show_results(self._page_no)
        elif arg == pages.PREV_PAGE.lower():
            self._show_item()
        elif target.kind == "button" and target.value in pages.SUB_PAGES:
            self._page = pages.sub_page(self.instruction, self.catalog.by_asin[self._asin], target.value)
        elif target.kind == "product":
            self._asin = target.value
            self._show_item()
        else:  # option
            self._options[target.option_name] = target.value
            self._show_item()
        return self._result()

    def _buy(self) -> StepResult:
        product = self.catalog.by_asin[self._asin]
        reward, reward_info = get_reward(
            product.as_reward_dict(),
            self.goal.as_reward_dict(),
            self.catalog.prices[product.asin],
            self._options,
            title_nouns=self.title_nouns,
        )
        self._done, self._reward = True, float(reward)
        self._final_info = {
            "purchased_asin": product.asin,
            "purchased_options": dict(self._options),
            "target_asin": self.goal.asin,
            "reward_info": reward_info,
        }
        self._page = pages.done_page(product.asin, self._options, self._reward)
        return self._result(reward=self._reward)

    def _info(self, invalid_reason: str | None) -> dict[str, Any]:
        return {
            "page": self._page.kind,
            "invalid": invalid_reason is not None,
            "invalid_reason": invalid_reason,
            "invalid_count": self._invalid_count,
            "catalog": self.catalog.name,
            "asin": self._asin,
            "options": dict(self._options),
            "steps": self._steps,
            **self._final_info,
        }

    def _result(self, reward: float = 0.0) -> StepResult:
        success = self._done and self._reward == 1.0
        return StepResult(self._page.text, reward, self._done, success, self._info(None))

    def _invalid(self, reason: str) -> StepResult:
        self._invalid_count += 1
        obs = self._page.text
        if self.invalid_feedback:
            obs = f"Invalid action! {reason}.{pages.SEP}{obs}"
        success = self._done and self._reward == 1.0
        return StepResult(obs, 0.0, self._done, success, self._info(reason))
