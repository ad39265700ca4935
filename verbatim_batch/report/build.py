"""Run reports: ``report.json`` (figures) and ``report.html`` (a page a researcher reads).

Every committed run gets both: counts per table, time per stage, throughput, quarantine and errors by reason,
spans per pair, abstention and rejects; the page adds, by kind of run, an extract run's spans in context per query
and a retrieve run's hits per query and method (``sections``), and where the time went. Plots are inline SVG (no
script, nothing loaded). ``write_evaluation_report`` renders ``evaluate --report DIR``.
"""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Sequence
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.runs import holding, read_manifest
from verbatim_batch.quality.abstention import abstention_section
from verbatim_batch.quality.evaluate import SWEEP_COLUMNS, sweep_rows
from verbatim_batch.report.data import TEXT_CHARS, count_reasons, run_table
from verbatim_batch.report.html import (
    CONTEXT_CHARS,
    FIELD_CHARS,
    PAGE_BYTES,
    SCORE_EDGES,
    cut,
    esc,
    highlight,
    histogram,
    html_page,
    kv_table,
    svg_bars,
    svg_histogram,
    svg_lines,
    windows,
)
from verbatim_batch.report.perf import performance_html, performance_rows
from verbatim_batch.report.sections import extract_section, retrieval_section
from verbatim_batch.report.summary import night_changes

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
COMPOSITES = ("nightly", "run")  # runs made of stage runs in sub-folders
_UNITS = {"chunk": "papers", "embed": "chunks", "retrieve": "queries", "extract": "pairs", "querygen": "chunks",
          "index": "chunks"}


def _sub_manifest(run_dir: str, stage: str) -> dict[str, Any] | None:
    """The manifest of a composite's stage run, None when it has none that is a run manifest."""
    try:
        return read_manifest(storage.join(run_dir, stage))
    except (FileNotFoundError, ValueError):
        return None


def time_breakdown(manifest: dict[str, Any]) -> dict[str, Any]:
    """Where a run's time went: each step's wall time (``<step>_s``), each ``time_ms.*`` its actors report
    (``<part>_s_summed_over_actors``: more than the wall time with several actors), and rows/s over the
    work-and-write wall time, Ray start-up excluded."""
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
    rate = {f"{key}_per_s": counts[key] / total for key in ("papers", "chunks", "pairs", "spans", "tokens", "queries")
            if total > 0 and counts.get(key)}
    if total > 0 and counts.get("papers_bytes"):
        rate["mb_per_s"] = counts["papers_bytes"] / 1e6 / total
    out["throughput"] = rate
    if changes := night_changes(manifest):  # the header says what a night changed
        out["changed"] = changes
    subs = {s: _sub_manifest(run_dir, s) for s in manifest.get("stages") or {}} if command in COMPOSITES else {}
    out["performance"] = performance_rows(manifest, subs)
    out["time_breakdown"] = time_breakdown(manifest)
    rate |= {k: v for k, v in out["time_breakdown"].items() if k.endswith("_per_s_excluding_ray_start")}
    where = {"quarantine": run_dir, "pairs": run_dir, "rejects": run_dir}
    if command in COMPOSITES:  # a run of stage runs: figures per stage, tables in theirs
        where = {t: holding(run_dir, (t,), manifest) or run_dir for t in where}
        stages: dict[str, dict[str, Any]] = {}
        for key, value in counts.items():
            stage, _, name = key.partition(".")
            stages.setdefault(stage, {})[name] = value
        for stage, figures in stages.items():
            out.setdefault("stage_counts", {})[stage] = {**figures, "seconds": float(timings.get(stage) or 0.0)}
        out["stage_time_breakdown"] = {stage: time_breakdown(sub) for stage in manifest.get("stages") or {}  # in order
                                       if isinstance(stage, str) and (sub := _sub_manifest(run_dir, stage)) is not None}
        if command == "nightly":
            out["index_update"] = manifest.get("index_update")
        out["throughput"] = {f"{stage}_{k}_per_s": v / float(timings[stage]) for stage, k in (
            ("chunks", "papers_chunked"), ("embeddings", "rows_new"), ("spans", "rows_new"))
            if float(timings.get(stage) or 0) > 0 and (v := counts.get(f"{stage}.{k}"))}
    quarantine = run_table(where["quarantine"], "quarantine", ["reason"], cut=TEXT_CHARS)
    if quarantine is not None:
        out["quarantine_by_reason"] = count_reasons(quarantine["reason"].to_pylist())
    pairs = run_table(where["pairs"], "pairs", ["n_spans", "error", "n_violations"], cut=TEXT_CHARS)
    if pairs is not None:
        n_spans = pairs["n_spans"].to_pylist()
        errors = pairs["error"].to_pylist()
        ok = [n for n, e in zip(n_spans, errors, strict=True) if not e]
        out["errors_by_reason"] = count_reasons(errors)
        out["spans_per_pair"] = {
            "mean": statistics.fmean(ok) if ok else 0.0, "median": statistics.median(ok) if ok else 0,
            "max": max(ok, default=0)}
        out["abstention_rate"] = sum(1 for n in ok if n == 0) / len(ok) if ok else None
        out["verbatim_violations"] = sum(v or 0 for v in pairs["n_violations"].to_pylist())
    rejects = run_table(where["rejects"], "rejects", ["reason"], cut=TEXT_CHARS)
    if rejects is not None:
        out["rejects"] = rejects.num_rows
        out["rejects_by_reason"] = count_reasons(rejects["reason"].to_pylist())
    return out


def _time_html(command: str, breakdown: dict[str, Any], title: str | None = None) -> str:
    if not breakdown:
        return ""
    title = title or f"Where the {command} time went"
    wall = [(k[:-2], v) for k, v in breakdown.items() if k.endswith("_s") and k != "total_s"]
    summed = [(k.removesuffix("_s_summed_over_actors"), v) for k, v in breakdown.items()
              if k.endswith("_s_summed_over_actors")]
    plot = svg_bars(f"{title}: wall time per step", wall) + (
        svg_bars("Summed over actors", summed) if summed else "")
    return kv_table(title, breakdown) + f'<div class="plots">{plot}</div>'


def render_html(report: dict[str, Any], sections: Sequence[str] = ()) -> str:
    """A self-contained static page: the run's own sections (spans by query, retrieval hits), then its summary,
    where the time went and its counts."""
    command = str(report.get("command"))
    summary = {k: report.get(k) for k in ("run_id", "command", "created_at", "status")}
    summary |= {k: report[k] for k in ("abstention_rate", "verbatim_violations", "rejects", "spans_per_pair")
                if k in report}
    # what the run found comes first; how it ran (time, counts) after
    body = [f"<h1>verbatim-batch {esc(command)} · {esc(report.get('run_id'))}</h1>",
            *([f'<p class="meta">This night: {esc(report["changed"])}</p>'] if report.get("changed") else []),
            *sections,
            kv_table("Summary", summary), kv_table("Tables (rows)", report.get("tables", {})),
            performance_html(report.get("performance") or {}),
            _time_html(command, report.get("time_breakdown", {})),
            *(_time_html(stage, b, f"Where the {stage} stage's time went")
              for stage, b in report.get("stage_time_breakdown", {}).items()),
            *(kv_table(f"Stage: {stage}", figures) for stage, figures in report.get("stage_counts", {}).items()),
            kv_table("Throughput", report.get("throughput", {})),
            kv_table("Quarantined by reason", report.get("quarantine_by_reason", {})),
            kv_table("Errors by reason", report.get("errors_by_reason", {})),
            kv_table("Rejects by reason", report.get("rejects_by_reason", {})),
            kv_table("Counts", report.get("counts", {}))]
    return html_page(cut(f"{command} {report.get('run_id')}"), body)


def bounded(value: Any, limit: int = 8 * FIELD_CHARS) -> Any:
    """``value`` (JSON-like) with every string, keys included, cut at ``limit`` characters."""
    if isinstance(value, str):
        return cut(value, limit)
    if isinstance(value, dict):
        return {bounded(k, limit): bounded(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bounded(v, limit) for v in value]
    return value


def report_json(report: dict[str, Any], max_bytes: int = PAGE_BYTES) -> str:
    """``report.json``: every string cut (``bounded``); past ``max_bytes`` the largest entries are replaced by
    what they weighed, until it fits."""
    report = bounded(report)
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    while len(text) > max_bytes:
        sizes = {k: len(json.dumps(v, default=str)) for k, v in report.items()}
        key = max(sizes, key=sizes.get)
        if isinstance(report[key], dict) and report[key].get("left_out_bytes"):
            break
        report[key] = {"left_out_bytes": sizes[key]}
        text = json.dumps(report, indent=2, sort_keys=True, default=str)
    return text


def write_report(run_dir: str, manifest: dict[str, Any] | None = None, n_samples: int = 12) -> dict[str, Any]:
    """Write ``report.json`` and ``report.html`` into the run folder; returns the report. ``n_samples``: pairs
    with spans shown per query (extract runs)."""
    if manifest is None:
        manifest = read_manifest(run_dir)
    report = build_report(run_dir, manifest)
    command = manifest.get("command")
    sections = []
    targets = [(run_dir, manifest)]
    if command in COMPOSITES:
        targets = [(storage.join(run_dir, s), m) for s in ("spans", "retrieval") if (m := _sub_manifest(run_dir, s))]
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
    storage.write_text(storage.join(run_dir, REPORT_JSON), report_json(report))
    storage.write_text(storage.join(run_dir, REPORT_HTML), render_html(report, sections))
    return report


def _marked(chunk: str, spans: Sequence[tuple[int, int]], cls: str, shown: list[tuple[int, int]]) -> str:
    marks = [{"start": a, "end": b, "score": None} for a, b in spans]
    parts = []
    for lo, hi in shown:
        inner = highlight(chunk, marks, lo, hi).replace('title="score n/a"', f'title="{cls}"')
        parts.append(f'<div class="ctx">{"… " if lo > 0 else ""}{inner}{" …" if hi < len(chunk) else ""}</div>')
    return "".join(parts) or '<div class="ctx"><i>no span</i></div>'


def write_evaluation_report(folder: str, result: dict[str, Any], rows: list[dict[str, Any]],
                            sweep: dict[str, dict[str, Any]] | None = None, title: str = "evaluation",
                            max_rows: int = 1000) -> str:
    """``folder/report.html`` and ``report.json`` of an evaluation: the metrics (a sweep's per threshold), then every
    gold row (worst word F1 first) with gold and predicted spans side by side (``rows``: ``row_details``)."""
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
    body.append(kv_table("Scores" + (" at the best threshold" if sweep else ""), figures))
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
        body.append(f'<section class="row" data-f1="{r["word_f1"]:.4f}"><h3>{esc(r["query"])}</h3>'
                    f'<div class="meta">word F1 <b class="f1">{r["word_f1"]:.3f}</b> (P {r["word_p"]:.3f}, '
                    f'R {r["word_r"]:.3f}) · {len(r["gold"])} gold, {len(r["pred"])} predicted'
                    f'{" · " + esc(where) if where else ""}{note}</div><div class="side">'
                    f'<div class="gold"><div class="meta">gold</div>{_marked(chunk, r["gold"], "gold", shown)}</div>'
                    f'<div class="pred"><div class="meta">predicted</div>'
                    f'{_marked(chunk, r["pred"], "predicted", shown)}</div></div></section>')
    page = html_page(title, body)
    storage.write_text(storage.join(folder, REPORT_HTML), page)
    data = bounded({"scores": result, "sweep": table or None,
                    "rows": [{k: v for k, v in r.items() if k != "chunk"} for r in rows]})
    storage.write_text(storage.join(folder, REPORT_JSON), json.dumps(data, indent=2, default=str))
    return storage.join(folder, REPORT_HTML)


def _cell(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
