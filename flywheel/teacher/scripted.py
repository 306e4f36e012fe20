"""Offline default teacher: honest thoughts written from privileged structure.

It knows the goal, the remaining expert path and what each observation changed,
and phrases them through the env's own `describe_action`. It never claims to be
an LLM: metadata labels its output "scripted".

Its lookahead is grounded: a thought at step t names an upcoming action only when every word
of it is already known to the agent at t (the instructions, the goal, the observations up to
o_t, its own actions); at the first one that is not, it says it will decide from what it sees.
Naming the answer object before the agent has seen it ("commit to the butterfly" at step 0,
the product id before the results page) teaches a small student to guess a name, and
measured: it ran into repeating guesses that never reached the Action line (README).
A numbered name ("egg 1", "drawer 3") is one word here: the goal's "egg" does not make
"take egg 1 from garbagecan 1" known before an observation has shown egg 1 (where it lies),
and the instructions' examples ("apple 1") name nothing in the room.

When o_t shows for the first time something the action at t names, the thought says so
("I see egg 1 here."): the quoted part of o_t is its first new sentence, which in ALFWorld is
"You arrive at garbagecan 1." and not the one that lists what lies there.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from flywheel.core.trajectory import Trajectory
from flywheel.teacher.base import Annotation

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z][a-z0-9]+(?: [0-9]+\b)?")  # "egg 1" is one name, "egg" another
UNSEEN_NEXT = "decide what comes next from what I see"


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _plain_words(text: str) -> set[str]:
    """Words without the numbered names: what instructions teach, not what a room holds."""
    return {w for w in _words(text) if " " not in w}


def _first_sentence(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    first = _SENTENCE.split(text, 1)[0] if text else ""
    return first if len(first) <= limit else first[:limit].rstrip() + "..."


def _novel_part(before: str, after: str) -> str:
    """The part of `after` that was not already in `before`, as one short sentence."""
    seen = {s.strip() for s in _SENTENCE.split(" ".join(before.split()))}
    fresh = [s for s in _SENTENCE.split(" ".join(after.split())) if s.strip() and s.strip() not in seen]
    return _first_sentence(" ".join(fresh) or after)


class ScriptedTeacher:
    name = "scripted"

    def __init__(self, describe_action: Callable[[str], str], *, lookahead: int = 2,
                 grounded_lookahead: bool = True) -> None:
        self.describe = describe_action
        self.lookahead = lookahead
        self.grounded_lookahead = grounded_lookahead  # False: name upcoming actions unseen (the earlier teacher)

    def annotate(self, traj: Trajectory, instructions: str) -> list[Annotation]:
        actions = [s.action for s in traj.steps]
        total = len(actions)
        goal = traj.goal.strip() or _first_sentence(traj.initial_observation, 240)
        known = _plain_words(instructions) | _words(goal) | _words(traj.initial_observation)
        notes = []
        for t, step in enumerate(traj.steps):
            shown, named = _words(step.observation), _words(step.action)
            first_seen = shown - known
            known |= shown | named
            intent = self.describe(step.action)
            upcoming = self._upcoming(actions[t + 1 : t + 1 + self.lookahead], known)
            if t == 0:
                situation = f"Goal: {goal} I expect about {total} step{'s' if total != 1 else ''}."
            else:
                prev = traj.steps[t - 1]
                seen = _novel_part(prev.observation, step.observation)
                here = sorted(n for n in named & first_seen if " " in n)  # numbered names only
                spotted = f" I see {' and '.join(here)} here." if here else ""
                situation = f"'{prev.action}' gave: \"{seen}\"{spotted} This is step {t + 1} of about {total}."
            why = f"After that: {'; then '.join(upcoming)}." if upcoming else "That should complete the goal."
            thought = f"{situation} Now I need to {intent}. {why}"
            plan = f"{intent[0].upper()}{intent[1:]}." + (f" Then {upcoming[0]}." if upcoming else " Done after that.")
            notes.append(Annotation(thought=thought, plan=plan))
        return notes

    def _upcoming(self, actions: list[str], known: set[str]) -> list[str]:
        """The next actions described, up to the first one the agent could not name yet."""
        out = []
        for a in actions:
            if self.grounded_lookahead and not _words(a) <= known:
                out.append(UNSEEN_NEXT)
                break
            out.append(self.describe(a))
            known = known | _words(a)
        return out

    def propose_tasks(
        self,
        *,
        benchmark: str,
        instructions: str,
        schema: str,
        seeds: list[dict],
        candidates: list[dict],
        n: int,
    ) -> list[dict]:
        """Stage 2, offline: up to n of the env's concrete candidates, harder than the seeds on purpose.

        Candidates expected to be at least as long as the seed median come first, and the
        kinds (unused variation, harder task type, harder setting, ...) take turns.
        """

        return pick_harder(candidates, [int(s.get("length", 0)) for s in seeds], n)


def pick_harder(candidates: Sequence[dict[str, Any]], seed_lengths: Sequence[int], n: int) -> list[dict[str, Any]]:
    """The offline proposer: up to n candidates, harder on purpose, spread over kinds.

    Within each kind, candidates expected to be at least as long as the seed median
    come first (in the synthesizer's deterministic order); kinds take turns.
    """
    median = statistics.median(seed_lengths) if seed_lengths else 0
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for c in candidates:
        by_kind.setdefault(str(c.get("kind", "")), []).append(c)
    queues = []
    for items in by_kind.values():
        harder = [c for c in items if (c.get("expected_length") or 0) >= median]
        rest = [c for c in items if (c.get("expected_length") or 0) < median]
        queues.append(harder + rest)
    picked: list[dict[str, Any]] = []
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                c = q.pop(0)
                exp = c.get("expected_length")
                why = f"{c.get('note', c.get('kind', ''))}; expected ~{exp} steps vs seed median {median:g}" if exp else c.get("note", "")
                picked.append({"kind": c.get("kind", ""), "params": dict(c.get("params", {})), "rationale": why})
    return picked
