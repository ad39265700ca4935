"""Nightly runs: re-extract a corpus incrementally against the last committed run.

Layout of a nightly root::

    ROOT/
      runs/<run_id>/            one immutable folder per run
        plan.json               the run it builds on (fixed at its first start, so a resume agrees)
        chunks/ embeddings/ index/ retrieval/ spans/    committed stage runs
        manifest.json           written last: the run is committed when it exists
        report.json report.html
      CURRENT                   id of the newest committed run
      current -> runs/<run_id>  the same, as a symlink

Each stage takes the stage of the base run as ``previous`` and does only what changed: papers are
chunked when their text or metadata changed, chunks embedded when their text or context changed, the
FAISS index updated (or rebuilt past ``max_drift``), retrieval reused when index and queries are the
same, and pairs extracted when their query, chunk or the extractor changed. Every stage is committed
under the run's id, so rerunning with ``--run-id`` after a crash skips the stages already committed
and the completed writes of the one that was interrupted.

Readers load the current span table with one call::

    pandas.read_parquet("ROOT/current/spans/spans")
    duckdb.sql("SELECT * FROM 'ROOT/current/spans/spans/*.parquet'")
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from .. import storage
from ..chunking import ChunkerConfig
from ..faults import fault_point
from ..runs import (
    RUNS_DIR,
    build_manifest,
    committed_run,
    current_run,
    jsonable,
    new_run_id,
    publish,
    safe_run_id,
    write_manifest,
)
from .chains import STAGES, Chain, run_chain
from .runner import write_report

PLAN_FILE = "plan.json"


@dataclass
class NightlyJob:
    """Settings of a nightly run (the CLI and jobs/nightly.py build one)."""

    input: str
    queries: str
    root: str
    metadata: str | None = None
    format: str = "auto"
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    embedder: Any = None  # EmbedderConfig; None: the offline default
    extractor: Any = None  # extractor config; None: the offline semantic default
    dense: Any = None  # index.DenseSpec; None: auto
    method: str = "hybrid"
    top_k: int = 5
    max_drift: float = 0.2
    keep_runs: int = 7
    run_id: str | None = None
    embed_batch_rows: int = 1024
    extract_batch_rows: int = 64
    max_retries: int = 2
    address: str | None = None
    num_cpus: int | None = None

    def config(self) -> dict[str, Any]:
        from ..embedding import EmbedderConfig
        from ..extract.semantic import SemanticConfig

        return {"input": self.input, "queries": self.queries, "metadata": self.metadata, "format": self.format,
                "chunker_config_hash": self.chunker.hash, "embedder_hash": (self.embedder or EmbedderConfig()).hash,
                "extractor_hash": (self.extractor or SemanticConfig()).hash, "method": self.method,
                "top_k": self.top_k, "max_drift": self.max_drift,
                "dense": jsonable(self.dense.__dict__) if self.dense is not None else None}


def _plan(run_dir: str, root: str, config: dict[str, Any]) -> dict[str, Any]:
    """The run's plan: its base run, fixed when it first starts so that a resumed run builds on the same."""
    path = storage.join(run_dir, PLAN_FILE)
    if storage.exists(path):
        plan = json.loads(storage.read_text(path))
        if plan["config"] != config:
            raise ValueError(f"{run_dir} was started with another config; use a new run id")
        return plan
    storage.makedirs(run_dir)
    plan = {"base": current_run(root), "config": config}
    storage.write_text(path, json.dumps(plan, indent=2, sort_keys=True))
    return plan


def run_nightly(job: NightlyJob) -> tuple[str, dict[str, Any]]:
    """One incremental run under ``job.root``; moves ``current`` to it once it is committed."""
    t0 = time.perf_counter()
    root = storage.normalize(job.root)
    config = job.config()
    run_id = safe_run_id(job.run_id or new_run_id("nightly", config))
    run_dir = storage.join(root, RUNS_DIR, run_id)
    if done := committed_run(run_dir, run_id):  # committed before; maybe killed before `current` moved
        done["pruned"] = publish(root, run_id, job.keep_runs)
        return run_dir, done
    plan = _plan(run_dir, root, config)
    base = storage.join(root, RUNS_DIR, plan["base"]) if plan["base"] else None

    chain = Chain(input=job.input, queries=job.queries, metadata=job.metadata, format=job.format,
                  chunker=job.chunker, embedder=job.embedder, dense=job.dense, extractor=job.extractor,
                  method=job.method, top_k=job.top_k, max_drift=job.max_drift, embed_batch_rows=job.embed_batch_rows,
                  extract_batch_rows=job.extract_batch_rows)
    results, timings = run_chain(chain, run_dir, previous=base, run_id=run_id, address=job.address,
                                 num_cpus=job.num_cpus, max_retries=job.max_retries,
                                 after_stage=lambda name: fault_point(f"stage.done:{name}"))
    manifests = {name: m for name, (_, m) in results.items()}
    manifest = build_manifest(
        run_id=run_id, command="nightly", config=config | {"base": plan["base"]},
        inputs=[job.input, job.queries] + ([job.metadata] if job.metadata else []),
        tables={name: info for m in manifests.values() for name, info in m["tables"].items()},
        counts=_counts(manifests), timings_s=timings | {"total": time.perf_counter() - t0},
    )
    manifest["stages"] = {name: name for name in STAGES}
    manifest["index_update"] = manifests["index"].get("update", {"action": "rebuilt"})
    write_manifest(run_dir, manifest, on_commit=write_report)
    fault_point("nightly.committed")  # committed, `current` not yet moved
    manifest["pruned"] = publish(root, run_id, job.keep_runs)
    return run_dir, manifest


def _counts(manifests: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The numbers that say what a night did, from its stages' manifests."""
    picks = {
        "chunks": ("papers", "chunks", "quarantined", "papers_chunked", "papers_unchanged", "papers_changed",
                   "papers_added", "papers_removed", "chunks_carried"),
        "embeddings": ("embedded", "carried", "stage_retries"),
        "index": ("vectors", "removed", "added"),
        "retrieval": ("queries", "reused"),
        "spans": ("pairs", "extracted_pairs", "carried_pairs", "pairs_with_spans", "pairs_abstained",
                  "pairs_failed", "spans", "verbatim_violations", "rejects", "stage_retries"),
    }
    counts = {}
    for stage, keys in picks.items():
        got = manifests[stage]["counts"]
        for key in keys:
            if key in got:
                counts[f"{stage}.{key}"] = int(got[key])
    return counts
