"""Any OpenAI-compatible chat endpoint as a teacher, with retries and a response cache.

The cache (in the DuckDB store) is keyed by model + request, so a re-run after a
failure never pays twice for an answer already received.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from flywheel.teacher.base import Annotation, TeacherError
from flywheel.trajectory import Trajectory

log = logging.getLogger(__name__)

ANNOTATE_INSTRUCTIONS = """You annotate an expert agent's successful trajectory for training.
For EVERY step, write:
- "thought": a multi-sentence analysis the agent could have had BEFORE acting: what the observation shows, progress toward the goal, and why this action is right.
- "plan": one or two sentences: the distilled plan from here.
Never mention that you saw the future; reason from the observation and the goal.
Answer with JSON only: {"steps": [{"thought": "...", "plan": "..."}, ...]} with exactly N items."""


PROPOSE_INSTRUCTIONS = """You design training tasks for an agent in a text environment (curriculum synthesis).
Propose NEW tasks that differ from the seed tasks in structure, length or goal, and are HARDER on purpose
(longer solutions, more sub-goals, less help from the environment), but still possible in this environment.
Every task must follow the params schema exactly; the environment rejects anything it cannot build or solve.
You may pick from the listed candidates or write your own params.
Answer with JSON only: {"tasks": [{"kind": "...", "params": {...}, "rationale": "..."}, ...]} with exactly N items."""


class Cache:
    """Minimal cache protocol: the Store satisfies it."""

    def cache_get(self, key: str) -> str | None: ...
    def cache_put(self, key: str, model: str, response: str) -> None: ...


def _retryable(exc: Exception) -> bool:
    status = getattr(exc, "status_code", None)
    if status is not None:
        return status == 429 or status >= 500 or status == 408
    name = type(exc).__name__
    return name in {"APITimeoutError", "APIConnectionError", "Timeout", "ConnectionError"}


class OpenAITeacher:
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str,
        cache: Cache | None = None,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 120.0,
        temperature: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from openai import OpenAI

        # The client's own retries are off: ours are counted, logged and cached around.
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
        self.model = model
        self.name = f"openai:{model}"
        self.cache = cache
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.sleep = sleep

    def chat(self, messages: list[dict[str, str]]) -> str:
        """One completion, from the cache when this exact request was answered before."""
        key = hashlib.sha256(json.dumps([self.model, self.temperature, messages]).encode()).hexdigest()
        if self.cache is not None and (hit := self.cache.cache_get(key)) is not None:
            return hit
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            try:
                resp = self.client.chat.completions.create(
                    model=self.model, messages=messages, temperature=self.temperature
                )
                text = resp.choices[0].message.content or ""
                if self.cache is not None:
                    self.cache.cache_put(key, self.model, text)
                return text
            except Exception as exc:  # noqa: BLE001 - classify, then retry or raise
                last = exc
                if not _retryable(exc) or attempt == self.max_retries:
                    break
                delay = self.backoff_s * (2**attempt)
                log.warning("teacher call failed (%s); retry %d in %.1fs", type(exc).__name__, attempt + 1, delay)
                self.sleep(delay)
        raise TeacherError(
            f"teacher endpoint failed after {self.max_retries + 1} attempt(s): "
            f"{type(last).__name__}: {_redact(str(last))}. Answers already received stay cached."
        ) from None

    def annotate(self, traj: Trajectory, instructions: str) -> list[Annotation]:
        lines = [f"Environment instructions:\n{instructions}", f"Goal: {traj.goal}",
                 f"Initial observation:\n{traj.initial_observation}", f"N = {len(traj.steps)} steps:"]
        for t, s in enumerate(traj.steps, 1):
            lines.append(f"Step {t}: action = {s.action!r}; observation after it = {s.next_observation[:600]!r}")
        messages = [{"role": "system", "content": ANNOTATE_INSTRUCTIONS}, {"role": "user", "content": "\n".join(lines)}]
        text = self.chat(messages)
        return parse_annotations(text, expected=len(traj.steps))

    def propose_tasks(
        self,
        *,
        benchmark: str,
        instructions: str,
        schema: str,
        seeds: list[dict],
        candidates: list[dict],
        n: int,
        max_listed: int = 40,
    ) -> list[Any]:
        """Stage 2: ask the model for n harder tasks; returns raw items (validated by the caller)."""
        seed_lines = [f"- {s.get('goal', '')[:200]!r} ({s.get('length', '?')} expert steps)" for s in seeds[:20]]
        cand_lines = [json.dumps({k: c.get(k) for k in ("kind", "params", "expected_length", "note")}, default=str)
                      for c in candidates[:max_listed]]
        user = "\n".join([
            f"Benchmark: {benchmark}", f"Environment instructions:\n{instructions[:3000]}",
            f"Params schema:\n{schema}", f"Seed tasks ({len(seeds)}):", *seed_lines,
            f"Candidates the environment can build ({len(candidates)}, first {len(cand_lines)}):", *cand_lines,
            f"N = {n}",
        ])
        messages = [{"role": "system", "content": PROPOSE_INSTRUCTIONS}, {"role": "user", "content": user}]
        return parse_proposals(self.chat(messages))[: max(n, 0)]


def parse_proposals(text: str) -> list[Any]:
    """The teacher's proposals as a list of raw items; an unreadable answer becomes one marked item.

    Items are validated later, one by one (flywheel.curriculum), so a bad item is rejected
    with its reason instead of failing the whole answer.
    """
    match = re.search(r"[\[{].*[\]}]", text, re.DOTALL)
    try:
        data: Any = json.loads(match.group(0) if match else text)
    except ValueError as exc:
        return [{"_unparsable": text[:500], "_error": f"not JSON ({exc})"}]
    items = data.get("tasks") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return [{"_unparsable": text[:500], "_error": "no 'tasks' list"}]
    return items


def parse_annotations(text: str, *, expected: int) -> list[Annotation]:
    """Parse the teacher's JSON (tolerating code fences); malformed -> TeacherError."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        data: Any = json.loads(match.group(0) if match else text)
        items = data["steps"] if isinstance(data, dict) else data
        notes = [Annotation(elaborate=str(i["thought"]).strip(), plan=str(i["plan"]).strip()) for i in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise TeacherError(f"malformed teacher answer ({exc}): {text[:200]!r}") from None
    if len(notes) != expected or any(not n.plan for n in notes):
        raise TeacherError(f"teacher answered {len(notes)} annotations for {expected} steps (or empty plans)")
    return notes


def _redact(text: str) -> str:
    """Never echo credentials that an error message might contain."""
    return re.sub(r"(sk-|Bearer\s+)[A-Za-z0-9_\-]{6,}", r"\1***", text)
