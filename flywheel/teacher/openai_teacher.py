"""Any OpenAI-compatible chat endpoint as a teacher, with retries and a response cache.

The cache (in the DuckDB store) is keyed by model + request, so a re-run after a
failure never pays twice for an answer already received. Only answers that parsed into
what the stage needs are cached: an unusable answer (null, prose, malformed JSON, a
huge body) is asked again, and after the retry limit the stage fails showing the
answer's first characters. Every text from the endpoint passes through a `Redactor`
that masks the configured key itself, whatever its shape.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flywheel.core.deadline import http_client
from flywheel.core.redaction import Redactor, preview
from flywheel.core.trajectory import Trajectory
from flywheel.teacher.base import Annotation, TeacherError, TeacherRefused

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_ANSWER_CHARS = 1_000_000  # a longer answer is unusable: never parsed, never cached

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

        # The client's own retries are off: ours are counted, logged and cached around, all within `timeout_s`
        # (each request's total time: connect, first byte and whole answer, `flywheel.core.deadline`).
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s,
                             http_client=http_client(timeout_s))
        self.timeout_s = timeout_s
        self.model = model
        self.name = f"openai:{model}"
        self.cache = cache
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.sleep = sleep
        self.redact = Redactor([api_key])

    def chat(self, messages: list[dict[str, str]], parse: Callable[[str], T] = lambda text: text) -> T:
        """One completion parsed by `parse`, from the cache when this exact request was answered before.

        An answer is cached only once `parse` accepted it (raised no TeacherError); an unusable
        answer counts as a failed attempt and is asked again, like a 5xx.
        """
        key = hashlib.sha256(json.dumps([self.model, self.temperature, messages]).encode()).hexdigest()
        if self.cache is not None and (hit := self.cache.cache_get(key)) is not None:
            try:
                return parse(hit)
            except TeacherError:  # cached by an older version before parsing: ask again
                log.warning("teacher: a cached answer did not parse; asking again")
        last: str = ""
        deadline = time.monotonic() + self.timeout_s  # every attempt and wait of this request counts against it
        refused = False
        for attempt in range(self.max_retries + 1):
            try:
                resp = self.client.chat.completions.create(
                    model=self.model, messages=messages, temperature=self.temperature,
                    timeout=max(deadline - time.monotonic(), 0.001),
                )
                text = self.redact(_content(resp))
                if len(text) > MAX_ANSWER_CHARS:
                    raise TeacherError(f"answer too long ({len(text)} chars > {MAX_ANSWER_CHARS}): {preview(text, self.redact)}")
                value = parse(text)
                if self.cache is not None:
                    self.cache.cache_put(key, self.model, text)
                return value
            except TeacherError as exc:  # the endpoint answered, but nothing usable: ask again
                last = f"unusable answer: {self.redact(str(exc))}"
                retry = True
            except Exception as exc:  # noqa: BLE001 - classify, then retry or raise
                last = self.redact.exception(exc)
                retry = _retryable(exc)
                refused = getattr(exc, "status_code", None) is not None and not retry
            delay = self.backoff_s * (2**attempt)
            if not retry or attempt == self.max_retries:
                break
            if time.monotonic() + delay >= deadline:
                last += f" (no time left for a retry within timeout_s {self.timeout_s:g} s)"
                break
            log.warning("teacher call failed (%s); retry %d in %.1fs", last[:200], attempt + 1, delay)
            self.sleep(delay)
        if refused:  # a 4xx other than 408/429: the request, key or model is wrong, and asking again cannot help
            raise TeacherRefused(f"teacher endpoint refused the request: {last}. Fix the teacher's base_url, "
                                 "model or key ($FLYWHEEL_TEACHER_API_KEY); a retry cannot change this") from None
        raise TeacherError(
            f"teacher endpoint failed after {attempt + 1} attempt(s): {last}. "
            "Answers already received stay cached."
        ) from None

    def annotate(self, traj: Trajectory, instructions: str) -> list[Annotation]:
        lines = [f"Environment instructions:\n{instructions}", f"Goal: {traj.goal}",
                 f"Initial observation:\n{traj.initial_observation}", f"N = {len(traj.steps)} steps:"]
        for t, s in enumerate(traj.steps, 1):
            lines.append(f"Step {t}: action = {s.action!r}; observation after it = {s.next_observation[:600]!r}")
        messages = [{"role": "system", "content": ANNOTATE_INSTRUCTIONS}, {"role": "user", "content": "\n".join(lines)}]
        return self.chat(messages, lambda text: parse_annotations(text, expected=len(traj.steps), redact=self.redact))

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
        return self.chat(messages, lambda text: _proposals_or_fail(text, self.redact))[: max(n, 0)]


def _content(resp: Any) -> str:
    """The answer's text; a response without one (null content, no choices) is unusable."""
    try:
        text = resp.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        text = None
    if not isinstance(text, str) or not text.strip():
        raise TeacherError(f"no answer text in the response (content: {str(text)[:40]!r})")
    return text


def _proposals_or_fail(text: str, redact: Redactor) -> list[Any]:
    """Proposals for the curriculum stage: an answer without any task list is unusable (asked again);
    bad items inside a list are rejected later, one by one."""
    items = parse_proposals(text)
    if len(items) == 1 and isinstance(items[0], dict) and "_unparsable" in items[0]:
        raise TeacherError(f"{items[0]['_error']}: {preview(text, redact)}")
    return items


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


def parse_annotations(text: str, *, expected: int, redact: Redactor | None = None) -> list[Annotation]:
    """Parse the teacher's JSON (tolerating code fences); malformed -> TeacherError."""
    redact = redact or Redactor()
    match = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        data: Any = json.loads(match.group(0) if match else text)
        items = data["steps"] if isinstance(data, dict) else data
        notes = [Annotation(thought=str(i["thought"]).strip(), plan=str(i["plan"]).strip()) for i in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise TeacherError(f"malformed teacher answer ({redact(str(exc))[:100]}): {preview(text, redact)}") from None
    if len(notes) != expected or any(not n.plan for n in notes):
        raise TeacherError(f"teacher answered {len(notes)} annotations for {expected} steps (or empty plans): "
                           f"{preview(text, redact)}")
    return notes
