"""Extract pair planning at 10k / 100k / 1M pairs (issue 20, item 4): what the driver pays to turn a retrieval
run into the (query, chunk) pairs an extractor reads, as its peak RSS and CPU-seconds.

    .venv/bin/python benchmarks/bench_pair_planning.py --pairs 10000,100000,1000000 \
        --out benchmarks/results-pair-planning.json

For each size the script writes, as committed run folders with manifests (what `chunk` and `retrieve` write,
synthesised directly as Parquet, no model): a chunk run of ``pairs / 2`` chunks of about 900 characters each
(so a chunk is retrieved about twice), a query file of ``pairs / 5`` queries and a retrieval run of 5 hybrid
rows per query (top-5) plus 5 dense rows (which `extract --method hybrid` filters out). With ``--previous`` it
also writes a previous extract run whose pairs table holds every pair with its input hash (so `extract
--previous` carries all of them: the carry check's cost).

Then one fresh process per size measures the planning step of `extract` exactly as the runner calls it
(``ExtractStage``: ``plan``, ``work``, ``unchanged`` when a previous run is given, ``dataset``), with the
extractor's placement replaced by the identity (the pairs dataset as the extractor would read it, blocks in
the object store) and the dataset's rows counted (``materialize``: every block is built, none comes to the
driver). The process starts a local Ray (2 CPUs) first, as a real extract does before its dataset is built. The
runner's to-do count (keys in the skip set) is part of the step; its row check after the write (``pc.unique``
of every key) is not, and is reported apart (``driver_peak_rss_with_row_check_mb``).
``--placement io`` plans for an I/O extractor (an LLM endpoint, never called): blocks of whole queries.

* ``driver_peak_rss_mb``: ``getrusage(RUSAGE_SELF).ru_maxrss`` of the measuring process at the end (its peak
  over its life: imports and Ray start included, synthesis is not: it ran in another process);
  ``driver_rss_before_mb``: its RSS just before planning (after Ray started);
* ``driver_cpu_s``: the measuring process's CPU (user + system) over the planning step;
* ``tree_cpu_s``: that plus the CPU of every descendant (raylet, GCS, Ray workers) over the step, from psutil
  (cpu_times of processes alive at the end, minus their figure at the start; a worker that exits in between
  is missed, so this reads low if anything).

Row counts are checked (``rows == pairs``). Growth exponents are log(figure ratio) / log(size ratio) between
consecutive sizes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOP_K = 5
WORDS = ("model data training results table accuracy baseline corpus evaluation token layer attention "
         "annotation dataset split benchmark score error analysis method approach").split()


def synth(root: Path, n_pairs: int, seed: int, previous: bool) -> dict[str, str]:
    """Chunk run, query file, retrieval run (and a previous extract run) for ``n_pairs`` pairs under ``root``."""
    import pyarrow as pa

    from verbatim_batch.core import storage
    from verbatim_batch.core.runs import build_manifest, write_manifest
    from verbatim_batch.core.tables import CHUNKS, PAIRS, RETRIEVAL, pair_id, pair_input_hash

    rng = random.Random(seed)
    n_queries, n_chunks = n_pairs // TOP_K, max(1, n_pairs // 2)
    chunk_run, retrieval_run = root / "chunks", root / "retrieval"
    body = " ".join(rng.choice(WORDS) for _ in range(150))
    per_file = 50_000
    papers = max(1, n_chunks // 20)
    chunk_text: dict[int, tuple[str, str, int]] = {}
    for f0 in range(0, n_chunks, per_file):
        ids = range(f0, min(n_chunks, f0 + per_file))
        texts = [f"Chunk {i}: " + body[(i * 7) % 200:] for i in ids]
        pids = [f"paper-{i % papers:06d}" for i in ids]
        starts = [1000 * (i // papers) for i in ids]
        if previous:
            chunk_text.update({i: (t, p, s) for i, t, p, s in zip(ids, texts, pids, starts, strict=True)})
        n = len(ids)
        table = pa.table({
            "chunk_id": [f"c{i:08d}" for i in ids], "paper_id": pids, "chunk_index": [i // papers for i in ids],
            "start": starts, "end": [s + len(t) for s, t in zip(starts, texts, strict=True)],
            "byte_start": starts, "byte_end": [s + len(t) for s, t in zip(starts, texts, strict=True)],
            "text": texts, "context": [""] * n, "heading_path": [[]] * n, "n_chars": [len(t) for t in texts],
            "flags": [[]] * n, "paper_sha256": ["0" * 64] * n, "normalization": ["nfc"] * n,
            "chunker_config_hash": ["bench"] * n}, schema=CHUNKS)
        storage.write_parquet(table, str(chunk_run / "chunks" / f"part-{f0 // per_file:05d}.parquet"))
    write_manifest(str(chunk_run), build_manifest(run_id="bench-chunks", command="chunk", config={}, inputs=[],
                                                  tables={}, counts={}, timings_s={}))
    queries = root / "queries.jsonl"
    with open(queries, "w", encoding="utf-8") as fh:
        for q in range(n_queries):
            fh.write(json.dumps({"query_id": f"q{q:07d}", "query": f"what does study {q} report about "
                                 f"{WORDS[q % len(WORDS)]}?"}) + "\n")
    q_per_file = 20_000
    prev_rows = []
    for q0 in range(0, n_queries, q_per_file):
        rows = []
        for q in range(q0, min(n_queries, q0 + q_per_file)):
            picks = rng.sample(range(n_chunks), min(n_chunks, 2 * TOP_K))
            for method, chosen in (("hybrid", picks[:TOP_K]), ("dense", picks[TOP_K:])):
                for rank, c in enumerate(chosen, 1):
                    rows.append((f"q{q:07d}", rank, f"c{c:08d}", f"paper-{c % papers:06d}", method))
                    if previous and method == "hybrid":
                        text, pid, start = chunk_text[c]
                        query = f"what does study {q} report about {WORDS[q % len(WORDS)]}?"
                        prev_rows.append((pair_id(f"q{q:07d}", f"c{c:08d}"), f"q{q:07d}", pid, f"c{c:08d}", rank,
                                          pair_input_hash(query, text, pid, start)))
        cols = list(zip(*rows, strict=True))
        table = pa.table({"query_id": cols[0], "rank": cols[1], "chunk_id": cols[2], "paper_id": cols[3],
                          "score": [1.0] * len(rows), "dense_rank": cols[1], "bm25_rank": [None] * len(rows),
                          "method": cols[4]}, schema=RETRIEVAL)
        storage.write_parquet(table, str(retrieval_run / "retrieval" / f"part-{q0 // q_per_file:05d}.parquet"))
    write_manifest(str(retrieval_run), build_manifest(
        run_id="bench-retrieval", command="retrieve", config={"queries": str(queries), "chunks": str(chunk_run)},
        inputs=[], tables={}, counts={}, timings_s={}))
    out = {"chunks": str(chunk_run), "retrieval": str(retrieval_run), "queries": str(queries)}
    if previous:
        from verbatim_batch.extract.semantic import SemanticConfig

        prev_run = root / "previous"
        cols = list(zip(*prev_rows, strict=True))
        n = len(prev_rows)
        table = pa.table({
            "run_id": ["prev"] * n, "pair_id": cols[0], "query_id": cols[1], "query": [None] * n,
            "paper_id": cols[2], "chunk_id": cols[3], "chunk_index": [0] * n, "rank": cols[4], "relevant": [None] * n,
            "n_spans": [0] * n, "relevance": [None] * n, "latency_ms": [None] * n, "error": [None] * n,
            "n_violations": [0] * n, "extractor": ["semantic"] * n, "model_id": [None] * n,
            "model_revision": [None] * n, "config_hash": ["x"] * n, "extra": [None] * n, "input_hash": cols[5]},
            schema=PAIRS)
        storage.write_parquet(table, str(prev_run / "pairs" / "part-00000.parquet"))
        cfg = SemanticConfig()
        from verbatim_batch.extract import registry

        config = {"extractor_hash": cfg.hash}
        if weights := registry.weights_fingerprint(cfg):
            config["model_revision"] = weights
        write_manifest(str(prev_run), build_manifest(run_id="prev", command="extract", config=config, inputs=[],
                                                     tables={}, counts={}, timings_s={}))
        out["previous"] = str(prev_run)
    return out


def measure(runs: dict[str, str], staging: str, placement: str) -> dict:
    """In this (fresh) process: start Ray, then plan the extract stage as the runner does, and count."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import ray

    from verbatim_batch.engine.pair_plan import query_blocks
    from verbatim_batch.engine.ray_env import init_ray
    from verbatim_batch.engine.stage import StageContext
    from verbatim_batch.extract.llm import LLMConfig
    from verbatim_batch.extract.semantic import SemanticConfig
    from verbatim_batch.stages import extract as ex

    def identity(setup, pairs):  # the pairs dataset as the extractor would read it
        if isinstance(pairs, pa.Table):  # the planner before issue 20's item 4: a table on the driver
            return ray.data.from_arrow(query_blocks(pairs, setup.resources.batch_rows))
        return pairs

    for kind in list(ex.PLACEMENTS):
        ex.PLACEMENTS[kind] = identity
    init_ray(address="local", num_cpus=2, log_to_driver=False)
    extractor = SemanticConfig() if placement == "model" else LLMConfig(model="bench", base_url="http://127.0.0.1:9/v1")
    job = ex.ExtractJob(output=staging, extractor=extractor, retrieval=runs["retrieval"], method="hybrid",
                        top_k=TOP_K, previous=runs.get("previous"))
    stage = ex.ExtractStage(job)
    me = psutil.Process()

    def tree_cpu() -> tuple[float, float]:
        t = me.cpu_times()
        own = t.user + t.system
        kids = 0.0
        for p in me.children(recursive=True):
            try:
                c = p.cpu_times()
                kids += c.user + c.system
            except psutil.Error:
                pass
        return own, kids

    rss_before = me.memory_info().rss
    own0, kids0 = tree_cpu()
    t0 = time.perf_counter()
    plan = stage.plan()
    ctx = StageContext(job=job, run_id="bench", staging=staging, config=plan.config, started=t0,
                       resources=stage.resolved())  # as the runner hands them over
    work = stage.work(plan, ctx)
    carried = 0
    skip = pa.array([], pa.string())
    if job.previous:
        keys = stage.unchanged(plan, work, job.previous, staging)
        skip = keys if isinstance(keys, (pa.Array, pa.ChunkedArray)) else pa.array(sorted(keys), pa.string())
        carried = len(skip)
    rows = 0
    if carried < work.n_in:
        ds = stage.dataset(plan, work, skip, ctx)
        rows = ds.materialize().count()
    if work.keys is not None and len(skip):  # the runner's to-do count (keys in the skip set)
        len(pc.unique(work.keys.filter(pc.is_in(work.keys, value_set=skip))))
    wall = time.perf_counter() - t0
    own1, kids1 = tree_cpu()
    peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if work.keys is not None:  # after the write, the runner checks every key is accounted for: not planning
        len(pc.unique(work.keys))
    return {"n_in": work.n_in, "rows": rows, "carried": carried, "driver_peak_rss_mb": peak,
            "driver_rss_before_mb": round(rss_before / 2**20), "driver_cpu_s": round(own1 - own0, 2),
            "tree_cpu_s": round((own1 - own0) + (kids1 - kids0), 2), "wall_s": round(wall, 1),
            "driver_peak_rss_with_row_check_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def exponent(a: float, b: float, factor: float) -> float | None:
    return round(math.log(b / a) / math.log(factor), 3) if a > 0 and b > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="10000,100000,1000000")
    ap.add_argument("--work", default="/tmp/bench-pair-planning")
    ap.add_argument("--previous", action="store_true", help="also measure the carry check (extract --previous)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--placement", choices=("model", "io"), default="model",
                    help="the extractor's placement: model (semantic) or io (an LLM endpoint: query-grouped blocks)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--measure", default="", help=argparse.SUPPRESS)  # internal: JSON of the runs to plan
    args = ap.parse_args()
    if args.measure:
        spec = json.loads(args.measure)
        print("RESULT " + json.dumps(measure(spec["runs"], spec["staging"], spec["placement"])))
        return
    results = []
    for n in [int(x) for x in args.pairs.split(",")]:
        root = Path(args.work) / f"p{n}{'-prev' if args.previous else ''}"
        marker = root / "runs.json"
        if marker.exists():
            runs = json.loads(marker.read_text())
        else:
            t = time.perf_counter()
            runs = synth(root, n, args.seed, args.previous)
            marker.write_text(json.dumps(runs))
            print(f"synthesised {n} pairs in {time.perf_counter() - t:.0f} s", flush=True)
        spec = json.dumps({"runs": runs, "staging": str(root / "staging"), "placement": args.placement})
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}
        done = subprocess.run([sys.executable, __file__, "--measure", spec], capture_output=True, text=True,
                              env=env, timeout=3600)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"measuring {n} pairs failed:\n{(done.stdout + done.stderr)[-4000:]}")
        row = {"pairs": n, **json.loads(line[7:])}
        assert row["n_in"] == n and row["rows"] + row["carried"] == n, row
        print(json.dumps(row), flush=True)
        results.append(row)
    for a, b in zip(results, results[1:], strict=False):
        factor = b["pairs"] / a["pairs"]
        b["exponent_vs_previous_size"] = {k: exponent(a[k], b[k], factor)
                                          for k in ("driver_peak_rss_mb", "driver_cpu_s", "tree_cpu_s")}
    summary = {"label": args.label, "placement": args.placement, "previous": args.previous,
               "date": dt.date.today().isoformat(),
               "machine": f"{psutil.cpu_count()} cores (shared), {round(psutil.virtual_memory().total / 2**30)} GiB",
               "command": " ".join(sys.argv), "results": results}
    if len(results) > 1:
        summary["rss_ratio_largest_to_smallest"] = round(results[-1]["driver_peak_rss_mb"] /
                                                         results[0]["driver_peak_rss_mb"], 3)
    print(json.dumps(summary, indent=1))
    if args.out:
        out = Path(args.out)
        old = json.loads(out.read_text()) if out.exists() else []
        out.write_text(json.dumps([*old, summary], indent=1) + "\n")


if __name__ == "__main__":
    main()
