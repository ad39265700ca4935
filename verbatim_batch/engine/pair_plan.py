"""Extract's pairs from a retrieval run, planned in Ray tasks: the driver does O(files) work, not O(rows).

``build_pairs`` (``stages.extract``) joins retrieval x queries x chunks on the driver (GBs of text at a million
pairs); ``PairPlanner`` does it in tasks, the driver holding refs and one array of pair ids: **keys** (``work``: per
retrieval file, the key rows split into ``P`` partitions by a hash of the query id), **chunks** (per chunk file, the
wanted rows, in the object store), **carry** (``unchanged``: per partition, input hash and rank against the previous
run's pairs) and **rows** (``dataset``: per partition, a streaming task yields the extractor's blocks, whole queries
for an I/O extractor, to ``ray.data.from_arrow_refs``). Rows equal ``build_pairs``'s, errors included
(tests/test_pair_plan.py); below ``IN_DRIVER_ROWS``, with Ray not up, the same functions run in this process.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import storage
from verbatim_batch.core.records import read_queries
from verbatim_batch.core.tables import PAIR_INPUT, pair_id, pair_input_hash
from verbatim_batch.engine.batches import drop_keys
from verbatim_batch.engine.resources import Resources, ray_args

PARTITION_PAIRS = 50_000  # pairs per planning partition (each hashes the wanted chunk ids once)
MAX_PARTITIONS = 256
IN_DRIVER_ROWS = 100_000  # retrieval rows up to which a driver without Ray plans in-process
# Pairs per block (a block costs the driver about 50 kB of Ray bookkeeping): whole ``batch_rows`` batches for a
# model extractor; fewer, whole queries, for an I/O one (a block is one write, what a killed run redoes).
MODEL_BLOCK_PAIRS = 8192
IO_BLOCK_PAIRS = 1024
KEY_COLUMNS = ["query_id", "rank", "chunk_id", "paper_id"]
CHUNK_COLUMNS = ["chunk_id", "paper_id", "chunk_index", "start", "text"]
_KEYS = pa.schema([("query_id", pa.string()), ("rank", pa.int32()), ("chunk_id", pa.string()),
                   ("paper_id", pa.string()), ("pair_id", pa.string())])
_CHUNKS = pa.schema([("chunk_id", pa.string()), ("chunk_index", pa.int32()), ("start", pa.int64()),
                     ("text", pa.large_string())])


def _parquet_files(folder: str) -> list[str]:
    """A table folder's files, as pyarrow reads the folder (names starting with ``_`` or ``.`` are not data)."""
    return [storage.join(folder, f) for f in storage.listdir(folder)
            if f.endswith(".parquet") and not f.startswith(("_", "."))]


def _rows_in(files: list[str]) -> int:
    """Rows of Parquet files, from their footers."""
    return sum(storage.parquet_file(f).metadata.num_rows for f in files)


# --- the task functions (plain functions: a Ray task when Ray is up, else a call in this process) ---------


def _retrieval_keys(path: str, method: str, top_k: int, parts: int) -> tuple:
    """One retrieval file -> ``parts`` key pieces (by query id), its pair ids, and ``(rows, methods)``."""
    table = storage.read_parquet(path, columns=[*KEY_COLUMNS, "method"])
    methods = sorted(set(pc.unique(table["method"]).to_pylist()))
    table = table.filter(pc.and_(pc.equal(table["method"], method), pc.less_equal(table["rank"], top_k)))
    keys = table.select(KEY_COLUMNS)
    ids = pa.array([pair_id(q, c) for q, c in zip(keys["query_id"].to_pylist(), keys["chunk_id"].to_pylist(),
                                                   strict=True)], pa.string())
    keys = keys.append_column("pair_id", ids).cast(_KEYS)
    queries = pc.unique(keys["query_id"])
    buckets = pa.array([zlib.crc32(q.encode("utf-8")) % parts for q in queries.to_pylist()], pa.int32())
    part = pc.take(buckets, pc.index_in(keys["query_id"], value_set=queries))
    pieces = [keys.filter(pc.equal(part, p)) for p in range(parts)]
    return (*pieces, ids, (keys.num_rows, methods))


def _read_query_table(path: str) -> pa.Table:
    return read_queries(path)[0]


def _wanted_chunks(*pieces: pa.Table) -> pa.Array:
    """The chunk ids some pair wants."""
    ids = [p["chunk_id"] for p in pieces if p.num_rows]
    return _flat(pc.unique(pa.chunked_array(ids, pa.string()))) if ids else pa.array([], pa.string())


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _chunk_rows(path: str, wanted: pa.Array) -> pa.Table:
    """A chunk file's rows of the wanted chunk ids (``_CHUNKS``), the id column read first."""
    ids = storage.read_parquet(path, columns=["chunk_id"])["chunk_id"]
    mask = pc.is_in(ids, value_set=wanted)
    if not pc.any(mask).as_py():
        return _CHUNKS.empty_table()
    table = storage.read_parquet(path, columns=CHUNK_COLUMNS).filter(mask)
    return table.select(_CHUNKS.names).cast(_CHUNKS)


def _previous_keys(pairs_dir: str) -> pa.Table:
    """The previous run's pairs that can carry: (pair_id, input_hash, rank), error-free, with a hash."""
    old = storage.read_parquet(pairs_dir, columns=["pair_id", "input_hash", "rank", "error"])
    old = old.filter(pc.and_(pc.is_null(old["error"]), pc.is_valid(old["input_hash"])))
    return old.select(["pair_id", "input_hash", "rank"])


def _attach(pieces: list[pa.Table], queries: pa.Table, chunks: list[pa.Table], skip: pa.Array | None) -> pa.Table:
    """Key pieces of one partition -> ``PAIR_INPUT`` rows (the to-do ones: ``skip`` dropped), sorted by
    (query_id, rank), query and chunk text attached; a query or chunk not found is an error row."""
    keys = pa.concat_tables([p.cast(_KEYS) for p in pieces]) if pieces else _KEYS.empty_table()
    if skip is not None and len(skip):
        keys = drop_keys(keys, "pair_id", skip)
    keys = keys.sort_by([("query_id", "ascending"), ("rank", "ascending")])
    query = pc.take(queries["query"], pc.index_in(keys["query_id"], value_set=queries["query_id"]))
    known = pa.concat_tables([c.cast(_CHUNKS) for c in chunks]) if chunks else _CHUNKS.empty_table()
    at = pc.index_in(keys["chunk_id"], value_set=known["chunk_id"].combine_chunks())
    found = known.take(at)  # null rows where the chunk is not in the chunk table
    errors: list[str | None] = [None] * keys.num_rows
    no_query, no_chunk = pc.is_null(query), pc.is_null(found["text"])
    if pc.any(pc.or_(no_query, no_chunk)).as_py():
        for i, (nq, nc, qid, cid) in enumerate(zip(no_query.to_pylist(), no_chunk.to_pylist(),
                                                   keys["query_id"].to_pylist(), keys["chunk_id"].to_pylist(),
                                                   strict=True)):
            if nq:
                errors[i] = f"query_not_found: query_id {qid!r} is not in the query file"
            elif nc:
                errors[i] = f"chunk_not_found: chunk_id {cid!r} is not in the chunk table"
    n = keys.num_rows
    return pa.table({
        "pair_id": keys["pair_id"], "query_id": keys["query_id"], "query": query, "chunk": found["text"],
        "chunk_id": keys["chunk_id"], "paper_id": keys["paper_id"], "chunk_index": found["chunk_index"],
        "chunk_start": found["start"], "rank": keys["rank"], "relevant": pa.nulls(n, pa.bool_()),
        "extra": pa.nulls(n, pa.string()), "input_error": pa.array(errors, pa.string())}, schema=PAIR_INPUT)


def input_hashes(pairs: pa.Table) -> pa.Array:
    """``tables.pair_input_hash`` of every pair (what carry compares)."""
    return pa.array([pair_input_hash(q, c, p, s) for q, c, p, s in zip(
        pairs["query"].to_pylist(), pairs["chunk"].to_pylist(), pairs["paper_id"].to_pylist(),
        pairs["chunk_start"].to_pylist(), strict=True)], pa.string())


def _resolved(values: list) -> list:
    """A list of refs (passed inside a list, Ray does not resolve them) as their values."""
    if "ray" not in sys.modules:  # called in this process without Ray: values already
        return values
    import ray

    refs = [i for i, v in enumerate(values) if isinstance(v, ray.ObjectRef)]
    if not refs:
        return values
    got = dict(zip(refs, ray.get([values[i] for i in refs]), strict=True))
    return [got.get(i, v) for i, v in enumerate(values)]


def _unchanged(queries: pa.Table, chunks: list[pa.Table], previous: pa.Table, *pieces: pa.Table) -> pa.Array:
    """Pair ids of one partition whose (input hash, rank) equal the previous run's."""
    pairs = _attach(list(pieces), queries, _resolved(chunks), None)
    at = pc.index_in(pairs["pair_id"], value_set=previous["pair_id"])
    old = previous.take(at)
    same = pc.and_(pc.equal(old["input_hash"], input_hashes(pairs)), pc.equal(old["rank"], pairs["rank"]))
    return _flat(pairs["pair_id"].filter(pc.fill_null(same, False)))


def query_blocks(pairs: pa.Table, rows: int) -> list[pa.Table]:
    """Blocks of about ``rows`` pairs that never split one query's run of pairs (LLM requests group them)."""
    qids = pairs["query_id"].to_pylist()
    blocks, start = [], 0
    for i in range(1, len(qids) + 1):
        if i == len(qids) or (i - start >= rows and qids[i] != qids[i - 1]):
            blocks.append(pairs.slice(start, i - start))
            start = i
    return blocks or [pairs]


def _blocks(queries: pa.Table, chunks: list[pa.Table], skip: pa.Array | None, query_grouped: bool,
            batch_rows: int, *pieces: pa.Table) -> Iterator[pa.Table]:
    """One partition's to-do pairs as the extractor's blocks."""
    pairs = _attach(list(pieces), queries, _resolved(chunks), skip)
    if not pairs.num_rows:
        return
    if query_grouped:
        blocks = query_blocks(pairs, max(batch_rows, IO_BLOCK_PAIRS))
    else:
        size = max(1, MODEL_BLOCK_PAIRS // batch_rows) * batch_rows
        blocks = [pairs.slice(i, size) for i in range(0, pairs.num_rows, size)]
    for block in blocks:  # noqa: UP028 - one object per block (``yield from`` fails in a Ray streaming task)
        yield block


# --- the driver side --------------------------------------------------------------------------------------

_REMOTE: dict[Any, Any] = {}
PLAN_TASK = Resources(cpus=1)  # each planning task: one file or partition


def _ray_up() -> bool:
    """Whether this process has Ray up, without importing it (a night with nothing to do never imports Ray)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _call(fn, *args, num_returns: int | str = 1):
    """``fn(*args)``: a Ray task when Ray is up (refs back), else a call here (values back)."""
    if not _ray_up():
        out = fn(*args)
        return list(out) if num_returns not in (1, "streaming") else out
    import ray

    if fn not in _REMOTE:
        _REMOTE[fn] = ray.remote(fn)
    return _REMOTE[fn].options(**ray_args(PLAN_TASK, num_returns=num_returns, max_retries=2)).remote(*args)


def _get(value):
    """The value of a ref (or list of refs), a failed task's own exception raised, not Ray's wrapper."""
    if "ray" not in sys.modules:  # no ref was ever made here: values, as computed in this process
        return value
    import ray

    if isinstance(value, list) and not any(isinstance(v, ray.ObjectRef) for v in value):
        return value
    if not isinstance(value, (list, ray.ObjectRef)):
        return value
    try:
        return ray.get(value)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise


def _put(value):
    if not _ray_up():
        return value
    import ray

    return value if isinstance(value, ray.ObjectRef) else ray.put(value)


class PairPlanner:
    """The pairs of a retrieval run, planned in tasks (module docstring); the extract stage's ``Work.data``."""

    def __init__(self, retrieval_dir: str, queries: str, chunks_dir: str, method: str, top_k: int,
                 start_ray) -> None:
        self.files = _parquet_files(retrieval_dir)
        self.chunk_files = _parquet_files(chunks_dir)
        rows = _rows_in(self.files)
        if not _ray_up() and rows > IN_DRIVER_ROWS:
            start_ray()
        self.parts = max(1, min(MAX_PARTITIONS, math.ceil(rows / PARTITION_PAIRS)))
        self.queries = _call(_read_query_table, queries)
        outs = [_call(_retrieval_keys, f, method, top_k, self.parts, num_returns=self.parts + 2)
                for f in self.files]
        self.pieces = [[o[p] for o in outs] for p in range(self.parts)]  # partition -> a piece per file
        metas = _get([o[-1] for o in outs])
        self.n = sum(m[0] for m in metas)
        methods = sorted({m for _, ms in metas for m in ms})
        if method not in methods:
            raise ValueError(f"retrieval table has no {method!r} rows (methods: {sorted(methods)})")
        ids = _get([o[-2] for o in outs])
        self.keys = pa.chunked_array(ids, pa.string())  # as fetched (no second copy)
        _get(_call(_count, self.queries))  # a bad query file fails here, as it did before
        self._chunks: list | None = None

    def chunks(self) -> list:
        """Per chunk file, its wanted rows (computed once, on first need)."""
        if self._chunks is None:
            wanted = _put(_call(_wanted_chunks, *[p for piece in self.pieces for p in piece]))
            self._chunks = [_call(_chunk_rows, f, wanted) for f in self.chunk_files]
        return self._chunks

    def unchanged(self, previous_pairs_dir: str) -> pa.Array:
        """Pair ids whose input hash and rank equal the previous run's (see ``_unchanged``)."""
        previous = _call(_previous_keys, previous_pairs_dir)
        queries, chunks = _put(self.queries), [_put(c) for c in self.chunks()]
        got = _get([_call(_unchanged, queries, chunks, previous, *piece) for piece in self.pieces])
        return pa.chunked_array(got, pa.string()).combine_chunks() if got else pa.array([], pa.string())

    def table(self, skip: pa.Array | None = None) -> pa.Table:
        """Every to-do pair as one table on the driver (for tests and inspection; runs use ``dataset``)."""
        chunks, queries = _get(self.chunks()), _get(self.queries)
        parts = [_attach(_get(piece), queries, chunks, skip) for piece in self.pieces]
        return pa.concat_tables(parts) if parts else PAIR_INPUT.empty_table()

    def dataset(self, skip: pa.Array, query_grouped: bool, batch_rows: int):
        """The to-do pairs as a ``ray.data.Dataset`` of the extractor's blocks; no row passes through here."""
        import ray

        queries, chunks, skip_ref = _put(self.queries), [_put(c) for c in self.chunks()], ray.put(skip)
        gens = [_call(_blocks, queries, chunks, skip_ref, query_grouped, batch_rows, *piece,
                      num_returns="streaming") for piece in self.pieces]
        refs = [ref for gen in gens for ref in gen]
        if not refs:
            return ray.data.from_arrow(PAIR_INPUT.empty_table())
        return ray.data.from_arrow_refs(refs)


def _count(table: pa.Table) -> int:
    return table.num_rows
