"""Before/after on one machine (issue 31): the same CLI command from two committed trees, alternating, in
CPU-seconds of the whole process tree (bench_scale.measure: a cgroup-v1 cpuacct group per call, so driver,
GCS, raylet and every Ray worker count), with wall time and the load average at each run.

Each tree is a git worktree (e.g. ``git worktree add /tmp/wt-base 4bc016d``); its code is imported by running
the CLI with ``cwd`` and ``PYTHONPATH`` set to the worktree (``-c`` puts the cwd first on sys.path, ahead of
the venv's editable finder; a local Ray's workers inherit both). ``--check-import`` prints, for each tree,
where the driver and a Ray task import ``verbatim_batch`` from.

    .venv/bin/python benchmarks/bench_before_after.py --trees base=/tmp/wt-base,head=/tmp/wt-head \
        --order base,head,base,head --work /tmp/ba demo
    .venv/bin/python benchmarks/bench_before_after.py ... chunk --corpus /tmp/ba/corpus-10
    .venv/bin/python benchmarks/bench_before_after.py ... compare-demo A B   # span and retrieval tables
    .venv/bin/python benchmarks/bench_before_after.py ... compare-chunks A B
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale  # noqa: E402

CHECK = r"""
import os, ray, verbatim_batch
print("driver", verbatim_batch.__file__)
ray.init(address="local", num_cpus=1, include_dashboard=False)
@ray.remote
def where():
    import verbatim_batch
    return verbatim_batch.__file__, os.getcwd()
print("ray task", ray.get(where.remote()))
ray.shutdown()
"""


def tree_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return env | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tree)}


def head_of(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run_one(name: str, tree: Path, cmd: list[str], log: Path) -> dict:
    bench_scale.REPO = tree  # measure() runs the call with cwd=REPO
    load0 = os.getloadavg()
    t = dt.datetime.now().isoformat(timespec="seconds")
    print(f"[{t}] {name}: verbatim-batch {' '.join(cmd)}  (load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f})",
          flush=True)
    m = bench_scale.measure(bench_scale.CLI + cmd, log, tree_env(tree))
    load1 = os.getloadavg()
    print(f"  rc {m['rc']}  tree {m['tree_cpu_s']} CPU-s  driver {m['driver_cpu_s']}  wall {m['wall_s']} s  "
          f"(load after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f})", flush=True)
    if m["rc"]:
        raise RuntimeError(f"{name} exited {m['rc']}:\n{log.read_text()[-4000:]}")
    return {"tree": name, "commit": head_of(tree), "started": t, "command": "verbatim-batch " + " ".join(cmd),
            "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in load1], **m}


def table_rows(path: Path, columns: list[str]) -> list[tuple]:
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=columns)
    return sorted(zip(*(t[c].to_pylist() for c in columns), strict=True), key=repr)


def digest(rows: list[tuple]) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def compare(a: Path, b: Path, tables: dict[str, list[str]]) -> dict:
    import pyarrow.parquet as pq

    out = {}
    for rel, cols in tables.items():
        sa, sb = pq.read_table(a / rel).schema.names, pq.read_table(b / rel).schema.names
        ra, rb = table_rows(a / rel, cols), table_rows(b / rel, cols)
        out[rel] = {"columns": cols, "rows": [len(ra), len(rb)], "digest": [digest(ra), digest(rb)],
                    "equal": ra == rb, "only_in_a": len(set(ra) - set(rb)), "only_in_b": len(set(rb) - set(ra)),
                    "schema_equal": sa == sb, **({} if sa == sb else {"schema": [sa, sb]})}
        print(f"  {rel}: {out[rel]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", required=True, help="name=worktree,name=worktree")
    ap.add_argument("--order", default="base,head,base,head")
    ap.add_argument("--work", default="/tmp/ba")
    ap.add_argument("--json", help="append the runs to this JSON file")
    ap.add_argument("--check-import", action="store_true")
    ap.add_argument("what", choices=["demo", "chunk", "compare-demo", "compare-chunks", "none"])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--corpus")
    ap.add_argument("--num-cpus", type=int, default=2, help="chunk only; the demo runs with its defaults")
    args = ap.parse_args()
    trees = {k: Path(v) for k, v in (kv.split("=", 1) for kv in args.trees.split(","))}
    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    if args.check_import:
        for name, tree in trees.items():
            r = subprocess.run([sys.executable, "-c", CHECK], cwd=tree, env=tree_env(tree), capture_output=True,
                               text=True)
            print(name, head_of(tree), [line for line in r.stdout.splitlines() if line.startswith(("driver", "ray"))])
    if args.what == "compare-demo":
        compare(Path(args.paths[0]), Path(args.paths[1]),
                {"spans/spans": ["pair_id", "start", "end", "text"],
                 "retrieval/retrieval": ["query_id", "rank", "chunk_id", "score"]})
        return
    if args.what == "compare-chunks":
        compare(Path(args.paths[0]), Path(args.paths[1]),
                {"chunks": ["chunk_id", "paper_id", "chunk_index", "text"], "papers": ["paper_id", "sha256"]})
        return
    if args.what == "none":
        return
    bench_scale.subreaper()
    runs = []
    for i, name in enumerate(args.order.split(",")):
        out = work / f"{args.what}-{name}-{i}"
        if args.what == "demo":
            cmd = ["demo", "--output", str(out)]
        else:
            c = Path(args.corpus)
            cmd = ["chunk", "--input", str(c), "--metadata", str(c / "metadata.jsonl"), "--output", str(out),
                   "--num-cpus", str(args.num_cpus)]
        t0 = time.time()
        runs.append(run_one(name, trees[name], cmd, work / "logs" / f"{args.what}-{name}-{i}.log"))
        runs[-1]["output"] = str(out)
        runs[-1]["elapsed_incl_reap_s"] = round(time.time() - t0, 1)
        if args.json:
            p = Path(args.json)
            old = json.loads(p.read_text()) if p.exists() else []
            p.write_text(json.dumps(old + [runs[-1]], indent=2) + "\n")


if __name__ == "__main__":
    main()
