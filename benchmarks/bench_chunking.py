"""Chunking throughput: the chunker alone, the ingest stage in one process, and the Ray job.

    .venv/bin/python benchmarks/bench_chunking.py --gb 1.0 --num-cpus 2

Generates (once, cached under bench-data/) a synthetic md corpus of the requested size
with the real corpus's size distribution, then measures, in one run, side by side:

  1. chunk_markdown alone, one process (papers read one at a time);
  2. the ingest stage alone (decode, validate, chunk, build Arrow rows), one process;
  3. the same work as the Ray job but sequential: read files + ingest + write Parquet, one process;
  4. the Ray job (`run_chunk`) on a local Ray with --num-cpus CPUs.

Reports MB/s (MB = 10^6 bytes of UTF-8 markdown), MB/s per core, and peak RSS (for the
Ray job: the sum over the driver and every Ray process, sampled every 0.2 s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verbatim_batch.corpus.chunker import ChunkerConfig, chunk_markdown  # noqa: E402
from verbatim_batch.corpus.ingest import DEFAULT_MAX_PAPER_BYTES, IngestStage  # noqa: E402
from verbatim_batch.corpus.readers import list_sources, read_md_files  # noqa: E402
from verbatim_synth import corpus as synth  # noqa: E402


class PeakRSS:
    """Peak summed RSS of this process and all its descendants (Ray starts its own processes)."""

    def __init__(self, interval: float = 0.2, tree: bool = True) -> None:
        self.interval, self.tree, self.peak = interval, tree, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        procs = [me] + (me.children(recursive=True) if self.tree else [])
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.peak = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def corpus(root: Path, gb: float, seed: int) -> tuple[Path, int]:
    folder = root / f"md-{gb:g}gb-seed{seed}"
    done = folder / "_done.json"
    if done.exists():
        return folder, json.loads(done.read_text())["bytes"]
    shutil.rmtree(folder, ignore_errors=True)
    t = time.perf_counter()
    summary = synth.write_corpus(folder, seed=seed, fmt="md", total_bytes=int(gb * 1e9), metadata=False)
    print(f"generated {summary['papers']} papers, {summary['bytes'] / 1e6:.0f} MB in {time.perf_counter() - t:.0f} s")
    done.write_text(json.dumps({"bytes": summary["bytes"], "papers": summary["papers"]}))
    return folder, summary["bytes"]


def bench_chunker(files: list[Path]) -> tuple[float, int, int]:
    t, chars, n = time.perf_counter(), 0, 0
    cfg = ChunkerConfig()
    for f in files:
        text = f.read_bytes().decode("utf-8")
        n += len(chunk_markdown(text, cfg))
        chars += len(text)
    return time.perf_counter() - t, n, chars


def bench_stage(folder: Path, write_to: str | None) -> tuple[float, int]:
    fs, sources = list_sources(str(folder), "md")
    stage = IngestStage()
    t, n = time.perf_counter(), 0
    for k, batch in enumerate(read_md_files(fs, sources, DEFAULT_MAX_PAPER_BYTES)):
        out = stage(batch)
        n += out["chunks"].num_rows
        if write_to:
            for name, table in out.items():
                os.makedirs(os.path.join(write_to, name), exist_ok=True)
                pq.write_table(table, os.path.join(write_to, name, f"part-{k}.parquet"), compression="zstd")
    return time.perf_counter() - t, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "bench-data"))
    ap.add_argument("--json", help="write results here too")
    args = ap.parse_args()

    folder, nbytes = corpus(Path(args.data), args.gb, args.seed)
    mb = nbytes / 1e6
    files = sorted(folder.glob("*.md"))
    results: dict = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.platform()}",
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "corpus": {"papers": len(files), "MB": round(mb, 1)},
    }

    with PeakRSS(tree=False) as mem:
        secs, n_chunks, _ = bench_chunker(files)
    results["chunker_alone_1proc"] = {"s": round(secs, 2), "MB_per_s": round(mb / secs, 1),
                                      "chunks": n_chunks, "peak_rss_MB": round(mem.peak / 1e6)}

    with PeakRSS(tree=False) as mem:
        secs, n_chunks = bench_stage(folder, None)
    results["ingest_stage_1proc"] = {"s": round(secs, 2), "MB_per_s": round(mb / secs, 1),
                                     "chunks": n_chunks, "peak_rss_MB": round(mem.peak / 1e6)}

    tmp = tempfile.mkdtemp(prefix="bench-chunk-")
    try:
        with PeakRSS(tree=False) as mem:
            secs, n_chunks = bench_stage(folder, os.path.join(tmp, "seq"))
        seq = mb / secs
        results["sequential_job_1proc"] = {"s": round(secs, 2), "MB_per_s": round(seq, 1),
                                           "chunks": n_chunks, "peak_rss_MB": round(mem.peak / 1e6)}

        from verbatim_batch.engine.ray_env import init_ray
        from verbatim_batch.stages.chunk import ChunkJob, run_chunk

        t0 = time.perf_counter()
        init_ray(num_cpus=args.num_cpus)
        startup = time.perf_counter() - t0
        with PeakRSS(tree=True) as mem:
            t = time.perf_counter()
            _, manifest = run_chunk(ChunkJob(input=str(folder), output=os.path.join(tmp, "ray"), format="md"))
            secs = time.perf_counter() - t
        ray_rate = mb / secs
        results["ray_job"] = {
            "cpus": args.num_cpus, "s": round(secs, 2), "ray_startup_s": round(startup, 1),
            "MB_per_s": round(ray_rate, 1), "MB_per_s_per_core": round(ray_rate / args.num_cpus, 1),
            "chunks": manifest["tables"]["chunks"]["rows"], "peak_rss_all_processes_MB": round(mem.peak / 1e6),
            "speedup_vs_sequential_job": round(ray_rate / seq, 2),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
