"""The extract stage: a batch of pairs in, a spans table and a pairs table out.

Any extractor mapping ``(queries, chunks)`` to ``PairResult`` objects plugs in. One bad pair is one error row, and
spans pass ``verbatim_spans`` (one that is not exactly ``chunk[start:end]`` is counted in ``n_violations``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa

from verbatim_batch.core.tables import PAIR_INPUT, PAIRS, REJECTS, SPANS, group_by, pair_input_hash
from verbatim_batch.extract.spans import PairResult, verbatim_spans

DEFAULT_MAX_CHUNK_CHARS = 200_000
DEFAULT_MAX_QUERY_CHARS = 2_000


class Extractor(Protocol):
    """What the stage needs from an extractor."""

    name: str

    def describe(self) -> dict[str, Any]:
        """``model_id``, ``model_revision`` and ``config_hash`` (plus anything for the manifest)."""

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        """One result per pair, in order."""


def validate_pair(row: dict[str, Any], max_chunk_chars: int, max_query_chars: int) -> str | None:
    """Why a pair cannot go to the extractor, or None when it can."""
    if row.get("input_error"):
        return row["input_error"]
    query, chunk = row.get("query"), row.get("chunk")
    if not isinstance(query, str) or not query.strip():
        return "empty_query"
    if not isinstance(chunk, str) or not chunk.strip():
        return "empty_chunk"
    if len(query) > max_query_chars:
        return f"query_too_long: {len(query)} chars > {max_query_chars}"
    if len(chunk) > max_chunk_chars:
        return f"chunk_too_large: {len(chunk)} chars > {max_chunk_chars}"
    return None


def _error_reason(exc: BaseException) -> str:
    return f"extractor_error: {type(exc).__name__}: {str(exc)[:300]}"


class PairExtractor:
    """Callable over ``PAIR_INPUT`` batches -> ``{"spans": SPANS table, "pairs": PAIRS table}``."""

    def __init__(self, extractor: Extractor, run_id: str, max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS,
                 max_query_chars: int = DEFAULT_MAX_QUERY_CHARS) -> None:
        self.extractor = extractor
        self.run_id = run_id
        self.max_chunk_chars = max_chunk_chars
        self.max_query_chars = max_query_chars
        info = extractor.describe()
        self.model_id = info.get("model_id")
        self.model_revision = info.get("model_revision")
        self.config_hash = info["config_hash"]
        self.last_ms: dict[str, int] = {}  # where the last batch's time went: model, gate (verbatim check, rows)

    @property
    def live_fraction(self) -> float | None:
        """The extractor's share of its current call through the model, where it counts one (``engine.live``)."""
        return getattr(self.extractor, "live_fraction", None)

    def _run(self, queries: list[str], chunks: list[str], query_ids: list[str] | None = None,
             ranks: list[int | None] | None = None) -> list[PairResult]:
        """The extractor over a batch (with query ids and ranks if it ``groups_queries``); if it fails, each pair
        alone."""
        try:
            if getattr(self.extractor, "groups_queries", False) and query_ids is not None:
                results = self.extractor.extract(queries, chunks, query_ids=query_ids, ranks=ranks)
            else:
                results = self.extractor.extract(queries, chunks)
            if len(results) != len(queries):
                raise RuntimeError(f"extractor returned {len(results)} results for {len(queries)} pairs")
            return results
        except Exception:  # noqa: BLE001 - isolate the failing pair below
            if len(queries) == 1:
                raise
        out = []
        for q, c in zip(queries, chunks, strict=True):
            try:
                out.extend(self.extractor.extract([q], [c]))
            except Exception as exc:  # noqa: BLE001 - a per-pair error row, the job goes on
                out.append(PairResult([], None, _error_reason(exc)))
        return out

    def __call__(self, batch: pa.Table) -> dict[str, pa.Table]:
        if batch.schema.names != PAIR_INPUT.names:
            batch = batch.select(PAIR_INPUT.names)
        rows = batch.to_pylist()
        errors = [validate_pair(r, self.max_chunk_chars, self.max_query_chars) for r in rows]
        todo = [i for i, e in enumerate(errors) if e is None]
        results: dict[int, PairResult] = {}
        t0 = time.perf_counter()
        if todo:
            try:
                got = self._run([rows[i]["query"] for i in todo], [rows[i]["chunk"] for i in todo],
                                [rows[i]["query_id"] for i in todo], [rows[i]["rank"] for i in todo])
            except Exception as exc:  # noqa: BLE001 - a single pair failed
                got = [PairResult([], None, _error_reason(exc))]
            results = dict(zip(todo, got, strict=True))
        t1 = time.perf_counter()
        latency_ms = 1000.0 * (t1 - t0) / max(1, len(todo))
        out = self.tables(rows, results, errors, latency_ms)
        self.last_ms = {"model": round(1000 * (t1 - t0)), "gate": round(1000 * (time.perf_counter() - t1))}
        return out

    def tables(self, rows: list[dict[str, Any]], results: dict[int, PairResult], errors: Sequence[str | None],
               latency_ms: float | Sequence[float] | None) -> dict[str, pa.Table]:
        """Spans, pairs and rejects tables for ``PAIR_INPUT`` rows and the processed ones' results (spans through
        ``verbatim_spans``). ``latency_ms``: one figure for every processed pair, or one per row."""
        per_row = latency_ms if isinstance(latency_ms, Sequence) else [latency_ms] * len(rows)
        span_rows, pair_rows, reject_rows = [], [], []
        for i, row in enumerate(rows):
            res = results.get(i) or PairResult([], None, errors[i])
            spans, violations = ([], 0) if res.error else verbatim_spans(row["chunk"], res.spans)
            base = {"run_id": self.run_id, "pair_id": row["pair_id"], "query_id": row["query_id"],
                    "paper_id": row["paper_id"], "chunk_id": row["chunk_id"], "chunk_index": row["chunk_index"],
                    "extractor": self.extractor.name, "model_id": self.model_id,
                    "model_revision": self.model_revision, "config_hash": self.config_hash}
            offset = row["chunk_start"]
            for sp in spans:
                span_rows.append(base | {
                    "query": row["query"], "start": sp.start, "end": sp.end,
                    "paper_start": offset + sp.start if offset is not None else None,
                    "paper_end": offset + sp.end if offset is not None else None,
                    "text": sp.text, "score": sp.score, "align": sp.align,
                })
            pair_rows.append(base | {
                "query": row["query"], "rank": row["rank"], "relevant": row["relevant"], "n_spans": len(spans),
                "relevance": res.relevance, "latency_ms": per_row[i] if i in results else None,
                "error": res.error, "n_violations": violations, "extra": row["extra"],
                "input_hash": pair_input_hash(row["query"], row["chunk"], row["paper_id"], row["chunk_start"]),
            })
            for rej in res.rejects:
                reject_rows.append({
                    "run_id": self.run_id, "request_id": rej.request_id or row["pair_id"],
                    "pair_id": row["pair_id"],
                    "query_id": row["query_id"], "chunk_id": row["chunk_id"] if rej.doc_index is not None else None,
                    "doc_index": rej.doc_index, "span": rej.span, "reason": rej.reason,
                    "raw_output": rej.raw_output, "model_id": self.model_id, "config_hash": self.config_hash,
                })
        return {"spans": pa.Table.from_pylist(span_rows, schema=SPANS),
                "pairs": pa.Table.from_pylist(pair_rows, schema=PAIRS),
                "rejects": pa.Table.from_pylist(reject_rows, schema=REJECTS)}


# --- one block per batch: the pairs rows with their spans and rejects nested in list columns ---------------

_SPAN_OWN = ["start", "end", "paper_start", "paper_end", "text", "score", "align"]
_SPAN_FROM_PAIR = [n for n in SPANS.names if n not in _SPAN_OWN]


def pack(out: dict[str, pa.Table]) -> pa.Table:
    """``{"spans", "pairs", "rejects"}`` -> the pairs table plus ``spans`` and ``rejects`` list columns."""
    pairs, spans = out["pairs"], out["spans"]
    by_pair = group_by(spans.select(["pair_id", *_SPAN_OWN]).to_pylist())
    struct = pa.struct([SPANS.field(n) for n in _SPAN_OWN])
    pair_ids = pairs.column("pair_id").to_pylist()
    nested = pa.array([by_pair.get(p, []) for p in pair_ids], pa.list_(struct))
    rejects = out.get("rejects")
    rows = rejects.to_pylist() if rejects is not None else []
    rej_by_pair = group_by([r | {"owner": r["pair_id"]} for r in rows], "owner")  # rejects keep their pair_id
    owners = [rej_by_pair.get(p, []) for p in pair_ids]
    rejects_col = pa.array(owners, pa.list_(pa.struct(list(REJECTS))))
    return pairs.append_column("spans", nested).append_column("rejects", rejects_col)


def unpack(packed: pa.Table) -> dict[str, pa.Table]:
    """The inverse of ``pack``."""
    import pyarrow.compute as pc

    nested = packed.column("spans").combine_chunks()
    rejects = pc.list_flatten(packed.column("rejects").combine_chunks())
    rejects = pa.Table.from_struct_array(rejects) if len(rejects) else REJECTS.empty_table()
    pairs = packed.drop_columns(["spans", "rejects"])
    parents = pc.list_parent_indices(nested)
    flat = pc.list_flatten(nested)
    base = pairs.select(_SPAN_FROM_PAIR).take(parents)
    cols = {n: base.column(n) for n in _SPAN_FROM_PAIR} | {n: flat.field(n) for n in _SPAN_OWN}
    spans = pa.table({n: cols[n] for n in SPANS.names}).cast(SPANS)
    return {"spans": spans, "pairs": pairs.cast(PAIRS), "rejects": rejects.cast(REJECTS)}
