"""Nightly incremental runs against a run from scratch, side by side on one synthetic corpus.

    .venv/bin/python benchmarks/bench_nightly.py --papers 200 --out benchmarks/results-nightly.json

Four `verbatim-batch nightly` processes (each its own local Ray, offline CPU defaults):
1. night 1 from scratch;  2. night 2, nothing changed;  3. night 3 after editing 1% of the papers;
4. a from-scratch run over night 3's corpus in another root (the baseline night 3 is compared with).
Records wall time and what each night did (papers chunked, chunks embedded, pairs extracted, index action).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUERIES = REPO / "verbatim_batch" / "examples" / "queries.jsonl"


def night(root: Path, corpus: Path, run_id: str) -> dict:
    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())", "nightly",
           "--input", str(corpus), "--queries", str(QUERIES), "--root", str(root), "--run-id", run_id]
    meta = corpus / "metadata.jsonl"
    if meta.exists():
        cmd += ["--metadata", str(meta)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    manifest = json.loads((root / "runs" / run_id / "manifest.json").read_text())
    c = manifest["counts"]
    return {"wall_s": round(wall, 1), "stages_s": manifest["timings_s"],
            "papers_chunked": c.get("chunks.papers_chunked"), "chunks_embedded": c.get("embeddings.rows_new"),
            "chunks_carried": c.get("embeddings.rows_carried"), "pairs_extracted": c.get("spans.rows_new"),
            "pairs_carried": c.get("spans.rows_carried"), "index": manifest.get("index_update", {}).get("action"),
            "retrieval_reused": c.get("retrieval.reused")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--papers", type=int, default=200)
    ap.add_argument("--changed", type=float, default=0.01, help="fraction of papers edited before night 3")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results-nightly.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-nightly-"))
    try:
        corpus = tmp / "corpus"
        subprocess.run([sys.executable, "-m", "verbatim_synth", "--out", str(corpus), "--n", str(args.papers),
                        "--seed", "0"], check=True, capture_output=True)
        results = {"night1_scratch": night(tmp / "root", corpus, "n1"),
                   "night2_unchanged": night(tmp / "root", corpus, "n2")}
        papers = sorted(corpus.glob("*.md"))
        edited = random.Random(0).sample(papers, max(1, round(args.changed * len(papers))))
        for p in edited:
            text = p.read_text(encoding="utf-8")
            cut = len(text) // 2
            p.write_text(text[:cut] + "\n\nA sentence added by the benchmark's nightly edit.\n\n" + text[cut:],
                         encoding="utf-8")
        results["night3_changed"] = night(tmp / "root", corpus, "n3")
        results["night3_scratch_baseline"] = night(tmp / "scratch", corpus, "n3")
        out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
               "command": " ".join(sys.argv), "papers": args.papers, "edited": len(edited), "results": results}
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
