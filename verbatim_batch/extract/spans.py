"""Spans: turning scores into character spans, post-processing, and the verbatim check.

Every extractor ends here: scored pieces of a chunk (tokens, sentences) become ``Span`` offsets, near neighbours
merge, short ones drop. ``verbatim_spans`` is the gate in front of every table (``chunk[start:end] == text``).
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
    """Maximal runs of consecutive positive segments (non-empty, score at least ``threshold``), untrimmed: from
    the first one's start to the last one's end, scored by their maximum (the released students' ``process()``
    rule, one window at a time)."""
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
    """Merge spans at most ``merge_gap`` characters apart, then drop those under ``min_chars`` (the released students'
    order: two short runs close together are one long span); with ``chunk``, survivors are trimmed (``trim``)."""
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


# --- the same rules over flat arrays (the highlighter: whole batches of windows at once) ---------------
# ``flat_runs`` + ``merge_runs`` + ``trimmed_spans`` give exactly what ``runs_above`` per window +
# ``postprocess`` give (the tests compare them on random inputs), without a Python object per token.


def flat_runs(offsets: np.ndarray, probs: np.ndarray, window_first: np.ndarray,
              threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``runs_above`` of many windows at once: ``(first token, char start, char end, score)`` of every run; a run
    never crosses a ``window_first`` token, and scores compare in float64 (the threshold never rounded to float32)."""
    offsets = np.asarray(offsets).reshape(-1, 2)
    p = np.asarray(probs).astype(np.float64)
    pos = (offsets[:, 1] > offsets[:, 0]) & (p >= threshold)
    first = np.asarray(window_first, dtype=bool)
    joined = np.zeros(len(pos), dtype=bool)  # token i continues the run of token i - 1: both positive, no new window
    joined[1:] = pos[1:] & pos[:-1] & ~first[1:]
    starts = np.flatnonzero(pos & ~joined)
    if not len(starts):
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, np.zeros(0, np.float64)
    cont = np.zeros(len(pos), dtype=bool)
    cont[:-1] = joined[1:]
    ends = np.flatnonzero(pos & ~cont)
    score = np.maximum.reduceat(np.where(pos, p, -np.inf), starts)  # tokens between two runs are -inf
    return starts, offsets[starts, 0].astype(np.int64), offsets[ends, 1].astype(np.int64), score


def merge_runs(group: np.ndarray, start: np.ndarray, end: np.ndarray, score: np.ndarray, min_chars: int,
               merge_gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``postprocess`` (without trimming) of many pairs' runs at once, ``group``s never merged: ``(group, start, end,
    score)`` of the kept spans, by group then start."""
    group, start, end = (np.asarray(a, dtype=np.int64) for a in (group, start, end))
    score = np.asarray(score, dtype=np.float64)
    order = np.lexsort((score, end, start, group))
    g, s, e, sc = group[order], start[order], end[order], score[order]
    if not len(g):
        return g, s, e, sc
    if merge_gap >= -1 and (e >= s).all():
        # A span's end is then the running maximum of the ends so far in its group (a new span never ends
        # before the previous one): one cumulative maximum, each group lifted above the ones before it.
        lift = (g - g[0]) * (int(e.max()) - int(e.min()) + 1)
        reach = np.maximum.accumulate(e + lift) - lift
        new = np.ones(len(g), dtype=bool)
        new[1:] = (g[1:] != g[:-1]) | (s[1:] - reach[:-1] > merge_gap)
        heads = np.flatnonzero(new)
        g, s, e, sc = g[heads], s[heads], np.maximum.reduceat(e, heads), np.maximum.reduceat(sc, heads)
    else:  # the plain loop (only for settings the package never uses: a gap below -1, or reversed offsets)
        rows: list[list] = []
        for gi, si, ei, ci in zip(g.tolist(), s.tolist(), e.tolist(), sc.tolist(), strict=True):
            if rows and rows[-1][0] == gi and si - rows[-1][2] <= merge_gap:
                rows[-1][2], rows[-1][3] = max(rows[-1][2], ei), max(rows[-1][3], ci)
            else:
                rows.append([gi, si, ei, ci])
        g, s, e = (np.array([r[k] for r in rows], dtype=np.int64) for k in range(3))
        sc = np.array([r[3] for r in rows], dtype=np.float64)
    keep = (e - s) >= min_chars
    return g[keep], s[keep], e[keep], sc[keep]


def trimmed_spans(chunk: str, start: np.ndarray, end: np.ndarray, score: np.ndarray) -> list[Span]:
    """``Span`` objects of kept ranges, each trimmed of edge whitespace (``trim``); all-whitespace ones go."""
    spans = (Span(s, e, sc) for s, e, sc in zip(start.tolist(), end.tolist(), score.tolist(), strict=True))
    return [t for sp in spans if (t := trim(sp, chunk)) is not None]


def verbatim_spans(chunk: str, spans: Iterable[Span]) -> tuple[list[Span], int]:
    """The spans that are exactly the chunk's text at their offsets (in range, claimed text equal to the slice,
    not all whitespace, finite score), with ``text`` filled in, and how many were not."""
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
