"""What metrics cost (issue 39): the one recurring cost they add to a run, the performance sampler's thread in the
driver (every ``perf.INTERVAL_S`` seconds: the CPU time and memory of every process of the driver's tree), measured
directly on a live local Ray (``time.thread_time`` of the sampling thread's work, per sample), and the one-off costs
at a commit (the metrics block: listing the staging folder; the push: one HTTP request).

The per-sample figure times the samples a run takes (one per second of its wall time) over the run's tree
CPU-seconds is the share metrics add to it; ``bench_before_after.py demo`` measures the same from the outside (the
demo's tree CPU-seconds before and after, alternating), where run-to-run spread is several percent.

    .venv/bin/python benchmarks/bench_metrics_overhead.py --samples 200 --json benchmarks/results-metrics-overhead.json

"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()

    import ray

    from verbatim_batch.engine.ray_env import init_ray
    from verbatim_batch.engine.telemetry import accounting, perf

    init_ray(None, args.num_cpus)

    @ray.remote
    class Busy:  # a few live workers, as a stage has
        def ping(self) -> int:
            return os.getpid()

    actors = [Busy.remote() for _ in range(args.num_cpus)]
    ray.get([a.ping.remote() for a in actors])
    sampler = perf.Sampler()
    window = sampler.open()  # starts the sampling thread; the samples below are timed in this thread instead
    per_sample = []
    for _ in range(args.samples):
        t = time.thread_time()
        sampler.sample()
        per_sample.append(time.thread_time() - t)
    processes = len(sampler.cpu)
    block = window.close()
    t = time.thread_time()
    for _ in range(20):
        accounting.written_bytes(str(ROOT / "verbatim_batch" / "examples"))
    listing_ms = (time.thread_time() - t) / 20 * 1000
    ray.shutdown()
    ms = statistics.fmean(per_sample) * 1000
    out = {
        "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "command": " ".join(sys.argv), "processes_in_tree": processes,
        "cpu_ms_per_sample_mean": round(ms, 3), "cpu_ms_per_sample_median": round(
            statistics.median(per_sample) * 1000, 3), "cpu_ms_per_sample_p90": round(
            sorted(per_sample)[int(0.9 * len(per_sample))] * 1000, 3),
        "cpu_s_per_hour_of_run": round(ms * 3600 / 1000 / perf.INTERVAL_S, 2),
        "commit_listing_ms": round(listing_ms, 3), "window": {k: block[k] for k in ("cpu_s", "processes")},
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
