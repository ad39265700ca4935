"""The highlighter's post-processing (numpy only): token probabilities -> spans as the released students'
``process()``, pair by pair (``TokenScores``, ``highlight_spans``) or over a whole batch (``ContextScores``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verbatim_batch.extract.spans import PairResult, Span, flat_runs, merge_runs, trimmed_spans


def default_query_tokens(max_length: int) -> int:
    """The query's share of a window when none is given: ``min(512, max_length // 4)``."""
    return min(512, max_length // 4)


def window_problem(max_length: int, stride: int, max_query_tokens: int | None = None) -> str | None:
    """Why windows of ``max_length`` tokens overlapping by ``stride``, with ``max_query_tokens`` for the query,
    cannot hold context, or None (checked by the highlighter's, silver's and training's configs)."""
    if not 0 <= stride < max_length // 2:
        return (f"stride must be in [0, max_length / 2), got {stride}: with --max-length {max_length}, pass a "
                f"--stride below {max_length // 2}")
    query = default_query_tokens(max_length) if max_query_tokens is None else max_query_tokens
    if not 0 < query < max_length - stride - 8:
        return (f"max_query_tokens ({query}) must leave room for the stride ({stride}) and some context in each "
                f"window of {max_length} tokens")
    return None


@dataclass
class TokenScores:
    """Per window of a pair, its context tokens' offsets ``(n, 2)`` and probabilities ``(n,)``."""

    windows: list[tuple[np.ndarray, np.ndarray]]

    @property
    def n_windows(self) -> int:
        return len(self.windows)

    def _merged(self) -> tuple[np.ndarray, np.ndarray]:
        parts = [np.column_stack([o, p.astype(np.float64)]) for o, p in self.windows if len(p)]
        if not parts:
            return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.float32)
        rows = np.concatenate(parts)
        rows = rows[rows[:, 1] > rows[:, 0]]
        if not len(rows):
            return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.float32)
        rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
        starts = np.flatnonzero(np.r_[True, (np.diff(rows[:, 0]) != 0) | (np.diff(rows[:, 1]) != 0)])
        return rows[starts, :2].astype(np.int64), np.maximum.reduceat(rows[:, 2], starts).astype(np.float32)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """Each distinct non-empty context token once, in chunk order (for inspection)."""
        return [(int(a), int(b)) for a, b in self._merged()[0]]

    @property
    def probs(self) -> np.ndarray:
        """The probability of each of ``segments``: its highest over the windows that hold it."""
        return self._merged()[1]

    @property
    def relevance(self) -> float:
        best = [float(p[o[:, 1] > o[:, 0]].max()) for o, p in self.windows if (o[:, 1] > o[:, 0]).any()]
        return max(best) if best else 0.0

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets (n, 2), probs (n,), window_first (n,))``: the windows one after another."""
        if not self.windows:
            return np.zeros((0, 2), np.int64), np.zeros(0, np.float32), np.zeros(0, bool)
        offsets = np.concatenate([np.asarray(o).reshape(-1, 2) for o, _ in self.windows])
        probs = np.concatenate([np.asarray(p, dtype=np.float32) for _, p in self.windows])
        first = np.zeros(len(probs), dtype=bool)
        sizes = np.array([len(p) for _, p in self.windows], dtype=np.int64)
        first[(np.cumsum(sizes) - sizes)[sizes > 0]] = True
        return offsets, probs, first

    def runs(self, threshold: float) -> list[Span]:
        """The runs at ``threshold`` of every window (unsorted, unmerged, untrimmed; compared in float64)."""
        _, start, end, score = flat_runs(*self.flat(), threshold)
        return [Span(s, e, c) for s, e, c in zip(start.tolist(), end.tolist(), score.tolist(), strict=True)]


def highlight_spans(scores: TokenScores, chunk: str, threshold: float, min_chars: int, merge_gap: int) -> list[Span]:
    """A pair's spans from its token probabilities: per-window runs, merged, short ones dropped, trimmed."""
    _, start, end, score = flat_runs(*scores.flat(), threshold)
    _, start, end, score = merge_runs(np.zeros(len(start), np.int64), start, end, score, min_chars, merge_gap)
    return trimmed_spans(chunk, start, end, score)


@dataclass
class ContextScores:
    """A batch's context tokens and probabilities, flat, window after window (what the span stage reads)."""

    errors: list[str | None]
    offsets: np.ndarray  # (C, 2)
    probs: np.ndarray  # float32 (C,)
    context_counts: np.ndarray  # (W,)
    window_pair: np.ndarray  # (W,)

    def pair(self, i: int) -> TokenScores:
        """Pair ``i``'s windows as ``TokenScores``."""
        bounds = np.r_[0, np.cumsum(self.context_counts)]
        return TokenScores([(self.offsets[bounds[w]:bounds[w + 1]], self.probs[bounds[w]:bounds[w + 1]])
                            for w in np.flatnonzero(self.window_pair == i)])

    def results(self, chunks: Sequence[str | None], threshold: float, min_chars: int,
                merge_gap: int) -> list[PairResult]:
        """Every pair's spans and relevance, computed over the whole batch at once; an error pair gets its error."""
        n = len(self.errors)
        counts = np.asarray(self.context_counts, dtype=np.int64)
        token_pair = np.repeat(np.asarray(self.window_pair, dtype=np.int64), counts)
        first = np.zeros(len(token_pair), dtype=bool)
        first[(np.cumsum(counts) - counts)[counts > 0]] = True
        first_token, start, end, score = flat_runs(self.offsets, self.probs, first, threshold)
        group, start, end, score = merge_runs(token_pair[first_token], start, end, score, min_chars, merge_gap)
        bounds = np.searchsorted(group, np.arange(n + 1))
        relevance = _pair_max(self.offsets, self.probs, token_pair, n)
        out = []
        for i in range(n):
            if self.errors[i]:
                out.append(PairResult([], None, self.errors[i]))
                continue
            a, b = bounds[i], bounds[i + 1]
            spans = trimmed_spans(chunks[i], start[a:b], end[a:b], score[a:b]) if b > a else []
            out.append(PairResult(spans, relevance[i]))
        return out


def _pair_max(offsets: np.ndarray, probs: np.ndarray, token_pair: np.ndarray, n: int) -> list[float]:
    """Per pair, the highest probability of a non-empty context token (0.0 when it has none)."""
    best = np.full(n, -np.inf)
    counts = np.bincount(token_pair, minlength=n)  # token_pair is sorted: each pair's tokens are one run
    has = counts > 0
    if has.any():
        masked = np.where(offsets[:, 1] > offsets[:, 0], probs.astype(np.float64), -np.inf)
        best[has] = np.maximum.reduceat(masked, (np.cumsum(counts) - counts)[has])
    return [b if b != -np.inf else 0.0 for b in best.tolist()]
