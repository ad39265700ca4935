"""(query, chunk) pairs for extraction, from a pairs file or from a retrieval run.

Both become one ``PAIR_INPUT`` table; a row that cannot be used (bad JSON, no query, an unknown chunk id) is kept
with ``input_error`` set, so the extract stage writes an error row for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from verbatim_batch.core import storage
from verbatim_batch.core.records import iter_records
from verbatim_batch.core.tables import PAIR_INPUT, pair_id, query_id_for, text_chunk_id

# Fields of a pairs file that have a column of their own; everything else goes to ``extra``.
KNOWN_FIELDS = ("query", "chunk", "query_id", "paper_id", "chunk_index", "chunk_id", "relevant", "gold_spans", "rank")
_CHUNK_COLUMNS = ["chunk_id", "paper_id", "chunk_index", "start", "text"]


def read_pair_records(path: str) -> Iterable[dict[str, Any]]:
    """Rows of a JSONL or Parquet pairs file (``records.iter_records``: a malformed line is an error record)."""
    return iter_records(path)


def chunk_lookup(chunks_dir: str, chunk_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``chunk_id -> {text, paper_id, chunk_index, start}`` for the given ids, only matching rows read."""
    ids = sorted({c for c in chunk_ids if c})
    if not ids:
        return {}
    table = storage.dataset(chunks_dir).to_table(columns=_CHUNK_COLUMNS, filter=pads.field("chunk_id").isin(ids))
    return {r["chunk_id"]: r for r in table.to_pylist()}


def _as_int(value: Any) -> int | None:
    """An int32 column value: integers (or integral numbers) in range; anything else is None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(value, float) and number != value:
        return None
    return number if -(2**31) <= number < 2**31 else None


def pairs_from_records(records: Iterable[Mapping[str, Any]],
                       chunks: Mapping[str, Mapping[str, Any]] | None = None) -> pa.Table:
    """Pairs-file records -> a ``PAIR_INPUT`` table (one row per record, in order). ``chunks`` resolves a
    ``chunk_id`` to text and paper offsets; unknown fields are kept as JSON in ``extra``."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    chunks = chunks or {}
    for n, rec in enumerate(records):
        line = rec.get("__line__", n + 1)
        error = rec.get("__error__")
        query = _text(rec.get("query"))
        chunk = _text(rec.get("chunk"))
        ids = {k: rec.get(k) for k in ("query_id", "chunk_id", "paper_id")}
        bad_id = next((k for k, v in ids.items() if v is not None and not _is_id(v)), None)
        cid = str(ids["chunk_id"]) if ids["chunk_id"] is not None and bad_id is None else None
        known = chunks.get(cid) if cid else None
        if error is None:
            if bad_id is not None:
                error = (f"invalid_id: record {line} has a {type(ids[bad_id]).__name__} {bad_id!r} "
                         "(ids are strings or integers)")
            elif _UNENCODABLE in (query, chunk):
                error = f"invalid_text: record {line} has text that is not valid Unicode (a lone surrogate)"
            elif not isinstance(query, str):
                error = f"missing_query: record {line} has no string 'query'"
            elif chunk is None and known is None:
                error = (f"chunk_not_found: chunk_id {cid!r} is not in the chunk table" if cid
                         else f"missing_chunk: record {line} has neither 'chunk' nor 'chunk_id'")
            elif chunk is not None and not isinstance(chunk, str):
                error = f"invalid_chunk: record {line} has a non-string 'chunk'"
            elif chunk is not None and known is not None and chunk != known["text"]:
                error = (f"chunk_mismatch: record {line} gives chunk text that differs from chunk {cid!r} in the "
                         "chunk table")
        if _UNENCODABLE in (query, chunk):
            query, chunk = (None if v is _UNENCODABLE else v for v in (query, chunk))
        if chunk is None and known is not None:
            chunk = known["text"]
        chunk_start = None
        if known is not None and chunk == known["text"]:
            chunk_start = known["start"]
        qid = ids["query_id"] if bad_id is None else None
        qid = str(qid) if qid is not None else (query_id_for(query) if isinstance(query, str) else f"line-{line}")
        if cid is None:
            cid = text_chunk_id(chunk) if isinstance(chunk, str) else f"line-{line}"
        pid = pair_id(qid, cid)
        if error is None and pid in seen:
            error = f"duplicate_pair: record {line} repeats query_id {qid!r} with chunk {cid!r}"
        if error is not None:
            pid = pair_id(qid, f"{cid}#line-{line}")  # error rows stay unique
        seen.add(pid)
        extra = {k: v for k, v in rec.items() if k not in KNOWN_FIELDS and not k.startswith("__")}
        paper_id = ids["paper_id"] if ids["paper_id"] is not None and bad_id is None else (
            known["paper_id"] if known else None)
        chunk_index = _as_int(rec.get("chunk_index", known["chunk_index"] if known else None))
        relevant = rec.get("relevant")
        rows.append({
            "pair_id": pid, "query_id": qid, "query": query if isinstance(query, str) else None,
            "chunk": chunk if isinstance(chunk, str) else None, "chunk_id": cid,
            "paper_id": str(paper_id) if paper_id is not None else None, "chunk_index": chunk_index,
            "chunk_start": chunk_start, "rank": _as_int(rec.get("rank")),
            "relevant": relevant if isinstance(relevant, bool) else None,
            "extra": json.dumps(extra, sort_keys=True, default=str) if extra else None,
            "input_error": error,
        })
    return pa.Table.from_pylist(rows, schema=PAIR_INPUT)


_UNENCODABLE = object()  # a string field that cannot be stored (lone surrogates)


def _text(value: Any) -> Any:
    """``value``, or ``_UNENCODABLE`` for a string that is not valid Unicode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _UNENCODABLE
    return value


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def pairs_from_retrieval(retrieval: pa.Table, queries: Mapping[str, str],
                         chunks: Mapping[str, Mapping[str, Any]], method: str = "hybrid",
                         top_k: int = 5) -> pa.Table:
    """Retrieval rows of ``method`` with ``rank <= top_k`` joined with queries and chunks -> ``PAIR_INPUT``."""
    methods = set(retrieval.column("method").to_pylist())
    if method not in methods:
        raise ValueError(f"retrieval table has no {method!r} rows (methods: {sorted(methods)})")
    rows = [r for r in retrieval.to_pylist() if r["method"] == method and r["rank"] <= top_k]
    rows.sort(key=lambda r: (r["query_id"], r["rank"]))
    out = []
    for r in rows:
        known = chunks.get(r["chunk_id"])
        query = queries.get(r["query_id"])
        error = None
        if query is None:
            error = f"query_not_found: query_id {r['query_id']!r} is not in the query file"
        elif known is None:
            error = f"chunk_not_found: chunk_id {r['chunk_id']!r} is not in the chunk table"
        out.append({
            "pair_id": pair_id(r["query_id"], r["chunk_id"]), "query_id": r["query_id"], "query": query,
            "chunk": known["text"] if known else None, "chunk_id": r["chunk_id"],
            "paper_id": r["paper_id"], "chunk_index": known["chunk_index"] if known else None,
            "chunk_start": known["start"] if known else None, "rank": r["rank"], "relevant": None,
            "extra": None, "input_error": error,
        })
    return pa.Table.from_pylist(out, schema=PAIR_INPUT)
