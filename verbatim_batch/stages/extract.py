"""The extract stage: (query, chunk) pairs -> spans, pairs and rejects tables.

Pairs come from a pairs file (read on the driver) or a retrieval run (``engine.pair_plan``: joined in Ray
tasks, so the driver holds only the pair ids). Model extractors run as one actor per GPU (else CPU actors), the
HTTP LLM backend as I/O-bound actors, the vLLM backend through ``ray.data.llm``. With ``previous``, pairs whose
input and extractor are unchanged keep that run's rows.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import carried_across, group, is_runtime, option, runtime_fields, settings
from verbatim_batch.core.records import read_queries
from verbatim_batch.core.runs import (
    committed_table_dir,
    expect_tables,
    jsonable,
    manifest_config,
    read_manifest,
    read_table,
)
from verbatim_batch.core.tables import PAIR_INPUT, PAIRS, REJECTS, SPANS
from verbatim_batch.engine.batches import drop_keys, strip_internal, with_counts, with_retry_count
from verbatim_batch.engine.model_actor import ModelActor, host, stage_failed
from verbatim_batch.engine.pair_plan import query_blocks
from verbatim_batch.engine.resources import Cluster, Resources, ray_args, task_bounds
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import Command, Outcome, Plan, RunOptions, StageContext, StageResult, TableStage, Work
from verbatim_batch.extract import registry
from verbatim_batch.extract.gate import DEFAULT_MAX_CHUNK_CHARS
from verbatim_batch.extract.highlighter import HighlighterConfig
from verbatim_batch.extract.semantic import SemanticConfig

if TYPE_CHECKING:
    import ray  # imported where a stage runs: the CLI parses its options without importing Ray

INPUT_PREFIX = "_input."  # columns that ride through the extract stages untouched (``api``: the caller's own)


def _input_columns(batch: pa.Table) -> list[str]:
    return [c for c in batch.column_names if c.startswith(INPUT_PREFIX)]


def _with_inputs(packed: pa.Table, batch: pa.Table) -> pa.Table:
    """``packed`` (one row per pair of ``batch``, in order) with ``batch``'s ``INPUT_PREFIX`` columns."""
    for name in _input_columns(batch):
        packed = packed.append_column(name, batch[name])
    return packed


def failed_pairs(stage, batch: pa.Table, error: str) -> pa.Table:
    """The packed rows of pairs a stage gave up on (``PairExtractor`` ``stage``): one error row each."""
    from verbatim_batch.extract.gate import pack

    rows = batch.select(PAIR_INPUT.names).to_pylist()
    return _with_inputs(pack(stage.tables(rows, {}, [error] * len(rows), None)), batch)


class ExtractActor(ModelActor):
    """One extractor per actor: pairs in, packed pairs+spans out (a batch whose retries are spent: error rows)."""

    what = "extract"

    def __init__(self, config, run_id: str, threads: int | None = None,
                 max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS,
                 retries: int = 2, query_block_rows: int | None = None, token_budget: int | None = None) -> None:
        self.run_id = run_id
        self.max_chunk_chars = max_chunk_chars
        self.query_block_rows = query_block_rows  # an I/O extractor's batch: split into query blocks of this size
        super().__init__(config, threads, retries, token_budget)

    def load(self, config):
        from verbatim_batch.extract.gate import PairExtractor
        return PairExtractor(registry.build_extractor(config), self.run_id, self.max_chunk_chars)

    def run(self, batch: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        from verbatim_batch.extract.gate import pack

        out = self.model(batch)
        t0 = time.perf_counter()
        packed = _with_inputs(pack(out), batch)
        ms = dict(self.model.last_ms)
        ms["gate"] = ms.get("gate", 0) + round(1000 * (time.perf_counter() - t0))
        return packed, {f"time_ms.{part}": v for part, v in ms.items()}

    def failed_rows(self, batch: pa.Table, error: str) -> pa.Table:
        return failed_pairs(self.model, batch, error)

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Pairs -> packed rows. With ``query_block_rows``, a block of whole queries is done as the
        ``query_blocks`` it holds, each with its own retries and error rows."""
        blocks = query_blocks(batch, self.query_block_rows) if self.query_block_rows else [batch]
        if len(blocks) == 1:
            return self._call(batch)
        return pa.concat_tables([self._call(b) for b in blocks], promote_options="default")

    def _call(self, batch: pa.Table) -> pa.Table:
        return ModelActor.__call__(self, batch)


def extractor_group() -> Any:
    """The extractor options: one of three configs, chosen by ``--extractor``."""
    return group(*registry.CONFIGS, select="extractor", select_default=registry.EXTRACTORS[0],
                 select_help="semantic: offline sentence scorer (bundled MiniLM); highlighter: ModernBERT token "
                 "classifier; llm: an LLM through an OpenAI-compatible endpoint or in-cluster vLLM")


@dataclass
class ExtractJob(RunOptions):
    """Settings of the extract job: pairs from a pairs file or a retrieval run, one extractor."""

    extractor: Any = extractor_group()
    pairs: str | None = option(None, "JSONL/Parquet pairs file (query + chunk or chunk_id per row)", path=True)
    retrieval: str | None = option(None, "a committed retrieval (or rerank) run: pairs are query x top-k", path=True)
    chunks: str | None = option(None, "the chunk run", path=True, default_help="found through the run's manifests")
    queries: str | None = option(None, "the retrieval run's query file", path=True,
                                 default_help="from its manifest")
    # which pairs there are, not what a pair gives: a pair carries across them (``options.carried_across``)
    method: str | None = option(None, "retrieval method whose top-k rows become pairs",
                                default_help="rerank for a rerank run, else hybrid", selects=True)
    top_k: int = option(5, "retrieved chunks per query to extract from", low=1, high=limits.PER_QUERY, selects=True)
    batch_rows: int = option(64, "pairs per actor call, sorted and packed inside", low=1,
                             high=limits.BATCH, runtime=True)
    concurrency: int | None = option(None, "model actors", low=1,
                                     high=limits.WORKERS, default_help="one per GPU, else 1; 2 for LLM "
                                     "requests", runtime=True)
    threads: int | None = option(None, "torch threads per CPU actor", low=1,
                                 high=limits.THREADS, default_help="all CPUs", runtime=True)
    max_chunk_chars: int = option(DEFAULT_MAX_CHUNK_CHARS, "pairs with longer chunks become error rows", low=1,
                                  high=limits.CHARS)


def pair_sources(job: ExtractJob) -> dict[str, Any]:
    """Where the job's pairs come from (the pairs file, or the retrieval run, its queries and chunk run), read
    off manifests only."""
    if (job.pairs is None) == (job.retrieval is None):
        raise ValueError("give exactly one of --pairs FILE or --retrieval RUN_DIR")
    if job.chunks:
        expect_tables(job.chunks, "--chunks", ("chunks",))  # also here: build_pairs is called without the runner
    if job.pairs is not None:
        if not storage.exists(job.pairs):
            raise FileNotFoundError(f"pairs file not found: {job.pairs}")
        return {"pairs": job.pairs, "chunks": job.chunks}
    expect_tables(job.retrieval, "--retrieval", ("retrieval",))
    retrieval_cfg = manifest_config(job.retrieval)
    if job.queries is None and not isinstance(retrieval_cfg.get("queries"), str):
        raise ValueError(f"{job.retrieval} records no query file it was made from: give --queries")
    if job.queries is None and not storage.exists(retrieval_cfg["queries"]):
        raise FileNotFoundError(f"the query file {retrieval_cfg['queries']} that {job.retrieval} was made from is "
                                "not found (moved, or recorded relative to another folder): give --queries")
    return {"retrieval": job.retrieval, "queries": job.queries or retrieval_cfg["queries"],
            "chunks": job.chunks or retrieval_cfg.get("chunks") or manifest_config(retrieval_cfg["index"])["chunks"]}


def pair_method(job: ExtractJob) -> str:
    """The job's method, else ``rerank`` for a rerank run and ``hybrid`` for a retrieval run."""
    if job.method:
        return job.method
    if job.retrieval is not None and read_manifest(job.retrieval)["command"] == "rerank":
        return "rerank"
    return "hybrid"


def build_pairs(job: ExtractJob, sources: dict[str, Any] | None = None) -> pa.Table:
    """The job's ``PAIR_INPUT`` table, built on the driver (the reference ``pair_planner`` is tested against)."""
    from verbatim_batch.extract.pairs import chunk_lookup, pairs_from_records, pairs_from_retrieval, read_pair_records

    sources = sources or pair_sources(job)
    if job.pairs is not None:
        records = list(read_pair_records(job.pairs))
        wanted = [str(r["chunk_id"]) for r in records if r.get("chunk_id") is not None]
        chunks = chunk_lookup(committed_table_dir(job.chunks, "chunks"), wanted) if job.chunks and wanted else {}
        return pairs_from_records(records, chunks)
    retrieval = read_table(job.retrieval, "retrieval")
    queries, _ = read_queries(sources["queries"])
    qmap = dict(zip(queries["query_id"].to_pylist(), queries["query"].to_pylist(), strict=True))
    method = pair_method(job)
    ids = retrieval.filter(pc.equal(retrieval["method"], method))["chunk_id"].to_pylist()
    chunks = chunk_lookup(committed_table_dir(sources["chunks"], "chunks"), ids)
    return pairs_from_retrieval(retrieval, qmap, chunks, method, job.top_k)


def pair_planner(job: ExtractJob, sources: dict[str, Any], start_ray) -> Any:
    """A ``PAIR_INPUT`` table for a pairs file, else a ``PairPlanner`` over the retrieval run (``start_ray``: called
    when the run is too large to plan here)."""
    if job.pairs is not None:
        return build_pairs(job, sources)
    from verbatim_batch.engine.pair_plan import PairPlanner

    return PairPlanner(committed_table_dir(job.retrieval, "retrieval"), sources["queries"],
                       committed_table_dir(sources["chunks"], "chunks"), pair_method(job), job.top_k, start_ray)


def extract_counts(pairs: pa.Table, spans_rows: int) -> dict[str, int]:
    """Pairs with spans, abstained and failed (by reason), spans and withheld non-verbatim spans."""
    errors = [e for e in pairs["error"].to_pylist() if e]
    n_spans = pairs["n_spans"].to_pylist()
    counts: Counter = Counter(f"errors.{e.split(':', 1)[0]}" for e in errors)
    counts.update({
        "pairs": pairs.num_rows,
        "pairs_with_spans": sum(1 for n in n_spans if n),
        "pairs_abstained": sum(1 for n, e in zip(n_spans, pairs["error"].to_pylist(), strict=True) if not n and not e),
        "pairs_failed": len(errors),
        "spans": spans_rows,
        "verbatim_violations": pc.sum(pairs["n_violations"]).as_py() or 0,
    })
    return dict(counts)


# --- the highlighter in three stages: host work on CPU tasks, only the forward pass on the model actors -------

def _highlight_tokenize(batch: pa.Table, config, max_chunk_chars: int) -> pa.Table:
    """CPU stage: validate and tokenise pairs into windows (``highlighter_stages.encode_table``)."""
    from verbatim_batch.extract.gate import DEFAULT_MAX_QUERY_CHARS
    from verbatim_batch.extract.highlighter import HighlighterTokenizer
    from verbatim_batch.extract.highlighter_stages import encode_table

    tokenizer = host(HighlighterTokenizer, config)
    t0 = time.perf_counter()
    out = encode_table(tokenizer, batch.select([*PAIR_INPUT.names, *_input_columns(batch)]),
                       max_chunk_chars, DEFAULT_MAX_QUERY_CHARS)
    return with_counts(out, {"time_ms.tokenize": round(1000 * (time.perf_counter() - t0))})


class HighlightForwardActor(ModelActor):
    """The split highlighter's forward pass, one model per actor (failed rows: the span stage writes their errors)."""

    what = "extract"

    def load(self, config):
        from verbatim_batch.extract.highlighter import Highlighter

        return Highlighter(config)

    @property
    def highlighter(self):
        return self.model

    def run(self, batch: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        from verbatim_batch.extract.highlighter_stages import forward_table

        return forward_table(self.model, batch), {}

    def counts(self, before, after, wall_s: float) -> dict[str, int]:
        return {"time_ms.forward": round(1000 * (after["forward_s"] - before["forward_s"])),
                "time_ms.model": round(1000 * wall_s)}

    def failed_rows(self, batch: pa.Table, error: str) -> pa.Table:
        from verbatim_batch.extract.highlighter_stages import failed_forward_table

        return failed_forward_table(batch, error)


def _highlight_spans(batch: pa.Table, config, run_id: str, info: dict[str, Any],
                     max_chunk_chars: int) -> pa.Table:
    """CPU stage: spans, the verbatim gate and the packed rows (``highlighter_stages.spans_table``)."""
    from verbatim_batch.extract.gate import PairExtractor, pack
    from verbatim_batch.extract.highlighter_stages import HighlighterRows, spans_table

    batch, carried = strip_internal(batch)  # counts and retries of the earlier stages ride on to the sink
    stage = PairExtractor(HighlighterRows(info), run_id, max_chunk_chars)
    t0 = time.perf_counter()
    failed = [e if e and e.startswith("stage_failed:") else None for e in batch["_hl_error"].to_pylist()]
    if any(failed):  # the forward stage gave up on these rows: error rows, whatever else they had
        invalid = [f or i for f, i in zip(failed, batch["_hl_invalid"].to_pylist(), strict=True)]
        batch = batch.set_column(batch.schema.get_field_index("_hl_invalid"), "_hl_invalid",
                                 pa.array(invalid, pa.string()))
    try:
        out = _with_inputs(pack(spans_table(batch, stage, config)), batch)
    except Exception as exc:  # noqa: BLE001 - error rows, the job goes on
        out = failed_pairs(stage, batch, stage_failed(exc))
    retries = carried.pop("stage_retries", 0)
    carried["time_ms.gate"] += round(1000 * (time.perf_counter() - t0))
    return with_retry_count(with_counts(out, dict(carried)), retries)


@dataclass(frozen=True)
class ExtractSetup:
    """How the placements below run an extractor: from a stage job (``extract_dataset``) or ``api.extract``."""

    extractor: Any  # HighlighterConfig | SemanticConfig | LLMConfig
    resources: Resources  # the placement's declaration with the job's options applied (``PLACEMENT_RESOURCES``)
    run_id: str
    max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS
    retries: int = 2  # of a failed batch, before its rows become error rows
    cluster: Cluster | None = None  # None: this driver's Ray, a stage job's own pipeline (api: a user's pipeline)


def _highlighter_stages(setup: ExtractSetup, pairs: ray.data.Dataset) -> ray.data.Dataset:
    """Tokenize (CPU tasks) -> forward pass (model actors) -> spans and the verbatim gate (CPU tasks), so the
    model's process does nothing but the model."""
    from verbatim_batch.extract.highlighter import host_describe

    cfg = setup.extractor
    bounds = task_bounds(setup.resources.restarts)
    ds = pairs.map_batches(
        _highlight_tokenize, batch_format="pyarrow", batch_size=None,
        fn_kwargs={"config": cfg, "max_chunk_chars": setup.max_chunk_chars}, **bounds)
    ds = ds.map_batches(HighlightForwardActor, **ray_args(
        setup.resources, HighlightForwardActor, setup.cluster, batch_format="pyarrow",
        fn_constructor_kwargs={"config": cfg, "retries": setup.retries}))
    return ds.map_batches(_highlight_spans, batch_format="pyarrow", batch_size=None,
                          fn_kwargs={"config": cfg, "run_id": setup.run_id, "info": host_describe(cfg),
                                     "max_chunk_chars": setup.max_chunk_chars}, **bounds)


def pairs_dataset(pairs: pa.Table | ray.data.Dataset, batch_rows: int, query_grouped: bool) -> ray.data.Dataset:
    """The pairs as the extractor's blocks: the planner's dataset as it is, a table as blocks of ``batch_rows``
    pairs (or of whole queries, ``query_grouped``)."""
    import ray

    if isinstance(pairs, ray.data.Dataset):
        return pairs
    if query_grouped:
        return ray.data.from_arrow(query_blocks(pairs, batch_rows))
    return ray.data.from_arrow([pairs.slice(i, batch_rows) for i in range(0, max(1, pairs.num_rows), batch_rows)])


def judges_queries(config: Any) -> bool:
    """Whether an extractor judges a query's pairs together (then its batches hold whole queries)."""
    from verbatim_batch.extract.semantic import judges_queries as semantic_judges

    return isinstance(config, SemanticConfig) and semantic_judges(config)


def _model_actors(setup: ExtractSetup, pairs: pa.Table | ray.data.Dataset) -> ray.data.Dataset:
    """One extractor per GPU, else CPU actors (the highlighter: CPU stages around its model actors). An extractor
    that judges a query's pairs together gets blocks of whole queries, so a query is never split between calls."""
    grouped = judges_queries(setup.extractor)
    res = setup.resources.with_(whole_blocks=True) if grouped else setup.resources
    ds = pairs_dataset(pairs, res.batch_rows, query_grouped=grouped)
    if isinstance(setup.extractor, HighlighterConfig):
        return _highlighter_stages(setup, ds)
    return _extract_actors(setup, res, ds)


def _io_actors(setup: ExtractSetup, pairs: pa.Table | ray.data.Dataset) -> ray.data.Dataset:
    """I/O-bound actors, no GPU (an HTTP endpoint); blocks keep a query's pairs together for its requests."""
    return _extract_actors(setup, setup.resources, pairs_dataset(pairs, setup.resources.batch_rows, True))


def _extract_actors(setup: ExtractSetup, res: Resources, ds: ray.data.Dataset) -> ray.data.Dataset:
    kwargs = {"config": setup.extractor, "run_id": setup.run_id, "max_chunk_chars": setup.max_chunk_chars,
              "retries": setup.retries, "query_block_rows": res.batch_rows if res.whole_blocks else None}
    return ds.map_batches(ExtractActor, **ray_args(res, ExtractActor, setup.cluster, batch_format="pyarrow",
                                                   fn_constructor_kwargs=kwargs))


def _vllm(setup: ExtractSetup, pairs: pa.Table | ray.data.Dataset) -> ray.data.Dataset:
    """In-cluster vLLM engines through ``ray.data.llm``; the interpretation actors take only the CPUs the engines
    leave. Requests are formed in tasks from blocks of whole queries: no pair passes through the driver."""
    from verbatim_batch.engine.pair_plan import IO_BLOCK_PAIRS
    from verbatim_batch.engine.vllm import LLMInterpret, helper_cpus, invalid_pairs, request_rows, vllm_dataset

    cfg = setup.extractor
    cluster = setup.cluster or Cluster.current()
    res = setup.resources.with_(cpus=helper_cpus(cfg, cluster.cpus))
    blocks = pairs_dataset(pairs, max(res.batch_rows, IO_BLOCK_PAIRS), query_grouped=True)  # as the planner's
    args = {"config": cfg, "run_id": setup.run_id, "max_chunk_chars": setup.max_chunk_chars}
    bounds = task_bounds(res.restarts)
    requests = blocks.map_batches(request_rows, fn_kwargs=args, batch_format="pyarrow", batch_size=None, **bounds)
    bad = blocks.map_batches(invalid_pairs, fn_kwargs=args, batch_format="pyarrow", batch_size=None, **bounds)
    ds = vllm_dataset(requests, cfg, res.cpus, res.restarts).map_batches(LLMInterpret, **ray_args(
        res, LLMInterpret, cluster, batch_format="pyarrow",
        fn_constructor_kwargs={"config": cfg, "run_id": setup.run_id}))
    return ds.union(bad)


PLACEMENTS = {"model": _model_actors, "io": _io_actors, "vllm": _vllm}  # extract.registry.PLACEMENTS

# What each placement needs from Ray (the extract stage's declaration: the extractor's placement picks one)
PLACEMENT_RESOURCES = {
    "model": Resources(cpus=1, gpus=1, batch_rows=ExtractJob.batch_rows),  # one model per GPU, else CPU actors
    # I/O-bound actors, two by default; each call one block of whole queries (about batch_rows pairs)
    "io": Resources(cpus=0.5, actors=2, batch_rows=ExtractJob.batch_rows, whole_blocks=True),
    # the interpretation actors beside the engines: their CPUs are what the engines leave (``_vllm``)
    "vllm": Resources(cpus=1, actors=1, batch_rows=ExtractJob.batch_rows, whole_blocks=True),
}


def extract_dataset(job: ExtractJob, pairs: pa.Table | ray.data.Dataset, run_id: str,
                    resources: Resources) -> ray.data.Dataset:
    """Packed pairs+spans+rejects blocks for the job's extractor, in its placement, with ``resources`` (the
    runner's ``ctx.resources``); ``pairs``: a table or the planner's dataset."""
    setup = ExtractSetup(job.extractor, resources, run_id, job.max_chunk_chars, job.batch_retries)
    return PLACEMENTS[registry.placement(job.extractor)](setup, pairs)


_NOT_OWN = ("extractor", "pairs", "retrieval", "chunks", "queries")  # by hash, and resolved (``pair_sources``)


def _pair_settings() -> tuple[str, ...]:
    """The job's output-deciding options that decide what a pair gives (not the inputs nor the pair choice)."""
    across = {*carried_across(ExtractJob), *_NOT_OWN}
    return tuple(f.name for f in fields(ExtractJob) if not is_runtime(f) and f.name not in across)


def same_extractor(previous: str, config: dict[str, Any]) -> bool:
    """Whether ``previous`` ran the extractor of ``config`` (hash and weights) under the same settings that decide
    a pair's rows (one an earlier release did not record counts as unchanged): else nothing carries."""
    prev = manifest_config(previous)
    same_job = all(prev.get(k, config.get(k)) == config.get(k) for k in _pair_settings())
    return same_job and prev.get("extractor_hash") == config["extractor_hash"] and not (
        config.get("model_revision") and prev.get("model_revision") != config["model_revision"])


def unchanged_pairs(previous: str, pairs: pa.Table, config: dict[str, Any]) -> set[str]:
    """Pair ids whose result ``previous`` holds for the same input, retrieval rank (a carried row never keeps a
    stale rank) and extractor; failed pairs are extracted again."""
    if not same_extractor(previous, config):
        return set()
    wanted = dict(zip(pairs["pair_id"].to_pylist(),
                      zip(_input_hashes(pairs), pairs["rank"].to_pylist(), strict=True), strict=True))
    old = storage.read_parquet(committed_table_dir(previous, "pairs"),
                               columns=["pair_id", "input_hash", "rank", "error"])
    return {pid for pid, h, rank, err in zip(*old.to_pydict().values(), strict=True)
            if err is None and h is not None and wanted.get(pid) == (h, rank)}


def _input_hashes(pairs: pa.Table) -> list[str]:
    from verbatim_batch.engine.pair_plan import input_hashes

    return input_hashes(pairs).to_pylist()


def extract_table_counts(name: str, table: pa.Table) -> dict[str, int]:
    if name != "rejects":
        return {}
    return dict(Counter(f"rejects.{r.split(':', 1)[0].split(' (', 1)[0]}" for r in table["reason"].to_pylist()))


class ExtractStage(TableStage):
    """The extract stage: every pair once, carried when its input and extractor are unchanged."""

    command = "extract"
    reads = {"chunks": ("chunks",), "retrieval": ("retrieval",)}
    outcomes = {"failed": ("pairs_failed",), "withheld": ("verbatim_violations",), "rejected": ("rejects",)}
    tables = {"spans": SPANS, "pairs": PAIRS, "rejects": REJECTS}
    key_column = "pair_id"
    key_tables = ("pairs",)
    table_counts = staticmethod(extract_table_counts)
    resources = PLACEMENT_RESOURCES  # by the extractor's placement (``placement``); the runner applies the options

    def placement(self) -> str:
        return registry.placement(self.job.extractor)

    def plan(self) -> Plan:
        job: ExtractJob = self.job
        sources = pair_sources(job)
        cfg = job.extractor
        own = {k: jsonable(v) for k, v in settings(job).items() if k not in _NOT_OWN}  # the extractor by its hash
        config = {"extractor": registry.kind_of(cfg), "extractor_config": jsonable(settings(cfg)),
                  "extractor_hash": cfg.hash, **own, "method": pair_method(job), **sources}
        if weights := registry.weights_fingerprint(cfg):
            config["model_revision"] = weights
        runtime = {"extractor": {k: v for k, v in cfg.to_dict().items() if k in runtime_fields(type(cfg))}}
        return Plan(config=config, inputs=tuple(v for v in sources.values() if v), facts=sources, runtime=runtime)

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        """A pairs file's pairs (a table), or a retrieval run's planner (pair ids and object refs, no text)."""
        t0 = time.perf_counter()
        data = pair_planner(self.job, plan.facts, ctx.ray)
        keys, n = (data["pair_id"], data.num_rows) if isinstance(data, pa.Table) else (data.keys, data.n)
        return Work(keys=keys, n_in=n, data=data, timings_s={"pairs": time.perf_counter() - t0})

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> set[str] | pa.Array:
        if isinstance(work.data, pa.Table):
            return unchanged_pairs(previous, work.data, plan.config)
        if not same_extractor(previous, plan.config):
            return set()
        return work.data.unchanged(committed_table_dir(previous, "pairs"))

    def writer(self, plan: Plan, work: Work):
        return _unpack

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext) -> ray.data.Dataset:
        if isinstance(work.data, pa.Table):
            pairs: pa.Table = work.data
            return extract_dataset(self.job, drop_keys(pairs, "pair_id", skip), ctx.run_id, ctx.resources)
        placement = registry.placement(self.job.extractor)
        # blocks of whole queries, for extractors that group them or judge a query's pairs together
        grouped = placement in ("io", "vllm") or judges_queries(self.job.extractor)
        blocks = work.data.dataset(skip, grouped, ctx.resources.batch_rows)
        return extract_dataset(self.job, blocks, ctx.run_id, ctx.resources)

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> StageResult:
        written = storage.read_parquet(storage.join(outcome.staging, "pairs"),
                                       columns=["error", "n_spans", "n_violations", "model_id", "model_revision"])
        loaded = written.filter(pc.is_valid(written["model_revision"])).slice(0, 1).to_pylist()
        config = {"model_id": loaded[0]["model_id"], "model_revision": loaded[0]["model_revision"]} if loaded else {}
        counts = extract_counts(written, outcome.result.rows["spans"]) | {"rejects": outcome.result.rows["rejects"]}
        return StageResult(tables={}, counts=counts, config=config)


def _unpack(packed: pa.Table) -> dict[str, pa.Table]:
    from verbatim_batch.extract.gate import unpack

    if not packed.num_rows and "spans" not in packed.column_names:  # a block with nothing in it
        return {}
    return unpack(packed)


def run_extract(job: ExtractJob) -> tuple[str, dict[str, Any]]:
    """Extract verbatim spans for every pair into ``spans/``, ``pairs/`` and ``rejects/`` tables."""
    return run_stage(ExtractStage(job))


COMMAND = Command("extract", "extract verbatim evidence spans for (query, chunk) pairs", ExtractJob, run_extract,
                  stage=ExtractStage, folder="spans")
