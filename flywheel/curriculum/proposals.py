"""Task proposals: what a teacher proposes, how it is read, and which env synthesizer judges it.

A proposal is a JSON object `{"kind": ..., "params": {...}, "rationale": ...}`; `params`
is benchmark-specific (each env's `synthesis.proposal_schema()` says what). Anything
else a teacher returns (a string, a list, an object without params) is kept as a
*rejected* proposal with the reason, never an exception.

The per-benchmark synthesizers live beside the envs (`envs/<name>/synthesis.py`, no
flywheel imports); each benchmark's spec hands out its own (`spec.synthesizer()`), which
implements `TaskSynthesizer` (structurally).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envs.base import BenchmarkSpec, Env, Task

META_KEYS = ("kind", "rationale", "expected_length", "note", "from_seed", "params")


class TaskSynthesizer(Protocol):
    """What a benchmark offers stage 2. Every reason to refuse is a ValueError with a readable message."""

    benchmark: str

    def proposal_schema(self) -> str:
        """The `params` fields of a proposal, in words, for an LLM teacher."""
        ...

    def candidates(self, seeds: Sequence[Task], *, holdout: Sequence[Task], limit: int, seed: int = 0) -> list[dict[str, Any]]:
        """Concrete proposals the env can build near the seeds: {"kind", "params", "expected_length", "note"}."""
        ...

    def instantiate(self, params: dict[str, Any], *, seeds: Sequence[Task], holdout: Sequence[Task]) -> Task:
        """A Task for `params`, or ValueError(reason) when it is malformed, impossible, a seed or an eval task."""
        ...

    def make_env(self, **options: Any) -> Env:
        """An env that can play synthesized tasks (and ordinary ones)."""
        ...

    def solve(self, task: Task, env: Env) -> list[str]:
        """Expert actions for `task` (gold path / handcoded expert / oracle), or ValueError(reason)."""
        ...


class UnknownSynthesizerError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def get_synthesizer(spec: BenchmarkSpec) -> TaskSynthesizer:
    """The benchmark's task synthesizer, from its spec (`synthesizer()`, see envs/base.py)."""
    own = getattr(spec, "synthesizer", None)
    if own is None:
        raise UnknownSynthesizerError(
            f"No task synthesizer for {spec.name!r}: its spec defines no `synthesizer()` (add one beside its env, "
            "in envs/<name>/synthesis.py), or turn synthesis off (CurriculumResource(synthesize=False))."
        )
    return own()


@dataclass
class Proposal:
    """One proposal and what became of it. status: rejected | unsolved | annotation_failed | solved."""

    proposal_id: str
    proposer: str
    kind: str = ""
    params: Any = None
    rationale: str = ""
    status: str = "proposed"
    reason: str = ""
    task_id: str = ""
    length: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def reject(self, status: str, reason: str) -> Proposal:
        self.status, self.reason = status, reason
        return self

    def record(self) -> dict[str, Any]:
        return {"proposal_id": self.proposal_id, "proposer": self.proposer, "kind": self.kind, "params": self.params,
                "rationale": self.rationale, "status": self.status, "reason": self.reason, "task_id": self.task_id,
                "length": self.length}


def _digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def read_proposal(raw: Any, index: int, proposer: str) -> Proposal:
    """Turn whatever the teacher returned for one proposal into a Proposal (rejected if unreadable)."""
    prop = Proposal(proposal_id=f"p{index:04d}-{_digest(raw)}", proposer=proposer)
    if not isinstance(raw, dict):
        prop.params = raw if isinstance(raw, str | int | float | bool | type(None)) else repr(raw)[:500]
        return prop.reject("rejected", f"unparsable proposal: expected a JSON object, got {type(raw).__name__}")
    if "_unparsable" in raw:
        prop.params = {"answer": str(raw["_unparsable"])[:500]}
        return prop.reject("rejected", f"unparsable teacher answer: {raw.get('_error', 'no JSON found')}")
    prop.kind = str(raw.get("kind") or "")[:80]
    prop.rationale = str(raw.get("rationale") or raw.get("note") or "")[:500]
    params = raw.get("params")
    if params is None:
        params = {k: v for k, v in raw.items() if k not in META_KEYS}
    prop.params = params
    if not isinstance(params, dict) or not params:
        return prop.reject("rejected", "unparsable proposal: no 'params' object with the task's fields")
    return prop
