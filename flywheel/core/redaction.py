"""Keep configured secrets out of anything an endpoint's text can reach: logs, errors, metadata, the store.

A `Redactor` knows the key values themselves (whatever their shape) and masks every
occurrence, plus the usual credential shapes (`sk-...`, `Bearer ...`) as a second line of
defence. The teacher and the policy client pass every text that came from an endpoint
(answers, error bodies, exception messages) through one before it goes anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
_SHAPES = re.compile(r"(sk-|Bearer\s+)[A-Za-z0-9_\-]{6,}")
_MIN_SECRET_LEN = 4  # shorter values ("", "EMPTY" is 5: still masked) would mask ordinary words


class Redactor:
    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first, so a key that contains another is masked whole.
        self.secrets = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        if not text:
            return text
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return _SHAPES.sub(rf"\1{MASK}", text)

    def exception(self, exc: BaseException) -> str:
        """`Type: message` of an exception, redacted (the only form of it that may be shown)."""
        return f"{type(exc).__name__}: {self(str(exc))}"


def preview(text: str, redact: Redactor, limit: int = 200) -> str:
    """The first characters of a raw answer, redacted, for an error message."""
    text = text or ""
    head = redact(text[: limit + 200])[:limit]  # redact before cutting: a cut key would escape the mask
    more = f" ... ({len(text)} chars in all)" if len(text) > limit else ""
    return f"{head!r}{more}"
