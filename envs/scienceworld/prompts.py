"""What the agent is told about ScienceWorld, and how its action lines are cleaned and glossed.

The response format (Thought/Plan/Action) is added by the core prompt builder, not here.
"""

from __future__ import annotations

import re

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


_RULES: list[tuple[re.Pattern[str], object]] = []


def _rule(pattern: str):
    def register(fn):
        _RULES.append((re.compile(pattern + r"$"), fn))
        return fn

    return register


@_rule(r"open (?:the )?door to (?P<x>.+)")
def _open_door(x: str) -> str:
    return f"open the door to {_place(x)} so I can go there"


@_rule(r"open (?P<x>.+) door")
def _open_named_door(x: str) -> str:
    return f"open the {x} door so I can go through it"


@_rule(r"close (?:the )?door to (?P<x>.+)")
def _close_door(x: str) -> str:
    return f"close the door to {_place(x)}"


@_rule(r"go (?:to )?(?P<x>.+)")
def _go(x: str) -> str:
    return f"go to {_place(x)} to continue the task there"


@_rule(r"teleport (?:to )?(?P<x>.+)")
def _teleport(x: str) -> str:
    return f"teleport straight to {_place(x)}"


@_rule(r"focus on (?P<x>.+)")
def _focus(x: str) -> str:
    return f"commit to {_the(x)} as the answer object (focus is irreversible, so only on the right object)"


@_rule(r"move (?P<x>.+) to (?P<y>.+)")
def _move(x: str, y: str) -> str:
    return f"move {_the(x)} to {_the(y)}"


@_rule(r"pick up (?P<x>.+)")
def _pick(x: str) -> str:
    return f"pick up {_the(x)} and carry it with me"


@_rule(r"put down (?P<x>.+)")
def _put_down(x: str) -> str:
    return f"put down {_the(x)} here"


@_rule(r"look around")
def _look_around() -> str:
    return "look around to see what is in this room"


@_rule(r"look at (?P<x>.+)")
def _look_at(x: str) -> str:
    return f"look at {_the(x)} closely"


@_rule(r"look in (?P<x>.+)")
def _look_in(x: str) -> str:
    return f"look inside {_the(x)} to see what it holds"


@_rule(r"examine (?P<x>.+)")
def _examine(x: str) -> str:
    return f"examine {_the(x)} to check its current state"


@_rule(r"read (?P<x>.+)")
def _read(x: str) -> str:
    return f"read {_the(x)} for information"


@_rule(r"open (?P<x>.+)")
def _open(x: str) -> str:
    return f"open {_the(x)} to get at what is inside"


@_rule(r"close (?P<x>.+)")
def _close(x: str) -> str:
    return f"close {_the(x)}"


@_rule(r"activate (?P<x>.+)")
def _activate(x: str) -> str:
    return f"turn on {_the(x)}"


@_rule(r"deactivate (?P<x>.+)")
def _deactivate(x: str) -> str:
    return f"turn off {_the(x)}"


@_rule(r"connect (?P<x>.+) to (?P<y>.+)")
def _connect(x: str, y: str) -> str:
    return f"connect {_the(x)} to {_the(y)} to build the circuit"


@_rule(r"disconnect (?P<x>.+)")
def _disconnect(x: str) -> str:
    return f"disconnect {_the(x)} from the circuit"


@_rule(r"use (?P<x>.*thermometer.*) on (?P<y>.+)")
def _thermometer(x: str, y: str) -> str:
    return f"measure the temperature of {_the(y)} with the thermometer"


@_rule(r"use (?P<x>.+) on (?P<y>.+)")
def _use_on(x: str, y: str) -> str:
    return f"use {_the(x)} on {_the(y)}"


@_rule(r"use (?P<x>.+)")
def _use(x: str) -> str:
    return f"use {_the(x)}"


@_rule(r"pour (?P<x>.+) (?:into|in) (?P<y>.+)")
def _pour(x: str, y: str) -> str:
    return f"pour {_the(x)} into {_the(y)}"


@_rule(r"dunk (?P<x>.+) (?:into|in) (?P<y>.+)")
def _dunk(x: str, y: str) -> str:
    return f"dunk {_the(x)} into {_the(y)}"


@_rule(r"mix (?P<x>.+)")
def _mix(x: str) -> str:
    return f"mix what is in {_the(x)} so the ingredients combine"


@_rule(r"eat (?P<x>.+)")
def _eat(x: str) -> str:
    return f"eat {_the(x)}"


@_rule(r"flush (?P<x>.+)")
def _flush(x: str) -> str:
    return f"flush {_the(x)}"


@_rule(r"wait\s*(?P<n>\d*)")
def _wait(n: str) -> str:
    if n == "1":
        return "wait a single time step so the process can progress"
    return f"wait {n or 'ten'} time steps so the process can progress"


@_rule(r"inventory")
def _inventory() -> str:
    return "check what I am carrying"


@_rule(r"task")
def _task() -> str:
    return "re-read the task description"


@_rule(r"(?P<n>\d+)")
def _choose(n: str) -> str:
    return f"choose option {n} from the list the environment offered"


def describe_action(action: str) -> str:
    """A short intent phrase for an action, e.g. "open door to kitchen" ->
    "open the door to the kitchen so I can go there" (fits "Next I need to <intent>.")."""
    text = normalize_action(action)
    for pattern, fn in _RULES:
        match = pattern.match(text)
        if match:
            return fn(**match.groupdict())  # type: ignore[operator]
    return f"try '{text}'" if text else "act"
