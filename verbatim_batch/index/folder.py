"""An index folder on disk: FAISS (``dense/``), BM25 (``bm25/``) and ``ids.parquet`` (row -> chunk), built
from an embeddings table, or updated from the index of the run the embeddings carried vectors from."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..runs import CARRIED_PREFIX, read_manifest
from ..tables import stable_hash


def build_index_files(embeddings_dir: str, chunks_dir: str, folder: str, spec, bm25: bool) -> dict[str, Any]:
    """Build FAISS (+ BM25) into ``folder``: ``dense/``, ``bm25/``, ``ids.parquet`` (row -> chunk)."""
    import numpy as np

    from . import build_dense, save_dense

    files = [storage.join(embeddings_dir, f) for f in storage.listdir(embeddings_dir) if f.endswith(".parquet")]
    metas = [storage.parquet_file(f) for f in files]
    n = sum(m.metadata.num_rows for m in metas)
    if n == 0:
        raise ValueError(f"{embeddings_dir} holds no embeddings")
    dim = metas[0].schema_arrow.field("vector").type.list_size

    def batches():
        for f in files:
            for rb in storage.parquet_file(f).iter_batches(columns=["vector"], batch_size=65_536):
                col = rb.column(0)
                flat = col.values.to_numpy(zero_copy_only=False)
                yield np.ascontiguousarray(flat.reshape(len(col), col.type.list_size), dtype=np.float32)

    t0 = time.perf_counter()
    index, resolved = build_dense(batches, n, dim, spec)
    t_dense = time.perf_counter() - t0
    ids = pa.concat_tables(storage.read_parquet(f, columns=["chunk_id", "paper_id"]) for f in files)
    ids = ids.append_column("row", pa.array(range(n), pa.int64()))
    with storage.local_dir(folder) as local:  # FAISS and bm25s write local files; uploaded when remote
        save_dense(index, os.path.join(local, "dense"))
        timings = {"dense_build": t_dense, **_write_ids_and_bm25(ids, chunks_dir, local, bm25)}
    return {"n": n, "dim": dim, "spec": dataclasses.asdict(resolved), "timings": timings, "update": "rebuilt"}


def _write_ids_and_bm25(ids: pa.Table, chunks_dir: str, folder: str, bm25: bool) -> dict[str, float]:
    """``ids.parquet`` (row -> chunk) and the BM25 index over the chunk texts in row order (``folder``: local)."""
    from . import Bm25Index

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


def _vectors(table: pa.Table):
    import numpy as np

    col = table["vector"].combine_chunks()
    flat = col.values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.reshape(len(col), col.type.list_size), dtype=np.float32)


def update_index_files(previous: str, embeddings_dir: str, chunks_dir: str, folder: str, bm25: bool,
                       max_drift: float, since_rebuild: tuple[int, int]) -> dict[str, Any] | None:
    """Update ``previous``'s index for an embed run that carried vectors from the one it indexed.

    Kept rows are the carried chunks (same id, same vector); everything else the old index holds is
    removed and the newly embedded chunks are added after the kept rows. Returns None when the drift
    calls for a rebuild (or the old index cannot tell what it holds). Drift is counted since the last
    rebuild (``since_rebuild``: vectors then, vectors removed or added since), not per night.
    """
    import numpy as np

    from . import load_dense, plan_update, save_dense, update_dense

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
    new_tables = [storage.read_parquet(storage.join(embeddings_dir, f), columns=["chunk_id", "paper_id", "vector"])
                  for f in fresh]
    n_new = sum(t.num_rows for t in new_tables)
    removed = np.flatnonzero(~keep)
    base_n, changed = since_rebuild
    action, drift = plan_update(base_n, changed + len(removed), n_new, max_drift)
    if action == "rebuilt":
        return None
    dim = storage.parquet_file(storage.join(embeddings_dir, files[0])).schema_arrow.field("vector").type.list_size
    with storage.local_dir(folder) as local:
        if action == "unchanged":
            storage.copytree(storage.join(previous, "dense"), os.path.join(local, "dense"))
            if bm25 and storage.isdir(storage.join(previous, "bm25")):
                storage.copytree(storage.join(previous, "bm25"), os.path.join(local, "bm25"))
                bm25 = False
            ids = old_ids
        else:
            prev_local = storage.local_copy(previous, read_manifest(previous)["run_id"])
            index = load_dense(os.path.join(prev_local, "dense"), mmap=False)
            vectors = np.concatenate([_vectors(t) for t in new_tables]) if n_new else np.zeros((0, dim), np.float32)
            index = update_dense(index, removed, vectors)
            save_dense(index, os.path.join(local, "dense"))
            kept = old_ids.filter(pa.array(keep)).select(["chunk_id", "paper_id"])
            added = [t.select(["chunk_id", "paper_id"]) for t in new_tables]
            ids = pa.concat_tables([kept, *added])
            ids = ids.append_column("row", pa.array(range(ids.num_rows), pa.int64()))
        timings = {"dense_update": time.perf_counter() - t0, **_write_ids_and_bm25(ids, chunks_dir, local, bm25)}
    return {"n": ids.num_rows, "dim": dim, "timings": timings, "update": action, "drift": drift,
            "removed": len(removed), "added": n_new, "since_rebuild": [base_n, changed + len(removed) + n_new]}


def index_fingerprint(ids_path: str, embed_config: dict[str, Any], spec: dict[str, Any], bm25: bool) -> str:
    """Identifies what an index answers: the vectors' model and the chunks in row order."""
    ids = storage.read_parquet(ids_path, columns=["chunk_id"])["chunk_id"].to_pylist()
    return stable_hash(json.dumps([embed_config.get("embedder_hash"), embed_config.get("model_revision"), spec, bm25],
                                  sort_keys=True), *ids)
