"""What the policy is told about ALFWorld, and how its action lines are cleaned.

Verb choice: these game files (and ALFWorld 0.4.x, its expert and its
admissible commands) accept `move X to Y`; `put X in/on Y` from older ALFWorld
and most published prompts gives "Nothing happens." here. The policy is taught
`move X to Y`, and `normalize_action` rewrites `put`/`place` forms to it, so
a model that learned the old verb still acts.
"""

from __future__ import annotations

import re

SYSTEM_PROMPT = """\
You are a household robot in a simulated home (ALFWorld). Each episode gives you one task, such as \
"put a clean mug in the coffeemachine" or "examine the book with the desklamp". You see the room as text; \
each turn you issue exactly one action and read what happens. The episode ends as soon as the task is done, \
or when the step limit is reached.

Actions (write them exactly like this, with the numbered names you have seen, e.g. "apple 1", "countertop 2"):
- go to <receptacle>                 walk to a receptacle (cabinet 3, fridge 1, countertop 1, ...)
- open <receptacle> / close <receptacle>
- take <object> from <receptacle>    pick up an object; you can carry only one at a time
- move <object> to <receptacle>      put the object you hold in or on a receptacle
- heat <object> with <receptacle>    with a microwave
- cool <object> with <receptacle>    with a fridge
- clean <object> with <receptacle>   with a sinkbasin
- use <object>                       switch on a lamp (desklamp, floorlamp)
- examine <something>                look closely at a receptacle or object
- inventory                          see what you carry
- look                               see where you are

Tips:
- Objects start inside or on receptacles; you only see what is in a receptacle when you are at it \
(and have opened it, if it is closed). Search likely places first, and do not revisit empty ones.
- To heat, cool or clean an object, hold it and go to the microwave, fridge or sinkbasin, then act; \
then take it to the target receptacle and move it there.
- To examine an object in light, hold it, go to a lamp and use the lamp.
- "put two X in Y" means placing two different X objects, one at a time.
- An action the game cannot do right now answers "Nothing happens."; try something else.
"""

_ARTICLES = re.compile(r"\b(?:the|a|an|some)\s+")
_PLACE = re.compile(r"^(?:put|place|move|drop|set)\s+(.+?)\s+(?:in/on|in or on|into|onto|inside|in|on|to|at)\s+(.+)$")
_PICK = re.compile(r"^(?:pick up|pickup|pick|grab|get)\s+(.+?)\s+from\s+(.+)$")
_GO = re.compile(r"^(?:go to|goto|go|walk to|navigate to|move to)\s+(.+)$")
_USE = re.compile(r"^(?:turn on|switch on|toggle)\s+(.+)$")
_SYNONYMS = ((_PLACE, "move {} to {}"), (_PICK, "take {} from {}"), (_USE, "use {}"), (_GO, "go to {}"))
_PREFIX = re.compile(r"^(?:action\s*\d*\s*:|>|[-*]|\d+[.)])\s*", re.IGNORECASE)


def system_prompt() -> str:
    return SYSTEM_PROMPT


def normalize_action(raw: str) -> str:
    """One model-written line -> ALFWorld's action syntax (idempotent).

    Lower-cases, drops quotes/markdown/"Action:" prefixes, articles and a final
    period, and maps synonyms: put/place X in/on Y -> move X to Y, goto X ->
    go to X, pick up X from Y -> take X from Y, turn on X -> use X.
    """
    lines = [line.strip() for line in raw.strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    marker = text.lower().rfind("action:")
    if marker >= 0:
        text = text[marker + len("action:") :]
    text = text.strip().strip("`*\"'").strip()
    text = _PREFIX.sub("", text).strip().strip("`*\"'").rstrip(".!").strip().lower()
    text = " ".join(_ARTICLES.sub("", text + " ").split())
    for pattern, template in _SYNONYMS:
        if match := pattern.match(text):
            return template.format(*match.groups())
    return text


_INTENTS = (
    (re.compile(r"^go to (.+)$"), "walk over to {0} to see what is there"),
    (re.compile(r"^open (.+)$"), "open {0} to look inside"),
    (re.compile(r"^close (.+)$"), "close {0}"),
    (re.compile(r"^take (.+) from (.+)$"), "pick up {0} from {1}"),
    (re.compile(r"^move (.+) to (.+)$"), "place {0} in/on {1}"),
    (re.compile(r"^heat (.+) with (.+)$"), "heat {0} using {1}"),
    (re.compile(r"^cool (.+) with (.+)$"), "cool {0} using {1}"),
    (re.compile(r"^clean (.+) with (.+)$"), "clean {0} using {1}"),
    (re.compile(r"^slice (.+) with (.+)$"), "slice {0} with {1}"),
    (re.compile(r"^use (.+)$"), "switch on {0}"),
    (re.compile(r"^examine (.+)$"), "examine {0} closely"),
    (re.compile(r"^inventory$"), "check what I am carrying"),
    (re.compile(r"^look$"), "look around where I am"),
    (re.compile(r"^help$"), "list the available commands"),
)


def describe_action(action: str) -> str:
    """A short intent for an action, for the scripted teacher's thoughts."""
    command = normalize_action(action)
    for pattern, template in _INTENTS:
        if match := pattern.match(command):
            return template.format(*match.groups())
    return command
