"""What the agent is told about ScienceWorld, and how its action lines are cleaned and glossed.

The response format (Thought/Plan/Action) is added by the core prompt builder, not here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

SYSTEM_PROMPT = """\
You are an agent in ScienceWorld, a text-based simulation of a house and its surroundings \
(kitchen, bathroom, workshop, greenhouse, outside, ...) where you carry out elementary-school \
science experiments. The first message gives your task and describes the room you are in. \
After each action you receive an observation.

Available actions (OBJ and LOC are objects or places exactly as the observations name them):
- look around: describe the current room
- look at OBJ: describe an object in detail
- look in OBJ: describe what a container holds
- examine OBJ: describe an object, including its state (e.g. temperature)
- read OBJ: read a note, book or label
- inventory: list what you are carrying
- task: repeat the task description
- go to LOC: move to an adjacent room (the door must be open)
- teleport to LOC: move directly to any room
- open OBJ / close OBJ: open or close a door or container
- pick up OBJ: put an object into your inventory
- put down OBJ: drop an object from your inventory here
- move OBJ to OBJ: move an object into a container or onto a surface
- pour OBJ into OBJ: pour a liquid or substance into a container
- dunk OBJ into OBJ: dunk a container into a liquid
- mix OBJ: chemically mix the contents of a container
- activate OBJ / deactivate OBJ: turn a device (stove, sink, lighter, ...) on or off
- connect OBJ to OBJ / disconnect OBJ: wire electrical components (terminals are named like "battery anode")
- use OBJ on OBJ: use a tool on something, e.g. "use thermometer on water"
- eat OBJ: eat food
- flush OBJ: flush a toilet
- wait: let 10 time steps pass; wait1: let a single time step pass
- focus on OBJ: declare the object the task is about

Rules:
- Write one action at a time, using object names as they appear in the observations.
- "focus on" is irreversible: focusing on a wrong object ends the task as a failure, so focus \
only on the object the task asks for, and only when you are sure.
- If an action matches several objects, the environment lists numbered options; answer with \
the number alone (e.g. "0") to choose one.
- Containers and doors may need to be opened before you can use what is inside or go through them.
- Some processes (heating, growing, mixing) take time: use wait or wait1 and then check again.
"""

# For small models on small budgets: the main rules in a quarter of the tokens (146 vs 584 with
# SmolLM2's tokenizer). Every SFT example and every rollout prompt carries the system prompt.
COMPACT_SYSTEM_PROMPT = """\
You are an agent in ScienceWorld, a text simulation of a house and its surroundings. The first \
message gives your task and the room you are in; each action returns an observation.
Actions (use names exactly as observed): look around, look at OBJ, examine OBJ, inventory, \
teleport to LOC, go to LOC, open OBJ, pick up OBJ, move OBJ to OBJ, pour OBJ into OBJ, \
activate OBJ, use OBJ on OBJ, wait1, focus on OBJ.
"focus on" is irreversible: use it only on the object the task asks for. \
If the environment lists numbered options, answer with the number alone.
"""
PROMPTS = {"full": SYSTEM_PROMPT, "compact": COMPACT_SYSTEM_PROMPT}

_QUOTES = "\"'`“”‘’"
_TRAILING = ".!?;,:" + _QUOTES
_PREFIX = re.compile(r"^(?:action\s*:|>)\s*", re.IGNORECASE)


def normalize_action(raw: str) -> str:
    """First non-empty line, without quotes, prompt marks or trailing punctuation, lowercased.

    The engine matches input case-insensitively but rejects trailing punctuation ("go to kitchen."
    is "No known action matches that input."), so both are safe to clean.
    """
    lines = [line for line in str(raw or "").splitlines() if line.strip()]
    text = lines[0].strip() if lines else ""
    for _ in range(3):  # peel nested wrappers like `"go to kitchen."`
        text = _PREFIX.sub("", text).strip().strip(_QUOTES).strip().rstrip(_TRAILING).strip()
    return " ".join(text.split()).lower()


def _the(obj: str) -> str:
    # ScienceWorld names some objects with a word twice ("baby baby dragonfly"): the action keeps it, the prose
    # says it once ("the baby dragonfly").
    obj = re.sub(r"\b([a-z]+)(?: \1\b)+", r"\1", obj.strip())
    return obj if re.match(r"^(the|a|an|some)\s", obj) else f"the {obj}"


def _place(loc: str) -> str:
    return _the(re.sub(r"^(the\s+)?door\s+to\s+", "", loc.strip()))


def _wait(n: str) -> str:
    if n == "1":
        return "wait a single time step so the process can progress"
    return f"wait {n or 'ten'} time steps so the process can progress"


# (action pattern, intent phrase), first match wins. In a phrase, {x} is the matched text as written,
# {the_x} the object with its article (`_the`), {place_x} a room without "door to" (`_place`); likewise y.
_RULES: list[tuple[str, str | Callable[..., str]]] = [
    (r"open (?:the )?door to (?P<x>.+)", "open the door to {place_x} so I can go there"),
    (r"open (?P<x>.+) door", "open the {x} door so I can go through it"),
    (r"close (?:the )?door to (?P<x>.+)", "close the door to {place_x}"),
    (r"go (?:to )?(?P<x>.+)", "go to {place_x} to continue the task there"),
    (r"teleport (?:to )?(?P<x>.+)", "teleport straight to {place_x}"),
    (r"focus on (?P<x>.+)", "commit to {the_x} as the answer object (focus is irreversible, so only on the right object)"),
    (r"move (?P<x>.+) to (?P<y>.+)", "move {the_x} to {the_y}"),
    (r"pick up (?P<x>.+)", "pick up {the_x} and carry it with me"),
    (r"put down (?P<x>.+)", "put down {the_x} here"),
    (r"look around", "look around to see what is in this room"),
    (r"look at (?P<x>.+)", "look at {the_x} closely"),
    (r"look in (?P<x>.+)", "look inside {the_x} to see what it holds"),
    (r"examine (?P<x>.+)", "examine {the_x} to check its current state"),
    (r"read (?P<x>.+)", "read {the_x} for information"),
    (r"open (?P<x>.+)", "open {the_x} to get at what is inside"),
    (r"close (?P<x>.+)", "close {the_x}"),
    (r"activate (?P<x>.+)", "turn on {the_x}"),
    (r"deactivate (?P<x>.+)", "turn off {the_x}"),
    (r"connect (?P<x>.+) to (?P<y>.+)", "connect {the_x} to {the_y} to build the circuit"),
    (r"disconnect (?P<x>.+)", "disconnect {the_x} from the circuit"),
    (r"use (?P<x>.*thermometer.*) on (?P<y>.+)", "measure the temperature of {the_y} with the thermometer"),
    (r"use (?P<x>.+) on (?P<y>.+)", "use {the_x} on {the_y}"),
    (r"use (?P<x>.+)", "use {the_x}"),
    (r"pour (?P<x>.+) (?:into|in) (?P<y>.+)", "pour {the_x} into {the_y}"),
    (r"dunk (?P<x>.+) (?:into|in) (?P<y>.+)", "dunk {the_x} into {the_y}"),
    (r"mix (?P<x>.+)", "mix what is in {the_x} so the ingredients combine"),
    (r"eat (?P<x>.+)", "eat {the_x}"),
    (r"flush (?P<x>.+)", "flush {the_x}"),
    (r"wait\s*(?P<n>\d*)", _wait),
    (r"inventory", "check what I am carrying"),
    (r"task", "re-read the task description"),
    (r"(?P<n>\d+)", "choose option {n} from the list the environment offered"),
]
_COMPILED = [(re.compile(pattern + "$"), phrase) for pattern, phrase in _RULES]


def describe_action(action: str) -> str:
    """A short intent phrase for an action, e.g. "open door to kitchen" ->
    "open the door to the kitchen so I can go there" (fits "Next I need to <intent>.")."""
    text = normalize_action(action)
    for pattern, phrase in _COMPILED:
        match = pattern.match(text)
        if match:
            groups = match.groupdict()
            if callable(phrase):
                return phrase(**groups)
            return phrase.format(**groups, **{f"the_{k}": _the(v) for k, v in groups.items()},
                                 **{f"place_{k}": _place(v) for k, v in groups.items()})
    return f"try '{text}'" if text else "act"
