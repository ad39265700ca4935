"""Arrow schemas of every table verbatim-batch writes (the contracts between stages), and the id functions.

Each schema carries ``SCHEMA_VERSION`` and its table name in its metadata, which travels into every Parquet file.

Offsets are Python ``str`` indices (Unicode code points) into the paper text as stored in the papers table;
``byte_start``/``byte_end`` give the same positions in its UTF-8 encoding for readers in other languages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = "1.0"
OFFSET_UNIT = "codepoint"
_META_VERSION = b"verbatim_batch.schema_version"
_META_TABLE = b"verbatim_batch.table"
_META_OFFSETS = b"verbatim_batch.offset_unit"


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    meta = {_META_VERSION: SCHEMA_VERSION.encode(), _META_TABLE: name.encode(), _META_OFFSETS: OFFSET_UNIT.encode()}
    return pa.schema(fields, metadata=meta)


PAPERS = _schema(
    "papers",
    [
        pa.field("paper_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        # sha256 of the source record's bytes as read (an md file's bytes): a later run tells an unchanged
        # source by these bytes alone, without decoding it (null in runs written before this column)
        pa.field("source_sha256", pa.string()),
        pa.field("sha256", pa.string(), nullable=False),  # of the text below, UTF-8
        pa.field("n_bytes", pa.int64(), nullable=False),
        pa.field("n_chars", pa.int64(), nullable=False),
        pa.field("n_chunks", pa.int32(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("authors", pa.list_(pa.string())),
        pa.field("year", pa.int32()),
        pa.field("venue", pa.string()),
        pa.field("url", pa.string()),
        pa.field("language", pa.string()),
        pa.field("normalization", pa.string(), nullable=False),
        pa.field("flags", pa.list_(pa.string()), nullable=False),
        pa.field("chunker_config_hash", pa.string(), nullable=False),
        pa.field("markdown", pa.large_string()),  # the text all offsets refer to
    ],
)

CHUNKS = _schema(
    "chunks",
    [
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("paper_id", pa.string(), nullable=False),
        pa.field("chunk_index", pa.int32(), nullable=False),
        pa.field("start", pa.int64(), nullable=False),
        pa.field("end", pa.int64(), nullable=False),
        pa.field("byte_start", pa.int64(), nullable=False),
        pa.field("byte_end", pa.int64(), nullable=False),
        pa.field("text", pa.large_string(), nullable=False),
        pa.field("context", pa.string(), nullable=False),
        pa.field("heading_path", pa.list_(pa.string()), nullable=False),
        pa.field("n_chars", pa.int32(), nullable=False),
        pa.field("flags", pa.list_(pa.string()), nullable=False),
        pa.field("paper_sha256", pa.string(), nullable=False),
        pa.field("normalization", pa.string(), nullable=False),
        pa.field("chunker_config_hash", pa.string(), nullable=False),
    ],
)

QUARANTINE = _schema(
    "quarantine",
    [
        pa.field("paper_id", pa.string()),  # null when the id itself is missing
        pa.field("source", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),  # a QuarantineReason value
        pa.field("detail", pa.string(), nullable=False),
        pa.field("n_bytes", pa.int64()),
        pa.field("raw_sha256", pa.string()),
    ],
)

# Raw records: what corpus readers hand to the ingest stage (internal, not persisted).
RAW_RECORDS = _schema(
    "raw_records",
    [
        pa.field("paper_id", pa.string()),
        pa.field("source", pa.string(), nullable=False),  # path, path#row=N or path#line=N
        pa.field("raw", pa.large_binary()),  # the paper's bytes as stored; null if not read
        pa.field("n_bytes", pa.int64()),
        pa.field("error", pa.string()),  # "reason: detail" when the reader already failed
    ],
)

# Run manifests are written as manifest.json; this schema is their contract and
# lets a set of manifests be loaded as one table (see runs.load_manifests).
MANIFEST = _schema(
    "manifest",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("command", pa.string(), nullable=False),
        pa.field("schema_version", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("created_at", pa.string(), nullable=False),
        pa.field("config", pa.string(), nullable=False),  # JSON
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("inputs", pa.list_(pa.string()), nullable=False),
        pa.field(
            "tables",
            pa.map_(pa.string(), pa.struct([("rows", pa.int64()), ("files", pa.int32())])),
            nullable=False,
        ),
        pa.field("counts", pa.map_(pa.string(), pa.int64()), nullable=False),
        pa.field("timings_s", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("versions", pa.map_(pa.string(), pa.string()), nullable=False),
    ],
)


def embeddings_schema(dim: int, dtype: pa.DataType | None = None) -> pa.Schema:
    """Embeddings table: one row per chunk: the vector of its first window (``vector``), and, for a chunk longer
    than the embedder's window, those of its other windows in order (``window_vectors``; ``windows`` counts all).
    The index scores a chunk by its best window."""
    dtype = dtype or pa.float32()
    return _schema(
        "embeddings",
        [
            pa.field("chunk_id", pa.string(), nullable=False),
            pa.field("paper_id", pa.string(), nullable=False),
            pa.field("vector", pa.list_(dtype, dim), nullable=False),
            pa.field("model_id", pa.string(), nullable=False),
            pa.field("dim", pa.int32(), nullable=False),
            pa.field("n_tokens", pa.int32(), nullable=False),  # embedded, over all windows
            pa.field("truncated", pa.bool_(), nullable=False),  # tokens left over after the last window
            pa.field("windows", pa.int16(), nullable=False),
            pa.field("window_vectors", pa.list_(pa.list_(dtype, dim)), nullable=False),
        ],
    )


RETRIEVAL = _schema(
    "retrieval",
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("paper_id", pa.string(), nullable=False),
        pa.field("score", pa.float32(), nullable=False),
        pa.field("dense_rank", pa.int32()),
        pa.field("bm25_rank", pa.int32()),
        pa.field("method", pa.string(), nullable=False),
    ],
)

# A rerank run's table (it is named ``retrieval`` too, so that extract and evaluate-retrieval read a rerank run
# like a retrieval run): RETRIEVAL's columns, with ``method`` "rerank", ``score`` the cross-encoder's score and
# ``rank`` its order; ``first_method``/``first_rank``/``first_score`` are the candidate's place in the list it was
# reranked from (dense_rank and bm25_rank are carried from that list).
RERANKED = _schema(
    "reranked",
    [
        *RETRIEVAL,
        pa.field("first_method", pa.string(), nullable=False),
        pa.field("first_rank", pa.int32(), nullable=False),
        pa.field("first_score", pa.float32()),
    ],
)

SPANS = _schema(
    "spans",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("paper_id", pa.string()),
        pa.field("chunk_id", pa.string()),
        pa.field("chunk_index", pa.int32()),
        pa.field("start", pa.int64(), nullable=False),
        pa.field("end", pa.int64(), nullable=False),
        pa.field("paper_start", pa.int64()),
        pa.field("paper_end", pa.int64()),
        pa.field("text", pa.large_string(), nullable=False),
        pa.field("score", pa.float32()),
        pa.field("extractor", pa.string(), nullable=False),
        pa.field("model_id", pa.string()),
        pa.field("model_revision", pa.string()),
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("align", pa.string()),  # LLM spans: exact | normalized | fuzzy; null for span models
    ],
)

# one extracted span, nested in a list column of the pair's row (``api.extract``)
SPAN_STRUCT = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("text", pa.large_string()),
                         ("score", pa.float32())])

# LLM output that could not become a span: the string the model returned, why it was
# rejected, and the model's whole raw answer, so nothing is dropped without a trace.
REJECTS = _schema(
    "rejects",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),  # request-level problems: the request's first pair
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("chunk_id", pa.string()),
        pa.field("doc_index", pa.int32()),
        pa.field("span", pa.large_string()),  # what the model returned (null for unparseable output)
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw_output", pa.large_string()),
        pa.field("model_id", pa.string()),
        pa.field("config_hash", pa.string(), nullable=False),
    ],
)

# The extract stage's input: (query, chunk) pairs from a pairs file or a retrieval run,
# normalised. ``chunk_start`` is the chunk's offset in its paper (chunk-table pairs only);
# ``input_error`` marks a row that could not be read, which becomes an error row.
PAIR_INPUT = _schema(
    "pair_input",
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("query", pa.string()),
        pa.field("chunk", pa.large_string()),
        pa.field("chunk_id", pa.string()),
        pa.field("paper_id", pa.string()),
        pa.field("chunk_index", pa.int32()),
        pa.field("chunk_start", pa.int64()),
        pa.field("rank", pa.int32()),
        pa.field("relevant", pa.bool_()),
        pa.field("extra", pa.string()),
        pa.field("input_error", pa.string()),
    ],
)

# One row per (query, chunk) pair an extractor saw, with or without spans, so that
# abstentions (n_spans 0) and failures (error set) are visible next to the spans.
PAIRS = _schema(
    "pairs",
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("query", pa.string()),
        pa.field("paper_id", pa.string()),
        pa.field("chunk_id", pa.string()),
        pa.field("chunk_index", pa.int32()),
        pa.field("rank", pa.int32()),  # retrieval rank when the pair came from a retrieval table
        pa.field("relevant", pa.bool_()),  # carried from a pairs file when given
        pa.field("n_spans", pa.int32(), nullable=False),
        pa.field("relevance", pa.float32()),  # the extractor's pair score (max token / sentence score)
        pa.field("latency_ms", pa.float32()),  # the pair's share of its batch's wall time
        pa.field("error", pa.string()),  # null when the pair was processed
        pa.field("n_violations", pa.int32(), nullable=False),  # spans withheld by the verbatim check
        pa.field("extractor", pa.string(), nullable=False),
        pa.field("model_id", pa.string()),
        pa.field("model_revision", pa.string()),
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("extra", pa.string()),  # unknown pairs-file fields, as a JSON object
        # hash of what the extractor saw (query, chunk text, paper id, chunk offset): an incremental run
        # reuses a pair's result only when this and the extractor's fingerprint are unchanged
        pa.field("input_hash", pa.string()),
    ],
)

# The key of each table a night is published as (engine/lake.py): a published table holds one row per key of the
# night published last, and declares these columns its Iceberg identifier fields.
PUBLISHED_KEYS: dict[str, tuple[str, ...]] = {
    "chunks": ("chunk_id",),
    "retrieval": ("query_id", "chunk_id"),
    "pairs": ("pair_id",),
    "spans": ("pair_id", "start", "end"),
}


class QuarantineReason:
    """Closed vocabulary of reasons a paper is set aside instead of processed."""

    EMPTY = "empty"
    INVALID_UTF8 = "invalid_utf8"
    NUL_BYTES = "nul_bytes"
    BINARY = "binary"
    TOO_LARGE = "too_large"
    DUPLICATE_ID = "duplicate_id"
    MISSING_ID = "missing_id"
    MISSING_TEXT = "missing_text"
    INVALID_RECORD = "invalid_record"
    READ_ERROR = "read_error"
    CHUNKER_ERROR = "chunker_error"
    # input paths that are never opened
    NOT_A_REGULAR_FILE = "not_a_regular_file"  # a FIFO, socket or device (stat only)
    BROKEN_SYMLINK = "broken_symlink"  # a symlink whose target does not exist
    SYMLINK_LOOP = "symlink_loop"  # a symlinked folder that leads to one of its own ancestors
    DUPLICATE_PATH = "duplicate_path"  # a symlinked folder that leads to a folder read under another path
    UNDECODABLE_NAME = "undecodable_name"  # a file or folder name that is not UTF-8 (shown with \\x escapes)

    ALL = frozenset(v for k, v in dict(locals()).items() if k.isupper())  # every reason above


# --- small tables between stages ---------------------------------------------------------------------------

# A query file, read (``records``): one row per usable query.
QUERIES = pa.schema([pa.field("query_id", pa.string(), nullable=False), pa.field("query", pa.string())])

# Queries generated by ``querygen`` (three per sampled chunk), with the chunk they came from.
GENERATED_QUERIES = _schema(
    "generated_queries",
    [
        pa.field("query_id", pa.string()), pa.field("query", pa.string()), pa.field("question", pa.string()),
        pa.field("question_type", pa.string()), pa.field("paper_id", pa.string()), pa.field("chunk_id", pa.string()),
        pa.field("chunk_index", pa.int32()), pa.field("model_id", pa.string()), pa.field("error", pa.string()),
    ],
)

# The chunk ``querygen`` picked for each sampled paper.
PICKED_CHUNKS = pa.schema([
    ("chunk_id", pa.string()), ("paper_id", pa.string()), ("chunk_index", pa.int32()), ("text", pa.large_string()),
    ("heading_path", pa.list_(pa.string()))])

# Papers a chunk run with ``previous`` found unchanged (carried, not chunked again); staging only.
UNCHANGED_PAPERS = pa.schema([pa.field("paper_id", pa.string(), nullable=False), pa.field("source", pa.string())])

# Silver training data: one row per (question, chunk) with the teacher's verbatim spans.
SILVER = _schema(
    "silver",
    [
        pa.field("question", pa.string(), nullable=False),
        pa.field("paper_id", pa.string()),
        pa.field("chunk_id", pa.string()),
        pa.field("chunk", pa.large_string(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),  # 1 when the pair has spans
        pa.field(
            "spans",
            pa.list_(pa.struct([("start", pa.int64()), ("end", pa.int64()), ("text", pa.large_string())])),
            nullable=False,
        ),
        pa.field("source", pa.string(), nullable=False),  # gold | retrieved
        pa.field("rank", pa.int32()),  # retrieval rank, null when retrieval missed the gold chunk
        pa.field("teacher_model", pa.string()),
        pa.field("query_id", pa.string(), nullable=False),
    ],
)

SILVER_WINDOWS = _schema(
    "silver_windows",
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("chunk_id", pa.string()),
        pa.field("window", pa.int32(), nullable=False),  # 0-based window index within the pair
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("attention_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("labels", pa.list_(pa.int8()), nullable=False),  # 1 evidence, 0 context, -100 ignored
    ],
)

# The pairs a training run read, as stored in its run folder (train_pairs/, eval_pairs/).
TRAIN_PAIRS = _schema(
    "train_pairs",
    [
        pa.field("pair_index", pa.int64(), nullable=False),  # row order of the input, after skipped rows
        pa.field("query_id", pa.string(), nullable=False),  # the input's, else a hash of the question
        pa.field("chunk_id", pa.string(), nullable=False),  # the input's, else a hash of the chunk text
        pa.field("question", pa.large_string(), nullable=False),
        pa.field("chunk", pa.large_string(), nullable=False),
        pa.field("spans", pa.list_(pa.struct([("start", pa.int64()), ("end", pa.int64())])), nullable=False),
    ],
)

# Packed training batches (in memory, fed to Ray Train through Ray Data; not written to the run folder).
TRAIN_BATCHES = pa.schema([
    pa.field("batch", pa.int32(), nullable=False),
    pa.field("n_tokens", pa.int64(), nullable=False),  # real (unpadded) tokens
    pa.field("input_ids", pa.list_(pa.list_(pa.int32())), nullable=False),
    pa.field("labels", pa.list_(pa.list_(pa.int8())), nullable=False),
])


def schema_version_of(schema: pa.Schema) -> str | None:
    """The schema version recorded in a schema's (or Parquet file's) metadata."""
    value = (schema.metadata or {}).get(_META_VERSION)
    return value.decode() if value is not None else None


def table_name_of(schema: pa.Schema) -> str | None:
    value = (schema.metadata or {}).get(_META_TABLE)
    return value.decode() if value is not None else None


def to_table(rows: Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Build a table with exactly ``schema`` from row dicts (extra keys are an error)."""
    rows = list(rows)
    names = set(schema.names)
    for row in rows:
        if extra := set(row) - names:
            raise ValueError(f"{table_name_of(schema)}: unknown columns {sorted(extra)}")
    return pa.Table.from_pylist(rows, schema=schema)


def group_by(rows: Iterable[dict[str, Any]], key: str = "pair_id") -> dict[Any, list[dict[str, Any]]]:
    """Rows grouped by ``key`` (removed from each row), in their order: spans by pair, for example."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.pop(key), []).append(row)
    return groups


def stable_hash(*parts: str | bytes, size: int = 16) -> str:
    """Hex blake2b over length-prefixed parts: stable across runs, machines and Python versions."""
    h = hashlib.blake2b(digest_size=size)
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def config_hash(config: Mapping[str, Any]) -> str:
    """Hash of a JSON-serialisable config, independent of key order."""
    return stable_hash(json.dumps(config, sort_keys=True, separators=(",", ":")), size=8)


def chunk_id(paper_id: str, text: str | bytes, chunker_config_hash: str, occurrence: int = 0) -> str:
    """Deterministic chunk id of paper id, text and chunker config; ``occurrence`` numbers a paper's chunks of
    identical text, so ids never depend on offsets (an earlier edit keeps later chunks' ids)."""
    return stable_hash(paper_id, text, chunker_config_hash, str(occurrence))


def pair_input_hash(query: str | None, chunk: str | None, paper_id: str | None, chunk_start: int | None) -> str:
    """What an extractor's output for a pair depends on, besides the extractor itself."""
    return stable_hash(query or "", chunk or "", paper_id or "", str(chunk_start), size=10)


def text_chunk_id(text: str) -> str:
    """Chunk id for a pairs-file chunk that has no id of its own: a hash of its text."""
    return "t-" + stable_hash("chunk-text", text)


def pair_id(query_id: str, chunk_id: str) -> str:
    """Deterministic id of a (query, chunk) pair."""
    return stable_hash(query_id, chunk_id, size=10)


def query_id_for(query: str) -> str:
    """The id a query gets when it comes without one."""
    return "q-" + stable_hash(query, size=6)
