"""What the policy is told about WebShop, and how its action lines are cleaned and described.

The response format (Thought/Plan/Action) is added by the core, so it is not described here.
"""

from __future__ import annotations

import re

_SYSTEM_PROMPT = """You are shopping on a web store to buy the product described in an instruction.
Every observation is the text of the current web page, with page elements separated by [SEP].
The instruction is shown at the top of every page.

Pages:
- Search page: has a search bar.
- Results page: "Page N (Total results: M)", then for each product its ID (e.g. B09ABC1234), title and price. Buttons: "Back to Search", "< Prev" (after page 1), "Next >".
- Product page: option groups (an option type such as "color" or "size" followed by its values), the title, price and rating, and the buttons "Description", "Features", "Reviews", "Buy Now", "< Prev" (back to the results) and "Back to Search".
- Description, Features and Reviews pages: more details about the product, with "< Prev" (back to the product) and "Back to Search".

Actions (exactly one per turn):
- search[keywords]: search the store. Only possible on the search page.
- click[value]: click a button, a product ID or an option value that is shown on the current page, e.g. click[Next >], click[B09ABC1234], click[large], click[Buy Now].
An action that is not possible on the current page does nothing.

Choose a product that matches the instruction's attributes and price limit, select every option the instruction asks for on the product page (one value per option type), then click[Buy Now]. Buying ends the episode and is scored from 0 to 1 on how well the product, its options and its price match the instruction. You have at most {max_steps} actions."""


# The same rules in about a third of the tokens, for small models on small machines (every SFT
# example and every rollout prompt carries the system prompt).
_COMPACT_SYSTEM_PROMPT = """Buy the product described by the instruction on a web store. Pages are text; elements are separated by [SEP].
Actions, exactly one per turn:
- search[keywords] (only on the search page)
- click[value]: a button, product ID or option value shown on the page, e.g. click[B09ABC1234], click[large], click[Buy Now], click[Next >], click[< Prev]
Open a product that matches the instruction and its price limit, click each option the instruction asks for, then click[Buy Now]. At most {max_steps} actions."""

PROMPTS = {"full": _SYSTEM_PROMPT, "compact": _COMPACT_SYSTEM_PROMPT}


def system_prompt(max_steps: int = 10, prompt: str = "full") -> str:
    if prompt not in PROMPTS:
        raise ValueError(f"Unknown WebShop prompt {prompt!r}. Valid: {', '.join(PROMPTS)}")
    return PROMPTS[prompt].format(max_steps=max_steps)


_ACTION_RE = re.compile(r"\b(search|click)\s*\[(.*)\]", re.I | re.S)
_LOOSE_RE = re.compile(r"^(search|click)\s*[:\s]\s*(.+)$", re.I | re.S)
_ASIN_RE = re.compile(r"^(?=.*\d)[a-z0-9]{10}$", re.I)


def normalize_action(raw: str) -> str:
    """Clean a model-written action into `search[...]` / `click[...]` (unknown forms pass through stripped).

    Handles an "Action:" prefix, quotes/backticks, trailing punctuation, odd case, spaces
    around brackets, and bracket-less "click Buy Now" / "search: red shoes".
    """
    text = (raw or "").strip()
    text = re.sub(r"^\s*(?:action\s*\d*\s*:)\s*", "", text, flags=re.I)
    text = text.strip().strip("`'\"").strip()
    m = _ACTION_RE.search(text)
    if m is None:
        first_line = text.splitlines()[0].strip() if text else ""
        loose = _LOOSE_RE.match(first_line.rstrip(".;"))
        if loose is None:
            return first_line
        verb, arg = loose.group(1), loose.group(2)
    else:
        verb, arg = m.group(1), m.group(2)
        if "]" in arg:  # "click[a] then click[b]": keep the first action only
            arg = arg.split("]", 1)[0]
    arg = arg.strip().strip("`'\"").strip()
    return f"{verb.lower()}[{arg}]"


def describe_action(action: str) -> str:
    """A short intent for the scripted teacher, e.g. "open product B09ABC1234"."""
    m = _ACTION_RE.search(action or "")
    if m is None:
        return f"do '{(action or '').strip()}'"
    verb, arg = m.group(1).lower(), m.group(2).strip()
    if verb == "search":
        return f"search the store for '{arg}'"
    key = arg.lower()
    if key == "buy now":
        return "buy the product with the selected options"
    if key == "back to search":
        return "go back to the search page"
    if key == "next >":
        return "go to the next page of results"
    if key == "< prev":
        return "go back to the previous page"
    if key in ("description", "features", "reviews"):
        return f"read the product's {key}"
    if _ASIN_RE.match(arg):
        return f"open product {arg.upper()}"
    return f"select the option '{arg}'"
