"""The documentation holds together: every relative link resolves, every anchor names a heading, and the
README stays a front door (at most 250 lines, with the headline markers the results update rewrites)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
HEADLINE_MARKERS = ("<!-- headline:start -->", "<!-- headline:end -->")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the target may carry a "title"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "experiments" / "results").glob("*/notes.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, punctuation other than `-` and `_`
    removed, spaces turned into `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, duplicates numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            out.append((n, m.group(1)))
    return out


def broken_links(path: Path) -> list[str]:
    """Every relative link of `path` that names no file or directory, or an anchor no heading has."""
    problems = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto, ...: not checked
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file or directory")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix != ".md":
                problems.append(f"{where}: an anchor into something that is not a markdown file")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def test_the_docs_exist():
    files = doc_files()
    assert (ROOT / "docs" / "README.md") in files
    assert len([f for f in files if f.name == "notes.md"]) >= 1


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    assert broken_links(path) == []


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference into docs/"
    text = "\n".join(lines)
    start, end = (text.find(m) for m in HEADLINE_MARKERS)
    assert start >= 0 and end > start, "README.md needs the headline markers, start before end"
    assert text.count(HEADLINE_MARKERS[0]) == 1 and text.count(HEADLINE_MARKERS[1]) == 1
    assert "|" in text[start:end], "the headline markers enclose the result table"


def test_readme_links_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(ROOT / "README.md") if not t.startswith("#")}
    docs = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert docs - linked == set(), f"pages of docs/ the README does not link: {sorted(p.name for p in docs - linked)}"


def test_the_checker_catches_what_it_should(tmp_path, monkeypatch):
    """A broken file link, a broken anchor and a broken in-file anchor are reported; code is not read."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# Other page\n\n## The recipe's defaults (`policy`)\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#the-recipes-defaults-policy) [ok](other.md#twice-1) [ok](#page) "
        "[ok](https://example.com/nowhere) `[in code](missing.md)`\n\n"
        "```\n[in a fence](missing.md)\n```\n\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad here](#nope) ![img](pic.png)\n"
    )
    problems = broken_links(page)
    assert [p.split(": ", 2)[1] for p in problems] == ["missing.md", "other.md#nope", "#nope", "pic.png"]
