"""The one reader of small input tables (queries, pairs, labels): JSON lines, Parquet or CSV, local or a URI.

JSONL is streamed as UTF-8 (bad bytes replaced), blank lines skipped; a line that is not a JSON object becomes an
error record (``__error__``, ``__line__``) instead of stopping the read; Parquet and CSV rows come as they are
(``__line__`` the row number). Callers decide what an error record costs, so no file is half-read silently.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from verbatim_batch.core import storage
from verbatim_batch.core.tables import QUERIES, query_id_for

ERROR = "__error__"
LINE = "__line__"


def iter_records(path: str) -> Iterator[dict[str, Any]]:
    """Every record of a small table; a malformed JSON line is an error record (``ERROR``). A pipe or device
    is refused, never opened (``storage.refuse_special``): such a path may come from a manifest."""
    storage.refuse_special(path)
    if path.endswith(".parquet") or storage.isdir(path):
        rows = storage.dataset(path).to_table().to_pylist()
    elif path.endswith(".csv"):
        import pyarrow.csv as pacsv

        fs, local = storage.resolve(path)
        with fs.open_input_stream(local) as fh:
            rows = pacsv.read_csv(fh).to_pylist()
    else:
        yield from _jsonl(path)
        return
    for i, row in enumerate(rows, 1):
        row.setdefault(LINE, i)
        yield row


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    fs, local = storage.resolve(path)
    with fs.open_input_stream(local) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):  # streamed; \n, \r\n and \r all end a line
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                yield {ERROR: f"invalid_json: line {lineno}: {msg}", LINE: lineno}
                continue
            if not isinstance(rec, dict):
                yield {ERROR: f"invalid_record: line {lineno} is not a JSON object", LINE: lineno}
                continue
            rec.setdefault(LINE, lineno)
            yield rec


def read_rows(path: str, columns: list[str] | None = None) -> tuple[pa.Table, int]:
    """The good records of a small table as a table of string-or-JSON-scalar columns (``columns``: only
    these, each must be present in some record), and how many records were malformed."""
    good, bad = [], 0
    for rec in iter_records(path):
        if ERROR in rec:
            bad += 1
            continue
        rec.pop(LINE, None)
        good.append(rec if columns is None else {c: rec.get(c) for c in columns})
    return pa.Table.from_pylist(good), bad


QUERY_FORMAT = ("a query file holds one JSON object per line with \"query_id\" and \"query\" (e.g. "
                '{"query_id": "q1", "query": "what is measured"}), or a Parquet/CSV table with those columns')


def read_queries(path: str) -> tuple[pa.Table, int]:
    """``(query_id, query)`` rows of a query file (``QUERIES``) and how many were rejected; a file with no query at
    all is refused with one line naming the expected format and the first record that failed."""
    if not storage.exists(path):
        raise FileNotFoundError(f"query file not found: {path}")
    ids, texts, rejected, columns, first_bad = [], [], 0, set(), None
    for rec in iter_records(path):
        q = rec.get("query")
        if ERROR in rec or not isinstance(q, str) or not q.strip():
            rejected += 1
            first_bad = first_bad or rec
            if ERROR not in rec:
                columns.update(k for k in rec if k != LINE)
            continue
        columns.update(k for k in rec if k != LINE)
        qid = rec.get("query_id")
        ids.append(str(qid) if qid is not None else query_id_for(q))
        texts.append(q)
    if "query" not in columns and first_bad is not None:  # no record is a query: the file is of another shape
        raise ValueError(f"{path}: {_why(path, first_bad)}: {QUERY_FORMAT}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate query_id values")
    return pa.table({"query_id": pa.array(ids, pa.string()), "query": pa.array(texts, pa.string())},
                    schema=QUERIES), rejected


def _why(path: str, rec: dict[str, Any]) -> str:
    """Why the first failing record is not a query, in the file's own terms (its line or row)."""
    where = f"{'row' if path.endswith(('.parquet', '.csv')) or storage.isdir(path) else 'line'} {rec.get(LINE)}"
    if ERROR in rec:
        kind, _, detail = str(rec[ERROR]).partition(": ")
        if kind == "invalid_record":
            return f"{where} is not a JSON object (a JSON array or a plain value)"
        return f"{where} is not JSON ({detail.partition(': ')[2] or detail})"
    fields = sorted(k for k in rec if k != LINE)
    if "query" not in rec:
        return f"{where} has no 'query' (its fields: {', '.join(fields) or 'none'}): it needs a 'query' column"
    return f"{where} has an empty or non-text 'query'"
