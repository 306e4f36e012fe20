"""Task synthesis for ScienceWorld (curriculum stage 2): new tasks the real engine loads and judges.

A proposal's params: {"task_name": engine or ETO name, "variation": int, "simplification": str}.
Kinds of candidate offered near the seeds (the ETO train tasks in use):

- unused_variation: a train variation of a seed's task type that no seed uses;
- harder_task_type: a train variation of another task type in the same topic (the
  engine's `<topic>-<n>` ids) whose typical gold path is longer;
- harder_setting: a seed's task type with fewer simplifications (`""`: doors and
  containers start closed, no teleport). The engine's gold path has the same length
  under both settings (measured), so this kind is harder for the policy, not longer.

Refused (ValueError with the reason): unknown task names, non-integer or negative
variations, unknown simplifications, `noElectricalAction` on an electrical task (the
engine refuses it), the seen/unseen evaluation tasks, and exact seeds. A variation the
engine cannot load is refused when the env resets it.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from itertools import zip_longest
from typing import Any

from scienceworld.constants import ID2TASK

from envs.base import Env, EnvError, Task
from envs.data import MissingDataError, require
from envs.scienceworld.adapter import SIMPLIFICATIONS, ScienceWorldEnv
from envs.scienceworld.tasks import (
    DEFAULT_SIMPLIFICATION,
    load_tasks,
    make_task,
    max_steps_table,
    resolve_task_name,
)

GOLD_LENGTH_SAMPLE = "splits/sciworld_gold_path_lengths_sample.json"
HARDER_SETTING = ""  # no simplifications at all
KINDS = ("unused_variation", "harder_task_type", "harder_setting")

SCHEMA = """params for a ScienceWorld task:
  "task_name": one of the engine's 30 task types (e.g. "find-living-thing", "boil"),
  "variation": integer variation index of that task type (a training variation; evaluation ones are refused),
  "simplification": "easy" (the default: all simplifications) or "" (none: doors and containers closed,
                    no teleport) or a comma list of teleportAction, openDoors, openContainers,
                    selfWateringFlowerPots, noElectricalAction."""


def topic_of(task_name: str) -> str:
    """The engine's topic id of a task type: "4" for find-living-thing ("4-1")."""
    for key, name in ID2TASK.items():
        if name == task_name:
            return key.split("-")[0]
    return ""


@cache
def typical_lengths() -> dict[str, float]:
    """Median gold length per task type from the shared sample file, else half the ETO step limit."""
    table = {name: limit / 2 for name, limit in max_steps_table().items()}
    try:
        sample = json.loads(require(GOLD_LENGTH_SAMPLE).read_text())
    except MissingDataError:
        return table
    for name, lengths in sample.items():
        try:
            table[resolve_task_name(name)] = float(statistics.median(lengths))
        except ValueError:
            continue
    return table


def _key(name: str, variation: int) -> tuple[str, int]:
    return (name, int(variation))


def _simplification_of(task: Task) -> str:
    return str(task.meta.get("simplification", DEFAULT_SIMPLIFICATION))


def synthetic_task_id(name: str, variation: int, simplification: str) -> str:
    base = f"{name}/{int(variation)}"
    return base if simplification == DEFAULT_SIMPLIFICATION else f"{base}@{simplification or 'none'}"


class ScienceWorldSynthesizer:
    benchmark = "scienceworld"

    def proposal_schema(self) -> str:
        return SCHEMA

    def candidates(self, seeds: Sequence[Task], *, holdout: Sequence[Task], limit: int, seed: int = 0) -> list[dict[str, Any]]:
        rng = random.Random(f"scienceworld-synthesis:{seed}")
        used = {_key(t.meta["task_name"], t.meta["variation"]) for t in seeds}
        held = {_key(t.meta["task_name"], t.meta["variation"]) for t in holdout}
        train = [t for t in load_tasks("train") if _key(t.meta["task_name"], t.meta["variation"]) not in used | held]
        by_type: dict[str, list[int]] = {}
        for t in train:
            by_type.setdefault(t.meta["task_name"], []).append(int(t.meta["variation"]))
        typical = typical_lengths()
        seed_types = list(dict.fromkeys(t.meta["task_name"] for t in seeds))
        queues: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for name in seed_types:
            spare = list(by_type.get(name, []))
            rng.shuffle(spare)
            for v in spare:
                queues["unused_variation"].append(self._candidate(
                    "unused_variation", name, v, DEFAULT_SIMPLIFICATION, typical,
                    f"unused train variation {v} of {name}"))
            for v in spare[::-1][: max(1, len(spare) // 4)]:
                queues["harder_setting"].append(self._candidate(
                    "harder_setting", name, v, HARDER_SETTING, typical,
                    f"{name} variation {v} without simplifications (closed doors and containers, no teleport)"))
            topic = topic_of(name)
            others = [o for o in sorted(by_type) if o != name and topic and topic_of(o) == topic
                      and typical.get(o, 0) > typical.get(name, 0)]
            per_type = []
            for other in others:
                spare_other = list(by_type[other])
                rng.shuffle(spare_other)
                per_type.append([self._candidate(
                    "harder_task_type", other, v, DEFAULT_SIMPLIFICATION, typical,
                    f"{other} (same topic as {name}, typically ~{typical.get(other, 0):g} vs "
                    f"~{typical.get(name, 0):g} gold steps), variation {v}") for v in spare_other[:8]])
            for group in zip_longest(*per_type):  # take turns between the harder task types
                queues["harder_task_type"].extend(c for c in group if c is not None)
        out: list[dict[str, Any]] = []
        while len(out) < limit and any(queues.values()):
            for kind in KINDS:
                if queues[kind] and len(out) < limit:
                    out.append(queues[kind].pop(0))
        return out

    @staticmethod
    def _candidate(kind: str, name: str, variation: int, simplification: str, typical: dict[str, float], note: str) -> dict[str, Any]:
        return {"kind": kind, "params": {"task_name": name, "variation": variation, "simplification": simplification},
                "expected_length": round(typical.get(name, 0)), "note": note}

    def instantiate(self, params: dict[str, Any], *, seeds: Sequence[Task], holdout: Sequence[Task]) -> Task:
        unknown = sorted(set(params) - {"task_name", "variation", "simplification"})
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; expected task_name, variation, simplification")
        if not isinstance(params.get("task_name"), str):
            raise ValueError("task_name must be a string naming a ScienceWorld task type")
        name = resolve_task_name(params["task_name"])  # ValueError lists the valid names
        raw_var = params.get("variation")
        if isinstance(raw_var, bool) or not isinstance(raw_var, int | str):
            raise ValueError(f"variation must be an integer, got {raw_var!r}")
        try:
            variation = int(raw_var)
        except ValueError:
            raise ValueError(f"variation must be an integer, got {raw_var!r}") from None
        if variation < 0:
            raise ValueError(f"variation must be >= 0, got {variation}")
        simplification = params.get("simplification", DEFAULT_SIMPLIFICATION)
        if not isinstance(simplification, str):
            raise ValueError(f"simplification must be a string, got {simplification!r}")
        simplification = ",".join(s.strip() for s in simplification.split(",") if s.strip())
        bad = [s for s in simplification.split(",") if s and s not in SIMPLIFICATIONS]
        if bad:
            raise ValueError(f"unknown simplification(s) {bad}; valid: {', '.join(SIMPLIFICATIONS)}")
        electrical = "power-component" in name or "conductivity" in name
        if electrical and "noElectricalAction" in simplification:
            raise ValueError(f"{name} needs electrical actions, so 'noElectricalAction' makes it impossible")
        if _key(name, variation) in {_key(t.meta["task_name"], t.meta["variation"]) for t in holdout}:
            raise ValueError(f"{name}/{variation} is an evaluation task (seen/unseen split)")
        for t in seeds:
            if _key(t.meta["task_name"], t.meta["variation"]) == _key(name, variation) and _simplification_of(t) == simplification:
                raise ValueError(f"{name}/{variation} with simplification {simplification!r} is already a seed task")
        task = make_task(name, variation, split="synthetic", simplification=simplification)
        task.meta["synthetic"] = True
        return replace(task, task_id=synthetic_task_id(name, variation, simplification))

    def make_env(self, **options: Any) -> Env:
        return ScienceWorldEnv(**options)

    def solve(self, task: Task, env: Env) -> list[str]:
        """The engine's gold path (generated on this env's JVM)."""
        if not isinstance(env, ScienceWorldEnv):
            raise ValueError("ScienceWorld synthesis needs a ScienceWorldEnv to generate gold paths")
        try:
            return env.expert_actions(task)
        except EnvError as exc:
            if "produced no gold path" in str(exc):
                raise ValueError(str(exc)) from None
            raise


SYNTHESIZER = ScienceWorldSynthesizer()
