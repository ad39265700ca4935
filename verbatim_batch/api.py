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

Every processor also takes ``preprocess`` / ``postprocess`` (row -> row functions, run with ``Dataset.map``
before and after the stage), and ``build_processor(config, ...)`` makes the one a config describes, to apply
later: ``processor = api.build_processor(api.SemanticConfig(), preprocess=...)``; ``spans = processor(pairs)``.

They compose in any pipeline without ``materialize()``, on any cluster size: chunking runs as tasks and a model's
actors claim no CPU, so every CPU stays free for the reads, maps and writes around them (actors that each hold a
CPU can take all of them on a small cluster, and then the read waits forever). Each processor runs the job's own
actors and splits (embed: tokenize tasks -> forward actors; the highlighter: tokenize -> forward -> span tasks).

Outputs have exactly these columns:

- ``chunk``: ``tables.CHUNKS`` (input: ``paper_id``, ``markdown``);
- ``embed``: ``tables.embeddings_schema`` (input: ``chunk_id``, ``paper_id``, ``context``, ``text``, and
  ``heading_path`` where there is one: a chunk under a References heading gets one window);
- ``retrieve``: ``tables.RETRIEVAL``, ``k`` rows per query and method (input: ``query``, optional ``query_id``);
- ``extract``: the input's columns + ``spans`` (list of ``start``, ``end``, ``text``, ``score``), ``relevance``,
  ``error`` (input: ``query``, ``chunk``; optional ``query_id``, ``paper_id``, ``chunk_id``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import ray

from verbatim_batch.core import storage
from verbatim_batch.core.tables import RAW_RECORDS, SPAN_STRUCT
from verbatim_batch.corpus.chunker import ChunkerConfig
from verbatim_batch.engine.resources import Cluster
from verbatim_batch.extract import registry
from verbatim_batch.extract.highlighter import HighlighterConfig
from verbatim_batch.extract.llm import LLMConfig
from verbatim_batch.extract.semantic import SemanticConfig
from verbatim_batch.retrieval.embedder import EmbedderConfig
from verbatim_batch.retrieval.retriever import RetrieverConfig
from verbatim_batch.stages.embed import EmbedJob
from verbatim_batch.stages.extract import ExtractJob
from verbatim_batch.stages.retrieve import RetrieveJob

__all__ = [
    "ChunkerConfig", "EmbedderConfig", "RetrieverConfig", "SemanticConfig", "HighlighterConfig", "LLMConfig",
    "Processor", "build_processor", "chunk", "embed", "retrieve", "extract",
]

Row = dict[str, Any]
RowFn = Callable[[Row], Row]
EXTRACTOR_CONFIGS = registry.CONFIGS  # the extractor registry's, semantic first
# each processor: the config types it takes and the columns its input rows must have
TAKES: dict[str, tuple[tuple[type, ...], tuple[str, ...]]] = {
    "chunk": ((ChunkerConfig,), ("paper_id", "markdown")),
    "embed": ((EmbedderConfig,), ("chunk_id", "paper_id", "context", "text")),
    "retrieve": ((RetrieverConfig,), ("query",)),
    "extract": (EXTRACTOR_CONFIGS, ("query", "chunk")),
}


TEXT_COLUMNS = ("markdown", "context", "text", "query", "chunk")  # read as text: another type is refused up front


def _check_config(name: str, config: Any) -> None:
    """A TypeError unless ``api.<name>`` takes ``config``, checked on the driver before any Ray work."""
    kinds = TAKES[name][0]
    if isinstance(config, kinds):
        return
    owner = next((fn for fn, (k, _) in TAKES.items() if isinstance(config, k)), None)
    raise TypeError(f"api.{name} takes {' or '.join(k.__name__ for k in kinds)}, not {type(config).__name__}"
                    + (f" (that configures api.{owner})" if owner else ""))


def _check_columns(name: str, ds: Any) -> None:
    """The input's columns, checked on the driver where its schema is known without running it (else the
    workers check them)."""
    try:
        schema = ds.schema(fetch_if_missing=False)
    except Exception:  # noqa: BLE001 - not a Ray Dataset, or a schema Ray cannot tell cheaply
        return
    names = getattr(schema, "names", None)
    if names is None:
        return
    if missing := [c for c in TAKES[name][1] if c not in names]:
        raise ValueError(f"api.{name} needs the column(s) {', '.join(missing)}; the dataset has "
                         f"{', '.join(names) or 'none'} (a preprocess function can make them)")
    types = dict(zip(names, getattr(schema, "types", None) or [], strict=False))
    for column in (c for c in TAKES[name][1] if c in TEXT_COLUMNS):
        kind = types.get(column)
        if isinstance(kind, pa.DataType) and not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                                  or pa.types.is_null(kind)):
            raise ValueError(f"api.{name}: column {column!r} holds {kind} values; it needs text (strings): cast "
                             "it, or a preprocess function can make it")


@dataclass(frozen=True)
class Processor:
    """A stage as a lazy function from a dataset to a dataset: ``preprocess`` -> the stage -> ``postprocess``."""

    name: str
    stage: Callable[[ray.data.Dataset], ray.data.Dataset]
    preprocess: RowFn | None = None
    postprocess: RowFn | None = None
    map_kwargs: dict[str, Any] = field(default_factory=dict)  # for the pre/postprocess maps (e.g. num_cpus)

    def __call__(self, ds: ray.data.Dataset) -> ray.data.Dataset:
        if self.preprocess is not None:
            ds = ds.map(self.preprocess, **self.map_kwargs)
        elif self.name in TAKES:
            _check_columns(self.name, ds)
        ds = self.stage(ds)
        if self.postprocess is not None:
            ds = ds.map(self.postprocess, **self.map_kwargs)
        return ds


def build_processor(config: Any, *, preprocess: RowFn | None = None, postprocess: RowFn | None = None,
                    map_kwargs: dict[str, Any] | None = None, **options: Any) -> Processor:
    """The processor a config describes: ``ChunkerConfig`` -> chunk, ``EmbedderConfig`` -> embed,
    ``RetrieverConfig`` -> retrieve, ``SemanticConfig``/``HighlighterConfig``/``LLMConfig`` -> extract.
    ``options`` are the stage function's own (``batch_rows``, ``concurrency``, ...)."""
    for name, (types, _) in TAKES.items():
        if isinstance(config, types):
            stage = {"chunk": _chunk, "embed": _embed, "retrieve": _retrieve, "extract": _extract}[name]
            fn = functools.partial(stage, config=config, **options)
            return Processor(name, fn, preprocess, postprocess, dict(map_kwargs or {}))
    raise TypeError(f"no processor for a {type(config).__name__} (one of ChunkerConfig, EmbedderConfig, "
                    "RetrieverConfig, SemanticConfig, HighlighterConfig, LLMConfig)")


def _chunk_papers(batch: pa.Table, chunker: ChunkerConfig, store_text: bool) -> pa.Table:
    """Papers (``paper_id``, ``markdown``) -> rows of ``tables.CHUNKS``, with the chunk job's own code."""
    from verbatim_batch.corpus.ingest import IngestStage

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
    return IngestStage(chunker=chunker, store_text=store_text)(records)["chunks"]


def _chunk(papers: ray.data.Dataset, config: ChunkerConfig, *, store_text: bool = True,
           batch_size: int = 64) -> ray.data.Dataset:
    # Tasks, not actors: chunking loads nothing, and a task gives its CPU back after each batch.
    return papers.map_batches(_chunk_papers, fn_kwargs={"chunker": config, "store_text": store_text},
                              batch_format="pyarrow", batch_size=batch_size, **_bounds())


def chunk(papers: ray.data.Dataset, chunker: ChunkerConfig | None = None, *, store_text: bool = True,
          batch_size: int = 64, preprocess: RowFn | None = None, postprocess: RowFn | None = None) -> ray.data.Dataset:
    """Papers (``paper_id``, ``markdown``) -> chunks (``tables.CHUNKS``). A paper that cannot be chunked yields
    no chunks (``verbatim-batch chunk`` writes the quarantine table)."""
    _check_config("chunk", chunker := chunker or ChunkerConfig())
    return build_processor(chunker, preprocess=preprocess, postprocess=postprocess,
                           store_text=store_text, batch_size=batch_size)(papers)


def _bounds() -> dict[str, int]:
    """A processor's plain tasks retry as a stage's do (``--worker-restarts``' default), not forever."""
    from verbatim_batch.engine.resources import task_bounds
    from verbatim_batch.engine.restarts import Restarting

    return task_bounds(Restarting.worker_restarts)


def _user_pipeline() -> Cluster:
    """Where a processor runs: this driver's Ray, inside the caller's pipeline (its actors claim no CPU)."""
    return Cluster.current(user_pipeline=True)


def _embed(chunks: ray.data.Dataset, config: EmbedderConfig, *, batch_rows: int = EmbedJob.batch_rows,
           concurrency: int | None = None) -> ray.data.Dataset:
    from verbatim_batch.engine.batches import strip_internal_batch
    from verbatim_batch.stages.embed import EmbedStage, embed_dataset

    res = EmbedStage.resources.with_(batch_rows=batch_rows, actors=concurrency)
    ds = embed_dataset(chunks, config, res, cluster=_user_pipeline())
    return ds.map_batches(strip_internal_batch, batch_format="pyarrow", batch_size=None, **_bounds())


def embed(chunks: ray.data.Dataset, config: EmbedderConfig | None = None, *, batch_rows: int = EmbedJob.batch_rows,
          concurrency: int | None = None, preprocess: RowFn | None = None,
          postprocess: RowFn | None = None) -> ray.data.Dataset:
    """Chunks (``chunk_id``, ``paper_id``, ``context``, ``text``) -> rows of ``tables.embeddings_schema``, one
    model per GPU (else CPU actors). ``config``: an ``EmbedderConfig`` (default: the bundled all-MiniLM-L6-v2)."""
    _check_config("embed", config := config or EmbedderConfig())
    return build_processor(config, preprocess=preprocess, postprocess=postprocess,
                           batch_rows=batch_rows, concurrency=concurrency)(chunks)


def _retrieve(queries: ray.data.Dataset, config: RetrieverConfig, *, batch_rows: int = RetrieveJob.batch_rows,
              concurrency: int | None = None, with_text: bool = False) -> ray.data.Dataset:
    from verbatim_batch.core.runs import expect_tables
    from verbatim_batch.stages.retrieve import RetrieveStage, retrieve_dataset

    config = dataclasses.replace(config, index_dir=storage.normalize(config.index_dir))  # actors run elsewhere
    expect_tables(config.index_dir, "api.retrieve", ("ids",))
    res = RetrieveStage.resources.with_(batch_rows=batch_rows, actors=concurrency)
    return retrieve_dataset(queries, config, res, cluster=_user_pipeline(), with_text=with_text)


def retrieve(queries: ray.data.Dataset, index: str | RetrieverConfig, *, batch_rows: int = RetrieveJob.batch_rows,
             concurrency: int | None = None, with_text: bool = False, preprocess: RowFn | None = None,
             postprocess: RowFn | None = None) -> ray.data.Dataset:
    """Queries (``query``, optional ``query_id``) -> the top-k chunks of an index run, as rows of
    ``tables.RETRIEVAL`` (``k`` per query and method). ``index``: the index run folder, or a ``RetrieverConfig``
    naming it (methods, k, weights). ``with_text``: each row also carries ``query`` and ``chunk`` (the chunk's
    text), so its rows go straight into ``extract``::

        from ray.data.expressions import col

        hits = api.retrieve(queries, "runs/index", with_text=True).filter(
            expr=(col("method") == "hybrid") & (col("rank") <= 5))  # an expression: a lambda makes Ray Data warn
        spans = api.extract(hits)
    """
    if not isinstance(index, (str, RetrieverConfig)):
        _check_config("retrieve", index)
    config = index if isinstance(index, RetrieverConfig) else RetrieverConfig(index_dir=index)
    return build_processor(config, preprocess=preprocess, postprocess=postprocess, batch_rows=batch_rows,
                           concurrency=concurrency, with_text=with_text)(queries)


OUTPUT_COLUMNS = ("spans", "relevance", "error")  # what extract adds to each pair row
PAIR_FIELDS = ("query", "chunk", "query_id", "paper_id", "chunk_id")  # the caller's columns a pair is made of


def _pairs_of(batch: pa.Table) -> pa.Table:
    """The caller's rows -> ``PAIR_INPUT`` rows, carrying the caller's columns through (``INPUT_PREFIX``)."""
    from verbatim_batch.extract.pairs import pairs_from_records
    from verbatim_batch.stages.extract import INPUT_PREFIX

    pairs = pairs_from_records([{k: v for k, v in r.items() if k in PAIR_FIELDS} for r in batch.to_pylist()])
    for name in batch.column_names:
        pairs = pairs.append_column(INPUT_PREFIX + name, batch[name])
    return pairs


def _rows_of(packed: pa.Table) -> pa.Table:
    """The extract stages' rows -> the caller's rows + ``spans`` (by start), ``relevance`` and ``error``."""
    from verbatim_batch.engine.batches import strip_internal
    from verbatim_batch.stages.extract import INPUT_PREFIX

    packed = strip_internal(packed)[0]
    if "spans" not in packed.column_names:  # a block with nothing in it
        return packed
    inputs = [c for c in packed.column_names if c.startswith(INPUT_PREFIX)]
    rows = packed.select(inputs).rename_columns([c[len(INPUT_PREFIX):] for c in inputs])
    rows = rows.drop_columns([c for c in OUTPUT_COLUMNS if c in rows.column_names])
    spans = [sorted(({k: s[k] for k in ("start", "end", "text", "score")} for s in pair), key=lambda s: s["start"])
             for pair in packed["spans"].to_pylist()]
    return (rows.append_column("spans", pa.array(spans, pa.list_(SPAN_STRUCT)))
            .append_column("relevance", packed["relevance"].cast(pa.float32()))
            .append_column("error", packed["error"].cast(pa.string())))


def _extract(pairs: ray.data.Dataset, config: Any, *, batch_rows: int = ExtractJob.batch_rows,
             concurrency: int | None = None) -> ray.data.Dataset:
    """The extract job's placements (``stages.extract.PLACEMENTS``) over the caller's rows."""
    from verbatim_batch.stages.extract import PLACEMENT_RESOURCES, PLACEMENTS, ExtractSetup

    where = registry.placement(config)
    if where == "vllm":
        raise ValueError("api.extract runs an LLM over HTTP (LLMConfig with a base_url); for in-cluster vLLM use "
                         "`verbatim-batch extract --backend vllm`, or ray.data.llm directly")
    # the caller's rows come in any order: batches of batch_rows rows, not the job's blocks of whole queries
    res = PLACEMENT_RESOURCES[where].with_(batch_rows=batch_rows, actors=concurrency, whole_blocks=False)
    setup = ExtractSetup(config, res, "api", cluster=_user_pipeline())
    ds = pairs.map_batches(_pairs_of, batch_format="pyarrow", batch_size=batch_rows, **_bounds())
    return PLACEMENTS[where](setup, ds).map_batches(_rows_of, batch_format="pyarrow", batch_size=None,
                                                    **_bounds())


def extract(pairs: ray.data.Dataset, config: Any = None, *, batch_rows: int = ExtractJob.batch_rows,
            concurrency: int | None = None, preprocess: RowFn | None = None,
            postprocess: RowFn | None = None) -> ray.data.Dataset:
    """Pairs (``query``, ``chunk``; any other columns pass through) -> the same rows with ``spans`` (verbatim
    substrings of ``chunk`` with offsets and scores), ``relevance`` and ``error`` (a bad pair gets an error,
    never a crash). ``config``: ``SemanticConfig`` (default), ``HighlighterConfig`` or an HTTP ``LLMConfig``."""
    _check_config("extract", config := config or SemanticConfig())
    return build_processor(config, preprocess=preprocess, postprocess=postprocess,
                           batch_rows=batch_rows, concurrency=concurrency)(pairs)
