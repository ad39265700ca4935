"""Spans: turning scores into character spans, post-processing, and the verbatim check.

Every extractor ends here. A model scores pieces of a chunk (tokens, sentences); the
functions below turn scored pieces into ``Span`` objects with offsets into the chunk,
merge near neighbours and then drop the short ones. ``verbatim_spans`` is the gate in
front of every table: a span leaves it only if ``chunk[start:end] == text``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Span:
    """A half-open character range ``[start, end)`` of a chunk, with a score."""

    start: int
    end: int
    score: float = 1.0
    text: str | None = None  # what the extractor claims is there; checked by verbatim_spans
    align: str | None = None  # how an LLM's string was placed (exact | normalized | fuzzy)

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Reject:
    """A string an LLM returned that did not become a span, and why."""

    span: str | None  # None when the whole output was unusable
    reason: str
    doc_index: int | None = None  # None: not tied to one document of the request
    raw_output: str | None = None
    request_id: str | None = None


@dataclass
class PairResult:
    """What an extractor returns for one (query, chunk) pair."""

    spans: list[Span]
    relevance: float | None = None  # the pair's score (e.g. max token probability); None if not scored
    error: str | None = None  # set when the pair could not be processed
    rejects: list[Reject] = field(default_factory=list)


def trim(span: Span, chunk: str) -> Span | None:
    """Shrink a span so it neither starts nor ends on whitespace (None if nothing is left)."""
    s, e = span.start, span.end
    while s < e and chunk[s].isspace():
        s += 1
    while e > s and chunk[e - 1].isspace():
        e -= 1
    if s >= e:
        return None
    return Span(s, e, span.score)


def runs_above(segments: Sequence[tuple[int, int]], scores: Sequence[float], threshold: float) -> list[Span]:
    """Maximal runs of consecutive positive segments, as untrimmed spans.

    ``segments`` are ``(start, end)`` character ranges in order (the context tokens of one
    window, or sentence units). A segment is positive when it is non-empty and its score is
    at least ``threshold``; any other segment ends the current run. A run spans from the
    start of its first segment to the end of its last, whatever lies between them, and
    scores the maximum of its segments. This is the run rule of the released students'
    ``process()``, applied to one window at a time.
    """
    out: list[Span] = []
    run_start = run_end = -1
    best = 0.0
    for (s, e), p in zip(segments, scores, strict=True):
        if e > s and p >= threshold:
            if run_start < 0:
                run_start, best = int(s), float(p)
            best = max(best, float(p))
            run_end = int(e)
        elif run_start >= 0:
            out.append(Span(run_start, run_end, best))
            run_start = -1
    if run_start >= 0:
        out.append(Span(run_start, run_end, best))
    return out


def postprocess(spans: Iterable[Span], min_chars: int, merge_gap: int, chunk: str | None = None) -> list[Span]:
    """Merge spans at most ``merge_gap`` characters apart, then drop those shorter than ``min_chars``.

    The order is the released students' (``process()`` in the model cards): sort the runs
    (by start, then end), merge a run into the previous span when it starts at most
    ``merge_gap`` characters after that span's end (overlapping runs always merge; the
    merged span ends at the larger end and keeps the highest score), and only then drop
    spans shorter than ``min_chars``. Dropping first gives different answers: two short
    runs close together are one long span here.

    With ``chunk``, each surviving span is then trimmed of leading and trailing whitespace
    (``trim``). Trimming happens after the length test, so it never changes which spans are
    kept or how they merge; it only removes whitespace at their edges (a span that is all
    whitespace disappears, as the verbatim gate would refuse it anyway).
    """
    ordered = sorted(spans, key=lambda s: (s.start, s.end, s.score))
    merged: list[Span] = []
    for sp in ordered:
        if merged and sp.start - merged[-1].end <= merge_gap:
            last = merged[-1]
            merged[-1] = Span(last.start, max(last.end, sp.end), max(last.score, sp.score))
        else:
            merged.append(Span(sp.start, sp.end, sp.score))
    kept = [sp for sp in merged if sp.length >= min_chars]
    if chunk is None:
        return kept
    return [t for sp in kept if (t := trim(sp, chunk)) is not None]


def verbatim_spans(chunk: str, spans: Iterable[Span]) -> tuple[list[Span], int]:
    """The spans that are exactly the chunk's text at their offsets, and how many were not.

    A span passes when ``0 <= start < end <= len(chunk)``, its text (the claimed text, or
    the slice when none is claimed) equals ``chunk[start:end]`` and is not all whitespace,
    and its score is finite. Passing spans come back with ``text`` filled in.
    """
    ok: list[Span] = []
    bad = 0
    n = len(chunk)
    for sp in spans:
        start, end = int(sp.start), int(sp.end)
        if not (0 <= start < end <= n):
            bad += 1
            continue
        piece = chunk[start:end]
        if (sp.text is not None and sp.text != piece) or not piece.strip() or not np.isfinite(sp.score):
            bad += 1
            continue
        ok.append(Span(start, end, float(sp.score), piece, sp.align))
    return ok, bad
