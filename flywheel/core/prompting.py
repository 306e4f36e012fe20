"""Long-short CoT fusion: the one prompt builder used by training and rollout.

The model writes the long thought e_t, the short plan p_t and the action a_t at
every step; the history it later sees keeps only p_t, a_t and the observations.
`keep_thoughts=True` builds the full-history variant, for measurement only.

`history_mode` chooses the prompt shape for training and rollout alike (the policy's
`history_mode` field): "fused" (above, the default) or "react", the plain ReAct baseline:
the model answers "Thought: e_t / Action: a_t" and its context is the whole chat transcript
(every past long thought, action and observation as alternating assistant/user turns), so
the prompt of step t+1 extends the prompt of step t plus answer t; a trajectory is then one
chat transcript (what DPO and GRPO score, agent turns only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flywheel.core.options import Bound, option

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

REACT_RESPONSE_FORMAT = (
    "At every step, answer in exactly this format:\n"
    "Thought: <your careful analysis of the situation and what to do next>\n"
    "Action: <exactly one action>"
)
HISTORY_MODES = ("fused", "react")

Message = dict[str, str]


def check_history_mode(mode: str) -> str:
    if mode not in HISTORY_MODES:
        raise ValueError(f"history_mode must be one of {', '.join(HISTORY_MODES)}, got {mode!r}")
    return mode


def writes_plans(mode: str) -> bool:
    """Whether a policy of this history mode writes a plan line (ReAct writes thought and action only)."""
    return check_history_mode(mode) != "react"


@dataclass(frozen=True)
class PromptShape:
    """How every step's prompt is built: declared once here, the same for SFT examples, rollouts
    and evaluation (a checkpoint is played with the prompts it was trained on).

    `history_mode`: "fused" (BPO's plan + action history) or "react" (the full-history baseline);
    `history_window`: keep the last N past steps (None = all); `max_observation_chars`: clip past
    observations to this (the latest one stays whole). The policy resource exposes these three
    fields flat (`policy.history_window`, ...) and builds one `PromptShape` for training and rollouts.
    """

    history_mode: str = option("fused", help='"fused": BPO\'s plan + action history; "react": the full '
                                             'transcript (the ReAct baselines)')
    history_window: int | None = option(None, help="past steps a prompt keeps (null: all)",
                                        bound=Bound(0, 10_000))
    max_observation_chars: int | None = option(None, help="past observations cut to this many characters (the "
                                                          "latest one stays whole; null: never cut)",
                                               bound=Bound(1, 10_000_000))

    def __post_init__(self) -> None:
        check_history_mode(self.history_mode)

    def messages(self, env_instructions: str, initial_observation: str, history: list[HistoryItem]) -> list[Message]:
        """The chat messages for the next step."""
        return build_messages(env_instructions, initial_observation, history, history_window=self.history_window,
                              max_observation_chars=self.max_observation_chars, history_mode=self.history_mode)

    def response(self, thought: str, plan: str, action: str) -> str:
        """The answer the model is trained to write at a step."""
        return format_response(thought, plan, action, history_mode=self.history_mode)


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


def format_response(thought: str, plan: str, action: str, *, history_mode: str = "fused") -> str:
    if check_history_mode(history_mode) == "react":  # plain ReAct: no short plan
        return f"Thought: {thought.strip()}\nAction: {action.strip()}"
    return f"Thought: {thought.strip()}\nPlan: {plan.strip()}\nAction: {action.strip()}"


# Leading blanks of the line only (not `\s*`, which crosses newlines and backtracks quadratically on
# a run of blank lines): the parse is linear in the answer's length.
_SECTION = re.compile(r"^[^\S\n]*(Thought|Plan|Action)\s*:\s*", re.IGNORECASE | re.MULTILINE)


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


def system_message(env_instructions: str, *, history_mode: str = "fused") -> str:
    fmt = REACT_RESPONSE_FORMAT if check_history_mode(history_mode) == "react" else RESPONSE_FORMAT
    return f"{env_instructions.strip()}\n\n{fmt}"


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
    history_mode: str = "fused",
) -> list[Message]:
    """Chat messages for the next step.

    The initial observation (which states the goal) always stays; `history_window`
    keeps only the last N past steps, for very long horizons. `max_observation_chars` clips
    past observations only: the latest observation, the page the model acts on, stays whole.
    """
    if check_history_mode(history_mode) == "react":
        return react_messages(env_instructions, initial_observation, history, history_window=history_window,
                              max_observation_chars=max_observation_chars)
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
        # Past observations are clipped; the latest one (the page the model acts on) never is.
        latest = i == len(history)
        lines.append(f"Observation: {_clip(item.observation, None if latest else max_observation_chars)}")
    lines.append(f"[Step {len(history) + 1}] Respond with Thought, Plan and Action.")
    return [
        {"role": "system", "content": system_message(env_instructions)},
        {"role": "user", "content": "\n".join(lines)},
    ]


def react_messages(
    env_instructions: str,
    initial_observation: str,
    history: list[HistoryItem],
    *,
    history_window: int | None = None,
    max_observation_chars: int | None = None,
) -> list[Message]:
    """The ReAct transcript: system, the task, then (answer, observation) turn pairs, full history.

    Past answers keep their long thoughts; observations are clipped like the fused prompt's.
    `history_window` keeps the last N exchanges (the task turn always stays).
    """
    shown = history if history_window is None else history[-history_window:]
    first = initial_observation.strip()
    if len(shown) < len(history):
        first += f"\n[{len(history) - len(shown)} earlier steps omitted]"
    messages: list[Message] = [
        {"role": "system", "content": system_message(env_instructions, history_mode="react")},
        {"role": "user", "content": first},
    ]
    for n, item in enumerate(shown, start=1):
        messages.append({"role": "assistant",
                         "content": format_response(item.thought, item.plan, item.action, history_mode="react")})
        limit = None if n == len(shown) else max_observation_chars  # the latest observation stays whole
        messages.append({"role": "user", "content": f"Observation: {_clip(item.observation, limit)}"})
    return messages


def history_from_steps(steps, *, upto: int) -> list[HistoryItem]:
    """History items for steps[:upto] of a stored trajectory (flywheel.core.trajectory.Step)."""
    return [
        HistoryItem(plan=s.plan, action=s.action, observation=s.next_observation, thought=s.thought)
        for s in steps[:upto]
    ]
