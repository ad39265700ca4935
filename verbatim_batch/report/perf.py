"""The performance section of a run's report, per stage (the manifests' ``performance``): wall and CPU time, rows/s,
tokens/s, actors' idle share, peak memory and GPU use. It comes after the findings: the report leads with spans."""

from __future__ import annotations

from typing import Any

from verbatim_batch.report.html import esc

COLUMNS = ("wall s", "CPU-s", "of which driver / Ray workers / Ray system", "rows/s", "tokens/s",
           "actor idle share", "peak memory (GB)", "GPU")


def performance_rows(manifest: dict[str, Any], sub: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """``{stage: performance}``: a composite's stages (``sub``: their manifests) then the whole; else the run."""
    rows = {stage: m["performance"] for stage, m in sub.items() if m and isinstance(m.get("performance"), dict)}
    if isinstance(manifest.get("performance"), dict):
        rows["whole run" if sub else str(manifest.get("command"))] = manifest["performance"]
    return rows


def _gpu(perf: dict[str, Any]) -> str:
    gpu = perf.get("gpu") or {}
    if "skipped" in gpu:
        return "none"  # why: once, under the table (``gpu_notes``)
    return f"{gpu.get('gpu_seconds', 0):,.1f} GPU-s, {gpu.get('utilisation_mean', 0):.0f}% mean on {gpu.get('devices')}"


def performance_html(rows: dict[str, dict[str, Any]]) -> str:
    """A table with a row per stage; empty when no run recorded its performance."""
    if not rows:
        return ""
    head = "".join(f"<th>{esc(c)}</th>" for c in ("stage", *COLUMNS))
    body = []
    for stage, p in rows.items():
        by = p.get("cpu_s_by_process") or {}
        split = " / ".join(f"{by.get(k, 0.0):,.1f}" for k in ("driver", "ray workers", "ray system"))
        idle = p.get("actor_idle_share")
        cells = (f"{p.get('wall_s', 0):,.1f}", f"{p.get('cpu_s', 0):,.1f}", split, f"{p.get('rows_per_s', 0):,.2f}",
                 f"{p.get('tokens_per_s', 0):,.0f}", "" if idle is None else f"{idle:.1%}",
                 f"{(p.get('peak_rss_bytes') or 0) / 1e9:,.2f}", _gpu(p))
        body.append(f"<tr><th>{esc(stage)}</th>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    scope = next((p.get("scope") for p in rows.values() if p.get("scope")), "")
    skipped = list(dict.fromkeys(str((p.get("gpu") or {}).get("skipped")) for p in rows.values()
                                 if "skipped" in (p.get("gpu") or {})))
    note = (f'<p class="meta">CPU-seconds and memory: {esc(scope)}, sampled every 2 s. rows/s: rows done by '
            "this run over the time its work took. Actor idle share: time model actors waited for input between "
            "batches, over time busy and waiting (after loading)."
            + (f" GPU: none sampled: {esc('; '.join(skipped))}." if skipped else "") + "</p>")
    return f"<h2>Performance</h2><table><tr>{head}</tr>{''.join(body)}</table>{note}"
