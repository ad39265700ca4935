"""An index folder on disk: FAISS (``dense/``), BM25 (``bm25/``), ``ids.parquet`` (row -> chunk) and, when a
chunk has more than one vector (one per window), ``owners.npy`` (FAISS row -> chunk row; a chunk's vectors
next to each other, its first window first). Built from an embeddings table, or updated from the index of the
run the embeddings carried vectors from."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from verbatim_batch.core import storage
from verbatim_batch.core.runs import CARRIED_PREFIX, read_manifest
from verbatim_batch.core.tables import stable_hash

OWNERS = "owners.npy"  # FAISS row -> chunk row (ids.parquet's ``row``); absent: the same row


def _fixed(col) -> Any:
    """A fixed-size-list column as a float32 (rows, dim) array."""
    import numpy as np

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    flat = col.values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.reshape(len(col), col.type.list_size), dtype=np.float32)


def window_counts(table_or_batch) -> Any:
    """Vectors per chunk row (1 for an embeddings table written before windows)."""
    import numpy as np

    if "windows" not in table_or_batch.schema.names:
        return np.ones(table_or_batch.num_rows, np.int64)
    return table_or_batch.column("windows").to_numpy(zero_copy_only=False).astype(np.int64)


def chunk_vectors(batch) -> Any:
    """The vectors of a batch of embeddings rows, chunk by chunk, each chunk's first window first."""
    import numpy as np

    first = _fixed(batch.column("vector"))
    if "window_vectors" not in batch.schema.names:
        return first
    more = batch.column("window_vectors")
    more = more.combine_chunks() if isinstance(more, pa.ChunkedArray) else more
    counts = pc.list_value_length(more).to_numpy(zero_copy_only=False).astype(np.int64)
    if not counts.sum():
        return first
    owner = np.concatenate([np.arange(len(first)), np.repeat(np.arange(len(first)), counts)])
    return np.concatenate([first, _fixed(pc.list_flatten(more))])[np.argsort(owner, kind="stable")]


def write_owners(folder: str, counts) -> None:
    """``owners.npy`` in (local) ``folder`` when some chunk has more than one vector."""
    import numpy as np

    counts = np.asarray(counts, np.int64)
    if len(counts) and counts.max() > 1:
        np.save(os.path.join(folder, OWNERS), np.repeat(np.arange(len(counts)), counts))


def read_owners(folder: str, n_vectors: int, n_chunks: int) -> Any:
    """The FAISS row -> chunk row map of an index folder; None when each chunk has one vector. A map that does
    not fit the index (or is no array) is refused (one line), read bounded by the size the index implies."""
    import io

    import numpy as np

    path = storage.join(folder, OWNERS)
    if not storage.exists(path):
        return None
    try:
        owners = np.load(io.BytesIO(storage.read_bytes_bounded(path, 8 * n_vectors + 4096)), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a row map ({str(exc).splitlines()[0][:120] if str(exc) else 'damaged'})") \
            from None
    fits = (isinstance(owners, np.ndarray) and owners.ndim == 1 and len(owners) == n_vectors
            and owners.dtype.kind in "iu")
    if fits and len(owners):  # a chunk's vectors next to each other, chunks in row order
        fits = int(owners.min()) >= 0 and int(owners.max()) < n_chunks and not (np.diff(owners) < 0).any()
    if not fits:
        raise ValueError(f"{path}: does not map the index's {n_vectors} vectors to its {n_chunks} chunks")
    return np.asarray(owners, np.int64)


def build_index_files(embeddings_dir: str, chunks_dir: str, folder: str, spec, bm25: bool) -> dict[str, Any]:
    """Build FAISS (+ BM25) into ``folder``: ``dense/``, ``bm25/``, ``ids.parquet`` (row -> chunk)."""
    import numpy as np

    from verbatim_batch.retrieval.index import build_dense, save_dense

    files = [storage.join(embeddings_dir, f) for f in storage.listdir(embeddings_dir) if f.endswith(".parquet")]
    metas = [storage.parquet_file(f) for f in files]
    n = sum(m.metadata.num_rows for m in metas)
    if n == 0:
        raise ValueError(f"{embeddings_dir} holds no embeddings")
    dim = metas[0].schema_arrow.field("vector").type.list_size
    windowed = all("window_vectors" in m.schema_arrow.names for m in metas)
    columns = ["vector", "window_vectors"] if windowed else ["vector"]

    def batches():
        for f in files:
            for rb in storage.parquet_file(f).iter_batches(columns=columns, batch_size=16_384):
                yield chunk_vectors(rb)

    ids = pa.concat_tables(storage.read_parquet(f, columns=["chunk_id", "paper_id"] + ["windows"] * windowed)
                           for f in files)
    counts = window_counts(ids) if windowed else np.ones(n, np.int64)
    t0 = time.perf_counter()
    index, resolved = build_dense(batches, int(counts.sum()), dim, spec)
    t_dense = time.perf_counter() - t0
    ids = ids.select(["chunk_id", "paper_id"]).append_column("row", pa.array(range(n), pa.int64()))
    with storage.local_dir(folder) as local:  # FAISS and bm25s write local files; uploaded when remote
        save_dense(index, os.path.join(local, "dense"))
        write_owners(local, counts)
        timings = {"dense_build": t_dense, **_write_ids_and_bm25(ids, chunks_dir, local, bm25)}
    return {"n": n, "vectors": int(counts.sum()), "multi_window_chunks": int((counts > 1).sum()), "dim": dim,
            "spec": dataclasses.asdict(resolved), "timings": timings, "update": "rebuilt"}


def _write_ids_and_bm25(ids: pa.Table, chunks_dir: str, folder: str, bm25: bool) -> dict[str, float]:
    """``ids.parquet`` (row -> chunk) and the BM25 index over the chunk texts in row order (``folder``: local)."""
    from verbatim_batch.retrieval.index import Bm25Index

    if len(set(ids["chunk_id"].to_pylist())) != ids.num_rows:
        raise ValueError("duplicate chunk ids in the embeddings table")
    pq.write_table(ids, os.path.join(folder, "ids.parquet"))
    if not bm25:
        return {}
    t0 = time.perf_counter()
    texts = storage.read_parquet(chunks_dir, columns=["chunk_id", "text"])
    joined = ids.select(["chunk_id", "row"]).join(texts, "chunk_id", join_type="left outer").sort_by("row")
    missing = joined["text"].null_count
    if missing:
        raise ValueError(f"{missing} embedded chunks are missing from {chunks_dir}")
    Bm25Index.build(joined["text"].to_pylist()).save(os.path.join(folder, "bm25"))
    return {"bm25_build": time.perf_counter() - t0}


def update_index_files(previous: str, embeddings_dir: str, chunks_dir: str, folder: str, bm25: bool,
                       max_drift: float, since_rebuild: tuple[int, int]) -> dict[str, Any] | None:
    """Update ``previous``'s index for an embed run that carried vectors from it (carried chunks kept, the rest removed,
    new ones after); None when the drift since the last rebuild (``since_rebuild``) calls for a rebuild, or the old
    index cannot tell what it holds."""
    import numpy as np

    from verbatim_batch.retrieval.index import load_dense, plan_update, save_dense, update_dense

    t0 = time.perf_counter()
    files = [f for f in storage.listdir(embeddings_dir) if f.endswith(".parquet")]
    carried = pa.concat_tables(
        [storage.read_parquet(storage.join(embeddings_dir, f), columns=["chunk_id"]) for f in files
         if f.startswith(CARRIED_PREFIX)] or [pa.table({"chunk_id": pa.array([], pa.string())})])["chunk_id"]
    fresh = [f for f in files if not f.startswith(CARRIED_PREFIX)]
    old_ids = storage.read_parquet(storage.join(previous, "ids.parquet")).sort_by("row")
    keep = pc.is_in(old_ids["chunk_id"], value_set=carried).to_numpy(zero_copy_only=False)
    if int(keep.sum()) != len(carried):
        return None  # carried vectors the old index does not have: it indexed another embed run
    new_tables = [storage.read_parquet(storage.join(embeddings_dir, f)) for f in fresh]
    old_owners = read_owners(previous, read_manifest(previous)["counts"].get("vectors", len(old_ids)), len(old_ids))
    old_counts = np.bincount(old_owners, minlength=len(old_ids)) if old_owners is not None \
        else np.ones(len(old_ids), np.int64)
    new_counts = np.concatenate([window_counts(t) for t in new_tables]) if new_tables else np.zeros(0, np.int64)
    keep_vectors = np.repeat(keep, old_counts)  # a chunk's vectors are next to each other, in chunk-row order
    removed = np.flatnonzero(~keep_vectors)
    n_new = int(new_counts.sum())
    base_n, changed = since_rebuild
    # drift counts since the last build, but the action is tonight's: nothing removed or added is ``unchanged``
    action, drift = ("unchanged", changed / max(base_n, 1)) if not len(removed) and not n_new else \
        plan_update(base_n, changed + len(removed), n_new, max_drift)
    if action == "rebuilt":
        return None
    dim = storage.parquet_file(storage.join(embeddings_dir, files[0])).schema_arrow.field("vector").type.list_size
    counts = old_counts
    with storage.local_dir(folder) as local:
        if action == "unchanged":
            storage.copytree(storage.join(previous, "dense"), os.path.join(local, "dense"))
            if bm25 and storage.isdir(storage.join(previous, "bm25")):
                storage.copytree(storage.join(previous, "bm25"), os.path.join(local, "bm25"))
                bm25 = False
            ids = old_ids
        else:
            prev = read_manifest(previous)
            prev_local = storage.local_copy(previous, f'{prev["run_id"]}@{prev.get("created_at", "")}')
            index = load_dense(os.path.join(prev_local, "dense"), mmap=False)
            vectors = (np.concatenate([chunk_vectors(t) for t in new_tables]) if n_new
                       else np.zeros((0, dim), np.float32))
            index = update_dense(index, removed, vectors)
            save_dense(index, os.path.join(local, "dense"))
            kept = old_ids.filter(pa.array(keep)).select(["chunk_id", "paper_id"])
            added = [t.select(["chunk_id", "paper_id"]) for t in new_tables]
            ids = pa.concat_tables([kept, *added])
            ids = ids.append_column("row", pa.array(range(ids.num_rows), pa.int64()))
            counts = np.concatenate([old_counts[keep], new_counts])
        write_owners(local, counts)
        timings = {"dense_update": time.perf_counter() - t0, **_write_ids_and_bm25(ids, chunks_dir, local, bm25)}
    return {"n": ids.num_rows, "vectors": int(counts.sum()), "multi_window_chunks": int((counts > 1).sum()),
            "dim": dim, "timings": timings, "update": action, "drift": drift, "removed": len(removed),
            "added": n_new, "since_rebuild": [base_n, changed + len(removed) + n_new]}


def index_fingerprint(ids_path: str, embed_config: dict[str, Any], spec: dict[str, Any], bm25: bool) -> str:
    """Identifies what an index answers: the vectors' model and the chunks in row order."""
    ids = storage.read_parquet(ids_path, columns=["chunk_id"])["chunk_id"].to_pylist()
    return stable_hash(json.dumps([embed_config.get("embedder_hash"), embed_config.get("model_revision"), spec, bm25],
                                  sort_keys=True), *ids)
