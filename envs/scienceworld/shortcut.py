"""A shorter expert: the engine's gold path with each walk between rooms replaced by one teleport.

The gold paths walk room to room ("open door to hallway", "go to hallway", ...) even under the
"easy" simplification, where doors start open and `teleport to LOC` exists. Collapsing every run
of door/go moves into a single teleport to where the run ends keeps the same task steps and
roughly halves the length (measured on 12 train variations each: find-non-living-thing 6.8 -> 3.9,
lifespan-longest-lived 5.8 -> 1.9). Short seeds matter for small models: fewer, shorter SFT
examples and fewer rollout steps. The adapter replays every shortened path and falls back to the
gold path when it does not succeed, so the expert is never worse than the engine's.
"""

from __future__ import annotations

import re

_NAVIGATION = re.compile(r"^(open door to|close door to|go to|teleport to) (.+)$")
_ARRIVES = ("go to", "teleport to")


def teleport_shortcut(actions: list[str]) -> list[str]:
    """Replace each maximal run of navigation moves that ends somewhere with `teleport to <room>`.

    A run with no move (only doors opened or closed) is kept as it is.
    """
    out: list[str] = []
    i = 0
    while i < len(actions):
        if not _NAVIGATION.match(actions[i]):
            out.append(actions[i])
            i += 1
            continue
        j, destination = i, None
        while j < len(actions) and (m := _NAVIGATION.match(actions[j])):
            if m.group(1) in _ARRIVES:
                destination = m.group(2)
            j += 1
        out.extend([f"teleport to {destination}"] if destination else actions[i:j])
        i = j
    return out


def allows_teleport(simplification: str) -> bool:
    parts = {s.strip() for s in simplification.split(",")}
    return "teleportAction" in parts or "easy" in parts
