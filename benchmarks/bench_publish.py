"""What publishing a night as Iceberg tables costs next to the night itself (issue 40), in CPU-seconds of the whole
process tree, side by side on one synthetic corpus.

    .venv/bin/python benchmarks/bench_publish.py --papers 20 --out benchmarks/results-publish.json

Three nights on one root (offline CPU defaults, 16 bundled queries), each followed by `verbatim-batch publish`
into one warehouse (pyiceberg's SQLite catalog): night 1 from scratch, night 2 over the same corpus, night 3 after
1% of the papers were edited (at least one). Each publish twice: as a user runs it here (a small local publish
writes in its own process) and through a local Ray (`--address local`: Ray's write tasks, as on a cluster, plus a
local Ray's start) into a second warehouse. Then the same publish again (a no-op), and a night 4 (nothing changed)
that publishes itself as it commits (`nightly --warehouse`), against night 2. Every call is a subprocess with
its own local Ray (`--num-cpus 2`), measured as bench_scale.py measures: a cgroup-v1 cpuacct group per call (root),
so the driver, Ray's GCS, raylet and workers all count. The ratio publish / night is the figure (issue 40 asks for at
most 10%); the machine is shared, so absolute times vary more than ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import measure, subreaper  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]
QUERIES = REPO / "verbatim_batch" / "examples" / "queries.jsonl"


def call(argv: list[str], log: Path, env: dict[str, str]) -> dict:
    print(f"$ verbatim-batch {' '.join(argv)}", flush=True)
    m = measure(CLI + argv, log, env)
    print(f"  rc {m['rc']}  tree {m['tree_cpu_s']} CPU-s  driver {m['driver_cpu_s']} CPU-s  wall {m['wall_s']} s",
          flush=True)
    if m["rc"]:
        raise RuntimeError(f"{argv[0]} exited {m['rc']}:\n{log.read_text()[-4000:]}")
    keep = ("rc", "wall_s", "tree_cpu_s", "tree_cpu_method", "driver_cpu_s", "tree_peak_rss_mb")
    return {k: m[k] for k in keep if k in m}


def rows(lake: Path) -> dict[str, int]:
    from verbatim_batch.engine.lake import IcebergTarget, open_catalog

    catalog = open_catalog(IcebergTarget(warehouse=str(lake)))
    out = {}
    for name in ("chunks", "retrieval", "pairs", "spans"):
        table = catalog.load_table(("verbatim", name))
        snap = table.current_snapshot()
        out[name] = int(snap.summary.get("added-records") or 0) if snap is not None else 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--papers", type=int, default=20)
    ap.add_argument("--changed", type=float, default=0.01)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results-publish.json"))
    ap.add_argument("--work", default=None, help="folder for the corpus, root and warehouse (default: a temp dir)")
    args = ap.parse_args()
    subreaper()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-publish-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    env |= {"HF_HUB_OFFLINE": "1"}
    corpus, root, lake = work / "corpus", work / "root", work / "lake"
    try:
        subprocess.run([sys.executable, "-m", "verbatim_synth", "--out", str(corpus), "--n", str(args.papers),
                        "--seed", "0"], check=True, capture_output=True)
        nights = {}
        for run_id in ("n1", "n2", "n3"):
            if run_id == "n3":
                papers = sorted(corpus.glob("*.md"))
                for p in random.Random(0).sample(papers, max(1, round(args.changed * len(papers)))):
                    text = p.read_text(encoding="utf-8")
                    cut = len(text) // 2
                    p.write_text(text[:cut] + "\n\nA sentence added by the benchmark's nightly edit.\n\n" + text[cut:],
                                 encoding="utf-8")
            night = call(["nightly", "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
                          "--queries", str(QUERIES), "--root", str(root), "--run-id", run_id, "--num-cpus", "2",
                          "--embed-batch-rows", "64", "--extract-batch-rows", "16"],  # small blocks: steady progress
                         work / f"{run_id}.log", env)
            publish = call(["publish", str(root), "--warehouse", str(lake), "--num-cpus", "2"],
                           work / f"{run_id}-publish.log", env)
            publish["rows"] = rows(lake)
            with_ray = call(["publish", str(root), "--warehouse", str(work / "lake-ray"), "--address", "local",
                             "--num-cpus", "2"], work / f"{run_id}-publish-ray.log", env)
            nights[run_id] = {"night": night, "publish": publish, "publish_through_local_ray": with_ray,
                              "publish_over_night_cpu": round(publish["tree_cpu_s"] / night["tree_cpu_s"], 3),
                              "ray_publish_over_night_cpu": round(with_ray["tree_cpu_s"] / night["tree_cpu_s"], 3)}
        again = call(["publish", str(root), "--warehouse", str(lake)], work / "republish.log", env)
        # night 4, nothing changed since night 3, publishing itself as it commits (nightly --warehouse, one process):
        # against night 2 (nothing changed, no publish), what publishing adds to a scheduled night
        n4 = call(["nightly", "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
                   "--queries", str(QUERIES), "--root", str(root), "--run-id", "n4", "--num-cpus", "2",
                   "--warehouse", str(work / "lake-nightly")], work / "n4.log", env)
        out = {
            "date": dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
            f"{platform.platform()}", "command": " ".join([sys.executable.split('/')[-1], *sys.argv]),
            "papers": args.papers, "nights": {"n1": "from scratch", "n2": "nothing changed",
                                              "n3": f"{max(1, round(args.changed * args.papers))} papers edited"},
            "results": nights, "republish_noop": again,
            "night4_unchanged_with_warehouse": n4 | {
                "over_night2_cpu": round(n4["tree_cpu_s"] / nights["n2"]["night"]["tree_cpu_s"], 3)},
        }
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out, indent=2))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
