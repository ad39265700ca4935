"""Sentence segments of a markdown chunk, as character offsets.

Prose lines are split at sentence ends (``.``, ``!``, ``?``, possibly followed by closing
quotes or brackets and by citation markers such as ``[12]`` or ``<sup>3</sup>``, then space and
an upper-case letter, digit or opening bracket), except after common abbreviations of
scientific writing (``e.g.``, ``et al.``, ``Fig.``, initials ...); a period between digits
(``0.923``) is never an end, as no space follows it. Markdown structure decides the rest: a
heading line is never a candidate; each table row (pipe rows, and lines with two or more tabs,
as PDF conversions write tables), each list item and each caption paragraph (``Table 3: ...``,
``**Figure 2.** ...``, one unit however many sentences it has) is a unit of its own; fenced code
is one unit per block. Segments never
include surrounding whitespace, so ``text[start:end]`` is the unit itself.
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset(
    """e.g i.e et al etc cf vs fig figs eq eqs sec secs tab tbl ref refs approx resp no nos vol pp ch app
    dr mr mrs ms prof st jr sr inc ltd co corp dept univ max min avg std var""".split()
)
_BOUNDARY = re.compile(r"[.!?][\"')\]]*(?:\[[^\]\n]{1,40}\]|<sup>[^<\n]{1,20}</sup>)*\s+(?=[\"'(\[]?[A-Z0-9])")
_CAPTION = re.compile(r"[*_]{0,2}(?:Table|Tab\.|Figure|Fig\.)\s*[A-Z]?\d+[a-z]?\s*[:.|]")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def _is_abbreviation(text: str, dot: int) -> bool:
    """Whether the period at ``dot`` ends an abbreviation or an initial rather than a sentence."""
    if text[dot] != ".":
        return False
    j = dot
    while j > 0 and (text[j - 1].isalpha() or text[j - 1] == "."):
        j -= 1
    word = text[j:dot].lower()
    if not word:
        return False
    if word in _ABBREVIATIONS or word.rstrip(".") in _ABBREVIATIONS:
        return True
    if len(word) == 1 and text[j].isupper():  # an initial: "J. Smith"
        return True
    return word == "al" and text[max(0, j - 3):j].lower() == "et "


def _split_prose(text: str, start: int, end: int) -> list[tuple[int, int]]:
    if _CAPTION.match(text, start):
        return [(start, end)]
    out = []
    s = start
    for m in _BOUNDARY.finditer(text, start, end):
        if _is_abbreviation(text, m.start()):
            continue
        cut = m.start() + len(m.group(0).rstrip())
        out.append((s, cut))
        s = m.end()
    out.append((s, end))
    return out


def _strip(text: str, s: int, e: int) -> tuple[int, int] | None:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return (s, e) if e > s else None


def sentence_segments(text: str) -> list[tuple[int, int]]:
    """Candidate evidence units of a chunk, in order, as ``(start, end)`` offsets."""
    segments: list[tuple[int, int]] = []
    pos = 0
    lines = text.splitlines(keepends=True)
    in_fence, fence_start = False, 0
    paragraph: tuple[int, int] | None = None

    def flush() -> None:
        nonlocal paragraph
        if paragraph is not None:
            for s, e in _split_prose(text, *paragraph):
                if (seg := _strip(text, s, e)) is not None:
                    segments.append(seg)
            paragraph = None

    for line in lines:
        line_start, line_end = pos, pos + len(line.rstrip("\r\n"))
        pos += len(line)
        stripped = line.strip()
        if _FENCE.match(line):
            flush()
            if in_fence:
                if (seg := _strip(text, fence_start, line_end)) is not None:
                    segments.append(seg)
                in_fence = False
            else:
                in_fence, fence_start = True, line_start
            continue
        if in_fence:
            continue
        if not stripped:
            flush()
        elif stripped.startswith("#") or _TABLE_SEPARATOR.match(line):
            flush()  # headings and table rules are not evidence
        elif stripped.startswith("|") or _LIST_ITEM.match(line) or line.count("\t") >= 2:
            flush()
            if (seg := _strip(text, line_start, line_end)) is not None:
                segments.append(seg)
        else:
            paragraph = (paragraph[0], line_end) if paragraph else (line_start, line_end)
    flush()
    if in_fence and (seg := _strip(text, fence_start, len(text))) is not None:
        segments.append(seg)  # an unclosed fence: the rest is one unit
    return segments
