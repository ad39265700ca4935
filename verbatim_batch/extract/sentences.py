"""Units of a markdown chunk (sentences, table rows, list items, ...), as character offsets and kinds.

Prose lines are split at sentence ends (``.``, ``!``, ``?``, possibly followed by closing quotes or brackets and
by citation markers such as ``[12]`` or ``<sup>3</sup>``, then space and an upper-case letter, digit or opening
bracket), except after common abbreviations of scientific writing (``e.g.``, ``et al.``, ``Fig.``, initials ...);
a period between digits (``0.923``) is never an end, as no space follows it. Markdown structure
(``corpus.markdown.scan``: lines, fences, table rows, as the chunker reads them) decides the rest: each heading
line, each table row (pipe rows; lines with two or more tabs, and runs of lines with a tab, as PDF conversions
write tables), each list item and each caption paragraph (``Table 3: ...``, ``**Figure 2.** ...``, one unit
however many sentences it has) is a unit of its own; fenced code is one unit per block. Segments never include
surrounding whitespace, so ``text[start:end]`` is the unit itself.

Every unit has a kind (``units``): ``prose``, ``heading``, ``list_item``, ``table_row``, ``caption``,
``code``, or one of the parts of a paper that are not its body:

* ``reference``: an entry of a reference list: a paragraph or list item under a References / Bibliography heading
  of the chunk, or one that reads like an entry anywhere (an author list, a year and a venue, page or DOI cue; a
  ``[12]`` marker and a year or cue; ``Cited by:``);
* ``toc``: a table-of-contents line (a title, dot leaders and a page number, or any line under a Contents heading);
* ``front_matter``: author, affiliation and e-mail lines, metadata lines of web dumps (``Title:``, ``URL Source:``,
  ``DOI:`` ...), the title line just above an author block, lines under a committee heading. A paragraph is front
  matter when one of its lines clearly is (an e-mail, an affiliation, a list of names with affiliation marks) and
  none of them reads like prose; a bare name line next to such a paragraph is too.

The extractors take no evidence from ``NON_BODY`` kinds by default. ``sentence_segments`` keeps its older meaning:
every unit but ``#`` heading lines, without kinds.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from verbatim_batch.corpus import markdown as md

PROSE, HEADING, LIST_ITEM, TABLE_ROW, CAPTION, CODE = "prose", "heading", "list_item", "table_row", "caption", "code"
RUN_IN = "run_in_heading"  # the short title that opens a paragraph: part of the paragraph, never evidence alone
REFERENCE, TOC, FRONT_MATTER = "reference", "toc", "front_matter"
UNIT_KINDS = (PROSE, HEADING, RUN_IN, LIST_ITEM, TABLE_ROW, CAPTION, CODE, REFERENCE, TOC, FRONT_MATTER)
NON_BODY = frozenset({HEADING, REFERENCE, TOC, FRONT_MATTER})  # never evidence by default


class Unit(NamedTuple):
    """One unit of a chunk: ``text[start:end]``, its kind, and for a table row its table's header row."""

    start: int
    end: int
    kind: str
    header: tuple[int, int] | None = None  # table rows: the first row of their table


_ABBREVIATIONS = frozenset(
    """e.g i.e et al etc cf vs fig figs eq eqs sec secs tab tbl ref refs approx resp no nos vol pp ch app
    dr mr mrs ms prof st jr sr inc ltd co corp dept univ max min avg std var""".split()
)
_BOUNDARY = re.compile(r"[.!?][\"')\]]*(?:\[[^\]\n]{1,40}\]|<sup>[^<\n]{1,20}</sup>)*\s+(?=[\"'(\[]?[A-Z0-9])")
_CAPTION = re.compile(r"[*_]{0,2}(?:Table|Tab\.|Figure|Fig\.)\s*[A-Z]?\d+[a-z]?\s*[:.|]")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}")
_RUN_IN_BOLD = re.compile(r"(\*\*[^*\n]{2,80}\*\*|__[^_\n]{2,80}__)[ \t]+(?=\S)")

# --- parts of a paper that are not its body -----------------------------------------------------------------

_PLAIN = re.compile(r"^[#*_\s]+|[*_:\s]+$")
_REFS_TITLE = re.compile(r"(?:[\dIVX]+\.?\s+)?(?:references?(?:\s+and\s+notes)?|bibliography|literature\s+cited|"
                         r"works\s+cited|reference\s+list|citations)", re.IGNORECASE)
_TOC_TITLE = re.compile(r"(?:table\s+of\s+)?contents", re.IGNORECASE)
_FRONT_TITLE = re.compile(r"(?:(?:organi[sz]ing|program(?:me)?|steering|scientific|local|area)\s+)?"
                          r"(?:committees?|chairs?)|(?:program\s+committee\s+)?members|reviewers|authors?|"
                          r"author\s+index|affiliations?", re.IGNORECASE)
_TOC_LINE = re.compile(r"(?:\.\s*){4,}(?:\d{1,5}|[ivxlcdm]{1,7})\s*$|(?:…\s*){2,}\d{1,5}\s*$", re.IGNORECASE)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\{[^{}\n]{1,300}\}\s*@[\w-]+(?:\.[\w-]+)+")
_METADATA = re.compile(r"[*_]{0,2}(?:title|url\s+source|published\s+time|markdown\s+content|correspondence|"
                       r"corresponding\s+authors?|e-?mails?|doi|received|accepted|available\s+online|"
                       r"equal\s+contribution)[*_]{0,2}\s*:|(?:\\?\*\s*)?corresponding\s+authors?\b|©|\(c\)\s+\d{4}|"
                       r"copyright\b", re.IGNORECASE)
_AFFILIATION = re.compile(r"\b(?:universit\w*|univ\.|institut\w*|department|dept\.|laborator\w*|labs?|"
                          r"cent(?:er|re)|college|school|faculty|inc\.|ltd\.?|corp\.?|corporation|gmbh|academy|"
                          r"hospital|foundation|research|polytechnic\w*)\b", re.IGNORECASE)
_PROSE_WORDS = frozenset(
    """we our us is are was were this that these those which has have had can could be been being show shows
    shown use uses used using propose proposed present presents it its they their not than such when while
    where there here would should will may might do does did""".split())
_AFFILIATION_MARK = re.compile(r"<sup>[^<\n]{0,20}</sup>|[\d¹²³⁴⁵⁶⁷⁸⁹⁰]+|\\?[*†‡§¶♠♣♥♦⋆★✉♮♭]")
_PARTICLES = frozenset("van von der den de da di del della dos das du la le ten ter bin ibn al el y".split())
_INITIAL = re.compile(r"(?:[A-Z]\.\s?-?)+")
_YEAR = re.compile(r"(?<![\d.])(?:19|20)\d{2}[a-z]?(?!\d)")
_REF_MARKER = re.compile(r"\s*\[\d{1,4}\]\s")
_REF_CUE = re.compile(r"\bIn\s+Proceedings|\bProceedings\s+of|\bProc\.|\barXiv|\bpreprint\b|\bConference\b|"
                      r"\bJournal\b|\bTransactions\b|\bWorkshop\b|\bpages\s+\d|\bpp\.\s*\d|\b[Vv]ol\.\s*\d|\bdoi\b|"
                      r"\bDOI\b|Association\s+for\s+Computational\s+Linguistics|\bCoRR\b|\babs/\d|\(Eds?\.\)|"
                      r"\beditors?\b|University\s+Press|\bSpringer\b|\bACM\b|\bIEEE\b|\d+\s*\(\d+\)\s*:\s*\d+|"
                      r"\bCited\s+by\b|\bExternal\s+Links\b|https?://|\bURL\b")
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")


def _plain(line: str) -> str:
    return _PLAIN.sub("", line)


def _words(line: str) -> list[str]:
    return _WORD.findall(line)


def _prose_like(line: str) -> bool:
    """A line that reads like running text (a common verb or pronoun, or a long line of words)."""
    words = _words(line)
    return len(words) > 40 or any(w.casefold() in _PROSE_WORDS and not w.isupper() for w in words)


def _name_token(token: str) -> bool:
    token = token.strip("()[]{}.,;")
    if not token:
        return False
    if _INITIAL.fullmatch(token + ".") or _INITIAL.fullmatch(token):
        return True
    return (token[0].isupper() and any(ch.islower() for ch in token)
            and all(ch.isalpha() or ch in "-'’." for ch in token))


def _names(items: list[str]) -> bool:
    """Every item is a person's name: 2 to 5 name tokens (initials, capitalised words, particles inside)."""
    for item in items:
        tokens = item.split()
        if not 2 <= len(tokens) <= 5 or tokens[0].casefold() in _PARTICLES:
            return False
        if not all(_name_token(t) or t.casefold() in _PARTICLES for t in tokens):
            return False
    return bool(items)


def _name_items(line: str) -> tuple[list[str], bool]:
    """The comma / "and" separated items of a line with its affiliation marks dropped, and whether it had any."""
    stripped, marks = _AFFILIATION_MARK.subn(" ", line.replace("**", " ").replace("__", " "))
    items = [i.strip() for i in re.split(r",|;|\band\b|&", stripped)]
    return [i for i in items if i], marks > 0


def _front_line(line: str) -> str | None:
    """How a line of a paragraph reads as front matter: "strong" (metadata, e-mail, affiliation, a list of
    names), "weak" (a single name, a short line of capitalised words), or None (anything else)."""
    plain = _plain(line)
    if not plain or len(plain) > 400:
        return None
    if _METADATA.match(plain):
        return "strong"
    prose = _prose_like(plain)
    if _EMAIL.search(plain) and (not prose or len(plain) < 80):
        return "strong"
    if prose or plain.endswith((".", "?", "!")) and not _INITIAL.fullmatch(plain.split()[-1]):
        return None
    items, marked = _name_items(plain)
    if _names(items) and (len(items) >= 2 or marked):
        return "strong"
    words = _words(plain)
    capitalised = [w for w in words if len(w) > 3]
    title_case = bool(capitalised) and sum(w[0].isupper() for w in capitalised) >= 0.6 * len(capitalised)
    if _AFFILIATION.search(plain) and len(plain) <= 250 and title_case:
        return "strong"
    if (marked and title_case and len(capitalised) >= 2 and len(plain) <= 200 and "://" not in plain
            and re.match(r"\s*(?:<sup>|[¹²³⁴⁵⁶⁷⁸⁹⁰*†‡§]|\d\s?[A-Z])", plain)):
        return "strong"  # "¹Computer Science, Cornell Tech, NY, USA": an affiliation behind its mark
    if _names(items) or (words and len(plain) <= 80 and all(w[0].isupper() or w.casefold() in _PARTICLES
                                                            or w.casefold() in ("of", "and", "for", "the")
                                                            for w in words)):
        return "weak"
    return None


def is_reference_entry(text: str) -> bool:
    """Whether a paragraph or list item (its marker removed) reads like an entry of a reference list."""
    items = re.split(r",\s*", text[:400])[:-1]
    if len(items) >= 6 and sum(_names([_REF_MARKER.sub("", i, count=1).strip()]) for i in items) >= 0.8 * len(items):
        return True  # a long author list ("A. Dubey, A. Jauhri, A. Pandey, ..."), often cut by a chunk boundary
    if len(text) > 3000:
        return False
    if re.search(r"\bCited\s+by\s*:|\bExternal\s+Links\s*:", text):
        return True
    year = _YEAR.search(text, 0, 1500)
    cues = {m.group(0).casefold() for m in _REF_CUE.finditer(text)}
    marker = _REF_MARKER.match(text)
    if marker and (year or cues):
        return True
    if len(cues) >= 2 and not _prose_like(text):
        return True  # the tail of an entry: "..., pages 1234-1249, Seattle. Association for Computational ..."
    if marker:  # "[11] J. Devlin, M.-W. Chang, and K. Toutanova, “BERT: ...": names up to the quoted title
        head = re.split(r"[“\"]", text[marker.end():], maxsplit=1)[0]
        return head != text[marker.end():] and _author_list(head)
    if year is None or any(w in ("we", "We", "our", "Our", "us") for w in _words(text)):
        return False  # "Following Lee et al. (2008), we use ..." is prose
    head = text[:year.start()].strip().rstrip("(").strip()
    if not _author_list(head):
        return False
    # a venue, page or link cue, or the year followed by a title ("2019. Title", "(2025)Title"), not by prose
    after = text[year.end():]
    return bool(cues) or (after[:1] in (".", ")") and not _prose_like(after[:200]))


def _author_list(head: str) -> bool:
    """``Names, Names, and Names.`` (initials, particles and ``et al.`` / ``editors`` allowed)."""
    tokens = [t for t in re.split(r"[\s,;]+", head) if t and t.casefold().strip("().") not in
              ("and", "&", "et", "al", "editors", "editor", "eds", "ed")]
    if len(tokens) < 2 or not head or not (head[-1] in ".,(" or head.endswith(("al", "al."))):
        return False
    return all(_name_token(t) or t.casefold() in _PARTICLES for t in tokens)


# --- splitting -----------------------------------------------------------------------------------------------


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


def _heading_like(piece: str, run_in: bool) -> bool:
    """A short title-like line ("Results and Discussion", "3 Method") or, ``run_in``, the short title that opens
    a paragraph ("Hybrid retrieval with RRF. The hybrid ..."): no digits, no verb or pronoun of running text."""
    words = _words(piece)
    if not words or len(words) > 8 or _prose_like(piece) or any(ch in piece for ch in "{}=$|"):
        return False
    if run_in:
        return piece.endswith(".") and not any(ch.isdigit() for ch in piece) and piece[0].isupper()
    return not piece.endswith((".", "?", "!", ":", ",", ";")) and (piece[0].isupper() or piece[0].isdigit())


def _split_prose(text: str, start: int, end: int) -> list[tuple[int, int, str]]:
    if _CAPTION.match(text, start):
        return [(start, end, CAPTION)]
    out = []
    s = start
    bold = _RUN_IN_BOLD.match(text, start, end)
    if bold and _words(bold.group(1)) and len(_words(bold.group(1))) <= 8:
        out.append((start, bold.end(1), RUN_IN))  # "**Peer Review** Many tasks ..."
        s = bold.end(1)
    for m in _BOUNDARY.finditer(text, start, end):
        if _is_abbreviation(text, m.start()):
            continue
        cut = m.start() + len(m.group(0).rstrip())
        out.append((s, cut, PROSE))
        s = m.end()
    out.append((s, end, PROSE))
    return out


def _strip(text: str, s: int, e: int) -> tuple[int, int] | None:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return (s, e) if e > s else None


class _Block(NamedTuple):
    kind: str  # "heading", "code", "row", "item", "para"
    lines: tuple[tuple[int, int], ...]  # (start, end) of each line, without the line break
    section: str | None  # "refs", "toc", "front" under such a heading of the chunk, else None
    header: tuple[int, int] | None = None


def _blocks(text: str) -> list[_Block]:
    scan = md.scan(text)
    out: list[_Block] = []
    section: str | None = None
    para: list[tuple[int, int]] = []
    header: tuple[int, int] | None = None  # the current table's first row

    def flush() -> None:
        nonlocal para, section
        if para:
            title = _plain(text[para[0][0]:para[0][1]]) if len(para) == 1 else ""
            if title and (_REFS_TITLE.fullmatch(title) or _TOC_TITLE.fullmatch(title)):  # "References" as a line
                section = "refs" if _REFS_TITLE.fullmatch(title) else "toc"
                out.append(_Block("heading", tuple(para), section))
            else:
                out.append(_Block("para", tuple(para), section))
            para = []

    def tabbed(i: int) -> bool:
        return 0 <= i < len(scan.lines) and "\t" in scan.lines[i] and bool(scan.lines[i].strip())

    for i, (ls, kind) in enumerate(zip(scan.starts, scan.kinds, strict=True)):
        if kind == md.FENCE:
            flush()
            out.append(_Block("code", ((ls, scan.stop(scan.closers[i])),), section))
            continue
        if kind == md.CODE:
            continue
        le = scan.stop(i)
        body = text[ls:le]
        stripped = body.strip()
        is_row = kind == md.TABLE or body.count("\t") >= 2 or (
            "\t" in body and stripped and (tabbed(i - 1) or tabbed(i + 1)))
        if not is_row:
            header = None
        if not stripped:
            flush()
        elif stripped.startswith("#"):
            flush()
            title = _plain(stripped)
            section = ("refs" if _REFS_TITLE.fullmatch(title) else "toc" if _TOC_TITLE.fullmatch(title)
                       else "front" if _FRONT_TITLE.fullmatch(title) else None)
            out.append(_Block("heading", ((ls, le),), section))
        elif _TABLE_SEPARATOR.match(body):
            flush()  # table rules are not units
        elif is_row:
            flush()
            if header is None:
                header = (ls, le)
            out.append(_Block("row", ((ls, le),), section, header))
        elif md.LIST_ITEM.match(body):
            flush()
            out.append(_Block("item", ((ls, le),), section))
        else:
            para.append((ls, le))
    flush()
    return out


def _classify(text: str, blocks: list[_Block]) -> list[str | None]:
    """The non-body kind of each block (reference, toc, front matter, or a heading line), None for body."""
    kinds: list[str | None] = [None] * len(blocks)
    front: list[str | None] = [None] * len(blocks)  # "all": every line front matter, "weak": bare names
    for b, block in enumerate(blocks):
        if block.kind not in ("para", "item"):
            continue
        s, e = block.lines[0][0], block.lines[-1][1]
        body = text[s:e]
        if block.kind == "item":
            body = md.LIST_ITEM.sub("", body, count=1)
        if block.section == "refs":
            kinds[b] = REFERENCE
        elif block.section == "toc":
            kinds[b] = TOC
        elif block.section == "front":
            kinds[b] = FRONT_MATTER
        elif all(_TOC_LINE.search(text, ls, le) for ls, le in block.lines):
            kinds[b] = TOC
        elif all(_METADATA.match(_plain(text[ls:le])) for ls, le in block.lines):
            kinds[b] = FRONT_MATTER  # "URL Source: https://..." before its cues make it look like a reference
        elif block.kind == "para" and _CAPTION.match(text, s):
            continue  # "Table 3: Results on the ACL Workshop data (IEEE) ...": a caption, whatever it cites
        elif is_reference_entry(body.strip()):
            kinds[b] = REFERENCE
        else:
            reads = [_front_line(text[ls:le]) for ls, le in block.lines]
            if "strong" in reads and all(r is not None or len(_plain(text[ls:le])) <= 80 and
                                         not _prose_like(text[ls:le]) for r, (ls, le) in
                                         zip(reads, block.lines, strict=True)):
                kinds[b] = FRONT_MATTER
                front[b] = "all"
            elif all(r == "weak" for r in reads):
                front[b] = "weak"
    # the pieces of entries a chunk boundary or a page break cut, in a chunk that is mostly a reference list
    text_blocks = [b for b, block in enumerate(blocks) if block.kind in ("para", "item")]
    refs = sum(kinds[b] == REFERENCE for b in text_blocks)
    if refs >= 3 and refs >= 0.5 * len(text_blocks):
        for i, b in enumerate(text_blocks):
            if kinds[b] is not None:
                continue
            s, e = blocks[b].lines[0][0], blocks[b].lines[-1][1]
            near = [kinds[text_blocks[j]] for j in (i - 1, i + 1) if 0 <= j < len(text_blocks)]
            if REFERENCE in near and (not _prose_like(text[s:e]) or near == [REFERENCE, REFERENCE]):
                kinds[b] = REFERENCE
    # bare name lines next to front matter are front matter too; so is a title line just above it
    changed = True
    while changed:
        changed = False
        for b in range(len(blocks)):
            if front[b] != "weak":
                continue
            near = [front[j] for j in (b - 1, b + 1) if 0 <= j < len(blocks)]
            if "all" in near:
                kinds[b], front[b], changed = FRONT_MATTER, "all", True
    for b, block in enumerate(blocks[:-1]):
        if (kinds[b] is None and block.kind == "para" and len(block.lines) == 1 and front[b + 1] == "all"
                and blocks[b + 1].kind == "para"):
            line = text[block.lines[0][0]:block.lines[0][1]].strip()
            if len(line) <= 200 and not line.endswith(".") and not _prose_like(line):
                kinds[b] = FRONT_MATTER
    return kinds


def units(text: str) -> list[Unit]:
    """Every unit of a chunk, in order, with its kind (see the module docs)."""
    out: list[Unit] = []
    blocks = _blocks(text)
    for block, special in zip(blocks, _classify(text, blocks), strict=True):
        s, e = block.lines[0][0], block.lines[-1][1]
        if block.kind == "heading":
            pieces = [(s, e, HEADING)]
        elif block.kind == "code":
            pieces = [(s, e, CODE)]
        elif block.kind == "row":
            pieces = [(s, e, TABLE_ROW)]
        elif special in (TOC, FRONT_MATTER) or (special == REFERENCE and block.section == "refs"):
            pieces = [(ls, le, special) for ls, le in block.lines]  # one unit a line
        elif special is not None:
            pieces = [(s, e, special)]
        elif block.kind == "item":
            pieces = [(s, e, LIST_ITEM)]
        else:
            toc = [bool(_TOC_LINE.search(text, ls, le)) for ls, le in block.lines]
            pieces = []
            run_start: int | None = None
            prev_end = s
            for (ls, le), is_toc in zip(block.lines, toc, strict=True):
                if is_toc:  # a dot-leader line inside a paragraph
                    if run_start is not None:
                        pieces += _split_prose(text, run_start, prev_end)
                        run_start = None
                    pieces.append((ls, le, TOC))
                else:
                    run_start = ls if run_start is None else run_start
                    prev_end = le
            if run_start is not None:
                pieces += _split_prose(text, run_start, prev_end)
            prose = [i for i, p in enumerate(pieces) if p[2] == PROSE]
            if len(pieces) == 1 and prose and _heading_like(text[pieces[0][0]:pieces[0][1]].strip(), run_in=False):
                pieces[0] = (pieces[0][0], pieces[0][1], HEADING)  # a heading line without "#"
            elif len(pieces) > 1 and prose and prose[0] == 0 and _heading_like(
                    text[pieces[0][0]:pieces[0][1]].strip(), run_in=True):
                pieces[0] = (pieces[0][0], pieces[0][1], RUN_IN)  # "Hybrid retrieval with RRF. The hybrid ..."
        for ps, pe, kind in pieces:
            if (seg := _strip(text, ps, pe)) is not None:
                out.append(Unit(seg[0], seg[1], kind, block.header if kind == TABLE_ROW else None))
    return out


def sentence_segments(text: str) -> list[tuple[int, int]]:
    """The units of a chunk, in order, as ``(start, end)`` offsets: every unit but ``#`` heading lines (a heading
    without ``#``, "Results" on a line of its own, is a unit here; ``units`` calls it a heading)."""
    return [(u.start, u.end) for u in units(text) if u.kind != HEADING or text[u.start] != "#"]
