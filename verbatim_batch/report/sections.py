"""A report page's sections by kind of run, each its figures and HTML: extract spans and retrieve hits by query."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa

from verbatim_batch.core import storage
from verbatim_batch.report.data import (
    TEXT_CHARS,
    chunk_texts,
    chunks_run_of,
    count_reasons,
    paper_titles,
    query_file,
    run_table,
)
from verbatim_batch.report.html import (
    LENGTH_EDGES,
    PAGE_BYTES,
    SCORE_EDGES,
    esc,
    histogram,
    in_context,
    kv_table,
    svg_histogram,
)

MAX_QUERIES = 300  # query sections on one page (the JSON counts them all)
HITS_SHOWN = 10  # retrieval hits shown per query and method
SNIPPET_CHARS = 240
SECTION_BYTES = PAGE_BYTES // 2  # a section's query sections stop here (each field in them is already cut)


def _stop(body: list[str], size: int, shown: int, total: int) -> bool:
    """Whether a section has reached ``SECTION_BYTES``; if so, says how many queries are left out."""
    if size <= SECTION_BYTES:
        return False
    body.append(f'<p class="meta">The page stops after {shown:,} of {total:,} queries ({SECTION_BYTES >> 20} MB); '
                "the run's tables hold them all.</p>")
    return True


def query_positions(path: str | None) -> dict[str, int]:
    """``query_id -> position`` in the query file a run was made from (empty when it is gone or unreadable)."""
    return {q: i for i, q in enumerate(query_file(path)[0])} if path else {}


def extract_section(run_dir: str, manifest: dict[str, Any], per_query: int = 12,
                    max_queries: int = MAX_QUERIES) -> tuple[dict[str, Any], str]:
    """Figures and HTML of an extract run: span score and length histograms, then a section per query with
    up to ``per_query`` of its pairs with spans shown in context, and its abstentions and failures."""
    pairs = run_table(run_dir, "pairs", ["pair_id", "query_id", "query", "paper_id", "chunk_id", "chunk_index",
                                      "rank", "n_spans", "relevance", "error"], cut=TEXT_CHARS)
    spans = run_table(run_dir, "spans", ["pair_id", "start", "end", "score", "align"])
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
    config = json.loads(manifest.get("config") or "{}")
    given = query_positions(config.get("queries"))
    order = sorted(groups, key=lambda q: (given.get(q, math.inf), not (groups[q][0].get("query") or "").strip(),
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
    texts = chunk_texts(config, [r for rows in shown.values() for r in rows])
    titles = paper_titles(chunks_run_of(manifest), {r["paper_id"] for rows in shown.values() for r in rows
                                                if r.get("paper_id")})
    body = [f"<h2>Spans ({spans.num_rows:,}) by query ({len(groups):,} queries)</h2>",
            '<div class="plots">',
            svg_histogram("Span scores", figures["span_score_histogram"], "score"),
            svg_histogram("Span lengths", figures["span_length_histogram"], "characters"), "</div>"]
    if len(order) > max_queries:
        body.append(f'<p class="meta">The first {max_queries} of {len(order):,} queries are shown; the spans '
                    f"table holds them all.</p>")
    size = 0
    for n_shown, q in enumerate(order[:max_queries]):
        if _stop(body, size, n_shown, len(order)):
            break
        first = len(body)
        rows = groups[q]
        query = rows[0].get("query") or ""
        n_with = sum(1 for r in rows if r["n_spans"])
        failed = [r for r in rows if r["error"]]
        abstained = sorted((r for r in rows if not r["n_spans"] and not r["error"]), key=rank_key)
        n_spans = sum(r["n_spans"] for r in rows)
        body.append(f'<section class="query" data-query-id="{esc(rows[0].get("query_id"))}">'
                    f'<h3>{esc(query) if query.strip() else "<i>(empty query)</i>"}</h3>'
                    f'<div class="meta">{len(rows)} pairs · {n_with} with spans · {n_spans} spans · '
                    f"{len(abstained)} abstained · {len(failed)} failed</div>")
        for r in shown.get(q, []):
            chunk = texts.get(r["pair_id"])
            rel = f"{r['relevance']:.2f}" if r.get("relevance") is not None else "n/a"
            rank = f" · rank {r['rank']}" if r.get("rank") is not None else ""
            title = f" — {esc(titles[r['paper_id']])}" if r.get("paper_id") in titles else ""
            ctx = (in_context(chunk, by_pair.get(r["pair_id"], [])) if chunk is not None
                   else '<div class="ctx"><i>chunk text not available</i></div>')
            body.append(f'<div class="pair" data-pair="{esc(r["pair_id"])}"><div class="meta">'
                        f"{esc(r.get('paper_id'))}{title} · chunk {esc(r.get('chunk_id'))}{rank} · "
                        f"{r['n_spans']} spans · relevance {rel}</div>{ctx}</div>")
        if n_with > len(shown.get(q, [])):
            body.append(f'<div class="meta">{n_with - len(shown[q])} more pairs with spans not shown</div>')
        if abstained:
            items = ", ".join(f"{esc(r.get('paper_id'))} #{esc(r.get('chunk_index'))}"
                              + (f" ({r['relevance']:.2f})" if r.get("relevance") is not None else "")
                              for r in abstained[:per_query])
            more = f" and {len(abstained) - per_query} more" if len(abstained) > per_query else ""
            body.append(f'<div class="abstained">No span (abstained) in: {items}{more}</div>')
        if failed:
            body.append(f'<div class="failed">Failed: {esc(json.dumps(count_reasons([r["error"] for r in failed])))}'
                        f"</div>")
        body.append("</section>")
        size += sum(len(b) for b in body[first:])
    return figures, "".join(body)


def retrieval_section(run_dir: str, manifest: dict[str, Any], hits: int = HITS_SHOWN,
                      max_queries: int = MAX_QUERIES) -> tuple[dict[str, Any], str]:
    """Figures and HTML of a retrieve run: a section per query with its top ``hits`` per method (chunk id,
    paper, score, a snippet of the chunk), recall@k per method when the query file labels a chunk."""
    import pyarrow.compute as pc

    table = run_table(run_dir, "retrieval", ["query_id", "query", "method", "rank", "chunk_id", "paper_id", "score"],
                      cut=TEXT_CHARS)
    if table is None:
        return {}, ""
    config = json.loads(manifest.get("config") or "{}")
    texts, labels = query_file(config.get("queries"))
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
    given = query_positions(config.get("queries"))
    order_all = sorted(query_ids, key=lambda q: (given.get(q, math.inf), (texts.get(q) or "").casefold(), q))
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
    chunks_run = chunks_run_of(manifest)
    chunks: dict[str, dict[str, Any]] = {}
    if chunks_run and storage.isdir(storage.join(chunks_run, "chunks")):
        from verbatim_batch.extract.pairs import chunk_lookup

        chunks = chunk_lookup(storage.join(chunks_run, "chunks"), [r["chunk_id"] for r in wanted])
    titles = paper_titles(chunks_run, {r["paper_id"] for r in wanted})
    firsts = table.filter(pc.equal(table["rank"], 1)).group_by("method").aggregate([("score", "mean")]).to_pylist() \
        if table.num_rows else []
    figures = {"queries": len(query_ids), "methods": methods, "k": k, "hits_shown_per_method": hits,
               "recall_at_k": recall, "top1_score_mean": {r["method"]: r["score_mean"] for r in firsts}}
    body = [f"<h2>Hits by query ({len(query_ids):,} queries; top {min(hits, k)} of {k} per method)</h2>"]
    if recall:
        body.append(kv_table(f"Recall@{k} on the labelled queries", recall))
    if len(query_ids) > max_queries:
        body.append(f'<p class="meta">The first {max_queries} of {len(query_ids):,} queries are shown.</p>')
    size = 0
    for n_shown, q in enumerate(order):
        if _stop(body, size, n_shown, len(query_ids)):
            break
        first = len(body)
        query = texts.get(q)
        body.append(f'<section class="query" data-query-id="{esc(q)}"><h3>{esc(query) if query else esc(q)}</h3>')
        for method in methods:
            rows = by_query[q].get(method, [])
            body.append(f'<table class="hits" data-method="{esc(method)}"><caption>{esc(method)}</caption>'
                        "<tr><th>rank</th><th>score</th><th>paper</th><th>chunk</th><th>snippet</th></tr>")
            for r in rows:
                c = chunks.get(r["chunk_id"])
                snippet = " ".join(c["text"][: SNIPPET_CHARS * 2].split())[:SNIPPET_CHARS] if c else ""
                mark = ' class="labelled" title="the labelled chunk"' if labels.get(q) == r["chunk_id"] else ""
                title = f"<br><small>{esc(titles[r['paper_id']])}</small>" if r["paper_id"] in titles else ""
                body.append(f'<tr{mark}><td>{r["rank"]}</td><td>{r["score"]:.4g}</td><td>{esc(r["paper_id"])}{title}'
                            f'</td><td class="cid">{esc(r["chunk_id"])}</td><td class="snippet">{esc(snippet)}'
                            f"{'…' if c and len(c['text']) > len(snippet) else ''}</td></tr>")
            body.append("</table>")
        body.append("</section>")
        size += sum(len(b) for b in body[first:])
    return figures, "".join(body)
