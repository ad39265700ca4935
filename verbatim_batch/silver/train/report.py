"""``training.json`` and ``training.html``: per-epoch metrics and the loss and F1 curves (inline SVG) of a run."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from verbatim_batch.core import storage

TRAINING_JSON = "training.json"
TRAINING_HTML = "training.html"
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def svg_plot(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], x_label: str,
             width: int = 520, height: int = 300) -> str:
    """A line plot of named (x, y) series as an SVG element."""
    pts = [p for _, s in series for p in s if p[1] == p[1]]  # NaN-free
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    left, right, top, bottom = 50, 15, 30, 40
    w, h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
             f'<text x="{width / 2}" y="18" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#444"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#444"/>',
             f'<text x="{left + w / 2}" y="{height - 8}" text-anchor="middle">{html.escape(x_label)}</text>']
    for i in range(5):
        yv, xv = y0 + (y1 - y0) * i / 4, x0 + (x1 - x0) * i / 4
        parts += [f'<text x="{left - 5}" y="{sy(yv) + 4:.1f}" text-anchor="end" font-size="11">{yv:.3g}</text>',
                  f'<text x="{sx(xv):.1f}" y="{top + h + 15}" text-anchor="middle" font-size="11">{xv:.3g}</text>']
    for k, (name, s) in enumerate(series):
        color = _COLORS[k % len(_COLORS)]
        clean = [p for p in s if p[1] == p[1]]
        if clean:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in clean)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in clean]
        parts.append(f'<text x="{left + 10}" y="{top + 14 + 14 * k}" fill="{color}" font-size="12">'
                     f'{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render(training: dict[str, Any]) -> str:
    epochs = training.get("epochs", [])
    losses = training.get("train_loss", [])
    loss_plot = svg_plot("Loss", [("train loss", [(e["epoch"], e["loss"]) for e in losses]),
                                  ("eval loss", [(e["epoch"], e.get("eval_loss", float("nan"))) for e in epochs])],
                         "epoch")
    f1_plot = svg_plot("Eval span metrics", [
        ("Word-F1 (micro)", [(e["epoch"], e.get("eval_word_f1", float("nan"))) for e in epochs]),
        ("IoU-F1 @0.5", [(e["epoch"], e.get("eval_iou_f1", float("nan"))) for e in epochs]),
        ("abstention acc.", [(e["epoch"], e.get("eval_abstention_acc", float("nan"))) for e in epochs])], "epoch")
    cols = ["epoch", "step", "eval_loss", "eval_word_f1", "eval_word_p", "eval_word_r", "eval_iou_f1",
            "eval_abstention_acc"]
    head = "".join(f"<th>{c}</th>" for c in cols)
    best_step = training.get("best", {}).get("step")
    rows = "".join(
        "<tr" + (' style="font-weight:bold"' if e.get("step") == best_step else "") + ">"
        + "".join(f"<td>{e.get(c, ''):.4g}</td>" if isinstance(e.get(c), float) else f"<td>{e.get(c, '')}</td>"
                  for c in cols) + "</tr>" for e in epochs)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>training</title></head><body>"
            f"<h1>Training</h1><p>best epoch (bold) by {html.escape(str(training.get('selected_by')))}; "
            f"{training.get('global_step')} steps, resumed from step {training.get('resumed_from_step')}</p>"
            f"{loss_plot}{f1_plot}<table border='1' cellpadding='3'><tr>{head}</tr>{rows}</table></body></html>")


def write_training_report(run_dir: str, training: dict[str, Any]) -> None:
    storage.write_text(storage.join(run_dir, TRAINING_JSON), json.dumps(training, indent=2, sort_keys=True))
    storage.write_text(storage.join(run_dir, TRAINING_HTML), render(training))
