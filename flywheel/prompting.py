"""Long-short CoT fusion: the one prompt builder used by training and rollout.

The model writes the long thought e_t, the short plan p_t and the action a_t at
every step; the history it later sees keeps only p_t, a_t and the observations.
`keep_thoughts=True` builds the full-history variant, for measurement only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RESPONSE_FORMAT = (
    "At every step, answer in exactly this format:\n"
    "Thought: <your careful analysis of the situation and what to do next>\n"
    "Plan: <one or two sentences: the plan from here>\n"
    "Action: <exactly one action>"
)
INVALID_FORMAT_OBSERVATION = (
    "Invalid response format: no 'Action:' line was found. "
    "Answer with a Thought line, a Plan line and an Action line."
)

Message = dict[str, str]


@dataclass(frozen=True)
class HistoryItem:
    plan: str
    action: str
    observation: str  # what the env answered to `action`
    thought: str = ""  # e_t; rendered only when keep_thoughts=True


@dataclass(frozen=True)
class Response:
    thought: str
    plan: str
    action: str
    well_formed: bool


def format_response(thought: str, plan: str, action: str) -> str:
    return f"Thought: {thought.strip()}\nPlan: {plan.strip()}\nAction: {action.strip()}"


_SECTION = re.compile(r"^\s*(Thought|Plan|Action)\s*:\s*", re.IGNORECASE | re.MULTILINE)


def parse_response(text: str) -> Response:
    """Split model output into (e_t, p_t, a_t); never raises.

    Missing sections are empty strings; `well_formed` is False when there is no
    non-empty action, and the rollout loop turns that into an observation.
    """
    parts: dict[str, str] = {}
    matches = list(_SECTION.finditer(text))
    for i, m in enumerate(matches):
        key = m.group(1).lower()
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        if key not in parts:  # first occurrence wins; models sometimes repeat
            parts[key] = text[m.end() : end].strip()
    action = parts.get("action", "").split("\n", 1)[0].strip()
    return Response(
        thought=parts.get("thought", ""),
        plan=parts.get("plan", ""),
        action=action,
        well_formed=bool(action),
    )


def system_message(env_instructions: str) -> str:
    return f"{env_instructions.strip()}\n\n{RESPONSE_FORMAT}"


def _clip(text: str, limit: int | None) -> str:
    text = text.strip()
    if limit is not None and len(text) > limit:
        return text[:limit].rstrip() + " ..."
    return text


def build_messages(
    env_instructions: str,
    initial_observation: str,
    history: list[HistoryItem],
    *,
    keep_thoughts: bool = False,
    history_window: int | None = None,
    max_observation_chars: int | None = None,
) -> list[Message]:
    """Chat messages for the next step.

    The initial observation (which states the goal) always stays; `history_window`
    keeps only the last N past steps, for very long horizons.
    """
    shown = history if history_window is None else history[-history_window:]
    first_shown = len(history) - len(shown) + 1
    lines = [initial_observation.strip()]
    if len(shown) < len(history):
        lines.append(f"[{len(history) - len(shown)} earlier steps omitted]")
    for i, item in enumerate(shown, start=first_shown):
        lines.append(f"[Step {i}]")
        if keep_thoughts:
            lines.append(f"Thought: {item.thought.strip()}")
        lines.append(f"Plan: {item.plan.strip()}")
        lines.append(f"Action: {item.action.strip()}")
        lines.append(f"Observation: {_clip(item.observation, max_observation_chars)}")
    lines.append(f"[Step {len(history) + 1}] Respond with Thought, Plan and Action.")
    return [
        {"role": "system", "content": system_message(env_instructions)},
        {"role": "user", "content": "\n".join(lines)},
    ]


def history_from_steps(steps, *, upto: int) -> list[HistoryItem]:
    """History items for steps[:upto] of a stored trajectory (flywheel.trajectory.Step)."""
    return [
        HistoryItem(plan=s.plan, action=s.action, observation=s.next_observation, thought=s.elaborate)
        for s in steps[:upto]
    ]
