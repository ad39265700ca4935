"""The extract stage: (query, chunk) pairs -> spans, pairs and rejects tables.

Pairs come from a pairs file or a retrieval run (``extract.pairs``). Model extractors (highlighter,
semantic) run as one actor per GPU (else CPU actors), the HTTP LLM backend as I/O-bound actors, the vLLM
backend through ``ray.data.llm`` (``extract.vllm``). With ``previous``, pairs whose input and extractor are
unchanged keep that run's rows; with a ``run_id``, a rerun after a crash extracts only the pairs no
completed write covers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from .. import storage
from ..runs import committed_table_dir, jsonable, manifest_config, read_table
from ..tables import PAIR_INPUT, PAIRS, REJECTS, SPANS
from .ray_env import cpu_actor_args, cpu_threads, model_actor_args
from .retrieve import read_queries
from .runner import RunOptions, Stage, StageContext, StageResult, run_stage
from .sink import RETRIES_COLUMN, table_entries, with_counts, with_retries

EXTRACT_TABLES = {"spans": SPANS, "pairs": PAIRS, "rejects": REJECTS}


class ExtractActor:
    """One extractor (one model) per actor; batches of pairs in, packed pairs+spans out."""

    def __init__(self, config, run_id: str, threads: int | None = None, max_chunk_chars: int | None = None,
                 retries: int = 2) -> None:
        from ..extract import build_extractor
        from ..extract.stage import DEFAULT_MAX_CHUNK_CHARS, ExtractStage

        if threads:
            import torch

            torch.set_num_threads(threads)
        self.stage = ExtractStage(build_extractor(config), run_id, max_chunk_chars or DEFAULT_MAX_CHUNK_CHARS)
        self.retries = retries

    def _packed(self, batch: pa.Table) -> pa.Table:
        from ..extract.stage import pack

        out = self.stage(batch)
        t0 = time.perf_counter()
        packed = pack(out)
        ms = dict(self.stage.last_ms)
        ms["gate"] = ms.get("gate", 0) + round(1000 * (time.perf_counter() - t0))
        return with_counts(packed, {f"time_ms.{part}": v for part, v in ms.items()})

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ..extract.stage import pack

        try:
            return with_retries(self._packed, batch, self.retries, "extract")
        except Exception as exc:  # noqa: BLE001 - retries spent: error rows, the job goes on
            rows = batch.select(PAIR_INPUT.names).to_pylist()
            error = f"stage_failed: {type(exc).__name__}: {exc}"[:500]
            out = pack(self.stage.tables(rows, {}, [error] * len(rows), None))
            marks = [self.retries] + [0] * (out.num_rows - 1) if out.num_rows else []
            return out.append_column(RETRIES_COLUMN, pa.array(marks, pa.int32()))


@dataclass
class ExtractJob(RunOptions):
    """Settings of the extract job: pairs from a pairs file or a retrieval run, one extractor."""

    extractor: Any  # HighlighterConfig | SemanticConfig | LLMConfig
    pairs: str | None = None  # JSONL/Parquet pairs file
    retrieval: str | None = None  # a committed retrieval run
    chunks: str | None = None  # chunk run (default: found through the retrieval/index manifests)
    queries: str | None = None  # query file of the retrieval run (default: from its manifest)
    method: str = "hybrid"
    top_k: int = 5
    batch_rows: int = 64
    concurrency: int | None = None
    threads: int | None = None
    max_chunk_chars: int | None = None


def build_pairs(job: ExtractJob) -> tuple[pa.Table, dict[str, Any]]:
    """The job's ``PAIR_INPUT`` table, and where its parts came from."""
    from ..extract.pairs import chunk_lookup, pairs_from_records, pairs_from_retrieval, read_pair_records

    if (job.pairs is None) == (job.retrieval is None):
        raise ValueError("give exactly one of --pairs FILE or --retrieval RUN_DIR")
    if job.pairs is not None:
        if not storage.exists(job.pairs):
            raise FileNotFoundError(f"pairs file not found: {job.pairs}")
        records = list(read_pair_records(job.pairs))
        wanted = [str(r["chunk_id"]) for r in records if r.get("chunk_id") is not None]
        chunks = chunk_lookup(committed_table_dir(job.chunks, "chunks"), wanted) if job.chunks and wanted else {}
        return pairs_from_records(records, chunks), {"pairs": job.pairs, "chunks": job.chunks}
    retrieval_cfg = manifest_config(job.retrieval)
    queries_path = job.queries or retrieval_cfg["queries"]
    chunks_run = job.chunks or manifest_config(retrieval_cfg["index"])["chunks"]
    retrieval = read_table(job.retrieval, "retrieval")
    queries, _ = read_queries(queries_path)
    qmap = dict(zip(queries["query_id"].to_pylist(), queries["query"].to_pylist(), strict=True))
    ids = retrieval.filter(pc.equal(retrieval["method"], job.method))["chunk_id"].to_pylist()
    chunks = chunk_lookup(committed_table_dir(chunks_run, "chunks"), ids)
    table = pairs_from_retrieval(retrieval, qmap, chunks, job.method, job.top_k)
    return table, {"retrieval": job.retrieval, "queries": queries_path, "chunks": chunks_run}


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


def query_blocks(pairs: pa.Table, rows: int) -> list[pa.Table]:
    """Blocks of about ``rows`` pairs that never split one query's run of pairs (LLM requests group them)."""
    qids = pairs["query_id"].to_pylist()
    blocks, start = [], 0
    for i in range(1, len(qids) + 1):
        if i == len(qids) or (i - start >= rows and qids[i] != qids[i - 1]):
            blocks.append(pairs.slice(start, i - start))
            start = i
    return blocks or [pairs]


def extract_dataset(job: ExtractJob, pairs: pa.Table, run_id: str) -> ray.data.Dataset:
    """Packed pairs+spans+rejects blocks for the job's extractor."""
    from ..extract.llm import LLMConfig
    from ..extract.stage import DEFAULT_MAX_CHUNK_CHARS

    cfg = job.extractor
    if isinstance(cfg, LLMConfig) and cfg.backend == "vllm":
        from ..extract.vllm import LLMInterpret, vllm_dataset, vllm_requests

        requests, bad = vllm_requests(pairs, cfg, run_id, job.max_chunk_chars or DEFAULT_MAX_CHUNK_CHARS)
        ds = vllm_dataset(requests, cfg).map_batches(
            LLMInterpret, fn_constructor_kwargs={"config": cfg, "run_id": run_id}, batch_format="pyarrow",
            concurrency=job.concurrency or 1, num_cpus=1)
        return ds.union(ray.data.from_arrow(bad)) if bad is not None else ds
    kwargs = {"config": cfg, "run_id": run_id, "max_chunk_chars": job.max_chunk_chars, "retries": job.max_retries}
    if isinstance(cfg, LLMConfig):  # http: I/O bound actors, no GPU; blocks keep a query's pairs together
        ds = ray.data.from_arrow(query_blocks(pairs, job.batch_rows))
        return ds.map_batches(ExtractActor, batch_format="pyarrow", batch_size=None,
                              **cpu_actor_args(job.concurrency or 2, 0.5), fn_constructor_kwargs=kwargs)
    blocks = [pairs.slice(i, job.batch_rows) for i in range(0, max(1, pairs.num_rows), job.batch_rows)]
    kwargs["threads"] = cpu_threads(job.threads)
    return ray.data.from_arrow(blocks).map_batches(ExtractActor, batch_format="pyarrow",
                                                   **model_actor_args(job.concurrency, job.batch_rows),
                                                   fn_constructor_kwargs=kwargs)


def unchanged_pairs(previous: str, pairs: pa.Table, config: dict[str, Any]) -> set[str]:
    """Pair ids whose result ``previous`` holds for the same input (query, chunk text, paper, offset) and the
    same extractor (config hash and weights); failed pairs are extracted again."""
    prev = manifest_config(previous)
    if prev.get("extractor_hash") != config["extractor_hash"] or (
            config.get("model_revision") and prev.get("model_revision") != config["model_revision"]):
        return set()
    wanted = dict(zip(pairs["pair_id"].to_pylist(), _input_hashes(pairs), strict=True))
    old = storage.read_parquet(committed_table_dir(previous, "pairs"), columns=["pair_id", "input_hash", "error"])
    return {pid for pid, h, err in zip(*old.to_pydict().values(), strict=True)
            if err is None and h is not None and wanted.get(pid) == h}


def _input_hashes(pairs: pa.Table) -> list[str]:
    from ..tables import pair_input_hash

    return [pair_input_hash(q, c, p, s) for q, c, p, s in zip(
        pairs["query"].to_pylist(), pairs["chunk"].to_pylist(), pairs["paper_id"].to_pylist(),
        pairs["chunk_start"].to_pylist(), strict=True)]


class ExtractStage(Stage):
    command = "extract"
    resumable = True

    def plan(self) -> tuple[dict[str, Any], list[str]]:
        from ..extract import weights_fingerprint

        job: ExtractJob = self.job
        t0 = time.perf_counter()
        self.pairs, sources = build_pairs(job)
        self.t_pairs = time.perf_counter() - t0
        cfg = job.extractor
        kind = type(cfg).__name__.removesuffix("Config").lower()
        config = {"extractor": kind, "extractor_config": jsonable(cfg.to_dict()), "extractor_hash": cfg.hash,
                  "method": job.method, "top_k": job.top_k, **sources}
        if weights := weights_fingerprint(cfg):
            config["model_revision"] = weights
        return config, [v for v in sources.values() if v]

    def execute(self, ctx: StageContext) -> StageResult:
        job: ExtractJob = self.job
        pairs = self.pairs
        carried: set[str] = set()
        if job.previous:
            carried = unchanged_pairs(job.previous, pairs, ctx.config)
            ctx.carry(EXTRACT_TABLES, "pair_id", carried, record_keys="pair_id")
        skip = pa.array(sorted(ctx.done | carried), pa.string())
        todo = pairs.filter(pc.invert(pc.is_in(pairs["pair_id"], value_set=skip)))
        sink = ctx.sink(_unpack, EXTRACT_TABLES, key_columns={"pairs": "pair_id"})
        timings = {"pairs": self.t_pairs}
        if todo.num_rows:  # no model is loaded when every pair is carried or already done
            t0 = time.perf_counter()
            ctx.ray()
            t1 = time.perf_counter()
            extract_dataset(job, todo, ctx.run_id).write_datasink(sink)
            timings |= {"ray_start": t1 - t0, "extract_and_write": time.perf_counter() - t1}
        result = sink.finish()
        if result.rows["pairs"] != pairs.num_rows:
            raise RuntimeError(f"{pairs.num_rows} pairs in but {result.rows['pairs']} pair rows written")
        written = storage.read_parquet(storage.join(ctx.staging, "pairs"),
                                       columns=["error", "n_spans", "n_violations", "model_id", "model_revision"])
        loaded = written.filter(pc.is_valid(written["model_revision"])).slice(0, 1).to_pylist()
        config = {"model_id": loaded[0]["model_id"], "model_revision": loaded[0]["model_revision"]} if loaded else {}
        counts = (extract_counts(written, result.rows["spans"]) | {"rejects": result.rows["rejects"]}
                  | {k: v for k, v in result.counts.items() if k.startswith("rejects.") or k == "stage_retries"}
                  | {"extracted_pairs": todo.num_rows, "carried_pairs": len(carried)}
                  | ({"resumed_pairs": len(ctx.done)} if ctx.done else {}))
        counts |= {k: v for k, v in result.counts.items() if k.startswith("time_ms.")}
        return StageResult(tables=table_entries(result, EXTRACT_TABLES), counts=counts, timings_s=timings,
                           config=config)


def _unpack(packed: pa.Table) -> dict[str, pa.Table]:
    from ..extract.stage import unpack

    return unpack(packed)


def run_extract(job: ExtractJob) -> tuple[str, dict[str, Any]]:
    """Extract verbatim spans for every pair into ``spans/``, ``pairs/`` and ``rejects/`` tables."""
    return run_stage(ExtractStage(job))
