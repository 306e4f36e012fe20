"""Task synthesis for WebShop (curriculum stage 2): synthetic goals over the catalog's products.

A goal is what WebShop itself defines (`engine/goal.py`): the target `asin`, an
instruction text, the goal `attributes`, the goal `options` (option type -> value)
and a `price_upper` bound; the reward then scores any purchase against it. A
proposal's params are exactly those fields:

    {"asin": "B0...", "attributes": ["tempered glass", ...], "options": {"color": "silver"},
     "price_upper": 120.0, "instruction": "optional; written from the fields when absent"}

Candidates, harder on purpose: products no goal targets (`new_product`) and seed
products asked with every option type and more attributes (`more_constraints`), ranked
by the oracle's path length (more option clicks, result pages to turn).

Refused (ValueError with the reason): an unknown product, an option the product does not
offer, an attribute the product does not have (the reward could never reach 1), a price
bound below the product's price, an evaluation goal's product, a goal identical to a
seed's, and any goal whose own target product would not score 1.0.

The env accepts a synthesized goal through `Task.meta["synthetic_goal"]`:
`SyntheticGoalWebShopEnv` (a `WebShopEnv` that installs that goal at reset).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from envs.base import Env, EnvError, Task
from envs.webshop import MAX_STEPS, pages
from envs.webshop.catalog import load_catalog
from envs.webshop.env import WebShopEnv
from envs.webshop.oracle import plan
from envs.webshop.products import Catalog, Goal, Product
from envs.webshop.reward import get_attribute_reward, get_reward, price_upper_for

MAX_ATTRIBUTES = 3
SCHEMA = """params for a WebShop goal (as WebShop defines goals):
  "asin": the target product's id (it must exist in the catalog),
  "attributes": 1-3 attribute phrases the product really has (e.g. "tempered glass"),
  "options": {option type: value} using only option types and values the product offers,
  "price_upper": a price bound in dollars above the product's price,
  "instruction": (optional) the shopper's instruction; written from the fields when absent."""


class SyntheticGoalWebShopEnv(WebShopEnv):
    """`WebShopEnv` that also plays goals given in `task.meta["synthetic_goal"]` (a Goal as a dict)."""

    def reset(self, task: Task) -> str:
        raw = task.meta.get("synthetic_goal")
        if raw is None:
            return super().reset(task)
        try:
            goal = Goal(**raw)
        except TypeError as exc:
            raise ValueError(f"malformed synthetic goal in task {task.task_id}: {exc}") from None
        if goal.asin not in self.catalog.by_asin:
            raise ValueError(f"synthetic goal of {task.task_id} targets {goal.asin}, not in {self.catalog.name}")
        if not self.catalog.goals:
            raise EnvError("the catalog has no goals to start a session from")
        # Let the base class set up a fresh session, then swap in the synthesized goal.
        super().reset(Task(benchmark=task.benchmark, split=task.split, task_id="goal-0",
                           meta={"catalog": task.meta.get("catalog", self.catalog.name), "goal_index": 0}))
        self.goal = goal
        self.instruction = goal.instruction_text
        self._page = pages.search_page(self.instruction)
        return self._page.text


def instruction_for(product: Product, attributes: Sequence[str], options: dict[str, str], price_upper: float) -> str:
    """The stand-in catalog's instruction style: "Find me <attrs> <query> with <type>: <value>, and price lower than X"."""
    text = f"Find me {', '.join(attributes)} {product.query}".strip()
    if options:
        text += " with " + ", and ".join(f"{k}: {v}" for k, v in options.items())
    if price_upper < 1e6:
        text += f", and price lower than {price_upper:.2f} dollars"
    return text


def goal_dict(product: Product, attributes: Sequence[str], options: dict[str, str], price_upper: float, instruction: str) -> dict[str, Any]:
    return asdict(Goal(
        asin=product.asin, instruction_text=instruction, attributes=list(attributes), goal_options=dict(options),
        price_upper=float(price_upper), query=product.query, category=product.category,
        product_category=product.product_category, name=product.title,
    ))


def _goal_key(asin: str, attributes: Sequence[str], options: dict[str, str] | Sequence[str]) -> str:
    opts = sorted(options.values()) if isinstance(options, dict) else sorted(options)
    return json.dumps([asin, sorted(a.lower() for a in attributes), opts])


class WebShopSynthesizer:
    benchmark = "webshop"

    def __init__(self, data_path: str | None = None, max_steps: int = MAX_STEPS) -> None:
        self.data_path = data_path
        self.max_steps = max_steps  # the spec's episode limit: a synthesized goal gets the seeds' limit

    @property
    def catalog(self) -> Catalog:
        return load_catalog(self.data_path)

    def proposal_schema(self) -> str:
        return SCHEMA

    # ------------------------------------------------------------------ candidates
    def candidates(self, seeds: Sequence[Task], *, holdout: Sequence[Task], limit: int, seed: int = 0) -> list[dict[str, Any]]:
        catalog = self.catalog
        rng = random.Random(f"webshop-synthesis:{seed}")
        held_asins = {t.meta.get("asin") for t in holdout}
        held_queries = {t.meta.get("query") for t in holdout}
        goal_asins = {g.asin for g in catalog.goals}
        seed_asins = [t.meta.get("asin") for t in seeds if t.meta.get("asin") in catalog.by_asin]
        pool = [p for p in catalog.products if p.attributes and p.asin not in held_asins
                and p.query not in held_queries and p.asin not in goal_asins]
        rng.shuffle(pool)
        queues: dict[str, list[dict[str, Any]]] = {"more_constraints": [], "new_product": []}
        for asin in seed_asins:
            product = catalog.by_asin[asin]
            seed_task = next(t for t in seeds if t.meta.get("asin") == asin)
            n_seed_attrs = len(seed_task.meta.get("attributes", []))
            attrs = product.attributes[: max(n_seed_attrs + 1, 2)][:MAX_ATTRIBUTES]
            cand = self._candidate("more_constraints", product, attrs, rng,
                                   f"seed product {asin} with every option type and {len(attrs)} attributes")
            if cand:
                queues["more_constraints"].append(cand)
        for product in pool[: 4 * limit]:
            attrs = rng.sample(product.attributes, min(len(product.attributes), rng.randint(1, MAX_ATTRIBUTES)))
            cand = self._candidate("new_product", product, attrs, rng, f"new target {product.asin} ({product.query})")
            if cand:
                queues["new_product"].append(cand)
        seed_keys = {_goal_key(t.meta.get("asin", ""), t.meta.get("attributes", []), t.meta.get("goal_options", {}))
                     for t in seeds}
        for kind, q in queues.items():
            queues[kind] = [c for c in q if _goal_key(c["params"]["asin"], c["params"]["attributes"],
                                                      c["params"]["options"]) not in seed_keys]
        for q in queues.values():  # longest expert paths first: harder on purpose
            q.sort(key=lambda c: -c["expected_length"])
        out: list[dict[str, Any]] = []
        while len(out) < limit and any(queues.values()):
            for q in queues.values():
                if q and len(out) < limit:
                    out.append(q.pop(0))
        return out

    def _candidate(self, kind: str, product: Product, attrs: list[str], rng: random.Random, note: str) -> dict[str, Any] | None:
        catalog = self.catalog
        options = {name: rng.choice(values) for name, values in sorted(product.options.items())}
        upper, _ = price_upper_for(catalog.prices[product.asin], rng)
        instruction = instruction_for(product, attrs, options, upper)
        found = plan(catalog, catalog.search_engine, Goal(**goal_dict(product, attrs, options, upper, instruction)),
                     max_steps=self.max_steps)
        if found.query_kind == "not_found":
            return None
        params = {"asin": product.asin, "attributes": attrs, "options": options, "price_upper": upper,
                  "instruction": instruction}
        return {"kind": kind, "params": params, "expected_length": len(found.actions), "note": note}

    # ------------------------------------------------------------------ instantiate
    def instantiate(self, params: dict[str, Any], *, seeds: Sequence[Task], holdout: Sequence[Task]) -> Task:
        catalog = self.catalog
        unknown = sorted(set(params) - {"asin", "attributes", "options", "price_upper", "instruction"})
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; expected asin, attributes, options, price_upper, instruction")
        asin = params.get("asin")
        if not isinstance(asin, str) or asin.upper() not in catalog.by_asin:
            raise ValueError(f"unknown product asin {asin!r} (not in the {catalog.name})")
        product = catalog.by_asin[asin.upper()]
        if product.asin in {t.meta.get("asin") for t in holdout}:
            raise ValueError(f"{product.asin} is the product of an evaluation goal")
        attrs = params.get("attributes")
        if not isinstance(attrs, list) or not attrs or not all(isinstance(a, str) and a.strip() for a in attrs):
            raise ValueError("attributes must be a non-empty list of attribute phrases")
        attrs = [a.strip().lower() for a in attrs]
        reward_product = product.as_reward_dict()
        for a in attrs:
            _, hit = get_attribute_reward(reward_product, {"attributes": [a]})
            if not hit:
                raise ValueError(f"attribute {a!r} is not a property of {product.asin}, so no purchase can satisfy it")
        options = params.get("options") or {}
        if not isinstance(options, dict):
            raise ValueError("options must be an object {option type: value}")
        chosen: dict[str, str] = {}
        for name, value in options.items():
            key, val = str(name).strip().lower(), str(value).strip().lower()
            if key not in product.options:
                raise ValueError(f"{product.asin} has no option type {name!r} (it offers {sorted(product.options) or 'none'})")
            if val not in product.options[key]:
                raise ValueError(f"{product.asin} offers no {key} {value!r} (values: {product.options[key]})")
            chosen[key] = val
        price = catalog.prices[product.asin]
        raw_upper = params.get("price_upper")
        if raw_upper is None:
            upper, _ = price_upper_for(price, random.Random(f"webshop-price:{product.asin}"))
        else:
            try:
                upper = float(raw_upper)
            except (TypeError, ValueError):
                raise ValueError(f"price_upper must be a number, got {raw_upper!r}") from None
        if upper <= price:
            raise ValueError(f"price bound {upper:.2f} is not above the product's price {price:.2f}: impossible")
        instruction = params.get("instruction") or instruction_for(product, attrs, chosen, upper)
        if not isinstance(instruction, str):
            raise ValueError("instruction must be a string")
        goal = goal_dict(product, attrs, chosen, upper, instruction.strip())
        reward, info = get_reward(reward_product, goal, price, chosen)
        if reward != 1.0:
            raise ValueError(f"buying the target itself would score {reward:.2f}, not 1.0 ({info})")
        key = _goal_key(product.asin, attrs, chosen)
        for t in seeds:
            if _goal_key(t.meta.get("asin", ""), t.meta.get("attributes", []), t.meta.get("goal_options", {})) == key:
                raise ValueError(f"same goal as seed task {t.task_id}")
        digest = hashlib.sha1(json.dumps(goal, sort_keys=True).encode()).hexdigest()[:8]
        return Task(
            benchmark=self.benchmark, split="synthetic", task_id=f"synth-{product.asin}-{digest}", goal=instruction,
            max_steps=self.max_steps,
            meta={"catalog": catalog.name, "catalog_fingerprint": catalog.fingerprint, "synthetic": True,
                  "synthetic_goal": goal, "asin": product.asin, "category": product.category, "query": product.query,
                  "attributes": attrs, "goal_options": chosen, "price_upper": upper},
        )

    def make_env(self, **options: Any) -> Env:
        if "data_path" not in options and "catalog" not in options:
            options["catalog"] = self.catalog
        return SyntheticGoalWebShopEnv(**options)

    def solve(self, task: Task, env: Env) -> list[str]:
        """The oracle's path: search, page to the target, pick the goal options, buy."""
        catalog = getattr(env, "catalog", None) or self.catalog
        goal = Goal(**task.meta["synthetic_goal"])
        found = plan(catalog, catalog.search_engine, goal, max_steps=task.max_steps)
        if found.query_kind == "not_found":
            raise ValueError(f"no search finds {goal.asin} within {task.max_steps} steps")
        return list(found.actions)

