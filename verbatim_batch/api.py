"""Each stage as a function over ``ray.data.Dataset``, to put inside your own Ray Data pipeline.

In the manner of ``ray.data.llm.build_llm_processor``: a stage is a config plus a function that maps a dataset
to a dataset, running the same stage code as the CLI's jobs (``IngestStage``, ``Embedder``, ``PairExtractor``)
with models loaded once per actor. What you give up against the jobs is the run folder (staging, resume,
manifest): these return lazy datasets and you decide where they go.

    import ray
    from verbatim_batch import api

    papers = ray.data.from_items([{"paper_id": "P1", "markdown": "# Intro\\n\\nWe train on 5k pairs."}])
    chunks = api.chunk(papers)                     # one row per chunk (tables.CHUNKS), exact offsets
    vectors = api.embed(chunks)                    # + the bundled MiniLM by default (tables.embeddings_schema)
    pairs = chunks.map(lambda c: {"query": "training data size", "chunk": c["text"]})
    spans = api.extract(pairs)                     # one row per pair: its verbatim spans, relevance, error
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import ray

from .chunking import ChunkerConfig
from .pipeline.ray_env import model_actor_args
from .tables import RAW_RECORDS, SPAN_STRUCT, group_by


class _Chunk:
    def __init__(self, chunker: ChunkerConfig, store_text: bool) -> None:
        from .ingest import IngestStage

        self.stage = IngestStage(chunker=chunker, store_text=store_text)

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch["paper_id"].to_pylist()
        texts = batch["markdown"].to_pylist()
        raw = [t.encode("utf-8", "surrogatepass") if isinstance(t, str) else None for t in texts]
        records = pa.table({
            "paper_id": pa.array([str(i) if i is not None else None for i in ids], pa.string()),
            "source": pa.array([f"dataset#row={i}" if p is None else str(p) for i, p in enumerate(ids)]),
            "raw": pa.array(raw, pa.large_binary()),
            "n_bytes": pa.array([len(r) if r is not None else None for r in raw], pa.int64()),
            "error": pa.array([None if isinstance(t, str) else "missing_text: markdown is not a string"
                               for t in texts], pa.string()),
        }, schema=RAW_RECORDS)
        return self.stage(records)["chunks"]


def chunk(papers: ray.data.Dataset, chunker: ChunkerConfig | None = None, *, store_text: bool = True,
          batch_size: int = 64) -> ray.data.Dataset:
    """Papers (``paper_id``, ``markdown``) -> chunks (``tables.CHUNKS``). A paper that cannot be chunked
    (empty, binary, missing text) yields no chunks; run ``verbatim-batch chunk`` for the quarantine table."""
    return papers.map_batches(_Chunk, fn_constructor_kwargs={"chunker": chunker or ChunkerConfig(),
                                                             "store_text": store_text},
                              batch_format="pyarrow", batch_size=batch_size, concurrency=(1, 8))


def embed(chunks: ray.data.Dataset, config: Any = None, *, batch_rows: int = 1024,
          concurrency: int | None = None) -> ray.data.Dataset:
    """Chunks (``chunk_id``, ``paper_id``, ``context``, ``text``) -> embeddings rows, one model per GPU (else
    CPU actors). ``config``: an ``EmbedderConfig`` (default: the bundled all-MiniLM-L6-v2)."""
    from .embedding import EmbedderConfig
    from .pipeline.batches import strip_internal_batch
    from .pipeline.embed import EmbedActor

    ds = chunks.select_columns(["chunk_id", "paper_id", "context", "text"]).map_batches(
        EmbedActor, fn_constructor_kwargs={"config": config or EmbedderConfig()}, batch_format="pyarrow",
        **model_actor_args(concurrency, batch_rows))
    return ds.map_batches(strip_internal_batch, batch_format="pyarrow", batch_size=None)


class _Extract:
    def __init__(self, config: Any) -> None:
        from .extract.registry import build_extractor
        from .extract.stage import PairExtractor

        self.stage = PairExtractor(build_extractor(config), run_id="api")

    def __call__(self, batch: pa.Table) -> pa.Table:
        from .extract.pairs import pairs_from_records

        rows = batch.to_pylist()
        pairs = pairs_from_records([{k: v for k, v in r.items() if k in ("query", "chunk", "query_id", "paper_id",
                                                                             "chunk_id")} for r in rows])
        out = self.stage(pairs)
        by_pair = group_by(out["spans"].select(["pair_id", "start", "end", "text", "score"]).to_pylist())
        result = out["pairs"].select(["pair_id", "relevance", "error"]).to_pylist()
        if len(result) != len(rows):  # the stage writes one pair row per input row, in order
            raise RuntimeError(f"extract: {len(rows)} pairs in, {len(result)} pair rows out")
        spans = [sorted(by_pair.get(p["pair_id"], []), key=lambda s: s["start"]) for p in result]
        return (batch.append_column("spans", pa.array(spans, pa.list_(SPAN_STRUCT)))
                .append_column("relevance", pa.array([p["relevance"] for p in result], pa.float32()))
                .append_column("error", pa.array([p["error"] for p in result], pa.string())))


def extract(pairs: ray.data.Dataset, config: Any = None, *, batch_rows: int = 64,
            concurrency: int | None = None) -> ray.data.Dataset:
    """Pairs (``query``, ``chunk``; any other columns pass through) -> the same rows with ``spans`` (verbatim
    substrings of ``chunk`` with offsets and scores), ``relevance`` and ``error`` (a bad pair gets an error,
    never a crash). ``config``: ``SemanticConfig`` (default), ``HighlighterConfig`` or an http ``LLMConfig``."""
    from .extract.semantic import SemanticConfig

    return pairs.map_batches(_Extract, fn_constructor_kwargs={"config": config or SemanticConfig()},
                             batch_format="pyarrow", **model_actor_args(concurrency, batch_rows))
