"""Spans: turning scores into character spans, post-processing, and the verbatim check.

Every extractor ends here. A model scores pieces of a chunk (tokens, sentences); the
functions below turn scored pieces into ``Span`` objects with offsets into the chunk,
drop the short ones and merge near neighbours. ``verbatim_spans`` is the gate in
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


def runs_above(segments: Sequence[tuple[int, int]], scores: Sequence[float], threshold: float,
               chunk: str) -> list[Span]:
    """Contiguous runs of scored segments at or above ``threshold``, as trimmed spans.

    ``segments`` are ``(start, end)`` character ranges in chunk order (tokens or
    sentences); consecutive positive segments form one run whatever lies between
    them. A run's score is its maximum segment score.
    """
    out: list[Span] = []
    run_start = run_end = -1
    best = 0.0
    for (s, e), p in zip(segments, scores, strict=True):
        if p >= threshold and e > s:
            if run_start < 0:
                run_start, best = s, float(p)
            best = max(best, float(p))
            run_end = max(run_end, e)
        elif run_start >= 0:
            out.append(Span(run_start, run_end, best))
            run_start = run_end = -1
    if run_start >= 0:
        out.append(Span(run_start, run_end, best))
    return [t for sp in out if (t := trim(sp, chunk)) is not None]


def postprocess(spans: Iterable[Span], min_chars: int, merge_gap: int) -> list[Span]:
    """Drop spans shorter than ``min_chars``, then merge spans at most ``merge_gap`` characters apart.

    Spans are sorted first; overlapping spans always merge. A merged span keeps the
    highest score of its parts.
    """
    kept = sorted((s for s in spans if s.length >= min_chars), key=lambda s: (s.start, s.end))
    merged: list[Span] = []
    for sp in kept:
        if merged and sp.start - merged[-1].end <= merge_gap:
            last = merged[-1]
            merged[-1] = Span(last.start, max(last.end, sp.end), max(last.score, sp.score))
        else:
            merged.append(Span(sp.start, sp.end, sp.score))
    return merged


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
