"""BM25 product search that ranks like WebShop's Pyserini/Lucene index.

The original indexes `title + description + first bullet + option text` (lowercased)
with Lucene's English analyzer (standard tokenizer, possessive filter, stopwords,
Porter stemmer) and BM25(k1=0.9, b=0.4), returning the top 50. Here the same
analyzer is reimplemented in Python and scoring is done by `bm25s` with Lucene's
BM25 variant; ties break by catalog order like Lucene's doc ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import bm25s
import numpy as np

if TYPE_CHECKING:
    from envs.webshop.products import Product

K1 = 0.9
B = 0.4
SEARCH_RETURN_N = 50

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

# Standard-tokenizer approximation (UAX#29): letters joined by . or ' stay one token
# ("d.o.n", "women's"), digits joined by . or , too ("3.5", "1,000"); hyphens split.
_TOKEN_RE = re.compile(r"\w+(?:(?:(?<=[^\W\d_])['.’](?=[^\W\d_])|(?<=\d)[.,](?=\d))\w+)*")


# ---------------------------------------------------------------- Porter stemmer


class _Porter:
    """Porter (1980) stemmer as in Porter's reference implementation, which Lucene follows.

    Written as a small state machine over one word: `k` is the end of the current
    stem, `j` the end of the stem before a matched suffix.
    """

    def __init__(self, word: str) -> None:
        self.b = list(word)
        self.k = len(word) - 1
        self.j = 0

    def cons(self, i: int) -> bool:
        ch = self.b[i]
        if ch in "aeiou":
            return False
        if ch == "y":
            return i == 0 or not self.cons(i - 1)
        return True

    def m(self) -> int:
        """Number of vowel-consonant sequences in b[0..j]."""
        n, i, j = 0, 0, self.j
        while i <= j and self.cons(i):
            i += 1
        while True:
            while i <= j and not self.cons(i):
                i += 1
            if i > j:
                return n
            while i <= j and self.cons(i):
                i += 1
            n += 1
            if i > j:
                return n

    def vowel_in_stem(self) -> bool:
        return any(not self.cons(i) for i in range(self.j + 1))

    def doublec(self, i: int) -> bool:
        return i >= 1 and self.b[i] == self.b[i - 1] and self.cons(i)

    def cvc(self, i: int) -> bool:
        if i < 2 or not self.cons(i) or self.cons(i - 1) or not self.cons(i - 2):
            return False
        return self.b[i] not in "wxy"

    def ends(self, s: str) -> bool:
        n = len(s)
        if n > self.k + 1 or "".join(self.b[self.k - n + 1 : self.k + 1]) != s:
            return False
        self.j = self.k - n
        return True

    def setto(self, s: str) -> None:
        self.b[self.j + 1 :] = list(s)
        self.k = self.j + len(s)

    def r(self, s: str) -> None:
        if self.m() > 0:
            self.setto(s)

    def step1ab(self) -> None:
        if self.b[self.k] == "s":
            if self.ends("sses"):
                self.k -= 2
            elif self.ends("ies"):
                self.setto("i")
            elif self.k >= 1 and self.b[self.k - 1] != "s":
                self.k -= 1
            del self.b[self.k + 1 :]
        if self.ends("eed"):
            if self.m() > 0:
                self.k -= 1
                del self.b[self.k + 1 :]
        elif (self.ends("ed") or self.ends("ing")) and self.vowel_in_stem():
            self.k = self.j
            del self.b[self.k + 1 :]
            if self.ends("at"):
                self.setto("ate")
            elif self.ends("bl"):
                self.setto("ble")
            elif self.ends("iz"):
                self.setto("ize")
            elif self.doublec(self.k):
                if self.b[self.k] not in "lsz":
                    self.k -= 1
                    del self.b[self.k + 1 :]
            else:
                self.j = self.k
                if self.m() == 1 and self.cvc(self.k):
                    self.setto("e")

    def step1c(self) -> None:
        if self.ends("y") and self.vowel_in_stem():
            self.b[self.k] = "i"

    _STEP2 = {
        "a": (("ational", "ate"), ("tional", "tion")),
        "c": (("enci", "ence"), ("anci", "ance")),
        "e": (("izer", "ize"),),
        "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
        "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
        "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
        "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
        "g": (("logi", "log"),),
    }
    _STEP3 = {
        "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
        "i": (("iciti", "ic"),),
        "l": (("ical", "ic"), ("ful", "")),
        "s": (("ness", ""),),
    }
    _STEP4 = {
        "a": ("al",),
        "c": ("ance", "ence"),
        "e": ("er",),
        "i": ("ic",),
        "l": ("able", "ible"),
        "n": ("ant", "ement", "ment", "ent"),
        "o": ("ion", "ou"),
        "s": ("ism",),
        "t": ("ate", "iti"),
        "u": ("ous",),
        "v": ("ive",),
        "z": ("ize",),
    }

    def _replace_first(self, rules: tuple[tuple[str, str], ...]) -> None:
        for suffix, repl in rules:
            if self.ends(suffix):
                self.r(repl)
                return

    def step2(self) -> None:
        if self.k >= 1:
            self._replace_first(self._STEP2.get(self.b[self.k - 1], ()))

    def step3(self) -> None:
        self._replace_first(self._STEP3.get(self.b[self.k], ()))

    def step4(self) -> None:
        if self.k < 1:
            return
        for suffix in self._STEP4.get(self.b[self.k - 1], ()):
            if self.ends(suffix):
                if suffix == "ion" and not (self.j >= 0 and self.b[self.j] in "st"):
                    continue
                break
        else:
            return
        if self.m() > 1:
            self.k = self.j
            del self.b[self.k + 1 :]

    def step5(self) -> None:
        self.j = self.k
        if self.b[self.k] == "e":
            a = self.m()
            if a > 1 or (a == 1 and not self.cvc(self.k - 1)):
                self.k -= 1
                del self.b[self.k + 1 :]
        if self.b[self.k] == "l" and self.doublec(self.k) and self.m() > 1:
            self.k -= 1
            del self.b[self.k + 1 :]

    def stem(self) -> str:
        if self.k <= 1:
            return "".join(self.b)
        self.step1ab()
        if self.k > 0:
            self.step1c()
            self.step2()
            self.step3()
            self.step4()
            self.step5()
        return "".join(self.b[: self.k + 1])


@lru_cache(maxsize=200_000)
def porter_stem(word: str) -> str:
    """Porter-stem one lowercase token (cached: catalogs reuse a small vocabulary)."""
    return _Porter(word).stem()


def analyze(text: str) -> list[str]:
    """Lucene EnglishAnalyzer approximation: tokenize, drop possessive 's, stopwords, stem."""
    out = []
    for tok in _TOKEN_RE.findall(text.lower()):
        if tok.endswith(("'s", "’s")):
            tok = tok[:-2]
        tok = tok.strip("_")
        if not tok or tok in LUCENE_STOPWORDS:
            continue
        out.append(porter_stem(tok))
    return out


# ---------------------------------------------------------------- index


def document_text(product: Product) -> str:
    """What the original indexes: title, description, first bullet and option text, lowercased."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())
    first_bullet = product.bullet_points[0] if product.bullet_points else ""
    return " ".join([product.title, product.description, first_bullet, option_text]).lower()


class SearchEngine:
    """BM25 over a catalog; `search` returns ASINs best first, ties by catalog order."""

    def __init__(self, products: Sequence[Product]) -> None:
        self.asins = [p.asin for p in products]
        corpus = [analyze(document_text(p)) or [""] for p in products]
        self._bm25 = bm25s.BM25(k1=K1, b=B, method="lucene")
        self._bm25.index(corpus, show_progress=False)
        self._vocab = self._bm25.vocab_dict

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every product for `query` (zeros when no query term is indexed)."""
        tokens = [t for t in analyze(query) if t in self._vocab]
        if not tokens:
            return np.zeros(len(self.asins), dtype=np.float32)
        return self._bm25.get_scores(tokens)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        order = hits[np.lexsort((hits, -scores[hits]))]
        return [self.asins[i] for i in order[:k]]
