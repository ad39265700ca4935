"""The HTML and SVG pieces of the report pages: spans in context, inline SVG plots, tables and the page itself."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

CONTEXT_CHARS = 200  # chunk text shown either side of a span
# Bounds on what a page shows whatever its input's fields hold (a 5 MB title): a field, a window of chunk text (and
# windows per pair), table rows, the page (the rest named, not shown: the run's tables hold everything).
FIELD_CHARS = 300
WINDOW_CHARS = 1_200
WINDOWS = 6
TABLE_ROWS = 200
PAGE_BYTES = 8 << 20
SCORE_EDGES = [i / 10 for i in range(11)]
LENGTH_EDGES = [0, 25, 50, 100, 200, 400, 800, 1600, 3200, math.inf]


def highlight(chunk: str, spans: list[dict[str, Any]], lo: int = 0, hi: int | None = None) -> str:
    """``chunk[lo:hi]`` as escaped HTML, each span a ``<mark>`` with its chunk offsets and its score on hover."""
    hi = len(chunk) if hi is None else hi
    parts, pos = [], lo
    for s in sorted(spans, key=lambda s: (s["start"], -s["end"])):
        start, end = max(s["start"], pos), min(s["end"], hi)
        if end <= start:
            continue  # overlaps a span already shown, or outside the window
        parts.append(html.escape(chunk[pos:start]))
        score = f"score {s['score']:.2f}" if s.get("score") is not None else "score n/a"
        how = f" · {s['align']}" if s.get("align") else ""  # LLM spans: how the string was placed
        parts.append(f'<mark class="span" data-start="{start}" data-end="{end}" title="{score}{how}">'
                     f"{html.escape(chunk[start:end])}</mark>")
        pos = end
    parts.append(html.escape(chunk[pos:hi]))
    return "".join(parts)


def windows(chunk: str, spans: Sequence[tuple[int, int]], context: int = CONTEXT_CHARS,
            max_chars: int = WINDOW_CHARS, max_windows: int = WINDOWS) -> list[tuple[int, int]]:
    """The parts of ``chunk`` to show: ``context`` characters either side of each span, overlaps merged, cut at
    spaces; at most ``max_windows`` windows of at most ``max_chars`` characters."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        lo, hi = max(0, start - context), min(len(chunk), end + context)
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
            merged[-1][3] = max(merged[-1][3], end)
        else:
            merged.append([lo, hi, start, end])
    out = []
    for lo, hi, first, last in merged:
        if lo > 0:
            cut = chunk.find(" ", lo, first)
            lo = cut + 1 if cut >= 0 else lo
        if hi < len(chunk):
            cut = chunk.rfind(" ", last, hi)
            hi = cut if cut >= 0 else hi
        out.append((lo, min(hi, lo + max_chars)))
    return out[:max_windows]


def in_context(chunk: str, spans: list[dict[str, Any]], context: int = CONTEXT_CHARS) -> str:
    """Each window of ``chunk`` around ``spans``, highlighted, with an ellipsis where text is left out."""
    parts = []
    for lo, hi in windows(chunk, [(s["start"], s["end"]) for s in spans], context):
        parts.append(f'<div class="ctx">{"… " if lo > 0 else ""}{highlight(chunk, spans, lo, hi)}'
                     f'{" …" if hi < len(chunk) else ""}</div>')
    return "".join(parts)


def histogram(values: Sequence[float], edges: Sequence[float]) -> dict[str, Any]:
    """Counts of ``values`` (nulls and NaN left out) in the bins ``[edges[i], edges[i+1])``; values below the
    first edge count in the first bin, values at or above the last in the last."""
    import numpy as np

    v = np.asarray([x for x in values if x is not None] if isinstance(values, list) else values, dtype=np.float64)
    v = v[~np.isnan(v)]
    n = len(edges) - 1
    idx = np.clip(np.searchsorted(np.asarray(edges, dtype=np.float64), v, side="right") - 1, 0, n - 1)
    counts = np.bincount(idx, minlength=n).tolist()
    return {"edges": [None if math.isinf(e) else e for e in edges], "counts": counts}  # None: no upper bound


def _num(v: float) -> str:
    return f"{v:.3g}" if isinstance(v, float) and not float(v).is_integer() else f"{v:,.0f}"


def svg_histogram(title: str, hist: dict[str, Any], x_label: str, width: int = 460, height: int = 220) -> str:
    """Vertical bars, one per bin, as an inline SVG element."""
    edges, counts = hist["edges"], hist["counts"]
    left, right, top, bottom = 40, 10, 36, 42
    w, h = width - left - right, height - top - bottom
    peak = max(counts, default=0) or 1
    bw = w / max(1, len(counts))
    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{width / 2}" y="17" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#444"/>',
             f'<text x="{left - 4}" y="{top + 10}" text-anchor="end" font-size="10">{peak}</text>',
             f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle" font-size="12">'
             f'{html.escape(x_label)}</text>']
    for i, c in enumerate(counts):
        bh = h * c / peak
        x = left + i * bw
        label = f"{_num(edges[i])}–{_num(edges[i + 1])}" if edges[i + 1] is not None else f"≥{_num(edges[i])}"
        parts.append(f'<rect class="bar" x="{x + 1:.1f}" y="{top + h - bh:.1f}" width="{max(bw - 2, 1):.1f}" '
                     f'height="{bh:.1f}" fill="#4c78a8"><title>{html.escape(label)}: {c}</title></rect>')
        if c:
            parts.append(f'<text x="{x + bw / 2:.1f}" y="{top + h - bh - 3:.1f}" text-anchor="middle" '
                         f'font-size="10">{c}</text>')
        if len(counts) <= 12 or i % 2 == 0:
            parts.append(f'<text x="{x + bw / 2:.1f}" y="{top + h + 13}" text-anchor="middle" font-size="9">'
                         f'{html.escape(_num(edges[i]))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_bars(title: str, bars: Sequence[tuple[str, float]], unit: str = "s", width: int = 640) -> str:
    """Horizontal labelled bars (e.g. seconds per step) as an inline SVG element."""
    bars = [(k, float(v)) for k, v in bars if v is not None and v == v]
    if not bars:
        return ""
    label_w, right, row = 260, 70, 20
    height = 30 + row * len(bars)
    w = width - label_w - right
    peak = max(v for _, v in bars) or 1.0
    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{width / 2}" y="17" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>']
    for i, (name, v) in enumerate(bars):
        y = 26 + i * row
        bw = max(w * v / peak, 1)
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" font-size="11">{html.escape(name)}'
                     f'</text><rect class="bar" x="{label_w}" y="{y + 2}" width="{bw:.1f}" height="{row - 6}" '
                     f'fill="#f58518"><title>{html.escape(name)}: {v:.3f} {unit}</title></rect>'
                     f'<text x="{label_w + bw + 4:.1f}" y="{y + 13}" font-size="11">{v:.3g} {unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_lines(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], x_label: str,
              width: int = 520, height: int = 280) -> str:
    """A line plot of named ``(x, y)`` series (y from 0) as an inline SVG element."""
    pts = [p for _, s in series for p in s if p[1] is not None and p[1] == p[1]]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = 0.0, max(1e-9, max(p[1] for p in pts))
    x1 = x1 if x1 > x0 else x0 + 1
    left, right, top, bottom = 46, 130, 28, 40
    w, h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    colors = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2")
    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{(left + w / 2):.0f}" y="17" text-anchor="middle" font-weight="bold">'
             f"{html.escape(title)}</text>",
             f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#444"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#444"/>',
             f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle" font-size="12">{html.escape(x_label)}'
             f'</text>']
    for i in range(5):
        yv, xv = y0 + (y1 - y0) * i / 4, x0 + (x1 - x0) * i / 4
        parts.append(f'<text x="{left - 4}" y="{sy(yv) + 4:.1f}" text-anchor="end" font-size="10">{yv:.3g}</text>'
                     f'<text x="{sx(xv):.1f}" y="{top + h + 14}" text-anchor="middle" font-size="10">{xv:.3g}</text>')
    for k, (name, s) in enumerate(series):
        color = colors[k % len(colors)]
        clean = [p for p in s if p[1] is not None and p[1] == p[1]]
        if clean:
            line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in clean)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"><title>{html.escape(name)}'
                      f' at {x:g}: {y:.3f}</title></circle>' for x, y in clean]
        parts.append(f'<text x="{left + w + 10}" y="{top + 12 + 15 * k}" fill="{color}" font-size="12">'
                     f'{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


_CSS = """body{font:15px/1.5 system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.4rem}h3{font-size:1.05rem;margin:.2rem 0}table{border-collapse:collapse;margin:.5rem 0 1.5rem}
td,th{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}th{background:#f5f5f5}
section.query{border-top:2px solid #ccc;padding:.6rem 0;margin:1rem 0}
.pair{border:1px solid #ddd;border-radius:6px;padding:.4rem .8rem;margin:.6rem 0}
.meta{color:#666;font-size:.85rem}.abstained,.failed{color:#555;font-size:.85rem;margin:.3rem 0}
.ctx{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.82rem;background:#fafafa;padding:.4rem;
margin:.3rem 0}.plots{display:flex;flex-wrap:wrap;gap:1rem}svg.plot{background:#fff;border:1px solid #eee}
table.hits{width:100%;font-size:.85rem}table.hits caption{text-align:left;font-weight:600}
td.cid{font-family:ui-monospace,monospace;font-size:.75rem}tr.labelled td{background:#e8f5e9}
td.snippet{color:#444}.side{display:grid;grid-template-columns:1fr 1fr;gap:.6rem}.side>div{min-width:0}
mark.span{background:#ffe066;border-radius:2px}mark.span:hover{background:#ffc400}
.gold mark.span{background:#a5d6a7}.gold mark.span:hover{background:#66bb6a}
tr.best td{font-weight:600;background:#fff8e1}"""


def cut(text: str, limit: int = FIELD_CHARS) -> str:
    """``text`` up to ``limit`` characters, with how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def esc(value: Any, limit: int = FIELD_CHARS) -> str:
    """A field as escaped HTML, cut at ``limit`` characters."""
    return html.escape(cut("" if value is None else str(value), limit))


def kv_table(title: str, data: dict[str, Any]) -> str:
    if not data:
        return ""
    items = list(data.items())
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(_fmt(v), 4 * FIELD_CHARS)}</td></tr>" for k, v in items[:TABLE_ROWS])
    more = f'<p class="meta">{len(items) - TABLE_ROWS:,} more not shown</p>' if len(items) > TABLE_ROWS else ""
    return f"<h2>{esc(title)}</h2><table>{rows}</table>{more}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def html_page(title: str, body: Sequence[str], max_bytes: int = PAGE_BYTES) -> str:
    """The page, its body parts in order up to about ``max_bytes`` (UTF-8), saying what it left out."""
    kept, size = [], 0
    for i, part in enumerate(body):
        n = len(part.encode("utf-8", "surrogatepass"))
        if size + n > max_bytes:
            kept.append(f'<p class="meta"><b>This page stops here:</b> {len(body) - i:,} more sections would pass '
                        f"{max_bytes >> 20} MB; the run's tables and report.json hold everything.</p>")
            break
        kept.append(part)
        size += n
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(kept)}</body></html>\n")
