"""Run reports: ``report.json`` (figures) and ``report.html`` (a page a person reads at a glance).

Every committed run gets both files. The JSON holds counts per table, time per stage,
throughput, quarantined papers and errors by reason, spans per pair, the abstention
rate and rejects. For extraction runs the HTML also shows a sample of queries with their
chunks, each span highlighted in place with its score on hover.
"""

from __future__ import annotations

import html
import json
import statistics
from collections import Counter
from typing import Any

from . import storage
from .runs import MANIFEST_FILE, read_manifest

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


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


def build_report(run_dir: str, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of one run folder (committed, or a staging folder with its manifest given)."""
    if manifest is None:
        manifest = read_manifest(run_dir)
    counts = manifest.get("counts", {})
    timings = manifest.get("timings_s", {})
    total = float(timings.get("total") or 0.0)
    out: dict[str, Any] = {
        "run_id": manifest.get("run_id"), "command": manifest.get("command"),
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
    if manifest.get("command") == "extract":
        out["time_breakdown"] = extract_time(counts, timings)
        if out["time_breakdown"].get("pairs_per_s_excluding_ray_start"):
            rate["pairs_per_s_excluding_ray_start"] = out["time_breakdown"]["pairs_per_s_excluding_ray_start"]
    where = {"quarantine": run_dir, "pairs": run_dir, "rejects": run_dir}
    if manifest.get("command") == "nightly":  # a run of stage runs: figures per stage, tables in theirs
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


def _chunk_texts(run_dir: str, config: dict[str, Any], pair_rows: list[dict[str, Any]]) -> dict[str, str]:
    """pair_id -> chunk text, from the chunk run or the pairs file the extraction read."""
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


def samples(run_dir: str, manifest: dict[str, Any], n: int = 12) -> list[dict[str, Any]]:
    """Up to ``n`` pairs of an extraction run with their chunk text and spans (most with spans, a few without)."""
    pairs = _table(run_dir, "pairs", ["pair_id", "query", "paper_id", "chunk_id", "n_spans", "relevance", "error"])
    spans = _table(run_dir, "spans", ["pair_id", "start", "end", "score", "align"])
    if pairs is None or spans is None:
        return []
    rows = pairs.to_pylist()
    without = [r for r in rows if not r["n_spans"] and not r["error"]]
    with_spans = [r for r in rows if r["n_spans"]]
    k = max(min(n // 4, len(without)), n - len(with_spans))  # about a quarter abstentions, if there are any
    picked = with_spans[: n - k] + without[:k]
    config = json.loads(manifest.get("config") or "{}")
    texts = _chunk_texts(run_dir, config, picked)
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for s in spans.to_pylist():
        by_pair.setdefault(s["pair_id"], []).append(s)
    out = []
    for r in picked:
        if r["pair_id"] in texts:
            out.append(r | {"chunk": texts[r["pair_id"]],
                            "spans": sorted(by_pair.get(r["pair_id"], []), key=lambda s: s["start"])})
    return out


def highlight(chunk: str, spans: list[dict[str, Any]]) -> str:
    """The chunk as escaped HTML with each span wrapped in ``<mark>`` (score and method on hover)."""
    parts, pos = [], 0
    for s in sorted(spans, key=lambda s: (s["start"], -s["end"])):
        start, end = max(s["start"], pos), s["end"]
        if end <= start:
            continue  # overlaps a span already shown
        parts.append(html.escape(chunk[pos:start]))
        score = f"score {s['score']:.2f}" if s.get("score") is not None else "score n/a"
        how = f" · {s['align']}" if s.get("align") else ""  # LLM spans: how the string was placed
        parts.append(f'<mark class="span" data-start="{start}" data-end="{end}" title="{score}{how}">'
                     f"{html.escape(chunk[start:end])}</mark>")
        pos = end
    parts.append(html.escape(chunk[pos:]))
    return "".join(parts)


_CSS = """body{font:15px/1.5 system-ui,sans-serif;margin:2rem auto;max-width:980px;color:#222}
h1{font-size:1.4rem}table{border-collapse:collapse;margin:.5rem 0 1.5rem}
td,th{border:1px solid #ddd;padding:.25rem .6rem;text-align:left}th{background:#f5f5f5}
.pair{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem;margin:1rem 0}
.q{font-weight:600}.meta{color:#666;font-size:.85rem}
.chunk{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85rem;background:#fafafa;padding:.5rem}
mark.span{background:#ffe066;border-radius:2px}mark.span:hover{background:#ffc400}"""


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


def extract_time(counts: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
    """Where an extract run's time went: reading pairs, Ray start-up, model, the verbatim gate and table
    building, writing (summed over actors: with several actors these add up to more than the wall time),
    and pairs/s over the extract-and-write wall time, Ray start-up excluded."""
    out: dict[str, Any] = {}
    for key, label in (("pairs", "read_pairs_s"), ("ray_start", "ray_start_s"),
                       ("work_and_write", "extract_and_write_wall_s"), ("total", "total_s")):
        if key in timings:
            out[label] = float(timings[key])
    for part in ("model", "gate", "write"):
        if f"time_ms.{part}" in counts:
            out[f"{part}_s_summed_over_actors"] = counts[f"time_ms.{part}"] / 1000
    wall = float(timings.get("work_and_write") or 0)
    if wall > 0 and counts.get("rows_new"):
        out["pairs_per_s_excluding_ray_start"] = counts["rows_new"] / wall
    return out


def render_html(report: dict[str, Any], sample_rows: list[dict[str, Any]]) -> str:
    """A self-contained static page: run summary, then the sampled pairs with highlighted spans."""
    summary = {k: report.get(k) for k in ("run_id", "command", "created_at", "status")}
    for key in ("abstention_rate", "verbatim_violations", "rejects", "spans_per_pair"):
        if key in report:
            summary[key] = report[key]
    body = [f"<h1>verbatim-batch {html.escape(str(report.get('command')))} run</h1>",
            _kv_table("Summary", summary), _kv_table("Tables (rows)", report.get("tables", {})),
            _kv_table("Time per stage (s)", report.get("timings_s", {})),
            *([_kv_table("Where the extract time went", report["time_breakdown"])]
              if report.get("time_breakdown") else []),
            *(_kv_table(f"Stage: {stage}", figures) for stage, figures in report.get("stage_counts", {}).items()),
            _kv_table("Throughput", report.get("throughput", {})),
            _kv_table("Quarantined by reason", report.get("quarantine_by_reason", {})),
            _kv_table("Errors by reason", report.get("errors_by_reason", {})),
            _kv_table("Rejects by reason", report.get("rejects_by_reason", {})),
            _kv_table("Counts", report.get("counts", {}))]
    if sample_rows:
        body.append(f"<h2>Sample of {len(sample_rows)} pairs</h2>")
        for r in sample_rows:
            rel = f"{r['relevance']:.2f}" if r.get("relevance") is not None else "n/a"
            body.append(
                f'<div class="pair" data-pair="{html.escape(r["pair_id"])}"><div class="q">'
                f"{html.escape(r['query'] or '')}</div><div class=\"meta\">{html.escape(str(r['paper_id']))} · "
                f"chunk {html.escape(str(r['chunk_id']))} · {r['n_spans']} spans · relevance {rel}</div>"
                f'<div class="chunk">{highlight(r["chunk"], r["spans"])}</div></div>')
    title = html.escape(f"{report.get('command')} {report.get('run_id')}")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def write_report(run_dir: str, manifest: dict[str, Any] | None = None, n_samples: int = 12) -> dict[str, Any]:
    """Write ``report.json`` and ``report.html`` into the run folder; returns the report."""
    if manifest is None:
        manifest = read_manifest(run_dir)
    report = build_report(run_dir, manifest)
    rows = samples(run_dir, manifest, n_samples) if manifest.get("command") == "extract" else []
    spans_run = storage.join(run_dir, "spans")
    if manifest.get("command") == "nightly" and storage.exists(storage.join(spans_run, MANIFEST_FILE)):
        rows = samples(spans_run, json.loads(storage.read_text(storage.join(spans_run, MANIFEST_FILE))), n_samples)
    storage.write_text(storage.join(run_dir, REPORT_JSON), json.dumps(report, indent=2, sort_keys=True, default=str))
    storage.write_text(storage.join(run_dir, REPORT_HTML), render_html(report, rows))
    return report
