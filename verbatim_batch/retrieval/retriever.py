"""Batch retrieval: dense, BM25 and hybrid (weighted RRF) top-k for a table of queries.

``Retriever`` loads an index folder once and maps ``(query_id, query)`` batches to ``tables.RETRIEVAL`` rows; dense
scores a chunk by its best window. Hybrid is weighted RRF over ``depth`` candidates per method, so each method's top
hits are ranked by the other too (``fill_missing``: one outside a pool counts just past it). The defaults were set on
the seed papers' labelled queries (benchmarks/history/retrieval.md), where plain RRF ranked below BM25 alone; with
another embedder, measure again (``verbatim-batch evaluate-retrieval``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import Declared, option, runtime
from verbatim_batch.core.tables import RETRIEVAL, query_id_for

METHODS = ("dense", "bm25", "hybrid")
# Hybrid defaults, set on the seed papers (see the module docstring): the CLI's defaults are these.
DEFAULT_WEIGHTS = {"dense": 0.2, "bm25": 1.0}
DEFAULT_RRF_K = 5
DEFAULT_DEPTH = 100


def parse_methods(value: str) -> tuple[str, ...]:
    """``"dense,bm25"`` -> ``("dense", "bm25")``."""
    methods = tuple(m.strip() for m in value.split(",") if m.strip())
    bad = sorted(set(methods) - set(METHODS))
    if bad or not methods:
        raise ValueError(f"expected any of {','.join(METHODS)}, got {value!r}")
    return methods


def parse_weights(value: str) -> dict[str, float]:
    """``"dense=0.2,bm25=1"`` -> ``{"dense": 0.2, "bm25": 1.0}``."""
    out = {}
    for part in value.split(","):
        name, _, weight = part.partition("=")
        try:
            out[name.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"expected name=number pairs like dense=1,bm25=0.5, got {value!r}") from None
    return out


@dataclass(frozen=True)
class RetrieverConfig(Declared):
    """How to retrieve from an index run: which run, chunks per query and method, methods and fusion settings."""

    index_dir: str = ""  # the retrieve job sets it to its --index
    k: int = option(10, "chunks retrieved per query and method", low=1, high=limits.PER_QUERY)
    methods: tuple[str, ...] = option(METHODS, f"any of {','.join(METHODS)}", parse=parse_methods)
    weights: dict[str, float] = option(default_factory=lambda: dict(DEFAULT_WEIGHTS), help=(
        "hybrid RRF weights (set on the seed papers with the bundled MiniLM; measure again with "
        "evaluate-retrieval for another embedder)"), parse=parse_weights)
    rrf_k: int = option(DEFAULT_RRF_K, "RRF constant", low=0, high=limits.PER_QUERY)
    depth: int = option(DEFAULT_DEPTH, "candidates each method ranks before hybrid fusion (at least --k): every "
                        "method's top hits are ranked by the other one too", low=1, high=limits.PER_QUERY)
    fill_missing: bool = True  # a candidate outside a method's pool counts at the rank just past it
    nprobe: int | None = option(None, "IVF lists to probe", low=1, high=limits.ROWS, default_help="the index's")
    device: str = runtime("auto")

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = set(self.methods) - set(METHODS)
        if bad or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {self.methods}")
        unknown = set(self.weights) - {"dense", "bm25"}
        if unknown or any(w < 0 for w in self.weights.values()) or not any(self.weights.values()):
            raise ValueError(f"weights must be non-negative for dense/bm25 with one > 0, got {self.weights}")


def read_index_manifest(index_dir: str) -> dict:
    """The manifest of a committed index run (``runs.read_manifest``), its config parsed."""
    from verbatim_batch.core.runs import read_manifest

    path = storage.join(index_dir, "manifest.json")
    if not storage.exists(path):
        raise FileNotFoundError(f"{index_dir} is not a committed index (no manifest.json)")
    manifest = read_manifest(index_dir)
    manifest["config"] = json.loads(manifest["config"]) if isinstance(manifest.get("config"), str) else \
        manifest.get("config", {})
    return manifest


class Retriever:
    """Loads an index folder once; maps query batches to retrieval rows."""

    def __init__(self, config: RetrieverConfig) -> None:
        from verbatim_batch.retrieval.embedder import Embedder, EmbedderConfig
        from verbatim_batch.retrieval.index import Bm25Index, load_dense

        self.config = config
        manifest = read_index_manifest(config.index_dir)
        # FAISS/bm25s memory-map local files; the copy is cached by run id and commit time (a root that is
        # deleted and made again reuses run ids)
        index_dir = storage.local_copy(config.index_dir, f'{manifest["run_id"]}@{manifest.get("created_at", "")}')
        ids = pq.read_table(os.path.join(index_dir, "ids.parquet"), columns=["chunk_id", "paper_id"])
        self.chunk_ids = ids["chunk_id"].to_pylist()
        self.paper_ids = ids["paper_id"].to_pylist()
        self.dense = self.bm25 = self.embedder = None
        need_dense = "dense" in config.methods or ("hybrid" in config.methods and config.weights.get("dense", 0))
        need_bm25 = "bm25" in config.methods or ("hybrid" in config.methods and config.weights.get("bm25", 0))
        self.owners, self.windows_max = None, 1
        if need_dense:
            from verbatim_batch.retrieval.index.folder import read_owners

            self.dense = load_dense(os.path.join(index_dir, "dense"), nprobe=config.nprobe)
            self.owners = read_owners(index_dir, self.dense.ntotal, len(self.chunk_ids))
            if self.owners is not None:  # a chunk with several windows: search deep enough for ``depth`` chunks
                self.windows_max = int(np.bincount(self.owners).max())
            embed_cfg = dict(manifest["config"]["embedder"])
            embed_cfg["device"] = config.device
            self.embedder = Embedder(EmbedderConfig(**_known_fields(EmbedderConfig, embed_cfg)))
        if need_bm25:
            bm25_dir = os.path.join(index_dir, "bm25")
            if not os.path.exists(bm25_dir):
                raise FileNotFoundError(f"{config.index_dir} was built without a BM25 index")
            self.bm25 = Bm25Index.load(bm25_dir, mmap=True)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from verbatim_batch.retrieval.index import best_window, rrf, search_dense

        cfg = self.config
        depth = max(1, min(max(cfg.depth, cfg.k), len(self.chunk_ids)))  # no deeper than the chunks there are:
        # a --k past them asks for all of them, not for arrays of --k rows per query
        queries = [q or "" for q in batch["query"].to_pylist()]
        qids = batch["query_id"].to_pylist() if "query_id" in batch.column_names else [None] * len(queries)
        qids = [qid or query_id_for(q) for qid, q in zip(qids, queries, strict=True)]
        pools: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if self.dense is not None:
            vectors, _, _ = self.embedder.embed(queries, is_query=True)
            found = search_dense(self.dense, vectors, max(1, min(depth * self.windows_max, self.dense.ntotal)))
            pools["dense"] = best_window(*found, self.owners, depth)
        if self.bm25 is not None:
            pools["bm25"] = self.bm25.search(queries, depth)
        pools = {m: _order_ties(scores, rows, self.chunk_ids) for m, (scores, rows) in pools.items()}
        ranked = {m: [[int(r) for r in row if r >= 0] for row in rows] for m, (_, rows) in pools.items()}
        fused = None
        if "hybrid" in cfg.methods:
            weights = {m: w for m, w in cfg.weights.items() if m in ranked}
            fused = rrf({m: ranked[m] for m in weights}, weights=weights, k=cfg.k, rrf_k=cfg.rrf_k,
                        tie_key=self.chunk_ids.__getitem__,  # ties by chunk id: independent of index order
                        fill_missing=cfg.fill_missing)
        out: dict[str, list] = {name: [] for name in RETRIEVAL.names}

        def emit(qid, rank, row, score, ranks, method):
            for key, value in (
                ("query_id", qid), ("rank", rank), ("chunk_id", self.chunk_ids[row]),
                ("paper_id", self.paper_ids[row]), ("score", float(score)), ("dense_rank", ranks.get("dense")),
                ("bm25_rank", ranks.get("bm25")), ("method", method),
            ):
                out[key].append(value)

        for q, qid in enumerate(qids):
            positions = {m: {row: i + 1 for i, row in enumerate(ranked[m][q])} for m in ranked}
            for method in ("dense", "bm25"):
                if method not in cfg.methods:
                    continue
                scores, rows = pools[method]
                for i in range(min(cfg.k, len(ranked[method][q]))):
                    row = int(rows[q, i])
                    emit(qid, i + 1, row, scores[q, i], {m: positions[m].get(row) for m in positions}, method)
            if fused is not None:
                for i, (row, score, _) in enumerate(fused[q]):
                    emit(qid, i + 1, row, score, {m: positions[m].get(row) for m in positions}, "hybrid")
        return pa.Table.from_pydict(out, schema=RETRIEVAL)


def _order_ties(scores: np.ndarray, rows: np.ndarray, chunk_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Equal scores in chunk-id order, not index-row order: a chunk's rank must not depend on where an
    incremental index update put it. Padding (-1 rows) stays last."""
    scores, rows = scores.copy(), rows.copy()
    for q in range(len(rows)):
        valid = [i for i in range(rows.shape[1]) if rows[q, i] >= 0]
        order = sorted(valid, key=lambda i: (-float(scores[q, i]), chunk_ids[int(rows[q, i])]))
        scores[q, : len(order)], rows[q, : len(order)] = scores[q, order], rows[q, order]
    return scores, rows


def _known_fields(cls, values: dict) -> dict:
    names = set(cls.__dataclass_fields__)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in names}


def recall_at(retrieval: pa.Table, labels: dict[str, str], k: int) -> dict[str, float]:
    """Per method: share of labelled queries whose source chunk is in the top ``k``."""
    hits: dict[str, set[str]] = {}
    methods = set(retrieval["method"].to_pylist())
    for row in retrieval.to_pylist():
        if row["rank"] <= k and labels.get(row["query_id"]) == row["chunk_id"]:
            hits.setdefault(row["method"], set()).add(row["query_id"])
    return {m: len(hits.get(m, ())) / max(1, len(labels)) for m in sorted(methods)}
