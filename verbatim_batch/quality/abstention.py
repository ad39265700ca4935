"""Abstention you can set: how precision and recall move with a threshold on the pair's ``relevance``.

Every pair an extractor scores gets a ``relevance`` in [0, 1] (the highlighter's best token probability, the
semantic extractor's best sentence score); the claim-aware seed paper abstains below a threshold on such a score.
This replays that gate on a finished extract run against a gold file: at each threshold, pairs (an *answered* pair
has spans and relevance >= it: precision over answered pairs, recall over relevant ones) and words (``evaluate``'s
word-level figures without abstained pairs' spans). A threshold chosen so is set as the extractor's own, with
nothing re-run; the extract report shows the curve when its pairs file carries gold spans.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.runs import read_table
from verbatim_batch.quality.evaluate import _index_gold, _new_diagnostics, _resolve, _score, load_gold, load_predictions

DEFAULT_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(20))


def _relevance(value: Any) -> float:
    return -math.inf if value is None else float(value)


def gold_of_run(manifest: dict[str, Any]) -> str | None:
    """The run's input pairs file when it is a gold file (rows with ``gold_spans``), else None."""
    config = manifest.get("config")
    config = json.loads(config) if isinstance(config, str) else (config or {})
    path = config.get("pairs")
    if not path or not storage.exists(path) or storage.isdir(path):
        return None
    try:
        rows = load_gold(path)
    except (ValueError, KeyError, TypeError, OSError):
        return None
    return path if rows and any(r.get("gold_spans") for r in rows) else None


def abstention_curve(run_dir: str, gold_path: str,
                     thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> list[dict[str, Any]]:
    """Per threshold, pairs below it abstaining: answered and abstained pairs, pair P/R and word P/R/F1 of the extract
    run ``run_dir`` against ``gold_path``."""
    gold = load_gold(gold_path)
    by_ids, by_text, by_cid = _index_gold(gold)
    pairs = read_table(run_dir, "pairs", ["query", "paper_id", "chunk_index", "chunk_id", "n_spans", "relevance",
                                          "error"]).to_pylist()
    scored = []  # (gold index, relevance, has spans) of every processed pair found in the gold file
    best: dict[tuple, float] = {}  # a span record's pair key -> its pair's relevance
    for p in pairs:
        key = (p["query"], p["paper_id"], p["chunk_index"], p["chunk_id"])
        best[key] = _relevance(p["relevance"])
        if p["error"]:
            continue
        i = _resolve({**p, "chunk": None}, by_ids, by_text, by_cid)
        if i is not None:
            scored.append((i, _relevance(p["relevance"]), bool(p["n_spans"])))
    records = load_predictions(run_dir).records
    relevant = sum(1 for g in gold if g.get("relevant") is True)
    out = []
    for t in thresholds:
        answered = [(i, r) for i, r, has in scored if has and r >= t]
        hits = sum(1 for i, _ in answered if gold[i].get("relevant") is True)
        kept = [r for r in records
                if best.get((r["query"], r["paper_id"], r["chunk_index"], r["chunk_id"]), -math.inf) >= t]
        words = _score(gold, kept, _new_diagnostics(), iou_thresholds=(), containment_thresholds=(),
                       coverage_thresholds=())["word"]
        out.append({"threshold": float(t), "answered": len(answered), "abstained": len(scored) - len(answered),
                    "pair_p": hits / len(answered) if answered else None,
                    "pair_r": hits / relevant if relevant else None,
                    "word_p": words["micro_p"], "word_r": words["micro_r"], "word_f1": words["micro_f1"]})
    return out


def reliability(run_dir: str, gold_path: str, edges: Sequence[float] = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)
                ) -> list[dict[str, Any]]:
    """How far ``relevance`` is from a probability: per relevance bin, the processed pairs in it and the share of
    them the gold file marks relevant (a calibrated score would have that share inside its bin)."""
    gold = load_gold(gold_path)
    by_ids, by_text, by_cid = _index_gold(gold)
    rows = []
    for p in read_table(run_dir, "pairs", ["query", "paper_id", "chunk_index", "chunk_id", "relevance",
                                           "error"]).to_pylist():
        i = None if p["error"] or p["relevance"] is None else _resolve({**p, "chunk": None}, by_ids, by_text, by_cid)
        if i is not None:
            rows.append((float(p["relevance"]), gold[i].get("relevant") is True))
    out = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        inside = [rel for r, rel in rows if lo <= r < hi or (hi == edges[-1] and r == hi)]
        out.append({"bin": f"[{lo:g}, {hi:g}{']' if hi == edges[-1] else ')'}", "pairs": len(inside),
                    "relevant_share": sum(inside) / len(inside) if inside else None})
    return out


def abstention_section(run_dir: str, manifest: dict[str, Any], gold_path: str | None = None
                       ) -> tuple[dict[str, Any], str] | None:
    """``(figures, html)`` of the abstention curve for an extract run, or None without a gold file."""
    import html

    gold_path = gold_path or gold_of_run(manifest)
    if gold_path is None:
        return None
    try:
        rows = abstention_curve(run_dir, gold_path)
        bins = reliability(run_dir, gold_path)
    except (ValueError, KeyError, OSError) as exc:  # a report never fails on its gold file: it says why
        return {"gold": gold_path, "error": str(exc)}, (
            f"<h2>Abstention threshold</h2><p>not computed on {html.escape(str(gold_path))}: "
            f"{html.escape(str(exc))}</p>")

    def cell(v: Any) -> str:
        return "n/a" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)

    head = ("threshold", "answered", "abstained", "pair P", "pair R", "word P", "word R", "word F1")
    keys = ("threshold", "answered", "abstained", "pair_p", "pair_r", "word_p", "word_r", "word_f1")
    body = "".join("<tr>" + "".join(f"<td>{cell(r[k])}</td>" for k in keys) + "</tr>" for r in rows)
    section = (f"<h2>Abstention threshold on {html.escape(str(gold_path))}</h2>"
               "<p>Pairs whose relevance is below the threshold give no spans. Pair P/R: answered pairs that are "
               "relevant / relevant pairs answered; word P/R/F1: the span metrics of <code>evaluate</code>.</p>"
               f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>"
               "<p>Relevance is the extractor's pair score, not a probability: the share of pairs the gold file "
               "marks relevant, per relevance bin.</p><table><tr><th>relevance</th><th>pairs</th>"
               "<th>relevant share</th></tr>"
               + "".join(f"<tr><td>{b['bin']}</td><td>{b['pairs']}</td><td>{cell(b['relevant_share'])}</td></tr>"
                         for b in bins) + "</table>")
    return {"gold": gold_path, "curve": rows, "reliability": bins}, section
