"""The commands: each turns parsed options into a job, runs it, and prints where its outputs are."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from importlib import resources
from typing import Any

from .. import storage
from ..chunking import ChunkerConfig

EXAMPLES = resources.files("verbatim_batch") / "examples"


def _given(args: argparse.Namespace, **names: str) -> dict[str, Any]:
    """``{field: args.<dest>}`` for every ``field=dest`` whose option was given (not None)."""
    return {f: getattr(args, d) for f, d in names.items() if getattr(args, d, None) is not None}


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``RunOptions`` fields a command's run and Ray options set."""
    return _given(args, output="output", overwrite="overwrite", run_id="run_id", previous="previous",
                  batch_retries="batch_retries", address="address", num_cpus="num_cpus")


def actor_options(args: argparse.Namespace) -> dict[str, Any]:
    return _given(args, batch_rows="batch_rows", concurrency="concurrency", threads="threads")


def chunker(args: argparse.Namespace, prefix: str = "") -> ChunkerConfig:
    p = prefix.replace("-", "_")
    return ChunkerConfig(heading_levels=getattr(args, p + "heading_levels"), min_chars=getattr(args, p + "min_chars"),
                         max_chars=getattr(args, p + "max_chars"), normalization=getattr(args, p + "normalize"))


def llm_config(args: argparse.Namespace, **fixed: Any):
    """An ``LLMConfig`` from the LLM options (those a command does not take stay at their defaults)."""
    from ..extract import extractor_config

    if not args.model:
        raise ValueError("--extractor llm needs --model (the served model name, or a hub id for vllm)")
    given = _given(args, backend="backend", base_url="base_url", api_key_env="api_key_env", style="style",
                   docs_per_request="docs_per_request", max_tokens="max_tokens", max_in_flight="max_in_flight",
                   timeout_s="timeout", request_retries="request_retries", tensor_parallel_size="tensor_parallel_size",
                   engines="engines", engine_gpus="engine_gpus", engine_cpus="engine_cpus",
                   placement_strategy="placement_strategy", max_model_len="max_model_len",
                   gpu_memory_utilization="gpu_memory_utilization", kv_cache_gb="kv_cache_gb")
    if getattr(args, "no_structured_output", False):
        given["structured_output"] = False
    if getattr(args, "enforce_eager", False):
        given["enforce_eager"] = True
    return extractor_config("llm", model=args.model, **(given | fixed))


def extractor(args: argparse.Namespace, threshold: float | None = None):
    """The extractor config the extractor options describe."""
    from ..extract import extractor_config

    common = {"threshold": threshold if threshold is not None else args.threshold, "min_chars": args.min_chars,
              "merge_gap": args.merge_gap, "token_budget": args.token_budget}
    if args.extractor == "highlighter":
        return extractor_config(
            "highlighter", model=args.model, revision=args.revision, max_length=args.max_length, stride=args.stride,
            dtype=args.dtype, trust_remote_code=args.trust_remote_code or None, **common)
    if args.extractor == "llm":
        return llm_config(args)
    return extractor_config("semantic", model=args.model, margin=args.margin, **common)


def _table_location(path: str, name: str) -> str:
    """Where table ``name`` of a run really is: its folder, or its single file (the index's ``ids.parquet``)."""
    folder = storage.join(path, name)
    if not storage.isdir(folder) and storage.exists(folder + ".parquet"):
        return folder + ".parquet"
    return folder


def report(path: str, manifest: dict) -> None:
    """Where a committed run's tables are, and its main counts."""
    counts = manifest["counts"]
    print(f"run {manifest['run_id']} committed to {path}")
    for name, info in manifest["tables"].items():
        print(f"  {name:<11} {info['rows']:>9} rows  {_table_location(path, name)}")
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


def chunk_job(args: argparse.Namespace):
    from ..pipeline import ChunkJob

    if args.max_paper_mb <= 0:
        raise ValueError(f"--max-paper-mb must be positive, got {args.max_paper_mb}")
    return ChunkJob(
        input=args.input, format=args.format, metadata=args.metadata, chunker=chunker(args),
        max_paper_bytes=int(args.max_paper_mb * 1024 * 1024), store_text=not args.no_store_text,
        **_given(args, concurrency="concurrency"), **run_options(args))


def embed_job(args: argparse.Namespace):
    from ..embedding import EmbedderConfig
    from ..pipeline import EmbedJob

    fields = {"output_dtype": args.output_dtype, "trust_remote_code": args.trust_remote_code}
    fields |= _given(args, model="model", revision="revision", max_length="max_length", token_budget="token_budget")
    return EmbedJob(chunks=args.chunks, embedder=EmbedderConfig(**fields), **actor_options(args), **run_options(args))


def index_job(args: argparse.Namespace):
    from ..index import DenseSpec
    from ..pipeline import IndexJob

    spec = DenseSpec(kind=args.kind, nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m)
    return IndexJob(embeddings=args.embeddings, chunks=args.chunks, dense=spec, bm25=not args.no_bm25,
                    **_given(args, max_drift="max_drift"), **run_options(args))


def _weights(value: str) -> dict[str, float]:
    out = {}
    for part in value.split(","):
        name, _, weight = part.partition("=")
        try:
            out[name.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"--weights expects name=number pairs like dense=1,bm25=0.5, got {value!r}") from None
    return out


def retrieve_job(args: argparse.Namespace):
    from ..pipeline import RetrieveJob
    from ..retrieval import RetrieverConfig

    cfg = RetrieverConfig(
        index_dir=args.index, k=args.k, methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        weights=_weights(args.weights), rrf_k=args.rrf_k, nprobe=args.nprobe, **_given(args, depth="depth"),
    )
    return RetrieveJob(index=args.index, queries=args.queries, retriever=cfg,
                       **_given(args, batch_rows="batch_rows", concurrency="concurrency"), **run_options(args))


def extract_job(args: argparse.Namespace):
    from ..pipeline import ExtractJob

    return ExtractJob(
        extractor=extractor(args), pairs=args.pairs, retrieval=args.retrieval, chunks=args.chunks,
        queries=args.queries, max_chunk_chars=args.max_chunk_chars, **_given(args, method="method", top_k="top_k"),
        **actor_options(args), **run_options(args))


def _run_and_report(build, run_name: str):
    def cmd(args: argparse.Namespace) -> int:
        from .. import pipeline

        path, manifest = getattr(pipeline, run_name)(build(args))
        report(path, manifest)
        return 0

    return cmd


def _thresholds(value: str) -> list[float]:
    try:
        return [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sweep-threshold expects numbers like 0.2,0.3,0.4, got {value!r}") from None


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..evaluate import evaluate_files, evaluate_predictions, format_sweep, gold_key, load_gold
    from ..extract import build_extractor
    from ..metrics import format_table

    report_dir = getattr(args, "report", None)
    detail: list[dict[str, Any]] | None = [] if report_dir else None
    if args.sweep_threshold is None:
        if not args.predictions:
            raise ValueError("give --predictions, or --sweep-threshold to run an extractor on the gold pairs")
        result = evaluate_files(args.gold, args.predictions, detail)
        print(json.dumps(result, indent=2) if args.json else format_table(result))
        if report_dir:
            _evaluation_report(report_dir, result, detail, None, f"evaluation of {args.predictions}", args.json)
        return 0
    thresholds = _thresholds(args.sweep_threshold)
    if args.extractor not in ("highlighter", "semantic"):
        raise ValueError("--sweep-threshold works with the highlighter and semantic extractors")
    gold = load_gold(args.gold)
    ext = build_extractor(extractor(args, thresholds[0]))
    runs = ext.sweep([g["query"] for g in gold], [g["chunk"] for g in gold], thresholds)
    results, details = {}, {}
    for t, pair_results in runs.items():
        preds = {gold_key(g): [(s.start, s.end) for s in r.spans] for g, r in zip(gold, pair_results, strict=True)}
        details[str(t)] = [] if report_dir else None
        results[str(t)] = evaluate_predictions(gold, preds, details[str(t)])
    if args.json:
        print(json.dumps({"extractor": ext.describe(), "thresholds": results}, indent=2))
    else:
        print(format_sweep(results, args.extractor))
    if report_dir:
        best = max(results, key=lambda t: results[t]["word"]["micro_f1"])
        _evaluation_report(report_dir, results[best], details[best], results,
                           f"{args.extractor} threshold sweep", args.json)
    return 0


def _evaluation_report(folder: str, result: dict, rows: list | None, sweep: dict | None, title: str,
                       quiet: bool) -> None:
    from ..report import write_evaluation_report

    path = write_evaluation_report(storage.normalize(folder), result, rows or [], sweep, title)
    print(f"report: {path}", file=sys.stderr if quiet else sys.stdout)  # --json keeps stdout pure JSON


def querygen_job(args: argparse.Namespace):
    from ..pipeline import QueryGenJob

    return QueryGenJob(chunks=args.chunks, llm=llm_config(args, backend="http"), seed=args.seed,
                       **_given(args, n_papers="n_papers", concurrency="concurrency"), **run_options(args))


def silver_job(args: argparse.Namespace):
    from ..pipeline import SilverJob

    return SilverJob(
        chunks=args.chunks, index=args.index, llm=llm_config(args, backend="http"), seed=args.seed,
        tokenizer=args.tokenizer, **_given(args, n_papers="n_papers", top_k="top_k", max_length="max_length",
                                           stride="stride", dev_fraction="dev_fraction"),
        **run_options(args))


def cmd_silver(args: argparse.Namespace) -> int:
    from ..pipeline import run_silver

    path, manifest = run_silver(silver_job(args))
    report(path, manifest)
    steps = ("papers", "queries", "rows", "kept", "train", "dev")
    print("  " + " -> ".join(f"{manifest['counts'].get(k, 0)} {k}" for k in steps))
    return 0


def chain_of(args: argparse.Namespace):
    """The ``Chain`` the chain options describe (``run`` and ``nightly``)."""
    from ..embedding import EmbedderConfig
    from ..pipeline import Chain

    if args.embed_model is None:  # the bundled embedder needs no hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return Chain(
        input=args.input, queries=args.queries, metadata=args.metadata, chunker=chunker(args, "chunk-"),
        embedder=EmbedderConfig(model=args.embed_model) if args.embed_model else None, extractor=extractor(args),
        **_given(args, format="format", method="method", top_k="top_k", max_drift="max_drift",
                 embed_batch_rows="embed_batch_rows", extract_batch_rows="extract_batch_rows"))


def nightly_job(args: argparse.Namespace):
    from ..pipeline import NightlyJob

    return NightlyJob(chain=chain_of(args), root=args.root, **_given(args, keep_runs="keep_runs"), **_given(
        args, run_id="run_id", batch_retries="batch_retries", address="address", num_cpus="num_cpus"))


def run_job(args: argparse.Namespace):
    from ..pipeline import ChainJob

    return ChainJob(chain=chain_of(args), **run_options(args))


def cmd_run(args: argparse.Namespace) -> int:
    from ..pipeline import run_chain_job
    from ..runs import read_manifest

    path, manifest = run_chain_job(run_job(args))
    for stage in manifest.get("stages", {}):
        print(f"\n== {stage} ==")
        report(os.path.join(path, stage), read_manifest(os.path.join(path, stage)))
    print(f"\nchain run {manifest['run_id']} committed to {path} (report: {os.path.join(path, 'report.html')})")
    return 0


def cmd_nightly(args: argparse.Namespace) -> int:
    from ..pipeline import run_nightly

    path, manifest = run_nightly(nightly_job(args))
    counts = manifest["counts"]
    print(f"nightly run {manifest['run_id']} committed to {path}; current -> {manifest['run_id']}")
    base = json.loads(manifest.get("config") or "{}").get("base")
    if "chunks.papers_unchanged" in counts:
        print("  papers: " + ", ".join(f"{counts.get('chunks.papers_' + k, 0)} {k}"
                                       for k in ("unchanged", "changed", "added", "removed")))
    elif base is None:  # a first night: every paper is new
        print(f"  papers: {counts.get('chunks.papers', 0)} added (first night)")
    else:
        print(f"  papers: {counts.get('chunks.papers_chunked', 0)} chunked, none carried from {base}")
    print(f"  chunks embedded {counts.get('embeddings.rows_new', 0)}, "
          f"carried {counts.get('embeddings.rows_carried', 0)}; index {manifest.get('index_update', {}).get('action')}")
    print(f"  pairs extracted {counts.get('spans.rows_new', 0)}, carried {counts.get('spans.rows_carried', 0)}; "
          f"{counts.get('spans.spans', 0)} spans")
    if storage.is_remote(args.root):  # object stores have no `current` symlink: CURRENT names the run
        print(f"  load the current span table: verbatim_batch.runs.current_table('{args.root}', 'spans')")
    else:
        print(f"  load the current span table: pandas.read_parquet('{os.path.join(args.root, 'current/spans/spans')}')")
    return 0


def train_job(args: argparse.Namespace):
    """The ``TrainJob`` the train options describe (unset options keep the job's defaults)."""
    from ..train import TrainJob

    return TrainJob(train=args.train, model=args.model, seed=args.seed, use_gpu=args.use_gpu, **_given(
        args, eval="eval", epochs="epochs", lr="lr", batch_size="batch_size", batch_tokens="batch_tokens",
        grad_accum="grad_accum", warmup_ratio="warmup_ratio", max_length="max_length", stride="stride",
        num_workers="num_workers", cpus_per_worker="cpus_per_worker", keep_checkpoints="keep_checkpoints"),
        **run_options(args))


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import run_train

    path, manifest = run_train(train_job(args))
    t = manifest["training"]
    best = t["best"]
    print(f"train run {manifest['run_id']} -> {path}")
    print(f"  model: {path}/model  (best epoch {best['epoch']}: Word-F1 {best.get('eval_word_f1', 0):.3f}, "
          f"IoU-F1 {best.get('eval_iou_f1', 0):.3f}, eval loss {best.get('eval_loss', 0):.4f})")
    print(f"  {t['global_step']} steps ({t['steps_per_epoch']}/epoch), resumed from step {t['resumed_from_step']}; "
          f"{(t['throughput'].get('tokens_per_s') or 0):.0f} tokens/s")
    print(f"  curves: {path}/training.html")
    return 0


def demo_chain(n_papers: int | None = None, scratch: str | None = None):
    """The demo's chain: the bundled example corpus and labelled queries, offline defaults. With ``n_papers``,
    the first N papers (by name) and the queries labelled with them, copied into ``scratch``."""
    from ..pipeline import Chain

    corpus_dir, queries = str(EXAMPLES / "corpus"), str(EXAMPLES / "queries.jsonl")
    if n_papers is not None and scratch is not None:
        names = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md"))[:n_papers]
        ids = {n.removesuffix(".md") for n in names}
        corpus_dir = os.path.join(scratch, "corpus")
        os.makedirs(corpus_dir)
        for name in names:
            shutil.copyfile(EXAMPLES / "corpus" / name, os.path.join(corpus_dir, name))
        for name in ("corpus/metadata.jsonl", "queries.jsonl"):  # both keyed by paper_id
            lines = (EXAMPLES / name).read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line.strip() and json.loads(line).get("paper_id") in ids]
            with open(os.path.join(scratch, name), "w", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in kept))
        queries = os.path.join(scratch, "queries.jsonl")
    return Chain(input=corpus_dir, queries=queries, format="md", metadata=os.path.join(corpus_dir, "metadata.jsonl"))


def cmd_demo(args: argparse.Namespace) -> int:
    """chunk -> embed -> index -> retrieve -> extract on the bundled corpus and queries, offline on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = storage.normalize(args.output)
    with tempfile.TemporaryDirectory(prefix="verbatim-demo-") as scratch:
        return _demo(args, out, demo_chain(args.n_papers, scratch))


def _demo(args: argparse.Namespace, out: str, chain) -> int:
    from ..pipeline import run_chain
    from ..records import read_rows
    from ..retrieval import recall_at
    from ..runs import read_manifest, read_table

    def show(stage: str) -> None:
        path = os.path.join(out, stage)
        print(f"\n== {stage} ==")
        report(path, read_manifest(path))

    run_chain(chain, out, overwrite=True, address=args.address, num_cpus=args.num_cpus, after_stage=show)
    labels, _ = read_rows(chain.queries, columns=["query_id", "chunk_id"])
    recall = recall_at(read_table(os.path.join(out, "retrieval"), "retrieval"),
                       {r["query_id"]: r["chunk_id"] for r in labels.to_pylist()}, k=5)
    print(f"\nrecall@5 on the {labels.num_rows} bundled labelled queries: "
          + ", ".join(f"{m} {v:.2f}" for m, v in recall.items()))
    _show_spans(os.path.join(out, "spans"))
    print(f"\nA readable report with the spans highlighted: {os.path.join(out, 'spans', 'report.html')}")
    print(f"\nOutputs under {out}. Load the span table with:")
    print(f"  {sys.executable} -c \"import pyarrow.parquet as pq; "
          f"print(pq.read_table('{out}/spans/spans').to_pandas().head())\"")
    return 0


def _show_spans(run_dir: str, n: int = 3) -> None:
    """A few extracted spans, best first, so a new user sees what the run produced."""
    from ..runs import read_table

    spans = read_table(run_dir, "spans", ["query", "paper_id", "text", "score"]).to_pylist()
    spans.sort(key=lambda r: -(r["score"] or 0))
    print(f"\n{len(spans)} verbatim spans; the top {min(n, len(spans))}:")
    for r in spans[:n]:
        text = " ".join(r["text"].split())
        print(f"  [{r['score']:.2f}] {r['query']!r} -> {r['paper_id']}: \"{text[:160]}\"")


def cmd_report(args: argparse.Namespace) -> int:
    from ..report import REPORT_HTML, REPORT_JSON, write_report

    result = write_report(args.run_dir, n_samples=args.samples)
    print(f"{result['command']} run {result['run_id']}:")
    print(f"  {os.path.join(args.run_dir, REPORT_JSON)}\n  {os.path.join(args.run_dir, REPORT_HTML)}")
    return 0


# ``verify`` starts a local Ray (no --address, no RAY_ADDRESS) only for a chunk run of more papers row groups than
# this: a row group (about 32 MB in memory) costs about 0.4 CPU-s to check, a local Ray's start 8 to 12 CPU-s.
VERIFY_LOCAL_RAY_UNITS = 32


def cmd_verify(args: argparse.Namespace) -> int:
    from ..verify import paper_units, verify_run

    units = paper_units(args.run_dir)  # 0 for an extract run: its checks run in this process
    address = args.address or os.environ.get("RAY_ADDRESS")
    if units > 1 and args.num_cpus != 1 and (address or args.num_cpus or (
            units > VERIFY_LOCAL_RAY_UNITS and (os.cpu_count() or 1) > 1)):
        from ..pipeline.ray_env import init_ray

        init_ray(args.address, args.num_cpus)  # the checks then run as Ray tasks (verify.check_papers)
    result = verify_run(args.run_dir)
    print(json.dumps(result, indent=2))
    return 1 if result["errors"] else 0


def _cutoffs(value: str) -> list[int]:
    try:
        ks = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise ValueError(f"--recall-at expects positive integers like 5,10,100, got {value!r}")
    return ks


def cmd_evaluate_retrieval(args: argparse.Namespace) -> int:
    from ..retrieval_eval import evaluate_retrieval, format_results

    result = evaluate_retrieval(args.retrieval, args.qrels, level=args.level, chunks=args.chunks,
                                queries=args.queries, recall_at=_cutoffs(args.recall_at))
    print(json.dumps(result, indent=2) if args.json else format_results(result))
    return 0


def rerank_job(args: argparse.Namespace):
    from ..pipeline.rerank import RerankJob
    from ..rerank import RerankerConfig

    cfg = RerankerConfig(model=args.model, trust_remote_code=args.trust_remote_code, **_given(
        args, revision="revision", max_length="max_length", token_budget="token_budget", dtype="dtype"))
    return RerankJob(retrieval=args.retrieval, reranker=cfg, chunks=args.chunks, queries=args.queries,
                     **_given(args, method="method", top_k="top_k"), **actor_options(args), **run_options(args))


def cmd_rerank(args: argparse.Namespace) -> int:
    from ..pipeline.rerank import run_rerank

    path, manifest = run_rerank(rerank_job(args))
    report(path, manifest)
    return 0


# command -> the job its options describe (``build_job`` builds one from Python)
JOBS = {
    "chunk": chunk_job, "embed": embed_job, "index": index_job, "retrieve": retrieve_job, "extract": extract_job,
    "rerank": rerank_job,
    "querygen": querygen_job, "silver": silver_job, "nightly": nightly_job, "train": train_job, "run": run_job,
}

HANDLERS = {
    "chunk": _run_and_report(chunk_job, "run_chunk"), "embed": _run_and_report(embed_job, "run_embed"),
    "index": _run_and_report(index_job, "run_index"), "retrieve": _run_and_report(retrieve_job, "run_retrieve"),
    "extract": _run_and_report(extract_job, "run_extract"), "querygen": _run_and_report(querygen_job, "run_querygen"),
    "evaluate": cmd_evaluate, "silver": cmd_silver, "demo": cmd_demo, "nightly": cmd_nightly, "verify": cmd_verify,
    "report": cmd_report, "train": cmd_train, "rerank": cmd_rerank,
    "evaluate-retrieval": cmd_evaluate_retrieval, "run": cmd_run,
}


def build_job(command: str, config: str | None = None, **options: Any):
    """The job a command would run, from Python: option values by their name (the YAML key / the flag's
    dest), over a YAML ``config`` file's, over the option defaults. Pass it to the stage's ``run_*``.

        job = build_job("extract", config="conf.yaml", retrieval="runs/retrieval", output="runs/spans")
        path, manifest = verbatim_batch.pipeline.run_extract(job)
    """
    from .. import config as configs
    from .options import command_options

    if command not in JOBS:
        raise ValueError(f"no job for {command!r} (one of {', '.join(JOBS)})")
    specs = command_options(command)
    unknown = set(options) - set(specs)
    if unknown:
        raise ValueError(f"{command} takes no option {sorted(unknown)}; it takes: {', '.join(sorted(specs))}")
    values = {dest: kw.get("default", False if kw.get("action") == "store_true" else None)
              for dest, (_, kw) in specs.items()}
    values |= (configs.load_config(config, command) if config else {}) | options
    missing = [specs[d][0] for d, (_, kw) in specs.items() if kw.get("required") and values.get(d) is None]
    if missing:
        raise ValueError(f"{command} needs {', '.join(missing)}")
    return JOBS[command](argparse.Namespace(command=command, **values))
