"""Run reports: ``report.json`` (figures) and ``report.html`` (a page a researcher reads).

Every committed run gets both files. The JSON holds counts per table, time per stage (wall time of each
step and, for stages whose actors report it, ``time_ms.*`` summed over actors), throughput, quarantined
papers and errors by reason, spans per pair, the abstention rate and rejects. The page adds, by kind of run:

* **extract**: a section per query (every query, up to ``MAX_QUERIES``), each with its pairs and their spans
  shown in context (``CONTEXT_CHARS`` of chunk text either side, not whole chunks), abstentions and failures,
  and histograms of span scores and span lengths;
* **retrieve**: a section per query with its top hits per method (rank, score, paper, chunk id, a snippet;
  a labelled chunk is marked, and recall@k is given when the query file has labels);
* **every run**: where the time went, as a table and a bar chart.

Plots are inline SVG: the page has no script and loads nothing, so it opens offline anywhere.
``write_evaluation_report`` renders ``verbatim-batch evaluate --report DIR`` (gold beside predicted spans).
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from . import storage
from .runs import MANIFEST_FILE, read_manifest

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
CONTEXT_CHARS = 200  # chunk text shown either side of a span
MAX_QUERIES = 300  # query sections on one page (the JSON counts them all)
HITS_SHOWN = 10  # retrieval hits shown per query and method
SNIPPET_CHARS = 240
COMPOSITES = ("nightly", "run")  # runs made of stage runs in sub-folders
_UNITS = {"chunk": "papers", "embed": "chunks", "retrieve": "queries", "extract": "pairs", "querygen": "chunks",
          "index": "chunks"}


def _table(run_dir: str, name: str, columns: list[str] | None = None):
    """A table of the run (only the columns it has, of those asked for), or None."""
    path = storage.join(run_dir, name)
    if not storage.isdir(path):
        return None
    if columns is not None:
        have = set(storage.dataset(path).schema.names)
        columns = [c for c in columns if c in have]
    return storage.read_parquet(path, columns=columns)


def _reasons(values: list[str | None]) -> dict[str, int]:
    return dict(Counter(v.split(":", 1)[0].split(" (", 1)[0] for v in values if v))


def _sub_manifest(run_dir: str, stage: str) -> dict[str, Any] | None:
    path = storage.join(run_dir, stage, MANIFEST_FILE)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def time_breakdown(manifest: dict[str, Any]) -> dict[str, Any]:
    """Where a run's time went: each timed step's wall time (``<step>_s``; an extract run's ``pairs`` is
    ``read_pairs_s``, its ``work_and_write`` ``extract_and_write_wall_s``), each ``time_ms.*`` count its
    stage's actors report (``<part>_s_summed_over_actors``: with several actors these add up to more than
    the wall time), and rows per second over the work-and-write wall time, Ray start-up excluded."""
    command = manifest.get("command") or ""
    counts, timings = manifest.get("counts", {}), manifest.get("timings_s", {})
    verb = {"extract": "extract", "embed": "embed", "retrieve": "retrieve", "chunk": "chunk"}.get(command, "work")
    labels = {"pairs": "read_pairs_s" if command == "extract" else "pairs_s", "ray_start": "ray_start_s",
              "work_and_write": f"{verb}_and_write_wall_s", "total": "total_s"}
    out: dict[str, Any] = {}
    for key, value in timings.items():
        if isinstance(value, (int, float)):
            out[labels.get(key, f"{key}_s")] = float(value)
    for key, value in sorted(counts.items()):
        stage, sep, part = key.rpartition("time_ms.")
        if sep and isinstance(value, (int, float)):
            out[f"{stage}{part}_s_summed_over_actors"] = value / 1000
    wall = float(timings.get("work_and_write") or 0)
    if wall > 0 and counts.get("rows_new"):
        out[f"{_UNITS.get(command, 'rows')}_per_s_excluding_ray_start"] = counts["rows_new"] / wall
    return out


def extract_time(counts: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
    """``time_breakdown`` of an extract run from its counts and timings."""
    return time_breakdown({"command": "extract", "counts": counts, "timings_s": timings})


def build_report(run_dir: str, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of one run folder (committed, or a staging folder with its manifest given)."""
    if manifest is None:
        manifest = read_manifest(run_dir)
    command = manifest.get("command")
    counts = manifest.get("counts", {})
    timings = manifest.get("timings_s", {})
    total = float(timings.get("total") or 0.0)
    out: dict[str, Any] = {
        "run_id": manifest.get("run_id"), "command": command,
        "created_at": manifest.get("created_at"), "status": manifest.get("status"),
        "tables": {k: v.get("rows") for k, v in manifest.get("tables", {}).items()},
        "timings_s": timings, "counts": counts,
    }
    rate = {}
    for key, label in (("papers", "papers_per_s"), ("chunks", "chunks_per_s"), ("pairs", "pairs_per_s"),
                       ("spans", "spans_per_s"), ("tokens", "tokens_per_s"), ("queries", "queries_per_s")):
        if total > 0 and counts.get(key):
            rate[label] = counts[key] / total
    if total > 0 and counts.get("papers_bytes"):
        rate["mb_per_s"] = counts["papers_bytes"] / 1e6 / total
    out["throughput"] = rate
    out["time_breakdown"] = time_breakdown(manifest)
    for key, value in out["time_breakdown"].items():
        if key.endswith("_per_s_excluding_ray_start"):
            rate[key] = value
    where = {"quarantine": run_dir, "pairs": run_dir, "rejects": run_dir}
    if command in COMPOSITES:  # a run of stage runs: figures per stage, tables in theirs
        where = {"quarantine": storage.join(run_dir, "chunks"), "pairs": storage.join(run_dir, "spans"),
                 "rejects": storage.join(run_dir, "spans")}
        stages: dict[str, dict[str, Any]] = {}
        for key, value in counts.items():
            stage, _, name = key.partition(".")
            stages.setdefault(stage, {})[name] = value
        for stage, figures in stages.items():
            seconds = float(timings.get(stage) or 0.0)
            figures["seconds"] = seconds
            out.setdefault("stage_counts", {})[stage] = figures
        out["stage_time_breakdown"] = {}
        for stage in ("chunks", "embeddings", "index", "retrieval", "spans"):
            sub = _sub_manifest(run_dir, stage)
            if sub is not None:
                out["stage_time_breakdown"][stage] = time_breakdown(sub)
        if command == "nightly":
            out["index_update"] = manifest.get("index_update")
        out["throughput"] = {f"{stage}_{k}_per_s": v / float(timings[stage]) for stage, k in (
            ("chunks", "papers_chunked"), ("embeddings", "rows_new"), ("spans", "rows_new"))
            if float(timings.get(stage) or 0) > 0 and (v := counts.get(f"{stage}.{k}"))}
    quarantine = _table(where["quarantine"], "quarantine", ["reason"])
    if quarantine is not None:
        out["quarantine_by_reason"] = _reasons(quarantine["reason"].to_pylist())
    pairs = _table(where["pairs"], "pairs", ["n_spans", "error", "n_violations"])
    if pairs is not None:
        n_spans = pairs["n_spans"].to_pylist()
        errors = pairs["error"].to_pylist()
        ok = [n for n, e in zip(n_spans, errors, strict=True) if not e]
        out["errors_by_reason"] = _reasons(errors)
        out["spans_per_pair"] = {
            "mean": statistics.fmean(ok) if ok else 0.0, "median": statistics.median(ok) if ok else 0,
            "max": max(ok, default=0)}
        out["abstention_rate"] = sum(1 for n in ok if n == 0) / len(ok) if ok else None
        out["verbatim_violations"] = sum(v or 0 for v in pairs["n_violations"].to_pylist())
    rejects = _table(where["rejects"], "rejects", ["reason"])
    if rejects is not None:
        out["rejects"] = rejects.num_rows
        out["rejects_by_reason"] = _reasons(rejects["reason"].to_pylist())
    return out


# --- chunk texts and paper titles --------------------------------------------------------------------------


def _chunks_run_of(manifest: dict[str, Any]) -> str | None:
    """The chunk run an extract or retrieve run's chunks come from (a retrieve run: through its index run)."""
    config = json.loads(manifest.get("config") or "{}")
    if config.get("chunks"):
        return config["chunks"]
    if config.get("index"):
        try:
            return json.loads(read_manifest(config["index"]).get("config") or "{}").get("chunks")
        except (OSError, ValueError):
            return None
    return None


def chunk_texts(config: dict[str, Any], pair_rows: list[dict[str, Any]]) -> dict[str, str]:
    """pair_id -> chunk text, from the pairs file or the chunk run the extraction read."""
    from .extract.pairs import chunk_lookup, pairs_from_records, read_pair_records

    if config.get("pairs") and storage.exists(config["pairs"]):
        table = pairs_from_records(read_pair_records(config["pairs"]))
        wanted = {p["pair_id"] for p in pair_rows}
        return {r["pair_id"]: r["chunk"] for r in table.to_pylist() if r["pair_id"] in wanted and r["chunk"]}
    chunks_run = config.get("chunks")
    if chunks_run and storage.isdir(storage.join(chunks_run, "chunks")):
        known = chunk_lookup(storage.join(chunks_run, "chunks"), [p["chunk_id"] for p in pair_rows])
        return {p["pair_id"]: known[p["chunk_id"]]["text"] for p in pair_rows if p["chunk_id"] in known}
    return {}


def _titles(chunks_run: str | None, paper_ids: set[str]) -> dict[str, str]:
    import pyarrow.dataset as pads

    papers = storage.join(chunks_run, "papers") if chunks_run else None
    if not papers or not paper_ids or not storage.isdir(papers):
        return {}
    table = storage.dataset(papers).to_table(columns=["paper_id", "title"],
                                             filter=pads.field("paper_id").isin(sorted(paper_ids)))
    return {p: t for p, t in zip(table["paper_id"].to_pylist(), table["title"].to_pylist(), strict=True) if t}


# --- spans in context ----------------------------------------------------------------------------------------


def highlight(chunk: str, spans: list[dict[str, Any]], lo: int = 0, hi: int | None = None) -> str:
    """``chunk[lo:hi]`` as escaped HTML with each span wrapped in ``<mark>`` (score and method on hover; the
    mark's ``data-start``/``data-end`` are chunk offsets)."""
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


def windows(chunk: str, spans: Sequence[tuple[int, int]], context: int = CONTEXT_CHARS) -> list[tuple[int, int]]:
    """The parts of ``chunk`` to show: ``context`` characters either side of each span, overlapping windows
    merged, each cut at a space so it starts and ends on whole words."""
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
        out.append((lo, hi))
    return out


def in_context(chunk: str, spans: list[dict[str, Any]], context: int = CONTEXT_CHARS) -> str:
    """Each window of ``chunk`` around ``spans``, highlighted, with an ellipsis where text is left out."""
    parts = []
    for lo, hi in windows(chunk, [(s["start"], s["end"]) for s in spans], context):
        parts.append(f'<div class="ctx">{"… " if lo > 0 else ""}{highlight(chunk, spans, lo, hi)}'
                     f'{" …" if hi < len(chunk) else ""}</div>')
    return "".join(parts)


# --- plots ---------------------------------------------------------------------------------------------------


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


# --- sections ------------------------------------------------------------------------------------------------

SCORE_EDGES = [i / 10 for i in range(11)]
LENGTH_EDGES = [0, 25, 50, 100, 200, 400, 800, 1600, 3200, math.inf]


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def extract_section(run_dir: str, manifest: dict[str, Any], per_query: int = 12,
                    max_queries: int = MAX_QUERIES) -> tuple[dict[str, Any], str]:
    """Figures and HTML of an extract run: span score and length histograms, then a section per query with
    up to ``per_query`` of its pairs with spans shown in context, and its abstentions and failures."""
    pairs = _table(run_dir, "pairs", ["pair_id", "query_id", "query", "paper_id", "chunk_id", "chunk_index",
                                      "rank", "n_spans", "relevance", "error"])
    spans = _table(run_dir, "spans", ["pair_id", "start", "end", "score", "align"])
    if pairs is None or spans is None:
        return {}, ""
    import numpy as np
    import pyarrow.compute as pc

    scores = spans["score"].drop_null().to_numpy().astype("float64") if spans.num_rows else []
    lengths = pc.subtract(spans["end"], spans["start"]).to_numpy() if spans.num_rows else []
    lo, hi = (min(0.0, float(scores.min())), max(1.0, float(scores.max()))) if len(scores) else (0.0, 1.0)
    score_edges = SCORE_EDGES if (lo, hi) == (0.0, 1.0) else [lo + (hi - lo) * i / 10 for i in range(11)]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in pairs.to_pylist():
        groups[r.get("query_id") or r.get("query") or ""].append(r)
    order = sorted(groups, key=lambda q: (not (groups[q][0].get("query") or "").strip(),
                                          (groups[q][0].get("query") or "").casefold(), q))
    figures: dict[str, Any] = {
        "queries": len(groups),
        "queries_with_spans": sum(1 for g in groups.values() if any(r["n_spans"] for r in g)),
        "spans": spans.num_rows,
        "span_score_histogram": histogram(scores, score_edges),
        "span_length_histogram": histogram(lengths, LENGTH_EDGES),
        "span_length_chars": {"median": float(np.median(lengths)) if len(lengths) else 0,
                              "max": int(lengths.max()) if len(lengths) else 0},
    }

    def rank_key(r: dict[str, Any]) -> tuple:
        return (r.get("rank") if r.get("rank") is not None else math.inf, -(r.get("relevance") or 0.0), r["pair_id"])

    shown: dict[str, list[dict[str, Any]]] = {}
    for q in order[:max_queries]:
        shown[q] = sorted((r for r in groups[q] if r["n_spans"]), key=rank_key)[:per_query]
    wanted = pa.array(sorted({r["pair_id"] for rows in shown.values() for r in rows}), pa.string())
    by_pair: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in spans.filter(pc.is_in(spans["pair_id"], value_set=wanted)).to_pylist():
        by_pair[s["pair_id"]].append(s)
    config = json.loads(manifest.get("config") or "{}")
    texts = chunk_texts(config, [r for rows in shown.values() for r in rows])
    titles = _titles(_chunks_run_of(manifest), {r["paper_id"] for rows in shown.values() for r in rows
                                                if r.get("paper_id")})
    body = [f"<h2>Spans ({spans.num_rows:,}) by query ({len(groups):,} queries)</h2>",
            '<div class="plots">',
            svg_histogram("Span scores", figures["span_score_histogram"], "score"),
            svg_histogram("Span lengths", figures["span_length_histogram"], "characters"), "</div>"]
    if len(order) > max_queries:
        body.append(f'<p class="meta">The first {max_queries} of {len(order):,} queries are shown; the spans '
                    f"table holds them all.</p>")
    for q in order[:max_queries]:
        rows = groups[q]
        query = rows[0].get("query") or ""
        n_with = sum(1 for r in rows if r["n_spans"])
        failed = [r for r in rows if r["error"]]
        abstained = sorted((r for r in rows if not r["n_spans"] and not r["error"]), key=rank_key)
        n_spans = sum(r["n_spans"] for r in rows)
        body.append(f'<section class="query" data-query-id="{_esc(rows[0].get("query_id"))}">'
                    f'<h3>{_esc(query) if query.strip() else "<i>(empty query)</i>"}</h3>'
                    f'<div class="meta">{len(rows)} pairs · {n_with} with spans · {n_spans} spans · '
                    f"{len(abstained)} abstained · {len(failed)} failed</div>")
        for r in shown.get(q, []):
            chunk = texts.get(r["pair_id"])
            rel = f"{r['relevance']:.2f}" if r.get("relevance") is not None else "n/a"
            rank = f" · rank {r['rank']}" if r.get("rank") is not None else ""
            title = f" — {_esc(titles[r['paper_id']])}" if r.get("paper_id") in titles else ""
            ctx = (in_context(chunk, by_pair.get(r["pair_id"], [])) if chunk is not None
                   else '<div class="ctx"><i>chunk text not available</i></div>')
            body.append(f'<div class="pair" data-pair="{_esc(r["pair_id"])}"><div class="meta">'
                        f"{_esc(r.get('paper_id'))}{title} · chunk {_esc(r.get('chunk_id'))}{rank} · "
                        f"{r['n_spans']} spans · relevance {rel}</div>{ctx}</div>")
        if n_with > len(shown.get(q, [])):
            body.append(f'<div class="meta">{n_with - len(shown[q])} more pairs with spans not shown</div>')
        if abstained:
            items = ", ".join(f"{_esc(r.get('paper_id'))} #{_esc(r.get('chunk_index'))}"
                              + (f" ({r['relevance']:.2f})" if r.get("relevance") is not None else "")
                              for r in abstained[:per_query])
            more = f" and {len(abstained) - per_query} more" if len(abstained) > per_query else ""
            body.append(f'<div class="abstained">No span (abstained) in: {items}{more}</div>')
        if failed:
            body.append(f'<div class="failed">Failed: {_esc(json.dumps(_reasons([r["error"] for r in failed])))}'
                        f"</div>")
        body.append("</section>")
    return figures, "".join(body)


def _query_file(path: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """``({query_id: query}, {query_id: labelled chunk_id})`` of a query file (ids as retrieve assigns them)."""
    from .records import iter_records
    from .tables import query_id_for

    texts: dict[str, str] = {}
    labels: dict[str, str] = {}
    if not path or not storage.exists(path):
        return texts, labels
    try:
        for rec in iter_records(path):
            q = rec.get("query")
            if "__error__" in rec or not isinstance(q, str):
                continue
            qid = str(rec["query_id"]) if rec.get("query_id") is not None else query_id_for(q)
            texts[qid] = q
            if isinstance(rec.get("chunk_id"), str):
                labels[qid] = rec["chunk_id"]
    except (OSError, ValueError):
        return {}, {}
    return texts, labels


def retrieval_section(run_dir: str, manifest: dict[str, Any], hits: int = HITS_SHOWN,
                      max_queries: int = MAX_QUERIES) -> tuple[dict[str, Any], str]:
    """Figures and HTML of a retrieve run: a section per query with its top ``hits`` per method (chunk id,
    paper, score, a snippet of the chunk), recall@k per method when the query file labels a chunk."""
    import pyarrow.compute as pc

    table = _table(run_dir, "retrieval", ["query_id", "query", "method", "rank", "chunk_id", "paper_id", "score"])
    if table is None:
        return {}, ""
    config = json.loads(manifest.get("config") or "{}")
    texts, labels = _query_file(config.get("queries"))
    k = pc.max(table["rank"]).as_py() or 0 if table.num_rows else 0
    query_ids = pc.unique(table["query_id"]).to_pylist()
    if "query" in table.column_names:  # a retrieval table that carries the query text
        for r in table.select(["query_id", "query"]).group_by(["query_id", "query"]).aggregate([]).to_pylist():
            texts[r["query_id"]] = r["query"]
    recall: dict[str, float] = {}
    asked = [q for q in query_ids if q in labels]
    if asked:
        gold = pa.table({"query_id": pa.array(list(labels), pa.string()), "chunk_id": pa.array(list(labels.values()),
                                                                                            pa.string())})
        hits_ = table.select(["query_id", "chunk_id", "method"]).join(gold, keys=["query_id", "chunk_id"],
                                                                      join_type="inner")
        found = Counter(m for m in hits_.group_by(["method", "query_id"]).aggregate([])["method"].to_pylist())
        recall = {m: found.get(m, 0) / len(asked) for m in sorted(pc.unique(table["method"]).to_pylist())}
    order_all = sorted(query_ids, key=lambda q: ((texts.get(q) or "").casefold(), q))
    order = order_all[:max_queries]
    shown = table.filter(pc.and_(pc.less_equal(table["rank"], hits),
                                 pc.is_in(table["query_id"], value_set=pa.array(order, pa.string()))))
    top = shown.to_pylist()
    by_query: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in sorted(top, key=lambda r: r["rank"]):
        by_query[r["query_id"]][r["method"]].append(r)
        if r.get("query"):
            texts.setdefault(r["query_id"], r["query"])
    methods = sorted({r["method"] for r in top}, key=lambda m: ("dense", "bm25", "hybrid").index(m)
                     if m in ("dense", "bm25", "hybrid") else 9)
    wanted = [r for q in order for rows in by_query[q].values() for r in rows]
    chunks_run = _chunks_run_of(manifest)
    chunks: dict[str, dict[str, Any]] = {}
    if chunks_run and storage.isdir(storage.join(chunks_run, "chunks")):
        from .extract.pairs import chunk_lookup

        chunks = chunk_lookup(storage.join(chunks_run, "chunks"), [r["chunk_id"] for r in wanted])
    titles = _titles(chunks_run, {r["paper_id"] for r in wanted})
    firsts = table.filter(pc.equal(table["rank"], 1)).group_by("method").aggregate([("score", "mean")]).to_pylist() \
        if table.num_rows else []
    figures = {"queries": len(query_ids), "methods": methods, "k": k, "hits_shown_per_method": hits,
               "recall_at_k": recall, "top1_score_mean": {r["method"]: r["score_mean"] for r in firsts}}
    body = [f"<h2>Hits by query ({len(query_ids):,} queries; top {min(hits, k)} of {k} per method)</h2>"]
    if recall:
        body.append(_kv_table(f"Recall@{k} on the labelled queries", recall))
    if len(query_ids) > max_queries:
        body.append(f'<p class="meta">The first {max_queries} of {len(query_ids):,} queries are shown.</p>')
    for q in order:
        query = texts.get(q)
        body.append(f'<section class="query" data-query-id="{_esc(q)}"><h3>{_esc(query) if query else _esc(q)}</h3>')
        for method in methods:
            rows = by_query[q].get(method, [])
            body.append(f'<table class="hits" data-method="{_esc(method)}"><caption>{_esc(method)}</caption>'
                        "<tr><th>rank</th><th>score</th><th>paper</th><th>chunk</th><th>snippet</th></tr>")
            for r in rows:
                c = chunks.get(r["chunk_id"])
                snippet = " ".join(c["text"][: SNIPPET_CHARS * 2].split())[:SNIPPET_CHARS] if c else ""
                mark = ' class="labelled" title="the labelled chunk"' if labels.get(q) == r["chunk_id"] else ""
                title = f"<br><small>{_esc(titles[r['paper_id']])}</small>" if r["paper_id"] in titles else ""
                body.append(f'<tr{mark}><td>{r["rank"]}</td><td>{r["score"]:.4g}</td><td>{_esc(r["paper_id"])}{title}'
                            f'</td><td class="cid">{_esc(r["chunk_id"])}</td><td class="snippet">{_esc(snippet)}'
                            f"{'…' if c and len(c['text']) > len(snippet) else ''}</td></tr>")
            body.append("</table>")
        body.append("</section>")
    return figures, "".join(body)


# --- the page ------------------------------------------------------------------------------------------------

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


def _kv_table(title: str, data: dict[str, Any]) -> str:
    if not data:
        return ""
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in data.items())
    return f"<h2>{html.escape(title)}</h2><table>{rows}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _time_html(command: str, breakdown: dict[str, Any], title: str | None = None) -> str:
    if not breakdown:
        return ""
    title = title or f"Where the {command} time went"
    wall = [(k[:-2], v) for k, v in breakdown.items() if k.endswith("_s") and k != "total_s"]
    summed = [(k.removesuffix("_s_summed_over_actors"), v) for k, v in breakdown.items()
              if k.endswith("_s_summed_over_actors")]
    plot = svg_bars(f"{title}: wall time per step", wall) + (
        svg_bars("Summed over actors", summed) if summed else "")
    return _kv_table(title, breakdown) + f'<div class="plots">{plot}</div>'


def _page(title: str, body: Sequence[str]) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def render_html(report: dict[str, Any], sections: Sequence[str] = ()) -> str:
    """A self-contained static page: run summary, where the time went, then the run's own sections."""
    command = str(report.get("command"))
    summary = {k: report.get(k) for k in ("run_id", "command", "created_at", "status")}
    for key in ("abstention_rate", "verbatim_violations", "rejects", "spans_per_pair"):
        if key in report:
            summary[key] = report[key]
    body = [f"<h1>verbatim-batch {html.escape(command)} run</h1>",
            _kv_table("Summary", summary), _kv_table("Tables (rows)", report.get("tables", {})),
            _time_html(command, report.get("time_breakdown", {})),
            *(_time_html(stage, b, f"Where the {stage} stage's time went")
              for stage, b in report.get("stage_time_breakdown", {}).items()),
            *(_kv_table(f"Stage: {stage}", figures) for stage, figures in report.get("stage_counts", {}).items()),
            _kv_table("Throughput", report.get("throughput", {})),
            _kv_table("Quarantined by reason", report.get("quarantine_by_reason", {})),
            _kv_table("Errors by reason", report.get("errors_by_reason", {})),
            _kv_table("Rejects by reason", report.get("rejects_by_reason", {})),
            *sections,
            _kv_table("Counts", report.get("counts", {}))]
    return _page(f"{command} {report.get('run_id')}", body)


def write_report(run_dir: str, manifest: dict[str, Any] | None = None, n_samples: int = 12) -> dict[str, Any]:
    """Write ``report.json`` and ``report.html`` into the run folder; returns the report. ``n_samples``: pairs
    with spans shown per query (extract runs)."""
    from .abstention import abstention_section

    if manifest is None:
        manifest = read_manifest(run_dir)
    report = build_report(run_dir, manifest)
    command = manifest.get("command")
    sections = []
    targets = [(run_dir, manifest)]
    if command in COMPOSITES:
        targets = [(storage.join(run_dir, s), m) for s in ("retrieval", "spans") if (m := _sub_manifest(run_dir, s))]
    for where, m in targets:
        if m.get("command") == "retrieve":
            figures, section = retrieval_section(where, m)
            report["retrieval"] = figures
            sections.append(section)
        elif m.get("command") == "extract":
            figures, section = extract_section(where, m, per_query=n_samples)
            report["extract"] = figures
            sections.append(section)
            if (abstain := abstention_section(where, m)) is not None:  # the input pairs file is a gold file
                report["abstention"], section = abstain
                sections.append(section)
    storage.write_text(storage.join(run_dir, REPORT_JSON), json.dumps(report, indent=2, sort_keys=True, default=str))
    storage.write_text(storage.join(run_dir, REPORT_HTML), render_html(report, sections))
    return report


# --- evaluate --report ---------------------------------------------------------------------------------------


def _marked(chunk: str, spans: Sequence[tuple[int, int]], cls: str, shown: list[tuple[int, int]]) -> str:
    marks = [{"start": a, "end": b, "score": None} for a, b in spans]
    parts = []
    for lo, hi in shown:
        inner = highlight(chunk, marks, lo, hi).replace('title="score n/a"', f'title="{cls}"')
        parts.append(f'<div class="ctx">{"… " if lo > 0 else ""}{inner}{" …" if hi < len(chunk) else ""}</div>')
    return "".join(parts) or '<div class="ctx"><i>no span</i></div>'


def sweep_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row of headline figures per threshold of a sweep (``{threshold: evaluate result}``)."""
    out = []
    for t, r in results.items():
        iou = r.get("iou", {})
        iou_key = "0.5" if "0.5" in iou else next(iter(iou), None)
        cov = r.get("coverage", {})
        cov_key = "0.5" if "0.5" in cov else next(iter(cov), None)
        out.append({"threshold": float(t), "pred_spans": r.get("n_pred_spans"), "word_p": r["word"]["micro_p"],
                    "word_r": r["word"]["micro_r"], "word_f1": r["word"]["micro_f1"],
                    "macro_f1": r["word"]["macro_f1"], "iou_f1": iou[iou_key]["f1"] if iou_key else None,
                    "iou_at": iou_key, "coverage": cov.get(cov_key) if cov_key else None, "coverage_at": cov_key,
                    "overlap_recall": r.get("any_overlap_recall"), "over_prediction": r.get("over_prediction_ratio")})
    return out


SWEEP_COLUMNS = (("threshold", "threshold"), ("pred_spans", "pred spans"), ("word_p", "word P"),
                 ("word_r", "word R"), ("word_f1", "word F1"), ("macro_f1", "macro F1"), ("iou_f1", "IoU F1"),
                 ("coverage", "coverage"), ("overlap_recall", "overlap rec."), ("over_prediction", "over-pred."))


def write_evaluation_report(folder: str, result: dict[str, Any], rows: list[dict[str, Any]],
                            sweep: dict[str, dict[str, Any]] | None = None, title: str = "evaluation",
                            max_rows: int = 1000) -> str:
    """``folder/report.html`` (and ``report.json``) of an evaluation: the metrics, for a sweep a table and
    plot per threshold, then every gold row (worst word F1 first) with its gold and predicted spans side by
    side. ``rows``: ``evaluate.row_details``; ``result``: the scores they came from (a sweep's best)."""
    body = [f"<h1>verbatim-batch {html.escape(title)}</h1>"]
    figures = {k: result.get(k) for k in ("n_rows", "n_gold_spans", "n_pred_spans", "any_overlap_recall",
                                           "over_prediction_ratio")}
    word = result.get("word", {})
    figures |= {f"word_{k}": v for k, v in word.items()}
    figures |= {f"iou_{t}_f1": v["f1"] for t, v in result.get("iou", {}).items()}
    figures |= {f"coverage_{t}": v for t, v in result.get("coverage", {}).items()}
    table = sweep_rows(sweep) if sweep else []
    if sweep:
        best = max(table, key=lambda r: r["word_f1"])
        body.append(f"<h2>Threshold sweep</h2><p>Per-row details below are at the best threshold by word F1: "
                    f"<b>{best['threshold']:g}</b>.</p>")
        head = "".join(f"<th>{html.escape(label)}</th>" for _, label in SWEEP_COLUMNS)
        lines = []
        for r in table:
            cells = "".join(f"<td>{html.escape(f'{r[k]:g}' if k == 'threshold' else _cell(r[k]))}</td>"
                            for k, _ in SWEEP_COLUMNS)
            lines.append(f'<tr{" class=best" if r is best else ""}>{cells}</tr>')
        iou_at, cov_at = table[0].get("iou_at"), table[0].get("coverage_at")
        body.append(f'<table class="sweep"><tr>{head}</tr>{"".join(lines)}</table>'
                    f'<p class="meta">IoU F1 at IoU ≥ {html.escape(str(iou_at))}; coverage: share of gold spans '
                    f"at least {html.escape(str(cov_at))} covered.</p>")
        body.append('<div class="plots">' + svg_lines("Scores by threshold", [
            (name, [(r["threshold"], r[key]) for r in table])
            for key, name in (("word_p", "word P"), ("word_r", "word R"), ("word_f1", "word F1"),
                              ("iou_f1", "IoU F1"))], "threshold") + "</div>")
    body.append(_kv_table("Scores" + (" at the best threshold" if sweep else ""), figures))
    f1s = [r["word_f1"] for r in rows]
    body.append('<div class="plots">' + svg_histogram("Per-row word F1", histogram(f1s, SCORE_EDGES), "word F1")
                + "</div>")
    ordered = sorted(rows, key=lambda r: (r["word_f1"] if r["gold"] or r["pred"] else 1.0, str(r.get("query"))))
    body.append(f"<h2>Gold and predicted spans, worst row first ({len(rows)} rows)</h2>")
    if len(ordered) > max_rows:
        body.append(f'<p class="meta">The {max_rows} worst rows of {len(ordered)} are shown.</p>')
    for r in ordered[:max_rows]:
        chunk = r["chunk"]
        shown = windows(chunk, [*r["gold"], *r["pred"]]) or [(0, min(len(chunk), 2 * CONTEXT_CHARS))]
        both_empty = not r["gold"] and not r["pred"]
        where = " · ".join(f"{k} {v}" for k, v in (("paper", r.get("paper_id")), ("chunk", r.get("chunk_index")))
                           if v is not None)
        note = " · no gold span and none predicted" if both_empty else ""
        body.append(f'<section class="row" data-f1="{r["word_f1"]:.4f}"><h3>{_esc(r["query"])}</h3>'
                    f'<div class="meta">word F1 <b class="f1">{r["word_f1"]:.3f}</b> (P {r["word_p"]:.3f}, '
                    f'R {r["word_r"]:.3f}) · {len(r["gold"])} gold, {len(r["pred"])} predicted'
                    f'{" · " + _esc(where) if where else ""}{note}</div><div class="side">'
                    f'<div class="gold"><div class="meta">gold</div>{_marked(chunk, r["gold"], "gold", shown)}</div>'
                    f'<div class="pred"><div class="meta">predicted</div>'
                    f'{_marked(chunk, r["pred"], "predicted", shown)}</div></div></section>')
    page = _page(title, body)
    storage.write_text(storage.join(folder, REPORT_HTML), page)
    data = {"scores": result, "sweep": table or None,
            "rows": [{k: v for k, v in r.items() if k != "chunk"} for r in rows]}
    storage.write_text(storage.join(folder, REPORT_JSON), json.dumps(data, indent=2, default=str))
    return storage.join(folder, REPORT_HTML)


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
