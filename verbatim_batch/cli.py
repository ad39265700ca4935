"""``verbatim-batch <command>``: the command-line entry point."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources

from . import storage
from .chunking import ChunkerConfig
from .corpus import NORMALIZATIONS

EXAMPLES = resources.files("verbatim_batch") / "examples"


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


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of options (see README: Configuration); flags override it")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs for a local Ray (default: all)")


def _add_run_args(p: argparse.ArgumentParser, previous: str | None) -> None:
    p.add_argument("--run-id", help="name the run; rerunning with the same id after a crash resumes it "
                   "(committed work is skipped) and a committed run is left as is")
    if previous:
        p.add_argument("--previous", help=previous)


def _add_chunk_args(p: argparse.ArgumentParser) -> None:
    d = ChunkerConfig()
    p.add_argument("--min-chars", type=int, default=d.min_chars, help="merge chunks shorter than this")
    p.add_argument("--max-chars", type=int, default=d.max_chars, help="split chunks longer than this")
    p.add_argument("--heading-levels", type=_levels, default=d.heading_levels, help="ATX levels that split (1,2,3,4)")
    p.add_argument(
        "--normalize", type=_normalizations, default=(),
        help=f"opt-in text normalisation, comma-separated from {','.join(NORMALIZATIONS)} (default: none; "
        "changes offsets and is recorded on every row)",
    )
    p.add_argument("--max-paper-mb", type=float, default=16.0, help="quarantine papers larger than this")
    p.add_argument("--no-store-text", action="store_true", help="do not keep paper text in the papers table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verbatim-batch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("chunk", help="chunk a corpus into papers/chunks/quarantine Parquet tables")
    p.add_argument("--input", required=True, help="folder of .md files, or Parquet/JSONL file or folder")
    p.add_argument("--output", required=True, help="run folder to create (atomically)")
    p.add_argument("--format", choices=["auto", "md", "parquet", "jsonl"], default="auto")
    p.add_argument("--metadata", help="metadata table (.parquet/.jsonl/.csv) joined by paper id")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--concurrency", type=int, help="max parallel ingest tasks")
    _add_run_args(p, "an earlier chunk run: its unchanged papers are copied, not chunked again")
    _add_chunk_args(p)
    _add_ray_args(p)

    p = sub.add_parser("embed", help="embed the chunks of a chunk run")
    p.add_argument("--chunks", required=True, help="a committed chunk run folder")
    p.add_argument("--output", required=True, help="embeddings run folder to create")
    p.add_argument("--model", help="hub id or local path (default: the bundled offline all-MiniLM-L6-v2)")
    p.add_argument("--revision", help="model revision (hub)")
    p.add_argument("--max-length", type=int, help="truncate inputs to this many tokens (default: the model's)")
    p.add_argument("--token-budget", type=int, help="padded tokens per forward pass")
    p.add_argument("--output-dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the hub (off by default)")
    p.add_argument("--batch-rows", type=int, default=1024, help="rows per actor call (sorted and packed inside)")
    p.add_argument("--concurrency", type=int, help="model actors (default: one per GPU, else 1)")
    p.add_argument("--threads", type=int, help="torch threads per CPU actor")
    p.add_argument("--stage-retries", type=int, default=2, help="retries of a failed batch (recorded in the manifest)")
    p.add_argument("--overwrite", action="store_true")
    _add_run_args(p, "an earlier embed run: vectors of unchanged chunks (same text and context) are copied")
    _add_ray_args(p)

    p = sub.add_parser("index", help="build FAISS + BM25 indexes from an embeddings run")
    p.add_argument("--embeddings", required=True, help="a committed embed run folder")
    p.add_argument("--chunks", required=True, help="the chunk run the embeddings came from")
    p.add_argument("--output", required=True, help="index folder to create")
    p.add_argument("--kind", choices=["auto", "flat", "ivf_flat", "ivf_pq"], default="auto",
                   help="auto: exact Flat below 1M vectors, IVF-Flat up to 20M, IVF-PQ above")
    p.add_argument("--nlist", type=int)
    p.add_argument("--nprobe", type=int)
    p.add_argument("--pq-m", type=int)
    p.add_argument("--no-bm25", action="store_true", help="skip the full-text index")
    p.add_argument("--max-drift", type=float, default=0.2,
                   help="with --previous: rebuild when (removed + added) / vectors since the last build exceeds this")
    p.add_argument("--overwrite", action="store_true")
    _add_run_args(p, "the index of the embed run --embeddings carried vectors from: updated instead of rebuilt")
    _add_ray_args(p)

    p = sub.add_parser("retrieve", help="top-k chunks per query: dense, BM25 and hybrid")
    p.add_argument("--index", required=True, help="an index folder from `verbatim-batch index`")
    p.add_argument("--queries", required=True, help="JSONL or Parquet with query (and query_id)")
    p.add_argument("--output", required=True, help="retrieval run folder to create")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--methods", default="dense,bm25,hybrid", help="any of dense,bm25,hybrid")
    p.add_argument("--weights", default="dense=1,bm25=1", help="hybrid RRF weights")
    p.add_argument("--rrf-k", type=int, default=60)
    p.add_argument("--nprobe", type=int, help="IVF lists to probe (default: the index's)")
    p.add_argument("--concurrency", type=int)
    p.add_argument("--overwrite", action="store_true")
    _add_run_args(p, "an earlier retrieval run, reused as is when index and queries are the same")
    _add_ray_args(p)

    p = sub.add_parser("extract", help="extract verbatim evidence spans for (query, chunk) pairs")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pairs", help="JSONL/Parquet pairs file (query + chunk or chunk_id per row)")
    src.add_argument("--retrieval", help="a committed retrieval run: pairs are query x top-k")
    p.add_argument("--output", required=True, help="extract run folder to create (spans/ and pairs/ tables)")
    p.add_argument("--chunks", help="chunk run to resolve chunk ids (default for --retrieval: from its manifests)")
    p.add_argument("--queries", help="query file of the retrieval run (default: from its manifest)")
    p.add_argument("--method", default="hybrid", help="retrieval method whose rows become pairs")
    p.add_argument("--top-k", type=int, default=5, help="retrieved chunks per query to extract from")
    _add_extractor_args(p)
    p.add_argument("--max-chunk-chars", type=int, help="pairs with longer chunks become error rows (200000)")
    p.add_argument("--batch-rows", type=int, default=64, help="pairs per actor call (sorted and packed inside)")
    p.add_argument("--concurrency", type=int, help="model actors (default: one per GPU, else 1)")
    p.add_argument("--threads", type=int, help="torch threads per CPU actor")
    p.add_argument("--stage-retries", type=int, default=2, help="retries of a failed batch (recorded in the manifest)")
    p.add_argument("--overwrite", action="store_true")
    _add_run_args(p, "an earlier extract run: pairs with the same input and extractor keep its results")
    _add_ray_args(p)

    p = sub.add_parser("evaluate", help="score predicted spans against a gold pairs file (paper metrics)")
    p.add_argument("--gold", required=True, help="pairs file with relevant and gold_spans")
    p.add_argument("--predictions", help="a span table / extract run folder, or JSONL rows with spans")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--config", help="YAML file of options; flags override it")
    p.add_argument("--sweep-threshold", help="run an extractor on the gold pairs at these thresholds, e.g. "
                   "0.2,0.3,0.4,0.5, and score each (needs no --predictions)")
    _add_extractor_args(p)

    p = sub.add_parser("querygen", help="generate 3 search queries per sampled chunk with an LLM (3 steps)")
    p.add_argument("--chunks", required=True, help="a committed chunk run")
    p.add_argument("--output", required=True, help="querygen run folder to create")
    p.add_argument("--n-papers", type=int, default=100, help="papers to sample (one chunk each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, help="actors sending requests (2)")
    p.add_argument("--overwrite", action="store_true")
    _add_llm_args(p)
    _add_ray_args(p)

    p = sub.add_parser("silver", help="silver training data: sample, querygen, retrieve, teacher, filter, split")
    p.add_argument("--chunks", required=True, help="a committed chunk run")
    p.add_argument("--index", required=True, help="the index built from that chunk run")
    p.add_argument("--output", required=True, help="folder for the job's runs (querygen/ retrieval/ teacher/ data/)")
    p.add_argument("--n-papers", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-k", type=int, default=5, help="retrieved chunks per query (hybrid)")
    p.add_argument("--dev-fraction", type=float, default=0.1)
    p.add_argument("--tokenizer", help="write tokenized windows for this tokenizer (hub id or path)")
    p.add_argument("--window", type=int, default=8192, help="tokens per window (max length)")
    p.add_argument("--stride", type=int, default=256, help="tokens shared by neighbouring windows")
    p.add_argument("--overwrite", action="store_true")
    _add_llm_args(p)
    _add_ray_args(p)

    p = sub.add_parser("nightly", help="incremental run against the last committed one; moves ROOT/current")
    p.add_argument("--input", required=True, help="the corpus: folder of .md files, or Parquet/JSONL")
    p.add_argument("--queries", required=True, help="JSONL or Parquet with query (and query_id)")
    p.add_argument("--root", required=True, help="folder holding runs/ and the current pointer")
    p.add_argument("--metadata", help="metadata table joined by paper id")
    p.add_argument("--format", choices=["auto", "md", "parquet", "jsonl"], default="auto")
    p.add_argument("--embed-model", help="embedding model, hub id or path (default: the bundled MiniLM)")
    p.add_argument("--method", default="hybrid", help="retrieval method whose top-k become pairs")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--max-drift", type=float, default=0.2, help="index drift since the last build before a rebuild")
    p.add_argument("--keep-runs", type=int, default=7, help="committed runs kept (older ones are deleted)")
    p.add_argument("--stage-retries", type=int, default=2, help="retries of a failed batch (recorded)")
    p.add_argument("--embed-batch-rows", type=int, default=1024, help="chunks per embedding actor call")
    p.add_argument("--extract-batch-rows", type=int, default=64, help="pairs per extraction actor call")
    p.add_argument("--chunk-min-chars", type=int, default=ChunkerConfig().min_chars)
    p.add_argument("--chunk-max-chars", type=int, default=ChunkerConfig().max_chars)
    p.add_argument("--heading-levels", type=_levels, default=ChunkerConfig().heading_levels)
    p.add_argument("--normalize", type=_normalizations, default=())
    _add_extractor_args(p)
    _add_run_args(p, None)
    _add_ray_args(p)

    p = sub.add_parser("demo", help="run the pipeline on the bundled example corpus (offline, CPU)")
    p.add_argument("--output", default="verbatim-demo", help="folder for the demo's runs")
    _add_ray_args(p)

    p = sub.add_parser("report", help="(re)write report.json and report.html of a run folder")
    p.add_argument("run_dir")
    p.add_argument("--samples", type=int, default=12, help="pairs shown with highlighted spans (extract runs)")

    p = sub.add_parser("verify", help="re-check a chunk run: offsets exact, coverage complete")
    p.add_argument("run_dir")

    p = sub.add_parser("synth", help="write a synthetic corpus (see verbatim_batch.synth)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _add_extractor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--extractor", choices=["semantic", "highlighter", "llm"], default="semantic",
                   help="semantic: offline sentence scorer (bundled MiniLM); highlighter: ModernBERT token "
                   "classifier; llm: an LLM through an OpenAI-compatible endpoint or in-cluster vLLM")
    p.add_argument("--model", help="hub id or local path (highlighter default: KRLabsOrg/acl-verbatim-modernbert; "
                   "semantic default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--revision", help="model revision (hub; highlighter)")
    p.add_argument("--threshold", type=float, help="keep tokens / sentences scoring at least this "
                   "(highlighter 0.2; semantic: see README)")
    p.add_argument("--min-chars", type=int, help="drop spans shorter than this (10)")
    p.add_argument("--merge-gap", type=int, help="merge spans at most this many characters apart (20)")
    p.add_argument("--max-length", type=int, help="highlighter window in tokens (8192)")
    p.add_argument("--stride", type=int, help="tokens shared by neighbouring highlighter windows (256)")
    p.add_argument("--margin", type=float, help="semantic: keep sentences within this of the best one")
    p.add_argument("--token-budget", type=int, help="padded tokens per forward pass")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="highlighter (auto)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the hub (off by default)")
    g = p.add_argument_group("llm extractor")
    g.add_argument("--backend", choices=["http", "vllm"], help="http: OpenAI-compatible endpoint; vllm: in-cluster")
    g.add_argument("--base-url", help="http: the endpoint, e.g. http://127.0.0.1:8000/v1 (or OPENAI_BASE_URL)")
    g.add_argument("--api-key-env", help="http: environment variable holding the API key (OPENAI_API_KEY)")
    g.add_argument("--style", choices=["default", "paragraph"], help="prompt: exact spans, or whole passages")
    g.add_argument("--docs-per-request", type=int, help="chunks per request as doc_0..doc_n (5; 1 = one each)")
    g.add_argument("--max-tokens", type=int, help="answer length limit (2048)")
    g.add_argument("--no-structured-output", action="store_true", help="do not ask for schema-constrained JSON")
    g.add_argument("--max-in-flight", type=int, help="http: concurrent requests per actor (8)")
    g.add_argument("--timeout", type=float, help="http: seconds per request (180)")
    g.add_argument("--max-retries", type=int, help="http: retries with backoff on 429/5xx/connection errors (4)")
    g.add_argument("--tensor-parallel-size", type=int, help="vllm: GPUs per engine (1)")
    g.add_argument("--engines", type=int, help="vllm: engine replicas (1)")


def _add_llm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the model name the endpoint serves")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (or OPENAI_BASE_URL)")
    p.add_argument("--api-key-env", help="environment variable holding the API key (OPENAI_API_KEY)")
    p.add_argument("--max-tokens", type=int, help="answer length limit (2048)")
    p.add_argument("--no-structured-output", action="store_true", help="do not ask for schema-constrained JSON")
    p.add_argument("--max-in-flight", type=int, help="concurrent requests per actor (8)")
    p.add_argument("--timeout", type=float, help="seconds per request (180)")
    p.add_argument("--max-retries", type=int, help="retries with backoff on 429/5xx/connection errors (4)")


def _llm(args: argparse.Namespace):
    from .extract import extractor_config

    return extractor_config(
        "llm", model=args.model, backend="http", base_url=args.base_url, api_key_env=args.api_key_env,
        max_tokens=args.max_tokens, structured_output=False if args.no_structured_output else None,
        max_in_flight=args.max_in_flight, timeout_s=args.timeout, max_retries=args.max_retries)


def cmd_querygen(args: argparse.Namespace) -> int:
    from .pipeline import QueryGenJob, run_querygen

    path, manifest = run_querygen(QueryGenJob(
        chunks=args.chunks, output=args.output, llm=_llm(args), n_papers=args.n_papers, seed=args.seed,
        concurrency=args.concurrency, overwrite=args.overwrite, address=args.address, num_cpus=args.num_cpus))
    _report(path, manifest)
    return 0


def cmd_silver(args: argparse.Namespace) -> int:
    from .pipeline import SilverJob, run_silver

    path, manifest = run_silver(SilverJob(
        chunks=args.chunks, index=args.index, output=args.output, llm=_llm(args), n_papers=args.n_papers,
        seed=args.seed, top_k=args.top_k, dev_fraction=args.dev_fraction, tokenizer=args.tokenizer,
        max_length=args.window, stride=args.stride, overwrite=args.overwrite, address=args.address,
        num_cpus=args.num_cpus))
    _report(path, manifest)
    steps = ("papers", "queries", "rows", "kept", "train", "dev")
    print("  " + " -> ".join(f"{manifest['counts'].get(k, 0)} {k}" for k in steps))
    return 0


def _extractor(args: argparse.Namespace, threshold: float | None = None):
    from .extract import extractor_config

    common = {"threshold": threshold if threshold is not None else args.threshold, "min_chars": args.min_chars,
              "merge_gap": args.merge_gap, "token_budget": args.token_budget}
    if args.extractor == "highlighter":
        return extractor_config(
            "highlighter", model=args.model, revision=args.revision, max_length=args.max_length, stride=args.stride,
            dtype=args.dtype, trust_remote_code=args.trust_remote_code or None, **common)
    if args.extractor == "llm":
        if not args.model:
            raise ValueError("--extractor llm needs --model (the served model name, or a hub id for vllm)")
        return extractor_config(
            "llm", model=args.model, backend=args.backend, base_url=args.base_url, api_key_env=args.api_key_env,
            style=args.style, docs_per_request=args.docs_per_request, max_tokens=args.max_tokens,
            structured_output=False if args.no_structured_output else None, max_in_flight=args.max_in_flight,
            timeout_s=args.timeout, max_retries=args.max_retries, tensor_parallel_size=args.tensor_parallel_size,
            engines=args.engines)
    return extractor_config("semantic", model=args.model, margin=args.margin, **common)


def _chunker(args: argparse.Namespace) -> ChunkerConfig:
    return ChunkerConfig(
        heading_levels=args.heading_levels, min_chars=args.min_chars, max_chars=args.max_chars,
        normalization=args.normalize,
    )


def cmd_chunk(args: argparse.Namespace) -> int:
    from .pipeline import ChunkJob, run_chunk

    job = ChunkJob(
        input=args.input, output=args.output, format=args.format, metadata=args.metadata,
        chunker=_chunker(args), max_paper_bytes=int(args.max_paper_mb * 1024 * 1024),
        store_text=not args.no_store_text, overwrite=args.overwrite, address=args.address,
        num_cpus=args.num_cpus, concurrency=args.concurrency, run_id=args.run_id, previous=args.previous,
    )
    path, manifest = run_chunk(job)
    _report(path, manifest)
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from .embedding import EmbedderConfig
    from .pipeline import EmbedJob, run_embed

    fields = {"output_dtype": args.output_dtype, "trust_remote_code": args.trust_remote_code}
    for name in ("model", "revision", "max_length", "token_budget"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    job = EmbedJob(
        chunks=args.chunks, output=args.output, embedder=EmbedderConfig(**fields), batch_rows=args.batch_rows,
        concurrency=args.concurrency, threads=args.threads, overwrite=args.overwrite, address=args.address,
        num_cpus=args.num_cpus, run_id=args.run_id, previous=args.previous, max_retries=args.stage_retries,
    )
    path, manifest = run_embed(job)
    _report(path, manifest)
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from .index import DenseSpec
    from .pipeline import IndexJob, run_index

    spec = DenseSpec(kind=args.kind, nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m)
    job = IndexJob(
        embeddings=args.embeddings, chunks=args.chunks, output=args.output, dense=spec, bm25=not args.no_bm25,
        overwrite=args.overwrite, address=args.address, num_cpus=args.num_cpus, run_id=args.run_id,
        previous=args.previous, max_drift=args.max_drift,
    )
    path, manifest = run_index(job)
    _report(path, manifest)
    return 0


def _weights(value: str) -> dict[str, float]:
    out = {}
    for part in value.split(","):
        name, _, weight = part.partition("=")
        try:
            out[name.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"--weights expects name=number pairs like dense=1,bm25=0.5, got {value!r}") from None
    return out


def cmd_retrieve(args: argparse.Namespace) -> int:
    from .pipeline import RetrieveJob, run_retrieve
    from .retrieval import RetrieverConfig

    cfg = RetrieverConfig(
        index_dir=args.index, k=args.k, methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        weights=_weights(args.weights), rrf_k=args.rrf_k, nprobe=args.nprobe,
    )
    job = RetrieveJob(
        index=args.index, queries=args.queries, output=args.output, retriever=cfg, concurrency=args.concurrency,
        overwrite=args.overwrite, address=args.address, num_cpus=args.num_cpus, run_id=args.run_id,
        previous=args.previous,
    )
    path, manifest = run_retrieve(job)
    _report(path, manifest)
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from .pipeline import ExtractJob, run_extract

    job = ExtractJob(
        output=args.output, extractor=_extractor(args), pairs=args.pairs, retrieval=args.retrieval,
        chunks=args.chunks, queries=args.queries, method=args.method, top_k=args.top_k, batch_rows=args.batch_rows,
        concurrency=args.concurrency, threads=args.threads, max_chunk_chars=args.max_chunk_chars,
        overwrite=args.overwrite, address=args.address, num_cpus=args.num_cpus, run_id=args.run_id,
        previous=args.previous, max_retries=args.stage_retries,
    )
    path, manifest = run_extract(job)
    _report(path, manifest)
    return 0


def _thresholds(value: str) -> list[float]:
    try:
        return [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sweep-threshold expects numbers like 0.2,0.3,0.4, got {value!r}") from None


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_files, gold_key, load_gold
    from .metrics import format_table

    if args.sweep_threshold is None:
        if not args.predictions:
            raise ValueError("give --predictions, or --sweep-threshold to run an extractor on the gold pairs")
        result = evaluate_files(args.gold, args.predictions)
        print(json.dumps(result, indent=2) if args.json else format_table(result))
        return 0
    from .evaluate import evaluate_predictions
    from .extract import build_extractor

    thresholds = _thresholds(args.sweep_threshold)
    if args.extractor not in ("highlighter", "semantic"):
        raise ValueError("--sweep-threshold works with the highlighter and semantic extractors")
    gold = load_gold(args.gold)
    extractor = build_extractor(_extractor(args, thresholds[0]))
    runs = extractor.sweep([g["query"] for g in gold], [g["chunk"] for g in gold], thresholds)
    results = {}
    for t, pair_results in runs.items():
        preds = {gold_key(g): [(s.start, s.end) for s in r.spans] for g, r in zip(gold, pair_results, strict=True)}
        results[str(t)] = evaluate_predictions(gold, preds)
    if args.json:
        print(json.dumps({"extractor": extractor.describe(), "thresholds": results}, indent=2))
    else:
        for t, result in results.items():
            print(f"\n== {args.extractor} at threshold {t} ==")
            print(format_table(result))
    return 0


def cmd_nightly(args: argparse.Namespace) -> int:
    from .embedding import EmbedderConfig
    from .nightly import NightlyJob, run_nightly

    if args.embed_model is None:  # the bundled embedder needs no hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    chunker = ChunkerConfig(heading_levels=args.heading_levels, min_chars=args.chunk_min_chars,
                            max_chars=args.chunk_max_chars, normalization=args.normalize)
    job = NightlyJob(
        input=args.input, queries=args.queries, root=args.root, metadata=args.metadata, format=args.format,
        chunker=chunker, embedder=EmbedderConfig(model=args.embed_model) if args.embed_model else None,
        extractor=_extractor(args), method=args.method, top_k=args.top_k, max_drift=args.max_drift,
        keep_runs=args.keep_runs, run_id=args.run_id, max_retries=args.stage_retries, address=args.address,
        num_cpus=args.num_cpus, embed_batch_rows=args.embed_batch_rows, extract_batch_rows=args.extract_batch_rows)
    path, manifest = run_nightly(job)
    counts = manifest["counts"]
    print(f"nightly run {manifest['run_id']} committed to {path}; current -> {manifest['run_id']}")
    print("  papers: " + ", ".join(f"{counts.get('chunks.papers_' + k, 0)} {k}"
                                   for k in ("unchanged", "changed", "added", "removed")))
    c = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith(("embeddings.", "spans."))}
    print(f"  chunks embedded {c.get('embedded', 0)}, carried {c.get('carried', 0)}; "
          f"index {manifest.get('index_update', {}).get('action')}")
    print(f"  pairs extracted {c.get('extracted_pairs', 0)}, carried {c.get('carried_pairs', 0)}; "
          f"{c.get('spans', 0)} spans")
    if storage.is_remote(args.root):  # object stores have no `current` symlink: CURRENT names the run
        print(f"  load the current span table: verbatim_batch.runs.current_table('{args.root}', 'spans')")
    else:
        print(f"  load the current span table: pandas.read_parquet('{os.path.join(args.root, 'current/spans/spans')}')")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """chunk -> embed -> index -> retrieve -> extract on the bundled corpus and queries, offline on CPU."""
    from .extract.semantic import SemanticConfig
    from .pipeline import (
        ChunkJob,
        EmbedJob,
        ExtractJob,
        IndexJob,
        RetrieveJob,
        read_rows,
        run_chunk,
        run_embed,
        run_extract,
        run_index,
        run_retrieve,
    )
    from .retrieval import recall_at
    from .runs import read_table

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    corpus_dir = str(EXAMPLES / "corpus")
    queries = str(EXAMPLES / "queries.jsonl")
    out = storage.normalize(args.output)
    ray_args = {"address": args.address, "num_cpus": args.num_cpus}
    steps = [
        ("chunk", lambda: run_chunk(ChunkJob(
            input=corpus_dir, output=os.path.join(out, "chunks"), format="md",
            metadata=os.path.join(corpus_dir, "metadata.jsonl"), overwrite=True, **ray_args))),
        ("embed", lambda: run_embed(EmbedJob(
            chunks=os.path.join(out, "chunks"), output=os.path.join(out, "embeddings"), overwrite=True, **ray_args))),
        ("index", lambda: run_index(IndexJob(
            embeddings=os.path.join(out, "embeddings"), chunks=os.path.join(out, "chunks"),
            output=os.path.join(out, "index"), overwrite=True, **ray_args))),
        ("retrieve", lambda: run_retrieve(RetrieveJob(
            index=os.path.join(out, "index"), queries=queries, output=os.path.join(out, "retrieval"),
            overwrite=True, **ray_args))),
        ("extract", lambda: run_extract(ExtractJob(
            output=os.path.join(out, "spans"), extractor=SemanticConfig(), retrieval=os.path.join(out, "retrieval"),
            method="hybrid", top_k=5, overwrite=True, **ray_args))),
    ]
    for name, step in steps:
        print(f"\n== {name} ==")
        path, manifest = step()
        _report(path, manifest)
    labels = read_rows(queries).select(["query_id", "chunk_id"]).to_pylist()
    recall = recall_at(read_table(os.path.join(out, "retrieval"), "retrieval"),
                       {r["query_id"]: r["chunk_id"] for r in labels}, k=5)
    print(f"\nrecall@5 on the {len(labels)} bundled labelled queries: "
          + ", ".join(f"{m} {v:.2f}" for m, v in recall.items()))
    _show_spans(os.path.join(out, "spans"))
    print(f"\nA readable report with the spans highlighted: {os.path.join(out, 'spans', 'report.html')}")
    print(f"\nOutputs under {out}. Load the span table with:")
    print(f"  {sys.executable} -c \"import pyarrow.parquet as pq; "
          f"print(pq.read_table('{out}/spans/spans').to_pandas().head())\"")
    return 0


def _show_spans(run_dir: str, n: int = 3) -> None:
    """A few extracted spans, best first, so a new user sees what the run produced."""
    from .runs import read_table

    spans = read_table(run_dir, "spans", ["query", "paper_id", "text", "score"]).to_pylist()
    spans.sort(key=lambda r: -(r["score"] or 0))
    print(f"\n{len(spans)} verbatim spans; the top {min(n, len(spans))}:")
    for r in spans[:n]:
        text = " ".join(r["text"].split())
        print(f"  [{r['score']:.2f}] {r['query']!r} -> {r['paper_id']}: \"{text[:160]}\"")


def _report(path: str, manifest: dict) -> None:
    counts = manifest["counts"]
    print(f"run {manifest['run_id']} committed to {path}")
    for name, info in manifest["tables"].items():
        print(f"  {name:<11} {info['rows']:>9} rows  {os.path.join(path, name)}")
    print(f"  manifest    {os.path.join(path, 'manifest.json')}")
    reasons = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("quarantine.")}
    if reasons:
        print(f"  quarantined by reason: {json.dumps(reasons, sort_keys=True)}")
    if "papers_bytes" in counts:
        print(f"  {counts['papers_bytes'] / 1e6:.1f} MB of papers in {manifest['timings_s']['total']:.1f} s")
    if "pairs" in counts:
        print(f"  {counts['pairs']} pairs: {counts.get('pairs_with_spans', 0)} with spans, "
              f"{counts.get('pairs_abstained', 0)} abstained, {counts.get('pairs_failed', 0)} failed; "
              f"{counts.get('spans', 0)} spans, {counts.get('verbatim_violations', 0)} withheld as non-verbatim")
    if "truncated" in counts:
        print(f"  {counts.get('tokens', 0)} tokens, {counts['truncated']} chunks truncated to the model's length")


def cmd_report(args: argparse.Namespace) -> int:
    from .report import REPORT_HTML, REPORT_JSON, write_report

    report = write_report(args.run_dir, n_samples=args.samples)
    print(f"{report['command']} run {report['run_id']}:")
    print(f"  {os.path.join(args.run_dir, REPORT_JSON)}\n  {os.path.join(args.run_dir, REPORT_HTML)}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_run

    result = verify_run(args.run_dir)
    print(json.dumps(result, indent=2))
    return 1 if result["errors"] else 0


def _with_config(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; a ``--config FILE`` supplies defaults that flags override."""
    from . import config

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    if known.config and command:
        try:
            config.apply(parser, command, known.config)
        except config.ConfigError as exc:
            parser.exit(2, f"verbatim-batch {command}: config error: {exc}\n")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .faults import mark_driver

    mark_driver()  # crash tests can aim a fault at this process from a worker
    args = _with_config(argv)
    if args.command == "synth":
        from .synth import main as synth_main

        return synth_main(args.args)
    handlers = {
        "chunk": cmd_chunk, "embed": cmd_embed, "index": cmd_index, "retrieve": cmd_retrieve,
        "extract": cmd_extract, "evaluate": cmd_evaluate,
        "querygen": cmd_querygen, "silver": cmd_silver, "demo": cmd_demo,
        "nightly": cmd_nightly, "verify": cmd_verify, "report": cmd_report,
    }
    try:
        return handlers[args.command](args)
    except (FileNotFoundError, FileExistsError, ValueError, NotImplementedError) as exc:
        print(f"verbatim-batch {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
