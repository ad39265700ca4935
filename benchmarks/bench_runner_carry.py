"""The runner's own bookkeeping on a night that carries every row (issue 20: the driver does O(files) work).

    .venv/bin/python benchmarks/bench_runner_carry.py                      # 10k, 100k, 1M rows
    .venv/bin/python benchmarks/bench_runner_carry.py --before REV --json benchmarks/results-runner-carry.json

A keyed stage (``TableStage``) whose rows are only a key and a value, so that what is measured is the runner's
loop and not a model: night 1 writes N rows in blocks of 65,536 (one file each), night 2 runs with
``--previous`` night 1 and every row unchanged. Night 2 goes through everything a real night does in the
runner: the resume check (``completed_keys``), the carry (``sink.carry_rows``: every file linked, its keys
read back), the skip set, the to-do count, the sink's result (``finish``: keys of every write record), the
row check and the counts. Each night runs in a fresh process without Ray (the carry's per-file reads then run
in this process too, so the figures include them; on a cluster they are Ray tasks). Figures: the process's
peak RSS, its RSS after imports, and its CPU seconds, for night 2; the ratio 1M / 10k is the driver's growth.

``--before REV`` runs the same nights with the package as it was at git revision REV (a temporary worktree),
in the same run, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile

STAGE = r'''
import json, os, sys, time
import pyarrow as pa
import pyarrow.parquet as pq
from dataclasses import dataclass
from verbatim_batch.engine.stage import Plan, RunOptions, TableStage, Work
from verbatim_batch.engine.runner import run_stage

ROWS = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.int64())])
BLOCK = 65536


@dataclass(kw_only=True)
class Job(RunOptions):
    input: str


class KeyedStage(TableStage):
    command = "bench"
    tables = {"rows": ROWS}
    key_column = "key"
    needs_ray = False

    def plan(self):
        return Plan(config={"input": self.job.input}, inputs=(self.job.input,))

    def work(self, plan, ctx):
        keys = pq.read_table(self.job.input, columns=["key"])["key"]
        return Work(keys=keys, n_in=len(keys), data=None)

    def unchanged(self, plan, work, previous, staging):
        return work.keys  # every row unchanged

    def dataset(self, plan, work, skip, ctx):
        import pyarrow.compute as pc
        table = pq.read_table(self.job.input)
        table = table.filter(pc.invert(pc.is_in(table["key"], value_set=skip)))
        for i in range(0, table.num_rows, BLOCK):
            yield table.slice(i, BLOCK)


def hwm_mb():  # this process's peak RSS (VmHWM starts afresh at exec; ru_maxrss keeps the parent's peak)
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


rss0 = hwm_mb()
cpu0, t0 = time.process_time(), time.perf_counter()
_, manifest = run_stage(KeyedStage(Job(input=sys.argv[1], output=sys.argv[2], previous=sys.argv[3] or None)))
print(json.dumps({"peak_rss_mb": round(hwm_mb(), 1),
                  "rss_after_imports_mb": round(rss0, 1), "cpu_s": round(time.process_time() - cpu0, 2),
                  "wall_s": round(time.perf_counter() - t0, 2),
                  "counts": {k: manifest["counts"][k] for k in ("rows_in", "rows_carried", "rows_new")},
                  "files": manifest["tables"]["rows"]["files"]}))
'''


def night(src: str, code: str, inp: str, out: str, previous: str) -> dict:
    env = os.environ | {"PYTHONPATH": src, "VERBATIM_PROGRESS": "off"}
    done = subprocess.run([sys.executable, "-c", code, inp, out, previous], capture_output=True, text=True,
                          env=env, cwd=src, timeout=3600)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--before", default=None, help="a git revision to compare with (run in a worktree)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="bench-runner-carry-")
    versions = {"after": repo}
    if args.before:
        tree = os.path.join(work, "before")
        subprocess.run(["git", "worktree", "add", "--detach", tree, args.before], cwd=repo, check=True,
                       capture_output=True)
        versions["before"] = tree
    result = {"benchmark": "bench_runner_carry", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([os.path.relpath(sys.executable, repo)] + sys.argv),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": platform.processor(),
                          "load_avg_at_start": os.getloadavg()},
              "before": args.before, "nights": {}}
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            inp = os.path.join(work, f"input-{n}.parquet")
            pq.write_table(pa.table({"key": [f"pair-{i:09d}-{i * 7919 % 1000003:07d}" for i in range(n)],
                                     "value": list(range(n))}), inp)
            for name, src in versions.items():
                first = night(src, STAGE, inp, os.path.join(work, f"{name}-{n}-n1"), "")
                second = night(src, STAGE, inp, os.path.join(work, f"{name}-{n}-n2"),
                               os.path.join(work, f"{name}-{n}-n1"))
                assert second["counts"]["rows_carried"] == n, second
                result["nights"].setdefault(name, {})[n] = {"night1": first, "night2_all_carried": second}
                print(name, n, json.dumps(second), flush=True)
    finally:
        if args.before:
            subprocess.run(["git", "worktree", "remove", "--force", versions["before"]], cwd=repo,
                           capture_output=True)
    result["machine"]["load_avg_at_end"] = os.getloadavg()
    sizes = sorted(next(iter(result["nights"].values())))
    for name, by_n in result["nights"].items():
        lo, hi = by_n[sizes[0]]["night2_all_carried"], by_n[sizes[-1]]["night2_all_carried"]
        result.setdefault("ratios", {})[name] = {
            "peak_rss_largest_over_smallest": round(hi["peak_rss_mb"] / lo["peak_rss_mb"], 2),
            "growth_over_imports_mb": round(hi["peak_rss_mb"] - hi["rss_after_imports_mb"], 1)}
    print(json.dumps(result.get("ratios"), indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
