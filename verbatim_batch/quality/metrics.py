"""Scoring of extracted evidence spans against gold spans (pure Python).

A span is a half-open ``(start, end)`` of code-point offsets into one chunk. :func:`evaluate` turns
:class:`EvalRow` s into word-level, span-level and coverage figures; :func:`align_gold` and
:func:`align_prediction` turn quoted strings into offsets.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Span = tuple[int, int]

_WORD_RE = re.compile(r"\S+")
_SPACE_RE = re.compile(r"\s+")


def word_spans(text: str) -> list[Span]:
    """Offsets of the words of ``text``: maximal runs of non-whitespace characters."""
    return [(m.start(), m.end()) for m in _WORD_RE.finditer(text)]


def _fold(text: str) -> str:
    """Lower-case ``text`` one character at a time, keeping its length (U+0130, whose lower case is two code
    points, stays as it is), so index ``i`` of the result is index ``i`` of the input."""
    return "".join(low if len(low := ch.lower()) == 1 else ch for ch in text)


def _find_exact(chunk: str, s: str) -> Span | None:
    idx = chunk.find(s)
    return (idx, idx + len(s)) if idx >= 0 else None


def _find_casefree(chunk: str, s: str) -> Span | None:
    """First occurrence of ``s`` in ``chunk`` ignoring case, with ``chunk[a:b].lower() == s.lower()``: found in
    folded copies (offsets never drift), then checked with the real, context-sensitive ``str.lower``."""
    folded_chunk, folded_s = _fold(chunk), _fold(s)
    target = s.lower()
    idx = folded_chunk.find(folded_s)
    while idx >= 0:
        end = idx + len(s)
        if chunk[idx:end].lower() == target:
            return (idx, end)
        idx = folded_chunk.find(folded_s, idx + 1)
    return None


def _collapse(chunk: str) -> tuple[str, list[int], list[int]]:
    """Folded ``chunk`` with each whitespace run as one space, and each position's start and end in ``chunk``."""
    parts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    folded = _fold(chunk)
    for m in _SPACE_RE.finditer(chunk):
        parts.append(folded[pos : m.start()])
        starts.extend(range(pos, m.start()))
        ends.extend(range(pos + 1, m.start() + 1))
        parts.append(" ")
        starts.append(m.start())
        ends.append(m.end())
        pos = m.end()
    parts.append(folded[pos:])
    starts.extend(range(pos, len(chunk)))
    ends.extend(range(pos + 1, len(chunk) + 1))
    return "".join(parts), starts, ends


def _find_collapsed(chunk: str, s: str) -> Span | None:
    needle = _fold(_SPACE_RE.sub(" ", s.strip()))
    if not needle:
        return None
    collapsed, starts, ends = _collapse(chunk)
    idx = collapsed.find(needle)
    if idx < 0:
        return None
    # The needle neither starts nor ends with a space, so both ends fall on real characters.
    return (starts[idx], ends[idx + len(needle) - 1])


def align_gold(chunk: str, s: str) -> Span | None:
    """Offsets of a gold quotation ``s`` in ``chunk``, or None: the first exact occurrence, else ignoring case,
    else ignoring case with whitespace runs as one space and ``s`` stripped (offsets in the original chunk)."""
    if not s or not s.strip():
        return None
    return _find_exact(chunk, s) or _find_casefree(chunk, s) or _find_collapsed(chunk, s)


def align_prediction(chunk: str, s: str) -> Span | None:
    """Offsets of a predicted quotation: exact, else ignoring case, else None (predictions are meant to be
    verbatim: no whitespace normalisation, unlike :func:`align_gold`)."""
    if not s:
        return None
    return _find_exact(chunk, s) or _find_casefree(chunk, s)


@dataclass
class EvalRow:
    """One scored (query, chunk) pair: its chunk text, gold spans and predicted spans."""

    chunk: str
    gold: list[Span]
    pred: list[Span]
    relevant: bool | None = None
    key: tuple = field(default=())


def _check_spans(row: EvalRow, side: str, spans: Sequence[Any]) -> list[Span]:
    n = len(row.chunk)
    out = []
    for span in spans:
        try:
            start, end = span
        except (TypeError, ValueError):
            raise ValueError(f"row {row.key!r}: {side} span {span!r} is not a (start, end) pair") from None
        if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) or not isinstance(end, int):
            raise ValueError(f"row {row.key!r}: {side} span {span!r} has non-integer offsets")
        if not 0 <= start < end <= n:
            raise ValueError(f"row {row.key!r}: {side} span {span!r} is empty or outside the chunk (length {n})")
        out.append((start, end))
    return out


def _covered_words(starts: list[int], ends: list[int], spans: Iterable[Span]) -> set[int]:
    """Indices of the words that share at least one character with some span."""
    covered: set[int] = set()
    for a, b in spans:
        first = bisect_right(ends, a)  # first word ending after a
        last = bisect_left(starts, b)  # words before this one start before b
        covered.update(range(first, last))
    return covered


def _overlap(x: Span, y: Span) -> int:
    return max(0, min(x[1], y[1]) - max(x[0], y[0]))


def _union(spans: Iterable[Span]) -> list[Span]:
    """Merge spans into disjoint, sorted intervals."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def _greedy_matches(pred: list[Span], gold: list[Span], threshold: float) -> int:
    """Size of a greedy one-to-one matching by descending IoU, keeping pairs with IoU >= threshold."""
    pairs = []
    for i, p in enumerate(pred):
        for j, g in enumerate(gold):
            inter = _overlap(p, g)
            if inter == 0:
                continue
            union = (p[1] - p[0]) + (g[1] - g[0]) - inter
            pairs.append((inter / union, i, j))
    pairs.sort(key=lambda x: (-x[0], x[1], x[2]))
    used_p: set[int] = set()
    used_g: set[int] = set()
    for iou, i, j in pairs:
        if iou < threshold:
            break
        if i in used_p or j in used_g:
            continue
        used_p.add(i)
        used_g.add(j)
    return len(used_p)


def _key(t: float) -> str:
    return str(float(t))


def evaluate(
    rows: Sequence[EvalRow],
    iou_thresholds: Sequence[float] = (0.3, 0.5, 0.7),
    containment_thresholds: Sequence[float] = (0.5, 0.8, 1.0),
    coverage_thresholds: Sequence[float] = (0.5, 0.8, 1.0),
) -> dict[str, Any]:
    """Score predicted spans against gold spans over all rows (relevant or not).

    Word level: a word is selected by a side when it shares a character with one of its spans; micro figures sum
    over rows, macro F1 averages per-row F1 (0 where neither side selects a word). Span IoU at t: per row, greedy
    one-to-one matching by descending IoU, pairs with IoU >= t; P, R, F1 per row (1 when both sides are empty, 0
    when one is), averaged. Containment at t: share of predicted spans with at least t of their characters in one
    gold span (``containment_union``: in the union of the row's gold spans). Coverage at t: share of gold spans
    with at least t of their characters in the predictions' union. Any-overlap recall: gold spans touching a
    prediction. Over-prediction: predicted over gold spans (None without gold). A span empty, reversed or outside
    its chunk is a ValueError naming the row's key.
    """
    tp_sum = fp_sum = fn_sum = 0
    row_f1: list[float] = []
    iou_sums = {_key(t): [0.0, 0.0, 0.0] for t in iou_thresholds}
    contained = {_key(t): 0 for t in containment_thresholds}
    contained_union = {_key(t): 0 for t in containment_thresholds}
    covered = {_key(t): 0 for t in coverage_thresholds}
    n_gold = n_pred = touched = 0

    for row in rows:
        gold = _check_spans(row, "gold", row.gold)
        pred = _check_spans(row, "pred", row.pred)
        n_gold += len(gold)
        n_pred += len(pred)

        # Word level.
        words = word_spans(row.chunk)
        starts = [w[0] for w in words]
        ends = [w[1] for w in words]
        g_words = _covered_words(starts, ends, gold)
        p_words = _covered_words(starts, ends, pred)
        tp = len(g_words & p_words)
        fp = len(p_words - g_words)
        fn = len(g_words - p_words)
        tp_sum += tp
        fp_sum += fp
        fn_sum += fn
        row_f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)

        # Span IoU.
        for t in iou_thresholds:
            acc = iou_sums[_key(t)]
            if not gold and not pred:
                p = r = f = 1.0
            elif not gold or not pred:
                p = r = f = 0.0
            else:
                m = _greedy_matches(pred, gold, t)
                p, r = m / len(pred), m / len(gold)
                f = _f1(p, r)
            acc[0] += p
            acc[1] += r
            acc[2] += f

        # Containment of each predicted span in one gold span, and in the union of the gold spans.
        gold_merged = _union(gold)
        for ps in pred:
            length = ps[1] - ps[0]
            best = max((_overlap(ps, g) for g in gold), default=0) / length
            in_union = sum(_overlap(ps, u) for u in gold_merged) / length
            for t in containment_thresholds:
                if best >= t:
                    contained[_key(t)] += 1
                if in_union >= t:
                    contained_union[_key(t)] += 1

        # Coverage of each gold span by the union of the predictions.
        merged = _union(pred)
        for gs in gold:
            inside = sum(_overlap(gs, u) for u in merged)
            if inside > 0:
                touched += 1
            share = inside / (gs[1] - gs[0])
            for t in coverage_thresholds:
                if share >= t:
                    covered[_key(t)] += 1

    n_rows = len(rows)
    micro_p = tp_sum / (tp_sum + fp_sum) if tp_sum + fp_sum else 0.0
    micro_r = tp_sum / (tp_sum + fn_sum) if tp_sum + fn_sum else 0.0
    return {
        "n_rows": n_rows,
        "word": {
            "micro_p": micro_p,
            "micro_r": micro_r,
            "micro_f1": _f1(micro_p, micro_r),
            "macro_f1": sum(row_f1) / n_rows if n_rows else 0.0,
        },
        "iou": {
            k: {m: s / n_rows if n_rows else 0.0 for m, s in zip(("p", "r", "f1"), v, strict=True)}
            for k, v in iou_sums.items()
        },
        "containment": {k: (v / n_pred if n_pred else 0.0) for k, v in contained.items()},
        "containment_union": {k: (v / n_pred if n_pred else 0.0) for k, v in contained_union.items()},
        "coverage": {k: (v / n_gold if n_gold else 0.0) for k, v in covered.items()},
        "any_overlap_recall": touched / n_gold if n_gold else 0.0,
        "over_prediction_ratio": n_pred / n_gold if n_gold else None,
        "n_gold_spans": n_gold,
        "n_pred_spans": n_pred,
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def format_table(result: dict[str, Any]) -> str:
    """Fixed-width text rendering of an :func:`evaluate` result (and its diagnostics, if any)."""
    lines: list[str] = []
    width = 28

    def line(label: str, *values: Any) -> None:
        lines.append(f"{label:<{width}}" + "".join(f"{_fmt(v):>10}" for v in values))

    line("rows", result.get("n_rows"))
    line("gold spans", result.get("n_gold_spans"))
    line("predicted spans", result.get("n_pred_spans"))
    lines.append("")
    word = result.get("word", {})
    lines.append(f"{'word level':<{width}}" + "".join(f"{h:>10}" for h in ("P", "R", "F1")))
    line("  micro", word.get("micro_p"), word.get("micro_r"), word.get("micro_f1"))
    line("  macro F1", word.get("macro_f1"))
    lines.append("")
    lines.append(f"{'span IoU (mean of rows)':<{width}}" + "".join(f"{h:>10}" for h in ("P", "R", "F1")))
    for t, v in result.get("iou", {}).items():
        line(f"  IoU >= {t}", v["p"], v["r"], v["f1"])
    lines.append("")
    for label, key in (
        ("containment (pred in gold)", "containment"),
        ("containment (pred in gold union)", "containment_union"),
        ("gold coverage (by pred)", "coverage"),
    ):
        lines.append(label)
        for t, v in result.get(key, {}).items():
            line(f"  >= {t}", v)
    lines.append("")
    line("any-overlap recall", result.get("any_overlap_recall"))
    line("over-prediction ratio", result.get("over_prediction_ratio"))
    lines.append("")
    lines.append("span IoU: per row, then averaged over rows; a row with no gold and no predicted span scores 1,")
    lines.append("one where only one side is empty 0 (as the paper scores abstention).")
    diagnostics = result.get("diagnostics")
    if diagnostics:
        lines.append("")
        lines.append("diagnostics")
        for k, v in diagnostics.items():
            line(f"  {k}", v)
    return "\n".join(lines)
