"""WebShop (text mode) as a flywheel benchmark.

Splits: WebShop has one test set, so "seen", "unseen" and "test" all give the same 200
held-out goals (papers report a single WebShop column); "train" gives the rest. With
the original human-instruction data the ETO index files (shared data
`splits/eto/webshop_{test,train}_indices.json`) define them; otherwise the first 200
goals of the seed-233 shuffled goal list are the test set. `task_types` filters by
the goal's broad category (the stand-in uses beauty, electronics, fashion, furniture,
grocery; original data uses its own `category` values).

Which data ran is never implicit: `SPEC.catalog_name`, every `Task.meta["catalog"]`
and every step's `info["catalog"]` say "original WebShop data" or
"stand-in catalog (built from items_ins_v2_1000.json)".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from envs.base import StepView, Task
from envs.webshop.catalog import load_catalog
from envs.webshop.env import WebShopEnv, goal_index
from envs.webshop.oracle import OraclePlan, plan
from envs.webshop.products import CATALOG_ORIGINAL, CATALOG_STANDIN, Catalog
from envs.webshop.prompts import describe_action, normalize_action, system_prompt

if TYPE_CHECKING:
    from envs.webshop.synthesis import WebShopSynthesizer

MAX_STEPS = 10  # ETO protocol
TEST_SPLITS = ("seen", "unseen", "test")


@dataclass
class WebShopSpec:
    """BenchmarkSpec for WebShop; data loads lazily on first use.

    Options (`configure_spec` / `EnvResource.spec_options`): `data_path`, `max_steps`, and
    `prompt` ("full", or "compact": the same rules in about a third of the tokens).
    """

    name = "webshop"
    display_name: ClassVar[str] = "WebShop"
    # One test set: "seen" and "unseen" are the same 200 goals, so evaluation plays it once
    # (reported in the "unseen" column, as the paper's single WebShop column).
    eval_splits = ("unseen",)
    # The paper reports WebShop's average reward (partial credit for attributes, options, price).
    primary_metric: ClassVar[str] = "avg_reward"
    paper_notes: ClassVar[tuple[str, ...]] = (
        "WebShop runs on the stand-in catalog built from items_ins_v2_1000.json (the original product files "
        "cannot be fetched here); its number is the average reward over the test goals played.",)
    # Evaluation buckets by the oracle's length: search, product, options..., buy; > 5 needs paging.
    eval_bucket_edges: ClassVar[tuple[float, ...]] = (4, 5)

    data_path: str | None = None
    max_steps: int = MAX_STEPS
    prompt: str = "full"
    # Per-instance caches (a configured copy starts empty), owned by this spec object.
    _plans: dict[tuple[str, int], OraclePlan] = field(default_factory=dict, init=False, repr=False, compare=False)
    _query_kinds: Counter[str] = field(default_factory=Counter, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        system_prompt(self.max_steps, self.prompt)  # an unknown prompt fails here, naming the valid ones

    @property
    def catalog(self) -> Catalog:
        return load_catalog(self.data_path)

    @property
    def catalog_name(self) -> str:
        return self.catalog.name

    def load_tasks(
        self, split: str, *, limit: int | None = None, task_types: tuple[str, ...] | None = None
    ) -> list[Task]:
        catalog = self.catalog
        if split in TEST_SPLITS:
            indices = catalog.test_indices
        elif split == "train":
            indices = catalog.train_indices
        else:
            raise ValueError(f"Unknown WebShop split {split!r}; use 'train', 'seen', 'unseen' or 'test'")
        tasks = []
        for i in indices:
            goal = catalog.goals[i]
            if task_types and goal.category not in task_types:
                continue
            tasks.append(
                Task(
                    benchmark=self.name,
                    split=split,
                    task_id=f"goal-{i}",
                    goal=goal.instruction_text,
                    max_steps=self.max_steps,
                    meta={
                        "catalog": catalog.name,
                        "catalog_fingerprint": catalog.fingerprint,
                        "goal_index": i,
                        "asin": goal.asin,
                        "category": goal.category,
                        "query": goal.query,
                        "attributes": list(goal.attributes),
                        "goal_options": goal.goal_options,
                        "price_upper": goal.price_upper,
                    },
                )
            )
            if limit is not None and len(tasks) >= limit:
                break
        return tasks

    def make_env(self, **options: Any) -> WebShopEnv:
        """Options: data_path, num_products, search_anywhere, invalid_feedback, title_nouns."""
        if "data_path" not in options and "catalog" not in options:
            options["catalog"] = self.catalog
        return WebShopEnv(**options)

    def system_prompt(self) -> str:
        return system_prompt(self.max_steps, self.prompt)

    def expert_plan(self, task: Task) -> OraclePlan:
        catalog = self.catalog
        key = (catalog.fingerprint, goal_index(task))
        if key not in self._plans:
            found = plan(catalog, catalog.search_engine, catalog.goals[key[1]], max_steps=task.max_steps)
            self._plans[key] = found
            self._query_kinds[found.query_kind] += 1
        return self._plans[key]

    def expert_actions(self, task: Task) -> list[str]:
        return list(self.expert_plan(task).actions)

    def expert_stats(self) -> dict[str, int]:
        """How many planned goals needed which query (instruction / attributes / title / not_found)."""
        return dict(self._query_kinds)

    def normalize_action(self, raw: str) -> str:
        return normalize_action(raw)

    def describe_action(self, action: str) -> str:
        return describe_action(action)

    def complexity_signals(self) -> dict[str, Callable[[Sequence[StepView]], float]]:
        """`locations` = searches and product pages; `subgoals` = option clicks and the purchase."""
        from envs.webshop.complexity import choices_made, pages_visited

        return {"locations": pages_visited, "subgoals": choices_made}

    def synthesizer(self) -> WebShopSynthesizer:
        """Stage 2's task synthesizer, imported on first use (only the curriculum needs it): this spec's catalog,
        and its step limit for the synthesized goals, as the seeds have."""
        from envs.webshop.synthesis import WebShopSynthesizer

        return WebShopSynthesizer(data_path=self.data_path, max_steps=self.max_steps)


SPEC = WebShopSpec()

__all__ = ["CATALOG_ORIGINAL", "CATALOG_STANDIN", "MAX_STEPS", "SPEC", "WebShopEnv", "WebShopSpec"]
