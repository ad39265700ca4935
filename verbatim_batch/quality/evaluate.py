"""Loading gold pairs files and predictions, matching them, and scoring with :mod:`.metrics`.

Gold is a pairs file (JSONL or Parquet), one row per (query, chunk) pair; predictions are a span table (or a run
holding one) or JSONL rows of spans per pair. A gold row is matched on :func:`gold_key`; span tables carry no chunk
text, so a gold row without ids is found through ``(query, chunk_id)`` (its ``chunk_id``, else ``text_chunk_id``).
"""

from __future__ import annotations

import io
import json
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.tables import SPANS, text_chunk_id
from verbatim_batch.quality.metrics import EvalRow, align_gold, align_prediction, evaluate

GoldKey = tuple  # (query, paper_id, chunk_index) or (query, chunk)
Span = tuple[int, int]

_SPAN_COLUMNS = ("query", "paper_id", "chunk_index", "chunk_id", "start", "end", "text")


def _is_parquet(path: str) -> bool:
    if storage.isdir(path):
        return True
    fs, local = storage.resolve(path)
    with fs.open_input_stream(local) as fh:
        return fh.read(4) == b"PAR1"


def read_jsonl(path: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; ValueError on bad JSON or a non-object line."""
    out = []
    fs, local = storage.resolve(path)
    with fs.open_input_stream(local) as raw, io.TextIOWrapper(raw, encoding="utf-8") as fh:
        for lineno, line in _lines(fh, path):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {lineno}: invalid JSON ({exc.msg})") from None
            except RecursionError:
                raise ValueError(f"{path}, line {lineno}: JSON nested too deeply") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}, line {lineno}: expected a JSON object, got {type(obj).__name__}")
            out.append((lineno, obj))
    return out


def _lines(fh, path: str):
    """Numbered lines of a text file; ValueError (not a traceback) on bytes that are not UTF-8."""
    lineno = 0
    while True:
        try:
            line = fh.readline()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}, line {lineno + 1}: not UTF-8 ({exc.reason})") from None
        if not line:
            return
        lineno += 1
        yield lineno, line


def _has_ids(row: Mapping[str, Any]) -> bool:
    return row.get("paper_id") is not None and row.get("chunk_index") is not None


def _placed(chunk: str, span: Any, align: Callable[[str, str], Span | None], what: str) -> Span | None:
    """A span's offsets: a quoted string placed by ``align`` (None when it cannot be), a ``{start, end}`` mapping or
    a pair of ints; anything else is a ValueError naming ``what``."""
    if isinstance(span, str):
        return align(chunk, span)
    if isinstance(span, Mapping) and "start" in span and "end" in span:
        return span["start"], span["end"]
    if isinstance(span, (list, tuple)) and len(span) == 2 and all(isinstance(v, int) for v in span):
        return span[0], span[1]
    raise ValueError(f"{what} {span!r} is neither a string nor {{'start', 'end'}}")


def gold_key(row: Mapping[str, Any]) -> GoldKey:
    """Key a gold row is matched on: ``(query, paper_id, chunk_index)`` if it has both ids, else ``(query, chunk)``."""
    if _has_ids(row):
        return (row["query"], str(row["paper_id"]), int(row["chunk_index"]))
    return (row["query"], row["chunk"])


def gold_chunk_id(row: Mapping[str, Any]) -> str:
    """Chunk id used to find a gold row from a span table: its own ``chunk_id``, else a hash of its text."""
    cid = row.get("chunk_id")
    return str(cid) if cid is not None else text_chunk_id(row["chunk"])


def normalize_gold_row(row: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """A copy of a pairs-file row with ``gold_spans`` as (start, end) tuples; string spans are placed with
    ``align_gold``, and those that cannot be are counted in ``gold_unaligned`` (normalising twice is harmless)."""
    prefix = f"{where}: " if where else ""
    for name in ("query", "chunk"):
        if not isinstance(row.get(name), str):
            raise ValueError(f"{prefix}missing or non-string {name!r}")
    out = dict(row)
    chunk = row["chunk"]
    spans: list[Span] = []
    unaligned = int(row.get("gold_unaligned") or 0)
    gold = row.get("gold_spans")
    if gold is not None and not isinstance(gold, (list, tuple)):
        raise ValueError(f"{prefix}'gold_spans' must be a list of strings or {{'start', 'end'}} objects, got a "
                         f"{type(gold).__name__}")
    for span in gold or []:
        if (placed := _placed(chunk, span, align_gold, f"{prefix}gold span")) is None:
            unaligned += 1
        else:
            spans.append(placed)
    out["gold_spans"] = spans
    out["gold_unaligned"] = unaligned
    if out.get("chunk_index") is not None:
        if isinstance(out["chunk_index"], bool) or not isinstance(out["chunk_index"], (int, str)):
            raise ValueError(f"{prefix}'chunk_index' must be an integer, got {out['chunk_index']!r}")
        out["chunk_index"] = int(out["chunk_index"])
    for name in ("query_id", "paper_id", "chunk_id", "relevant"):
        out.setdefault(name, None)
    return out


def fill_chunks(records: list[tuple[str, dict[str, Any]]], chunks: str) -> None:
    """Rows that name their chunk instead of giving its text get it from the chunk run ``chunks`` (else raise)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    from verbatim_batch.core.runs import expect_tables

    wanted = [(where, r) for where, r in records if isinstance(r, dict) and not isinstance(r.get("chunk"), str)]
    if not wanted:
        return
    table_dir = storage.join(expect_tables(chunks, "--chunks", ("chunks",)), "chunks")  # a chain folder too
    ids = sorted({str(r["chunk_id"]) for _, r in wanted if r.get("chunk_id") is not None})
    papers = sorted({str(r["paper_id"]) for _, r in wanted if r.get("chunk_id") is None and r.get("paper_id")})
    found = pads.field("chunk_id").isin(pa.array(ids, pa.string())) | pads.field("paper_id").isin(
        pa.array(papers, pa.string()))
    rows = storage.dataset(table_dir).to_table(columns=["chunk_id", "paper_id", "chunk_index", "text"],
                                               filter=found).to_pylist()
    by_id = {r["chunk_id"]: r for r in rows}
    by_index = {(r["paper_id"], r["chunk_index"]): r for r in rows}
    for where, r in wanted:
        if r.get("chunk_id") is not None:
            hit = by_id.get(str(r["chunk_id"]))
            name = f"chunk_id {r['chunk_id']}"
        else:
            try:
                index = int(r.get("chunk_index"))
            except (TypeError, ValueError):
                raise ValueError(f"{where}: no 'chunk' text, and no chunk_id or paper_id + chunk_index to look it "
                                 f"up in {chunks}") from None
            hit = by_index.get((str(r.get("paper_id")), index))
            name = f"paper_id {r.get('paper_id')!r} chunk_index {index}"
        if hit is None:
            raise ValueError(f"{where}: {name} is not in the chunk run {chunks}")
        r["chunk"] = hit["text"]
        r.setdefault("chunk_id", hit["chunk_id"])
        r.setdefault("paper_id", hit["paper_id"])
        r.setdefault("chunk_index", hit["chunk_index"])


def load_gold(path: str | Path, chunks: str | None = None) -> list[dict[str, Any]]:
    """A pairs file (JSONL, Parquet or a folder of Parquet) as normalised gold rows (``normalize_gold_row``); with
    ``chunks``, a chunk run, rows may name their chunk instead of giving its text (``fill_chunks``)."""
    path = _location(path)
    if not storage.exists(path):
        raise FileNotFoundError(f"gold file {path} not found")
    if _is_parquet(path):
        records = [(f"{path} row {i}", r) for i, r in enumerate(storage.read_parquet(path).to_pylist())]
    else:
        records = [(f"{path}, line {n}", r) for n, r in read_jsonl(path)]
    if chunks:
        fill_chunks(records, chunks)
    else:
        for where, r in records:
            if r.get("chunk") is None and (r.get("chunk_id") is not None or _has_ids(r)):
                named = "chunk_id" if r.get("chunk_id") is not None else "paper_id, chunk_index"
                raise ValueError(f"{where}: names its chunk ({named}) but has no 'chunk' text: pass --chunks RUN "
                                 "(the chunk run it names them in) to look them up")
    rows = [normalize_gold_row(r, where) for where, r in records]
    if not rows:
        raise ValueError(f"{path} holds no gold pairs: nothing to evaluate against")
    return rows


@dataclass
class Predictions:
    """Predicted spans grouped by pair: ``kind`` ``"spans"`` or ``"jsonl"``; each record has ``query``, ``paper_id``,
    ``chunk_index``, ``chunk_id``, ``chunk`` (each may be None), ``spans`` and ``where`` (for messages)."""

    kind: str
    records: list[dict[str, Any]] = field(default_factory=list)


def _location(path: str | Path) -> str:
    """A local path or a URI (``Path`` would fold ``s3://`` into ``s3:/``)."""
    return storage.normalize(str(path))


def _span_table_path(path: str) -> str:
    """The span table of what ``--predictions`` names: itself, an extract run, a chain's folder or a nightly root."""
    from verbatim_batch.core.runs import holding, run_of

    run = run_of(path)
    try:
        ours = storage.exists(storage.join(run, "manifest.json"))
        found = holding(run, ("spans",)) if ours else None
    except ValueError:  # a manifest of someone else's: the folder is read as laid out
        ours, found = False, None
    if ours:
        if found is None:
            raise ValueError(f"--predictions: {path} holds no spans table; give an extract run, a chain's folder "
                             "or a nightly root")
        return storage.join(found, "spans")
    if storage.isdir(run) and storage.isdir(storage.join(run, "spans")):
        inner = storage.join(run, "spans")
        if storage.exists(storage.join(inner, "manifest.json")):  # a folder of stage runs (the demo's output)
            return _span_table_path(inner)
        return inner
    return run


def _load_span_table(path: str) -> Predictions:
    table = storage.read_parquet(_span_table_path(path))
    if table.num_columns == 0:  # an empty folder: a run that produced no spans
        return Predictions("spans", [])
    missing = [c for c in ("query", "start", "end", "text") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a span table (missing columns {missing}; expected the {SPANS.names} schema)")
    columns = [c for c in _SPAN_COLUMNS if c in table.column_names]
    groups: dict[tuple, dict[str, Any]] = {}
    for row in table.select(columns).to_pylist():
        ident = (row["query"], row.get("paper_id"), row.get("chunk_index"), row.get("chunk_id"))
        rec = groups.get(ident)
        if rec is None:
            rec = groups[ident] = {
                "query": row["query"],
                "paper_id": row.get("paper_id"),
                "chunk_index": row.get("chunk_index"),
                "chunk_id": row.get("chunk_id"),
                "chunk": None,
                "spans": [],
                "where": f"{path} query={row['query']!r} chunk={ident[1:]!r}",
            }
        rec["spans"].append({"start": row["start"], "end": row["end"], "text": row["text"]})
    return Predictions("spans", list(groups.values()))


def _load_prediction_jsonl(path: str) -> Predictions:
    records = []
    seen: dict[tuple, int] = {}
    for lineno, obj in read_jsonl(path):
        where = f"{path}, line {lineno}"
        if not isinstance(obj.get("query"), str):
            raise ValueError(f"{where}: missing or non-string 'query'")
        if not _has_ids(obj) and not isinstance(obj.get("chunk"), str):
            raise ValueError(f"{where}: a prediction needs 'paper_id' and 'chunk_index', or 'chunk'")
        if "spans" not in obj:
            hint = " (it has 'gold_spans': is it the gold file?)" if "gold_spans" in obj else ""
            raise ValueError(f"{where}: no 'spans' field, so not a predictions file{hint}")
        spans = obj["spans"] if obj["spans"] is not None else []
        if not isinstance(spans, list):
            raise ValueError(f"{where}: 'spans' must be a list")
        rec = {
            "query": obj["query"],
            "paper_id": obj.get("paper_id"),
            "chunk_index": int(obj["chunk_index"]) if obj.get("chunk_index") is not None else None,
            "chunk_id": obj.get("chunk_id"),
            "chunk": obj.get("chunk"),
            "spans": spans,
            "where": where,
        }
        ident = gold_key(rec)
        if ident in seen:
            raise ValueError(f"{where}: duplicate prediction for the pair already given on line {seen[ident]}")
        seen[ident] = lineno
        records.append(rec)
    return Predictions("jsonl", records)


def load_predictions(path: str | Path) -> Predictions:
    """Predictions: a span table (or a run holding one), grouped per (query, paper_id, chunk_index, chunk_id), or
    JSONL rows of ``query``, ``paper_id`` + ``chunk_index`` or ``chunk``, and ``spans`` (offsets or strings). A row
    without ``spans`` is refused, so a gold file passed as predictions is an error, not a score of 0."""
    path = _location(path)
    if _is_parquet(path):
        return _load_span_table(path)
    return _load_prediction_jsonl(path)


def _index_gold(gold_rows: Sequence[Mapping[str, Any]]) -> tuple[dict, dict, dict]:
    """Lookup tables over gold rows: by ids, by (query, chunk) and by (query, chunk id)."""
    by_ids: dict[tuple, int] = {}
    by_text: dict[tuple, int] = {}
    by_cid: dict[tuple, int] = {}
    for i, row in enumerate(gold_rows):
        key = gold_key(row)
        table = by_ids if _has_ids(row) else by_text
        if key in table:
            raise ValueError(f"duplicate gold pair {key!r} (rows {table[key]} and {i})")
        table[key] = i
        if not _has_ids(row):
            by_cid.setdefault((row["query"], gold_chunk_id(row)), i)
    return by_ids, by_text, by_cid


def _resolve(rec: Mapping[str, Any], by_ids: dict, by_text: dict, by_cid: dict) -> int | None:
    """Index of the gold row a prediction record belongs to, or None."""
    if _has_ids(rec) and (hit := by_ids.get((rec["query"], str(rec["paper_id"]), int(rec["chunk_index"])))) is not None:
        return hit
    if rec.get("chunk") is not None and (hit := by_text.get((rec["query"], rec["chunk"]))) is not None:
        return hit
    if rec.get("chunk_id") is not None:
        return by_cid.get((rec["query"], str(rec["chunk_id"])))
    return None


def _place_spans(chunk: str, spans: Iterable[Any], diag: dict[str, int], where: str) -> list[Span]:
    """Offsets of predicted spans in the gold chunk; strings are aligned, offsets with text are checked."""
    out: list[Span] = []
    for span in spans:
        if (offsets := _placed(chunk, span, align_prediction, f"{where}: predicted span")) is None:
            diag["pred_dropped"] += 1
            continue
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in offsets):
            raise ValueError(f"{where}: predicted span {span!r} has no integer offsets")
        text = span.get("text") if isinstance(span, Mapping) else None
        if text is not None and chunk[offsets[0] : offsets[1]] != text:
            diag["offset_mismatch"] += 1
            continue
        out.append(offsets)
    return out


def _score(
    gold_rows: Sequence[dict[str, Any]],
    records: Iterable[Mapping[str, Any]],
    diag: dict[str, int],
    detail: list[dict[str, Any]] | None = None,
    **thresholds: Any,
) -> dict[str, Any]:
    by_ids, by_text, by_cid = _index_gold(gold_rows)
    preds: list[list[Span]] = [[] for _ in gold_rows]
    n_records = 0
    for rec in records:
        n_records += 1
        i = _resolve(rec, by_ids, by_text, by_cid)
        if i is None:
            diag["unmatched_predictions"] += 1
            continue
        preds[i].extend(_place_spans(gold_rows[i]["chunk"], rec["spans"], diag, rec.get("where", "")))
    if n_records and diag["unmatched_predictions"] == n_records:
        raise ValueError(f"none of the {n_records} predicted pairs matches a gold pair (by query with paper_id "
                         "and chunk_index, chunk text or chunk_id): predictions for another gold file?")
    rows = [
        EvalRow(chunk=g["chunk"], gold=list(g["gold_spans"]), pred=p, relevant=g.get("relevant"), key=gold_key(g))
        for g, p in zip(gold_rows, preds, strict=True)
    ]
    result = evaluate(rows, **thresholds)
    if detail is not None:
        detail.extend(row_details(gold_rows, rows))
    diag["gold_unaligned"] = sum(int(g.get("gold_unaligned") or 0) for g in gold_rows)
    diag["gold_rows"] = len(gold_rows)
    diag["relevant_rows"] = sum(1 for g in gold_rows if g.get("relevant") is True)
    result["diagnostics"] = dict(diag)
    return result


def _new_diagnostics() -> dict[str, int]:
    names = ("gold_unaligned", "pred_dropped", "unmatched_predictions", "offset_mismatch", "gold_rows", "relevant_rows")
    return dict.fromkeys(names, 0)


def evaluate_predictions(
    gold_rows: Sequence[Mapping[str, Any]],
    predictions: Mapping[GoldKey, Sequence[Any]],
    detail: list[dict[str, Any]] | None = None,
    **thresholds: Any,
) -> dict[str, Any]:
    """Score in-memory predictions against gold rows (as from :func:`load_gold`).

    ``predictions`` maps a gold row's :func:`gold_key` to its predicted spans: (start, end) pairs, ``{"start",
    "end"}`` dicts (checked against the chunk when they carry ``"text"``) or quoted strings (``align_prediction``).
    A gold row absent counts as predicting nothing; a key matching none is an ``unmatched_predictions``. The
    threshold lists go to :func:`~verbatim_batch.quality.metrics.evaluate`; ``detail`` gets :func:`row_details`.
    """
    gold = [normalize_gold_row(g, f"gold row {i}") for i, g in enumerate(gold_rows)]
    by_ids, by_text, _ = _index_gold(gold)
    diag = _new_diagnostics()
    lookup = {**by_ids, **by_text}  # key shapes differ (3 vs 2 items), so they cannot collide
    records = []
    for key, spans in predictions.items():
        i = lookup.get(key)
        if i is None:
            diag["unmatched_predictions"] += 1
            continue
        g = gold[i]
        records.append({**g, "chunk": g["chunk"], "spans": list(spans), "where": f"prediction {key!r}"})
    return _score(gold, records, diag, detail, **thresholds)


def evaluate_files(gold_path: str | Path, predictions_path: str | Path,
                   detail: list[dict[str, Any]] | None = None, chunks: str | None = None,
                   **thresholds: Any) -> dict[str, Any]:
    """Load a pairs file and predictions, match and score them, with ``diagnostics`` (``detail``: ``row_details``)."""
    gold = load_gold(gold_path, chunks)
    preds = load_predictions(predictions_path)
    return _score(gold, preds.records, _new_diagnostics(), detail, **thresholds)


def row_details(gold_rows: Sequence[Mapping[str, Any]], rows: Sequence[EvalRow]) -> list[dict[str, Any]]:
    """Per gold row, for the side-by-side report: ids, chunk, sorted gold and predicted spans, and its word P, R, F1."""
    out = []
    for g, row in zip(gold_rows, rows, strict=True):
        word = evaluate([row], iou_thresholds=(), containment_thresholds=(), coverage_thresholds=())["word"]
        out.append({"query": g["query"], "query_id": g.get("query_id"), "paper_id": g.get("paper_id"),
                    "chunk_index": g.get("chunk_index"), "chunk_id": g.get("chunk_id"), "relevant": g.get("relevant"),
                    "chunk": row.chunk, "gold": sorted(set(row.gold)), "pred": sorted(set(row.pred)),
                    "word_p": word["micro_p"], "word_r": word["micro_r"], "word_f1": word["macro_f1"]})
    return out


def sweep_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row of headline figures per threshold of a sweep (``{threshold: evaluate result}``)."""
    out = []
    for t, r in results.items():
        iou, cov = r.get("iou", {}), r.get("coverage", {})
        iou_key, cov_key = ("0.5" if "0.5" in d else next(iter(d), None) for d in (iou, cov))
        out.append({"threshold": float(t), "pred_spans": r.get("n_pred_spans"), "word_p": r["word"]["micro_p"],
                    "word_r": r["word"]["micro_r"], "word_f1": r["word"]["micro_f1"],
                    "macro_f1": r["word"]["macro_f1"], "iou_f1": iou[iou_key]["f1"] if iou_key else None,
                    "iou_at": iou_key, "coverage": cov.get(cov_key) if cov_key else None, "coverage_at": cov_key,
                    "overlap_recall": r.get("any_overlap_recall"), "over_prediction": r.get("over_prediction_ratio")})
    return out


SWEEP_COLUMNS = (("threshold", "threshold"), ("pred_spans", "pred spans"), ("word_p", "word P"),
                 ("word_r", "word R"), ("word_f1", "word F1"), ("macro_f1", "macro F1"), ("iou_f1", "IoU F1"),
                 ("coverage", "coverage"), ("overlap_recall", "overlap rec."), ("over_prediction", "over-pred."))


def format_sweep(results: Mapping[str, Mapping[str, Any]], extractor: str = "") -> str:
    """A threshold sweep as one fixed-width table, a line per threshold (``SWEEP_COLUMNS``), the best word F1 ``*``."""
    rows = sweep_rows(dict(results))
    if not rows:
        return "no thresholds"
    best = max(rows, key=lambda r: r["word_f1"])
    labels = [label for _, label in SWEEP_COLUMNS]
    widths = [max(len(label), 9) for label in labels]
    lines = ["  ".join(f"{label:>{w}}" for label, w in zip(labels, widths, strict=True))]
    for r in rows:
        cells = []
        for (key, _), w in zip(SWEEP_COLUMNS, widths, strict=True):
            v = r[key]
            text = "n/a" if v is None else f"{v:g}" if key == "threshold" else str(v) if isinstance(v, int) \
                else f"{v:.3f}"
            cells.append(f"{text:>{w}}")
        lines.append("  ".join(cells) + ("  *" if r is best else ""))
    first = next(iter(results.values()))
    diag = first.get("diagnostics", {})
    head = (f"{extractor + ' ' if extractor else ''}threshold sweep over {first.get('n_rows')} gold rows, "
            f"{first.get('n_gold_spans')} gold spans (IoU F1 at IoU >= {rows[0]['iou_at']}, coverage at "
            f">= {rows[0]['coverage_at']}; * best word F1)")
    tail = [f"diagnostics: {', '.join(f'{k} {v}' for k, v in diag.items())}"] if diag else []
    return "\n".join([head, *lines, *tail])
