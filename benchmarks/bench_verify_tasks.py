"""``verbatim-batch verify RUN`` in this process vs as Ray tasks (one per papers row group), measured like
``bench_scale.py``: every call a subprocess in a cgroup-v1 ``cpuacct`` group of its own (root), so the tree's
CPU includes Ray's GCS, raylet and workers; the driver's CPU is read from its zombie before it is reaped.

    python benchmarks/bench_verify_tasks.py RUN [--reps 2] [--num-cpus 2] [--out results.json]

Calls alternate (in process, Ray tasks, in process, ...) so that a shared machine's load falls on both."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale as bs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    bs.subreaper()
    env = os.environ | {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    modes = {"in process": ["verify", args.run, "--num-cpus", "1"],
             "ray tasks": ["verify", args.run, "--num-cpus", str(args.num_cpus)]}
    res: dict = {"machine": bs.machine(), "run": args.run, "runs": []}
    with tempfile.TemporaryDirectory() as logs:
        for rep in range(args.reps):
            for mode, cmd in modes.items():
                m = bs.run_cli(cmd, Path(logs) / f"verify-{rep}-{mode.replace(' ', '-')}.log", env)
                out = (Path(logs) / f"verify-{rep}-{mode.replace(' ', '-')}.log").read_text()
                m["result"] = json.loads(out[out.index("{\n  \"papers\""):out.rindex("}") + 1])
                m["mode"] = mode
                res["runs"].append(m)
    for mode in modes:
        runs = [r for r in res["runs"] if r["mode"] == mode]
        print(f"{mode}: driver CPU-s {[r['driver_cpu_s'] for r in runs]}  tree CPU-s {[r['tree_cpu_s'] for r in runs]}"
              f"  wall s {[r['wall_s'] for r in runs]}  driver peak MB {[r['driver_peak_rss_mb'] for r in runs]}"
              f"  errors {[r['result']['n_errors'] for r in runs]}")
    same = len({json.dumps(r["result"], sort_keys=True) for r in res["runs"]}) == 1
    print("same result in every call:", same)
    res["same_result"] = same
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
