"""The one markdown line scanner: what a line, a heading, a fence, a table row and a list marker are.

The chunker (``corpus.chunker``), the sentence units (``extract.sentences``) and silver's reference scan
(``silver.dataset``) all read markdown through ``scan``, so they agree on its structure:

* lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (CommonMark's line endings; ``\\u2028``, form feeds and the
  other ends of ``str.splitlines`` are text). A ``\\r`` before ``\\n`` stays at the end of its line string, so
  offsets are exact whatever the line ends;
* a line is classified by its first non-blank character, indented at most 3 columns (a leading byte-order mark
  of the text is ignored, and kept in the line): an ATX heading (``#`` to ``######``, then a space, a tab or the
  line's end), a pipe table row (``|``), a fence (three or more backticks or tildes; a backtick fence's info
  string holds no backtick), else text;
* a fence opens a code block only when it closes: by a later fence line of the same character, at least as long,
  with no info string. A fence line that closes nothing is ``UNCLOSED``, text to every reader, so one stray
  fence never swallows the rest of a paper; inside a block nothing is a heading or a row.

What each reader adds is its own: the chunker splits at the heading levels of its config; the sentence units
also end a unit at any line that starts with ``#`` (``###Task Description:`` in prompts that papers quote is
never evidence) and read lines with tabs as table rows (PDF conversions); silver also reads a bold line
(``**References**``) as a heading.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

BOM = "\ufeff"
# Line kinds. FENCE: the opening line of a code block (``Scan.closer`` gives its closing line); CODE: the lines
# after it, its closer included.
BLANK, TEXT, HEADING, TABLE, FENCE, CODE, UNCLOSED = range(7)

HEADING_RE = re.compile(r"(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
FENCE_RE = re.compile(r"(`{3,}|~{3,})(.*)$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")  # "- ", "* ", "+ ", "• ", "1. ", "2) "
BOLD_HEADING = re.compile(r"^\s*(?:\*\*|__)(.+?)(?:\*\*|__)\s*$")  # "**References**": docling's unmarked headings
LONE_CR = re.compile(r"\r(?!\n)")
_LINE_SPLIT = re.compile(r"\n|\r(?!\n)")


@dataclass(slots=True)
class Scan:
    """A text's lines, their kinds and indents, its headings (line -> level, text, outside code blocks) and its
    code blocks."""

    lines: list[str]
    starts: list[int]
    kinds: list[int]
    indents: list[int]
    headings: dict[int, tuple[int, str]]
    closers: dict[int, int]  # FENCE line -> the CODE line that closes it

    def end(self, i: int) -> int:
        """Offset after line ``i``'s last non-blank character."""
        return self.starts[i] + len(self.lines[i].rstrip())

    def stop(self, i: int) -> int:
        """Offset of line ``i``'s line ending (trailing blanks kept)."""
        return self.starts[i] + len(self.lines[i].removesuffix("\r"))


def scan(text: str) -> Scan:
    """Every line of ``text`` classified, fences paired (see the module docs)."""
    lines = _LINE_SPLIT.split(text) if "\r" in text and LONE_CR.search(text) else text.split("\n")
    n = len(lines)
    starts, kinds, indents = [0] * n, [BLANK] * n, [0] * n
    headings: dict[int, tuple[int, str]] = {}
    fences: dict[int, tuple[str, int]] = {}  # fence line -> (char, length)
    closers: dict[str, list[int]] = {"`": [], "~": []}  # fence lines with no info string, by character
    bom = text.startswith(BOM)
    pos = 0
    for i, line in enumerate(lines):
        starts[i] = pos
        pos += len(line) + 1  # every terminator but the last is one character (\n or a lone \r)
        lead = int(i == 0 and bom)  # a byte-order mark is not text: the line is classified without it
        body = line[lead:].lstrip()
        if not body and not lead:
            continue
        kinds[i] = TEXT  # a byte-order mark alone too: it stays in a chunk
        indent = len(line) - lead - len(body)
        indents[i] = 0 if lead else indent  # the mark stays in the line's unit
        if indent > 3 or not body:
            continue
        c = body[0]
        if c == "#":
            if HEADING_RE.match(body):
                m = HEADING_RE.match(body.rstrip())  # "# Title ##\r": the closing "##" is not the heading's
                kinds[i] = HEADING
                headings[i] = (len(m.group(1)), (m.group(2) or "").strip())
        elif c == "|":
            kinds[i] = TABLE
        elif c == "`" or c == "~":
            m = FENCE_RE.match(body)
            if m and not (c == "`" and "`" in m.group(2)):
                fences[i] = (c, len(m.group(1)))
                if not m.group(2).strip():
                    closers[c].append(i)
                kinds[i] = UNCLOSED
    pairs: dict[int, int] = {}
    for i in sorted(fences):
        if kinds[i] != UNCLOSED:
            continue  # inside a block found before
        char, length = fences[i]
        candidates = closers[char]
        k = bisect.bisect_right(candidates, i)
        while k < len(candidates) and fences[candidates[k]][1] < length:
            k += 1
        if k < len(candidates):
            j = pairs[i] = candidates[k]
            kinds[i] = FENCE
            kinds[i + 1 : j + 1] = [CODE] * (j - i)
            for h in range(i + 1, j + 1):
                headings.pop(h, None)
    return Scan(lines, starts, kinds, indents, headings, pairs)
