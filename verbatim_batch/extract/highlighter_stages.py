"""The highlighter as the extract job runs it: three stages over Arrow batches (the split placement, issue 25),
a CPU tokenize stage (``encode_table``), the model actors' forward stage (``forward_table``) and a CPU span
stage (``spans_table``, with ``HighlighterRows`` as the extractor the verbatim gate sees)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig, HighlighterTokenizer
from verbatim_batch.extract.highlighter_spans import ContextScores
from verbatim_batch.extract.spans import PairResult

# --- the three stages over Arrow batches (the extract job's split placement) -------------------------------
# A batch of ``PAIR_INPUT`` rows travels with internal list columns, one row per pair:
#   tokenize stage -> _hl_ids (tokens of all its windows), _hl_wlen (window lengths), _hl_ctx (positions of the
#                     context tokens in _hl_ids), _hl_off (their offsets, two per token), _hl_cnum (context
#                     tokens per window), _hl_invalid (validate_pair's reason), _hl_error (extractor error),
#                     _hl_ms (host and model milliseconds spent on the pair so far)
#   forward stage  -> drops _hl_ids, _hl_wlen and _hl_ctx; adds _hl_p (the context tokens' probabilities)
#   span stage     -> the packed spans/pairs/rejects block (``stage.pack``)

TOKEN_COLUMNS = ("_hl_ids", "_hl_wlen", "_hl_ctx")


def _flat(column: pa.ChunkedArray | pa.Array, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values (flat numpy) and each row's list length."""
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)


def _lists(values: np.ndarray, counts: np.ndarray, type_: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    values = np.asarray(values).astype(type_.to_pandas_dtype(), copy=False)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, type_))


def encode_table(host: HighlighterTokenizer, batch: pa.Table, max_chunk_chars: int,
                 max_query_chars: int) -> pa.Table:
    """The tokenize stage: ``PAIR_INPUT`` rows -> the same rows with their windows (see above). A pair that
    fails validation or tokenisation gets its reason; the others are tokenised together."""
    from verbatim_batch.extract.gate import _error_reason, validate_pair

    t0 = time.perf_counter()
    rows = batch.select(["query", "chunk", "input_error"]).to_pylist()
    n = len(rows)
    invalid = [validate_pair(r, max_chunk_chars, max_query_chars) for r in rows]
    errors: list[str | None] = [None] * n
    todo = [i for i, e in enumerate(invalid) if e is None]
    try:
        enc = host.encode([rows[i]["query"] for i in todo], [rows[i]["chunk"] for i in todo])
    except Exception:  # noqa: BLE001 - find the pair that fails, tokenise the others together
        for i in todo:
            try:
                host.encode([rows[i]["query"]], [rows[i]["chunk"]])
            except Exception as exc:  # noqa: BLE001 - a per-pair error row, the batch goes on
                errors[i] = _error_reason(exc)
        todo = [i for i in todo if errors[i] is None]
        enc = host.encode([rows[i]["query"] for i in todo], [rows[i]["chunk"] for i in todo])
    for k, i in enumerate(todo):
        errors[i] = enc.errors[k]
    row = np.asarray(todo, dtype=np.int64)[enc.window_pair] if len(enc.window_pair) else np.zeros(0, np.int64)
    win_per_row = np.bincount(row, minlength=n)
    tok_per_row = np.bincount(row, weights=enc.window_lengths, minlength=n).astype(np.int64)
    ctx_per_row = np.bincount(row, weights=enc.context_counts, minlength=n).astype(np.int64)
    row_start = np.cumsum(tok_per_row) - tok_per_row
    local_ctx = enc.context - np.repeat(row_start, ctx_per_row)
    ms = 1000.0 * (time.perf_counter() - t0) / max(1, len(todo))
    columns = {
        "_hl_ids": _lists(enc.ids, tok_per_row, pa.int32()),
        "_hl_wlen": _lists(enc.window_lengths, win_per_row, pa.int32()),
        "_hl_ctx": _lists(local_ctx, ctx_per_row, pa.int32()),
        "_hl_off": _lists(enc.offsets.reshape(-1), 2 * ctx_per_row, pa.int32()),
        "_hl_cnum": _lists(enc.context_counts, win_per_row, pa.int32()),
        "_hl_invalid": pa.array(invalid, pa.string()),
        "_hl_error": pa.array(errors, pa.string()),
        "_hl_ms": pa.array([ms if e is None else 0.0 for e in invalid], pa.float64()),
    }
    for name, col in columns.items():
        batch = batch.append_column(name, col)
    return batch


def forward_table(hl: Highlighter, batch: pa.Table) -> pa.Table:
    """The forward stage: the model over every window of the batch (packed under the token budget), nothing
    else; the context tokens' probabilities come back as ``_hl_p``. If the batch fails, each pair alone."""
    from verbatim_batch.extract.gate import _error_reason

    t0 = time.perf_counter()
    ids, tok_per_row = _flat(batch["_hl_ids"], np.int32)
    lengths, win_per_row = _flat(batch["_hl_wlen"], np.int64)
    ctx, ctx_per_row = _flat(batch["_hl_ctx"], np.int64)
    errors = batch["_hl_error"].to_pylist()
    row_start = np.cumsum(tok_per_row) - tok_per_row
    try:
        probs = hl.forward_probs(ids, lengths)
    except Exception:  # noqa: BLE001 - isolate the failing pair below
        probs = np.zeros(len(ids), np.float32)
        win_start = np.cumsum(win_per_row) - win_per_row
        for r in np.flatnonzero(win_per_row):
            a, b = row_start[r], row_start[r] + tok_per_row[r]
            try:
                probs[a:b] = hl.forward_probs(ids[a:b], lengths[win_start[r]:win_start[r] + win_per_row[r]])
            except Exception as exc:  # noqa: BLE001 - a per-pair error row, the batch goes on
                errors[r] = _error_reason(exc)
    p = probs[ctx + np.repeat(row_start, ctx_per_row)] if len(ctx) else np.zeros(0, np.float32)
    done = np.asarray([e is None for e in batch["_hl_invalid"].to_pylist()])
    ms = batch["_hl_ms"].to_numpy(zero_copy_only=False) + np.where(
        done, 1000.0 * (time.perf_counter() - t0) / max(1, int(done.sum())), 0.0)
    return _forwarded(batch, p, ctx_per_row, errors, ms)


def failed_forward_table(batch: pa.Table, error: str) -> pa.Table:
    """``forward_table``'s columns for a batch the forward stage gave up on, every row with ``error``."""
    _, ctx_per_row = _flat(batch["_hl_ctx"], np.int64)
    n = batch.num_rows
    return _forwarded(batch, np.zeros(int(ctx_per_row.sum())), ctx_per_row, [error] * n, [0.0] * n)


def _forwarded(batch: pa.Table, probs: np.ndarray, ctx_per_row: np.ndarray, errors: list, ms: Any) -> pa.Table:
    out = batch.drop_columns([*TOKEN_COLUMNS, "_hl_error", "_hl_ms"])
    return (out.append_column("_hl_p", _lists(probs, ctx_per_row, pa.float32()))
            .append_column("_hl_error", pa.array(errors, pa.string()))
            .append_column("_hl_ms", pa.array(ms, pa.float64())))


def scores_of(batch: pa.Table) -> ContextScores:
    """The span stage's view of a forward stage's batch."""
    offsets, _ = _flat(batch["_hl_off"], np.int64)
    probs, _ = _flat(batch["_hl_p"], np.float32)
    counts, win_per_row = _flat(batch["_hl_cnum"], np.int64)
    errors = [a or b for a, b in zip(batch["_hl_invalid"].to_pylist(), batch["_hl_error"].to_pylist(), strict=True)]
    window_pair = np.repeat(np.arange(batch.num_rows, dtype=np.int64), win_per_row)
    return ContextScores(errors, offsets.reshape(-1, 2), probs, counts, window_pair)


def spans_table(batch: pa.Table, stage: Any, config: HighlighterConfig) -> dict[str, pa.Table]:
    """The span stage: every pair's spans from a forward stage's batch, then the verbatim gate and the rows."""
    from verbatim_batch.core.tables import PAIR_INPUT

    t0 = time.perf_counter()
    results = scores_of(batch).results(batch["chunk"].to_pylist(), config.threshold, config.min_chars,
                                       config.merge_gap)
    invalid = batch["_hl_invalid"].to_pylist()
    done = [i for i, e in enumerate(invalid) if e is None]
    ms = 1000.0 * (time.perf_counter() - t0) / max(1, len(done))
    latency = [v + ms for v in batch["_hl_ms"].to_pylist()]
    rows = batch.select(PAIR_INPUT.names).to_pylist()
    return stage.tables(rows, {i: results[i] for i in done}, invalid, latency)


class HighlighterRows:
    """The highlighter as the span stage's ``PairExtractor`` sees it: no model, the driver's ``host_describe``."""

    name = "highlighter"

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = dict(info)

    def describe(self) -> dict[str, Any]:
        return dict(self.info)

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        raise RuntimeError("the span stage builds spans from model outputs; it runs no model")
