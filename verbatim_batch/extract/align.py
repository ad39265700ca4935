"""Alignment: find where an LLM-returned span string sits in its chunk.

A model asked to quote a chunk changes case, re-flows whitespace, expands ligatures, swaps a word or invents text;
this maps its string back onto the chunk as *offsets*, and what is emitted is always ``chunk[start:end]``. Three
steps, first hit wins:

1. ``exact``: ``chunk.find(span.strip())``.
2. ``normalized``: both sides folded per character (NFKD, then ``casefold``), whitespace runs collapsed; a match
   maps back through a per-character index, widened so a partly matched character (``"ß"`` -> ``"ss"``) is whole.
3. ``fuzzy`` (spans of at least ``min_fuzzy_chars``): rapidfuzz's best partial alignment in folded space at
   ``fuzzy_threshold``, its edges moved a few words to where ``fuzz.ratio`` is best (its window is exactly the
   span's length, so an added word would pull in a neighbour), mapped back, widened to whole words and trimmed;
   rejected when under half or over twice the span's folded length. The score is the partial ratio.

Per-character folding makes the offset map exact; NFKD, not NFKC, because decomposition is per-character (a
precomposed ``"é"`` and ``"e"`` + U+0301 both fold to the latter). Quotes, dashes and accents are left to the fuzzy
step. Rejects are reason strings whose first word is a code: ``"empty"``, ``"not_a_string"``, ``"not_found"`` (with
``" (best fuzzy 0.62)"`` after the fuzzy step) and ``"fuzzy_length_mismatch"``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rapidfuzz.fuzz import partial_ratio_alignment, ratio

from verbatim_batch.extract.spans import Span

NORMAL_FORM = "NFKD"
METHODS = ("exact", "normalized", "fuzzy")

# Every code point with str.isspace() lies at or below U+3000 (checked by a test).
_WS_LIMIT = 0x3000
_WS_CODES = tuple(c for c in range(_WS_LIMIT + 1) if chr(c).isspace())
_WS_LUT = np.zeros(_WS_LIMIT + 2, dtype=bool)  # one extra False slot for every code above the limit
_WS_LUT[list(_WS_CODES)] = True


@dataclass(frozen=True)
class Alignment:
    """Where a span landed: ``chunk[start:end]`` (code points) is the text to emit."""

    start: int
    end: int
    method: str  # "exact" | "normalized" | "fuzzy"
    score: float  # 1.0 for exact and normalized; the fuzzy similarity in [0, 1] otherwise

    def to_span(self, chunk: str) -> Span:
        """The ``Span`` to hand to ``verbatim_spans`` (text filled from the chunk)."""
        return Span(self.start, self.end, self.score, chunk[self.start : self.end], align=self.method)


class _FoldTable(dict):
    """``str.translate`` table: code point -> folded string, filled on first use."""

    def __missing__(self, code: int) -> str:
        folded = unicodedata.normalize(NORMAL_FORM, chr(code)).casefold()
        self[code] = folded
        return folded


_FOLD = _FoldTable()
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")
_SPECIAL: dict[str, bool] = {}
_STABLE: dict[str, bool] = {}


def _is_special(ch: str) -> bool:
    """Whether ``str.lower`` (applied to whole strings, fast) does not give a non-ASCII character's fold: it
    decomposes, folds differently (``"ß"``), lowers to several characters (``"İ"``) or by context (capital sigma)."""
    got = _SPECIAL.get(ch)
    if got is None:
        low = ch.lower()
        got = _SPECIAL[ch] = ch == "\u03a3" or len(low) != 1 or _FOLD[ord(ch)] != low
    return got


def _is_stable(ch: str) -> bool:
    """Whether a character's fold survives a later ``lower`` and folds to itself (all but Cherokee)."""
    got = _STABLE.get(ch)
    if got is None:
        f = _FOLD[ord(ch)]
        got = _STABLE[ch] = f.lower() == f and all(_FOLD[ord(x)] == x for x in f)
    return got


def _fold_parts(text: str) -> tuple[str, list[str]]:
    """``fold(text)``, and the characters of ``text`` whose fold is not one character long."""
    if text.isascii():
        return text.lower(), []  # ASCII is its own decomposition, and casefold == lower there
    specials = [c for c in set(_NON_ASCII.findall(text)) if _is_special(c)]
    if not specials:
        return text.lower(), []
    if all(_is_stable(c) for c in specials):
        for c in specials:  # a few C-speed passes, then one lower() that leaves the folds alone
            text = text.replace(c, _FOLD[ord(c)])
        folded = text.lower()
    else:
        parts, last = [], 0
        for m in _NON_ASCII_RUN.finditer(text):
            parts.append(text[last : m.start()].lower())
            parts.append(m.group().translate(_FOLD))
            last = m.end()
        parts.append(text[last:].lower())
        folded = "".join(parts)
    return folded, [c for c in specials if len(_FOLD[ord(c)]) != 1]


def fold(text: str) -> str:
    """Per-character fold (decompose, casefold); whitespace untouched."""
    return _fold_parts(text)[0]


def normalize_text(text: str) -> str:
    """The folded form of a span: ``fold``, whitespace runs collapsed to one space, stripped."""
    return " ".join(fold(text).split())


def _codes(text: str) -> np.ndarray:
    """Code points of ``text`` as an array (uint8 for ASCII, else uint32; lone surrogates kept)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _is_space(codes: np.ndarray) -> np.ndarray:
    if codes.dtype == np.uint8:
        return _WS_LUT[codes]
    return _WS_LUT[np.minimum(codes, _WS_LIMIT + 1)]


def normalize_with_map(text: str) -> tuple[str, np.ndarray]:
    """The folded, whitespace-collapsed ``text`` (not stripped) and each folded character's source index."""
    n = len(text)
    folded, odd = _fold_parts(text)
    index: np.ndarray | None = None
    if odd:
        orig = _codes(text)
        reps = np.ones(n, dtype=np.int64)
        for ch in odd:
            reps[orig == ord(ch)] = len(_FOLD[ord(ch)])
        index = np.repeat(np.arange(n, dtype=np.int64), reps)
    codes = _codes(folded)
    ws = _is_space(codes)
    keep = np.ones(len(codes), dtype=bool)
    keep[1:] = ~(ws[1:] & ws[:-1])
    kept = codes[keep]  # fancy indexing copies
    kept[ws[keep]] = 32
    if kept.dtype == np.uint8:
        norm = kept.tobytes().decode("ascii")
    else:
        norm = kept.tobytes().decode("utf-32-le", "surrogatepass")
    return norm, (index[keep] if index is not None else np.flatnonzero(keep))


def _refine(norm: str, target: str, lo: int, hi: int, k: int = 3) -> tuple[int, int]:
    """Move a fuzzy window's edges up to ``k`` words either way to where it best matches ``target``."""
    n = len(norm)
    s0 = lo + 1 if norm[lo] == " " else norm.rfind(" ", 0, lo) + 1
    starts, q = [s0], s0
    for _ in range(k):
        if q <= 1:
            break
        q = norm.rfind(" ", 0, q - 1) + 1
        starts.append(q)
    q = s0
    for _ in range(k):
        nxt = norm.find(" ", q)
        if nxt < 0 or nxt + 1 >= hi:
            break
        q = nxt + 1
        starts.append(q)
    if norm[hi - 1] == " ":
        e0 = hi - 1
    else:
        e0 = norm.find(" ", hi - 1)
        e0 = n if e0 < 0 else e0
    ends, q = [e0], e0
    for _ in range(k):
        if q >= n:
            break
        nxt = norm.find(" ", q + 1)
        q = n if nxt < 0 else nxt
        ends.append(q)
    q = e0
    for _ in range(k):
        prev = norm.rfind(" ", 0, q)
        if prev <= lo:
            break
        q = prev
        ends.append(q)

    def best_start(end: int) -> int:
        return max(starts, key=lambda st: (ratio(target, norm[st:end]) if st < end else -1.0, -abs(st - lo)))

    def best_end(start: int) -> int:
        return max(ends, key=lambda en: (ratio(target, norm[start:en]) if start < en else -1.0, -abs(en - hi)))

    start = best_start(e0)
    end = best_end(start)
    start = best_start(end)
    if start >= end:
        return lo, hi
    return start, end


class ChunkIndex:
    """One chunk, its folded form and word edges computed on first need (exact hits never pay for folding)."""

    __slots__ = ("text", "_norm", "_index", "_ws", "_word_start", "_word_end")

    def __init__(self, text: str) -> None:
        self.text = text
        self._norm: str | None = None
        self._index: np.ndarray | None = None
        self._ws: np.ndarray | None = None
        self._word_start: np.ndarray | None = None
        self._word_end: np.ndarray | None = None

    def normalized(self) -> tuple[str, np.ndarray]:
        """``normalize_with_map(text)``, cached."""
        if self._norm is None:
            self._norm, self._index = normalize_with_map(self.text)
        return self._norm, self._index  # type: ignore[return-value]

    def _words(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per position: is it whitespace, where its word starts, where its word ends (exclusive)."""
        if self._ws is None:
            ws = self._ws = _is_space(_codes(self.text))
            n = len(ws)
            pos = np.arange(n, dtype=np.int64)
            starts = np.ones(n, dtype=bool)
            starts[1:] = ws[:-1]
            self._word_start = np.maximum.accumulate(np.where(starts, pos, 0))
            ends = np.ones(n, dtype=bool)
            ends[:-1] = ws[1:]
            self._word_end = np.minimum.accumulate(np.where(ends, pos + 1, n)[::-1])[::-1]
        return self._ws, self._word_start, self._word_end  # type: ignore[return-value]

    def _finish(self, start: int, end: int, method: str, score: float) -> Alignment | None:
        """Trim whitespace off ``[start, end)``; None if nothing (or something invalid) is left."""
        text = self.text
        piece = text[start:end]
        start += len(piece) - len(piece.lstrip())
        end -= len(piece) - len(piece.rstrip())
        if not 0 <= start < end <= len(text):
            return None
        return Alignment(start, end, method, score)

    def align(self, span: Any, *, fuzzy_threshold: float = 0.8, min_fuzzy_chars: int = 20,
              fuzzy: bool = True) -> Alignment | str:
        """Align one span string (see the module docs); an ``Alignment`` or a reject reason."""
        if not isinstance(span, str):
            return "not_a_string"
        s = span.strip()
        if not s:
            return "empty"
        text = self.text
        pos = text.find(s)
        if pos >= 0:
            return Alignment(pos, pos + len(s), "exact", 1.0)

        target = normalize_text(s)
        if not target:
            return "empty"
        norm, index = self.normalized()
        pos = norm.find(target)
        if pos >= 0:
            got = self._finish(int(index[pos]), int(index[pos + len(target) - 1]) + 1, "normalized", 1.0)
            if got is not None:
                return got

        if not fuzzy or len(s) < min_fuzzy_chars or not norm.strip():
            return "not_found"
        res = partial_ratio_alignment(target, norm)
        score = res.score / 100.0
        if score < fuzzy_threshold or res.dest_end <= res.dest_start:
            return f"not_found (best fuzzy {score:.2f})"
        lo, hi = _refine(norm, target, res.dest_start, res.dest_end)
        start, end = int(index[lo]), int(index[hi - 1]) + 1
        if 0 < start and not text[start - 1].isspace() and not text[start].isspace():
            start = int(self._words()[1][start])  # the start cuts a word: widen to its beginning
        if end < len(text) and not text[end].isspace() and not text[end - 1].isspace():
            end = int(self._words()[2][end - 1])  # the end cuts a word: widen to its end
        got = self._finish(start, end, "fuzzy", min(1.0, score))
        if got is None:
            return f"not_found (best fuzzy {score:.2f})"
        n_folded = int(np.searchsorted(index, got.end) - np.searchsorted(index, got.start))
        if not 0.5 * len(target) <= n_folded <= 2.0 * len(target):
            return "fuzzy_length_mismatch"
        return got


def align_span(chunk: str, span: str, **kw: Any) -> Alignment | str:
    """Align one span string onto ``chunk`` (``ChunkIndex.align``): an ``Alignment``, or a reject reason."""
    return ChunkIndex(chunk).align(span, **kw)


def align_spans(chunk: str | ChunkIndex, spans: Sequence[str] | Iterable[str],
                **kw: Any) -> tuple[list[Alignment], list[tuple[str, str]]]:
    """Align many spans onto one chunk (folded once): alignments in order, each once, and ``(span, reason)`` rejects."""
    index = chunk if isinstance(chunk, ChunkIndex) else ChunkIndex(chunk)
    found: list[Alignment] = []
    rejects: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    for span in spans:
        got = index.align(span, **kw)
        if isinstance(got, str):
            rejects.append((span, got))
        elif (got.start, got.end) not in seen:
            seen.add((got.start, got.end))
            found.append(got)
    return found, rejects
