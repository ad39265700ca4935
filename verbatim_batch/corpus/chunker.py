"""Markdown chunker for docling-style research papers.

``chunk_markdown`` is a pure function from a paper's text to its chunks. It keeps three promises, checked by
property tests:

* ``text[chunk.start:chunk.end] == chunk.text`` for every chunk;
* every non-whitespace character of the paper lies in exactly one chunk;
* pipe tables (with their ``Table N:`` caption) and fenced code blocks are never split; one that is larger than
  ``max_chars`` stays whole and is flagged.

How it works: ``corpus.markdown.scan`` cuts the text into lines and classifies them (see there: line ends,
headings, fences; a leading byte-order mark stays in the first chunk; a fence line that never closes is text, and
its chunk is flagged ``unclosed_fence``). Lines become *units*: a heading line, a paragraph (a run of non-blank
text lines), a pipe table (plus an adjacent caption paragraph) or a fenced code block. Units are grouped into
sections at ATX headings whose level is in ``heading_levels``; deeper headings stay inside their section as text.
Sections longer than ``max_chars`` are cut between units (at blank lines outside protected blocks); a single text
unit that is still too long is cut at a line break, else a sentence end, else a space, and flagged
``forced_split``. Finally, chunks shorter than ``min_chars`` merge into the next chunk (or the previous one) when
the result fits ``max_chars``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from verbatim_batch.core import limits
from verbatim_batch.core.options import Declared, option
from verbatim_batch.core.tables import config_hash
from verbatim_batch.corpus import markdown as md
from verbatim_batch.corpus.readers import NORMALIZATIONS


def parse_levels(value: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``."""
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated levels like 1,2,3,4, got {value!r}") from None


def parse_normalizations(value: str) -> tuple[str, ...]:
    """``"crlf,nfc"`` -> ``("crlf", "nfc")`` (``none``: no normalisation)."""
    ops = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
    bad = set(ops) - set(NORMALIZATIONS)
    if bad:
        raise ValueError(f"unknown normalization {sorted(bad)}; choose from {','.join(NORMALIZATIONS)}")
    return ops

CHUNKER_VERSION = "1"

# Chunk flags.
OVERSIZED_BLOCK = "oversized_block"  # a table/code block longer than max_chars, kept whole
FORCED_SPLIT = "forced_split"  # a text unit with no blank line had to be cut inside
UNDERSIZED = "undersized"  # shorter than min_chars, and no neighbour could take it
UNCLOSED_FENCE = "unclosed_fence"  # contains a fence opener that is never closed
HAS_TABLE = "has_table"
HAS_CODE = "has_code"

# Unit kinds.
_TEXT, _HEADING, _TABLE, _CODE = 0, 1, 2, 3

_SENTENCE_END_RE = re.compile(r"[.!?][\"')\]]*\s")


@dataclass(frozen=True)
class ChunkerConfig(Declared):
    """Settings that change chunk boundaries; their hash goes into every chunk id."""

    heading_levels: tuple[int, ...] = option((1, 2, 3, 4), "ATX heading levels that split", parse=parse_levels)
    min_chars: int = option(500, "merge chunks shorter than this", low=0, high=limits.CHARS)
    max_chars: int = option(5000, "split chunks longer than this", low=1, high=limits.CHARS)
    caption_pattern: str = r"[*_]*(?:table|tab\.)\s*[0-9IVXivx]+[a-z]?\s*[:.]"
    normalization: tuple[str, ...] = option(
        (), f"opt-in text normalisation, comma-separated from {','.join(NORMALIZATIONS)} (changes offsets; recorded "
        "on every row)", name="normalize", parse=parse_normalizations, default_help="none")

    def __post_init__(self) -> None:
        super().__post_init__()  # the declared bounds
        levels = tuple(sorted(set(self.heading_levels)))
        if not levels or any(not 1 <= lv <= 6 for lv in levels):
            raise ValueError(f"heading_levels must be within 1..6, got {self.heading_levels!r}")
        object.__setattr__(self, "heading_levels", levels)
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) > max_chars ({self.max_chars})")
        object.__setattr__(self, "normalization", tuple(self.normalization))
        re.compile(self.caption_pattern)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["heading_levels"] = list(self.heading_levels)
        d["normalization"] = list(self.normalization)
        return d

    @property
    def hash(self) -> str:
        return config_hash({"chunker_version": CHUNKER_VERSION, **self.to_dict()})


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: ``paper[start:end] == text``."""

    index: int
    start: int
    end: int
    text: str
    heading_path: tuple[str, ...]
    flags: tuple[str, ...]


@dataclass(slots=True)
class _Piece:
    start: int
    end: int
    path: tuple[str, ...]
    flags: set[str]

    @property
    def size(self) -> int:
        return self.end - self.start


def build_context(title: str | None, heading_path: tuple[str, ...] | list[str]) -> str:
    """Title plus heading path, for embedding; never part of the verbatim text."""
    parts = [title] if title else []
    parts += [h for h in heading_path if h and h != title]
    return " > ".join(parts)


# Headings that name a part of a paper, never its title: "Abstract", "1 Introduction", "3.2 Results",
# "Appendix A", "A.1 Proofs", "II. Related Work", "Acknowledgements", "References", ...
SECTION_NAMES = (
    "abstract", "introduction", "background", "related work", "related works", "prior work", "preliminaries",
    "method", "methods", "methodology", "approach", "model", "models", "experiments", "experimental setup",
    "experiment", "setup", "evaluation", "results", "result", "analysis", "discussion", "results and discussion",
    "conclusion", "conclusions", "conclusion and future work", "conclusions and future work", "future work",
    "summary", "limitations", "ethics statement", "ethical considerations", "broader impact", "acknowledgments",
    "acknowledgements", "acknowledgment", "acknowledgement", "references", "bibliography", "appendix",
    "appendices", "supplementary material", "keywords", "index terms", "ccs concepts", "contents",
    "table of contents",
)
_SECTION_RE = re.compile(
    r"(?:(?:\d+|[ivxlc]+|[a-z])(?:\.\d+)*\.?\s+)?(?:" + "|".join(re.escape(n) for n in SECTION_NAMES)
    + r")(?:\s+[a-z0-9.]{1,4})?\s*[:.]?", re.IGNORECASE)
# "3 Corpus creation", "3.1 Data", "II. Method", "A.2 Prompts" (not "A Survey of ...")
_NUMBERED_RE = re.compile(r"(?:\d+(?:\.\d+)*\.?|[IVXLC]+\.(?:\d+\.?)*|[A-Z]\.\d+(?:\.\d+)*\.?)\s+\S")
_MARKUP_RE = re.compile(r"^[*_`]+|[*_`]+$")
_LABEL_RE = re.compile(r"title\s*:\s*", re.IGNORECASE)  # "Title: ..." (web-page dumps of papers)
TITLE_MAX_CHARS = 200


def _plain(text: str) -> str:
    """A heading or line without its emphasis markers and surrounding space."""
    return _MARKUP_RE.sub("", text.strip().lstrip("#").strip()).strip()


def is_section_heading(text: str) -> bool:
    """True for a heading that names a section (``Abstract``, ``1 Introduction``, ``A.1 Proofs``,
    ``Appendix B``, ``References``) or is numbered like one (``3 Corpus creation``): never a paper's title."""
    plain = _plain(text)
    return bool(_SECTION_RE.fullmatch(plain) or _NUMBERED_RE.match(plain))


_REFERENCES_RE = re.compile(r"(?:(?:\d+|[ivxlc]+|[a-z])\.?\s+)?(?:references|bibliography|works cited|literature cited"
                            r"|cited works)\s*[:.]?", re.IGNORECASE)


def is_reference_heading(text: str) -> bool:
    """True for the heading of a paper's reference list (``References``, ``7 Bibliography``)."""
    return bool(_REFERENCES_RE.fullmatch(_plain(text)))


def first_heading(text: str, limit: int = 20_000) -> str | None:
    """The paper's title from its text, for papers without a metadata title (docling puts it in a heading).

    The first ATX heading before the body starts that is not a section name (``Abstract``, ``1
    Introduction``, ``References``, ... at any level: see ``is_section_heading``); failing that, the first
    non-empty line that is neither a section heading nor markup (a leading ``Title:`` label dropped).
    Trimmed and capped at ``TITLE_MAX_CHARS``; None for a paper with no such line."""
    scan = md.scan(text[:limit].removeprefix(md.BOM))
    for heading in (h for _, h in scan.headings.values() if h):  # in line order, outside code blocks
        if is_section_heading(heading):
            break  # the body has started: later headings are sections, not the title
        return _cap(_plain(heading))
    for line in scan.lines:
        m = md.HEADING_RE.match(line.strip()) if line.lstrip().startswith("#") else None
        plain = _plain((m.group(2) or "") if m else line)
        if not plain or is_section_heading(plain) or plain.startswith(("<!--", "<", "|", "![", "```", "~~~")):
            continue
        if not any(ch.isalnum() for ch in plain):
            continue
        return _cap(_LABEL_RE.sub("", plain, count=1) if _LABEL_RE.match(plain) else plain)
    return None


def _cap(title: str) -> str | None:
    title = " ".join(title.split())
    if len(title) > TITLE_MAX_CHARS:
        title = title[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return title or None


def chunk_markdown(text: str, config: ChunkerConfig | None = None) -> list[Chunk]:
    """Split a markdown paper into chunks with exact offsets (see module docs)."""
    config = config or ChunkerConfig()
    units = _units(text, config)
    if not units:
        return []
    pieces = _size_pieces(text, _sections(units, config), config)
    pieces = _merge_small(pieces, config)
    return [
        Chunk(i, p.start, p.end, text[p.start : p.end], p.path, tuple(sorted(p.flags)))
        for i, p in enumerate(pieces)
    ]


# --- lines and units -------------------------------------------------------------


def _units(text: str, config: ChunkerConfig) -> list[tuple]:
    """Units as tuples ``(kind, start, end, level, heading_text, flags)``."""
    scan = md.scan(text)
    kinds, starts, end = scan.kinds, scan.starts, scan.end
    n = len(kinds)
    units: list[tuple] = []
    i = 0
    while i < n:
        kind = kinds[i]
        if kind == md.BLANK:
            i += 1
            continue
        start = starts[i] + scan.indents[i]  # a leading BOM stays inside the first unit (coverage is exact)
        if kind == md.HEADING:
            units.append((_HEADING, start, end(i), *scan.headings[i], ()))
            i += 1
            continue
        if kind == md.FENCE:
            j = scan.closers[i]
            units.append((_CODE, start, end(j), 0, "", ()))
            i = j + 1
            continue
        if kind == md.TABLE:
            j = i
            while j + 1 < n and kinds[j + 1] == md.TABLE:
                j += 1
            units.append((_TABLE, start, end(j), 0, "", ()))
            i = j + 1
            continue
        # A paragraph: text lines (and fence lines that never close) up to a blank
        # line, a heading, a table row or a fence that does close.
        j = i
        while j + 1 < n and kinds[j + 1] in (md.TEXT, md.UNCLOSED):
            j += 1
        flags = (UNCLOSED_FENCE,) if md.UNCLOSED in kinds[i : j + 1] else ()
        units.append((_TEXT, start, end(j), 0, "", flags))
        i = j + 1
    return _attach_captions(text, units, re.compile(config.caption_pattern, re.IGNORECASE))


def _attach_captions(text: str, units: list[tuple], caption_re: re.Pattern) -> list[tuple]:
    """Merge each table with an adjacent ``Table N:`` caption paragraph (one before wins)."""
    out: list[tuple] = []
    k = 0
    n = len(units)
    while k < n:
        unit = units[k]
        if unit[0] == _TABLE:
            prev = out[-1] if out else None
            if prev is not None and prev[0] == _TEXT and caption_re.match(text, prev[1]):
                out[-1] = (_TABLE, prev[1], unit[2], 0, "", prev[5])
                k += 1
                continue
            # A caption after this table, unless it sits right before another table
            # (then it is that table's caption: captions-before is docling's habit).
            if (
                k + 1 < n
                and units[k + 1][0] == _TEXT
                and caption_re.match(text, units[k + 1][1])
                and not (k + 2 < n and units[k + 2][0] == _TABLE)
            ):
                nxt = units[k + 1]
                out.append((_TABLE, unit[1], nxt[2], 0, "", nxt[5]))
                k += 2
                continue
        out.append(unit)
        k += 1
    return out


# --- sections, sizing, merging ---------------------------------------------------


def _sections(units: list[tuple], config: ChunkerConfig) -> list[tuple[tuple[str, ...], list[tuple]]]:
    """Group units at splitting headings; each section carries its heading path."""
    levels = set(config.heading_levels)
    stack: list[tuple[int, str]] = []
    sections: list[tuple[tuple[str, ...], list[tuple]]] = []
    current: list[tuple] = []
    path: tuple[str, ...] = ()
    for unit in units:
        if unit[0] == _HEADING and unit[3] in levels:
            if current:
                sections.append((path, current))
            while stack and stack[-1][0] >= unit[3]:
                stack.pop()
            stack.append((unit[3], unit[4]))
            path = tuple(h for _, h in stack)
            current = [unit]
        else:
            current.append(unit)
    if current:
        sections.append((path, current))
    return sections


def _unit_flags(unit: tuple, config: ChunkerConfig) -> set[str]:
    flags = set(unit[5])
    if unit[0] == _TABLE:
        flags.add(HAS_TABLE)
    elif unit[0] == _CODE:
        flags.add(HAS_CODE)
    if unit[0] in (_TABLE, _CODE) and unit[2] - unit[1] > config.max_chars:
        flags.add(OVERSIZED_BLOCK)
    return flags


def _size_pieces(text: str, sections: list, config: ChunkerConfig) -> list[_Piece]:
    """Cut sections longer than ``max_chars`` between units (then inside long text units)."""
    limit = config.max_chars
    pieces: list[_Piece] = []
    for path, units in sections:
        current: _Piece | None = None
        for unit in units:
            kind, start, end = unit[0], unit[1], unit[2]
            flags = _unit_flags(unit, config)
            if current is not None and end - current.start <= limit:
                current.end = end
                current.flags |= flags
                continue
            if current is not None:
                pieces.append(current)
                current = None
            if end - start <= limit or kind in (_TABLE, _CODE):
                current = _Piece(start, end, path, flags)
                continue
            subs = _split_long(text, start, end, limit)
            for s, e in subs[:-1]:
                pieces.append(_Piece(s, e, path, flags | {FORCED_SPLIT}))
            current = _Piece(subs[-1][0], subs[-1][1], path, flags | {FORCED_SPLIT})
        if current is not None:
            pieces.append(current)
    return pieces


def _split_long(text: str, start: int, end: int, limit: int) -> list[tuple[int, int]]:
    """Cut ``text[start:end]`` into pieces of at most ``limit`` chars at the best breaks.

    Each piece starts and ends on non-whitespace; only whitespace falls between pieces.
    """
    out: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        if end - pos <= limit:
            out.append((pos, end))
            break
        window_end = pos + limit
        cut = text.rfind("\n", pos + 1, window_end)
        if cut <= pos:  # a lone \r ends a line too (CR-only papers)
            cut = max((m.start() for m in md.LONE_CR.finditer(text, pos + 1, window_end)
                       if text[m.start() + 1 : m.start() + 2] != "\n"), default=-1)
        if cut <= pos:
            cut = -1
            for m in _SENTENCE_END_RE.finditer(text, pos, window_end + 1):
                cut = m.end() - 1
            if cut <= pos:
                cut = max(text.rfind(" ", pos + 1, window_end), text.rfind("\t", pos + 1, window_end))
        if cut <= pos:
            cut = window_end  # no whitespace at all: a hard cut
        piece_end = cut
        while piece_end > pos and text[piece_end - 1].isspace():
            piece_end -= 1
        out.append((pos, piece_end))
        pos = cut
        while pos < end and text[pos].isspace():
            pos += 1
    return out


def _merge_small(pieces: list[_Piece], config: ChunkerConfig) -> list[_Piece]:
    """Merge pieces shorter than ``min_chars`` forward, else backward, within ``max_chars``."""
    lo, hi = config.min_chars, config.max_chars
    out: list[_Piece] = []
    pending: _Piece | None = None
    for piece in pieces:
        if pending is not None:
            if piece.end - pending.start <= hi:
                piece = _join(pending, piece)
            elif out and pending.end - out[-1].start <= hi:
                out[-1] = _join(out[-1], pending)
            else:
                out.append(pending)
            pending = None
        if piece.size < lo:
            pending = piece
        else:
            out.append(piece)
    if pending is not None:
        if out and pending.end - out[-1].start <= hi:
            out[-1] = _join(out[-1], pending)
        else:
            out.append(pending)
    for piece in out:
        if piece.size < lo:
            piece.flags.add(UNDERSIZED)
    return out


def _join(a: _Piece, b: _Piece) -> _Piece:
    path = b.path if b.size > a.size else a.path
    return _Piece(a.start, b.end, path, a.flags | b.flags)


class ChunkInvariantError(AssertionError):
    """A chunk list broke the verbatim or coverage promise (a bug, never expected)."""


def verify_chunks(text: str, chunks: list[Chunk]) -> None:
    """Check exact offsets and exactly-once coverage of non-whitespace; raise if broken."""
    pos = 0
    for chunk in chunks:
        if chunk.start < pos or chunk.end < chunk.start:
            raise ChunkInvariantError(f"chunk {chunk.index} at [{chunk.start}, {chunk.end}) overlaps or is reversed")
        if text[chunk.start : chunk.end] != chunk.text:
            raise ChunkInvariantError(f"chunk {chunk.index}: text differs from paper[{chunk.start}:{chunk.end}]")
        gap = text[pos : chunk.start]
        if gap and not gap.isspace():
            raise ChunkInvariantError(f"non-whitespace text at [{pos}, {chunk.start}) is in no chunk")
        pos = chunk.end
    tail = text[pos:]
    if tail and not tail.isspace():
        raise ChunkInvariantError(f"non-whitespace text at [{pos}, {len(text)}) is in no chunk")
