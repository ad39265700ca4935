"""Dense index benchmark: exact Flat vs IVF-Flat vs IVF-PQ on synthetic embeddings.

    .venv/bin/python benchmarks/bench_index.py --n 1000000 --dim 384 [--json PATH]

Data: L2-normalised vectors from a two-level Gaussian mixture with anisotropic
noise, built to look like sentence embeddings rather than uniform noise (on which
IVF looks artificially bad) or tight separate blobs (on which it looks artificially
good): ``--topics`` random unit topic directions; ``--centres`` cluster centres,
each ``normalise(topic + g)`` for a random topic, with log-normal (sigma 1) weights
so cluster sizes are uneven; every vector is ``normalise(centre + --noise * h)``
where ``h`` is Gaussian with a power-law spectrum (variance of the i-th principal
direction ~ i^-``--alpha``, in a random rotation) and expected norm 1; ``g`` is
isotropic with expected norm 1. With the defaults (100 topics, 2,000 centres, noise
1.5, alpha 1) random pairs have cosine ~0, a query's nearest neighbour ~0.6, and
clusters overlap, so the recall of IVF grows gradually with nprobe. Queries are
1,000 more vectors drawn the same way from a different random stream (held out:
not in the index).

The vectors are written once to a raw float32 file in the work folder and every
build streams it in 50,000-row batches through ``build_dense`` (read with
``readinto``, not mapped, so the page cache does not count as our memory); build
times include those reads (``stream_pass_s`` is the time of one bare pass).

Measured, for each index: build time (auto spec for the kind), peak RSS of this
process during the build (sampled every 20 ms; also the rise above the RSS before
the build), index size on disk, time to search the 1,000 queries in one batch
(k=10, all threads), recall@10 against the Flat results. For IVF-Flat (and
IVF-PQ) also an nprobe sweep; for IVF-PQ also recall 10@100 (the share of the
true top 10 found in PQ's top 100, i.e. what exact re-ranking could recover).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import faiss
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verbatim_batch.retrieval.index import DenseSpec, build_dense, save_dense, search_dense, set_nprobe  # noqa: E402
from verbatim_batch.retrieval.index.dense import DENSE_FILE  # noqa: E402


class PeakRss:
    """Sample this process's RSS in a thread; ``peak`` is the largest value seen."""

    def __init__(self, interval: float = 0.02):
        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


class Mixture:
    def __init__(self, dim: int, n_topics: int, n_centres: int, noise: float, alpha: float, seed: int):
        rng = np.random.default_rng([seed, 0])
        topics = rng.standard_normal((n_topics, dim), dtype=np.float32)
        topics /= np.linalg.norm(topics, axis=1, keepdims=True)
        centres = topics[rng.integers(0, n_topics, n_centres)]
        centres += rng.standard_normal((n_centres, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        weights = rng.lognormal(0.0, 1.0, n_centres)
        spectrum = np.arange(1, dim + 1, dtype=np.float64) ** (-alpha / 2)
        spectrum *= np.sqrt(1.0 / np.sum(spectrum**2))  # E|h|^2 = 1
        rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
        self.centres = centres
        self.weights = weights / weights.sum()
        # h = (z * spectrum) @ rotation for z ~ N(0, I); fold the noise scale in
        self.noise_map = (spectrum[:, None] * rotation * noise).astype(np.float32)

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        dim = self.centres.shape[1]
        x = self.centres[rng.choice(len(self.centres), size=size, p=self.weights)]
        x += rng.standard_normal((size, dim), dtype=np.float32) @ self.noise_map
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def write_vectors(path: Path, n: int, mix: Mixture, seed: int, batch: int) -> None:
    with open(path, "wb") as f:
        for i, start in enumerate(range(0, n, batch)):
            mix.draw(np.random.default_rng([seed, 1, i]), min(batch, n - start)).tofile(f)


def stream(path: Path, n: int, dim: int, batch: int):
    def batches():
        with open(path, "rb", buffering=0) as f:
            for start in range(0, n, batch):
                arr = np.empty((min(batch, n - start), dim), dtype=np.float32)
                f.readinto(memoryview(arr).cast("B"))
                yield arr

    return batches


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    hits = sum(len(np.intersect1d(f[f >= 0], t[t >= 0])) for f, t in zip(found, truth, strict=True))
    return hits / (len(truth) * k)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--centres", type=int, default=2000)
    ap.add_argument("--noise", type=float, default=1.5)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--kinds", default="flat,ivf_flat,ivf_pq")
    ap.add_argument("--nprobes", default="4,8,16,32,64,128,256")
    ap.add_argument("--nlist", type=int, default=None, help="override the auto nlist (IVF kinds)")
    ap.add_argument("--train-size", type=int, default=None, help="override the auto train_size (IVF kinds)")
    ap.add_argument("--workdir", default=None, help="folder for the vectors and indexes (default: a temp folder)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    args = ap.parse_args(argv)

    t_all = time.perf_counter()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_index_"))
    work.mkdir(parents=True, exist_ok=True)
    mix = Mixture(args.dim, args.topics, args.centres, args.noise, args.alpha, args.seed)
    vec_path = work / f"vectors_{args.n}x{args.dim}.f32"
    t0 = time.perf_counter()
    write_vectors(vec_path, args.n, mix, args.seed, args.batch)
    gen_s = time.perf_counter() - t0
    queries = mix.draw(np.random.default_rng([args.seed, 2]), args.queries)
    batches = stream(vec_path, args.n, args.dim, args.batch)
    t0 = time.perf_counter()
    for _ in batches():
        pass
    stream_s = time.perf_counter() - t0

    summary: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "faiss_threads": faiss.omp_get_max_threads(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "faiss": faiss.__version__,
            "faiss_gpus": faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0,
            "loadavg_1m_start": round(os.getloadavg()[0], 2),  # other work on the machine skews timings
        },
        "data": {
            "n": args.n, "dim": args.dim, "queries": args.queries, "k": args.k, "topics": args.topics,
            "centres": args.centres, "noise": args.noise, "alpha": args.alpha, "seed": args.seed,
            "generate_s": round(gen_s, 2), "stream_pass_s": round(stream_s, 2),
        },
        "indexes": {},
    }
    truth = None
    for kind in [s for s in args.kinds.split(",") if s]:
        spec = DenseSpec(kind=kind, nlist=args.nlist if kind != "flat" else None,
                         train_size=args.train_size if kind != "flat" else None)
        gc.collect()
        with PeakRss() as mem:
            t0 = time.perf_counter()
            index, resolved = build_dense(batches, args.n, args.dim, spec)
            build_s = time.perf_counter() - t0
        folder = work / kind
        save_dense(index, folder)
        size = (folder / DENSE_FILE).stat().st_size
        t0 = time.perf_counter()
        scores, rows = search_dense(index, queries, args.k)
        search_s = time.perf_counter() - t0
        row = {
            "spec": {f: getattr(resolved, f) for f in ("kind", "nlist", "pq_m", "nprobe", "train_size", "use_gpu")},
            "build_s": round(build_s, 2),
            "peak_rss_mb": round(mem.peak / 2**20),
            "peak_rss_rise_mb": round((mem.peak - mem.start) / 2**20),
            "size_mb": round(size / 2**20, 1),
            "search_s": round(search_s, 3),
            "search_ms_per_query": round(1000 * search_s / args.queries, 3),
        }
        if kind == "flat":
            truth = rows
            row["recall_at_k"] = 1.0
        elif truth is not None:
            row["recall_at_k"] = round(recall_at(rows, truth), 4)
            if kind == "ivf_pq":  # would re-ranking a longer PQ list with exact vectors recover the top k?
                _, rows_long = search_dense(index, queries, 10 * args.k)
                row[f"recall_{args.k}_at_{10 * args.k}"] = round(recall_at(rows_long, truth), 4)
            sweep = []
            for nprobe in sorted({int(p) for p in args.nprobes.split(",") if p} | {resolved.nprobe}):
                if nprobe > resolved.nlist:
                    continue
                set_nprobe(index, nprobe)
                t0 = time.perf_counter()
                _, r = search_dense(index, queries, args.k)
                dt_s = time.perf_counter() - t0
                sweep.append({"nprobe": nprobe, "recall_at_k": round(recall_at(r, truth), 4),
                              "search_s": round(dt_s, 3), "ms_per_query": round(1000 * dt_s / args.queries, 3)})
            row["nprobe_sweep"] = sweep
        summary["indexes"][kind] = row
        print(json.dumps({kind: row}), flush=True)
        del index
        gc.collect()
    summary["total_s"] = round(time.perf_counter() - t_all, 1)
    summary["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return summary


if __name__ == "__main__":
    main()
