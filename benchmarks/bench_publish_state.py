"""Publishing current-state Iceberg tables at 10% of the ACL (issue 52): the first publish, a night with 1% of the
papers edited, a night with nothing changed, side by side in one run, in CPU-seconds of each call's process tree.

    .venv/bin/python benchmarks/bench_publish_state.py --work /tmp/pubbench --out benchmarks/results-publish-state.json

Chunk nights only (they run on CPU here): 11,400 synthetic papers (``verbatim-batch synth``, seed 0), a full
``chunk`` run, then ``chunk --previous`` after 1% of the papers were edited (a sentence in the middle of each, as
bench_scale.py does), then ``chunk --previous`` with nothing changed. Each night's run is published to one
warehouse with ``verbatim-batch publish RUN --warehouse LAKE``, measured as bench_scale.py measures a call (a
cgroup per call: every process of its tree). What each publish wrote comes from its snapshot's summary (data files,
bytes, rows added, position deletes) and the warehouse's files before and after. The warehouse is made anew each
time; runs already in ``--work`` are published as they are (remove them to measure the chunk nights again).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import edit, machine, run_cli, synth  # noqa: E402


def lake_files(lake: Path) -> dict[str, int]:
    files = [p for p in lake.rglob("*") if p.is_file() and "/data/" in str(p)]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def snapshot_facts(lake: Path, night: str) -> dict:
    from pyiceberg.catalog import load_catalog

    table = load_catalog("verbatim", type="sql", uri=f"sqlite:///{lake}/catalog.db").load_table("verbatim.chunks")
    ref = table.metadata.refs[f"night-{night}"]
    snap = table.snapshot_by_id(ref.snapshot_id)
    summary = snap.summary.additional_properties
    return {"snapshot": ref.snapshot_id, "snapshots_total": len(table.snapshots()),
            "snapshot_is_this_nights": summary.get("verbatim.night") == night,
            "added_data_files": int(summary.get("added-data-files", 0)) if summary.get("verbatim.night") == night
            else 0, "added_records": int(summary.get("added-records", 0)) if summary.get("verbatim.night") == night
            else 0, "added_files_size": int(summary.get("added-files-size", 0))
            if summary.get("verbatim.night") == night else 0,
            "added_position_deletes": int(summary.get("added-position-deletes", 0))
            if summary.get("verbatim.night") == night else 0,
            "total_records": int(summary.get("total-records", 0)) - int(summary.get("total-position-deletes", 0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", type=int, default=11_400)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    work = args.work
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}
    corpus = work / "corpus"
    res: dict = {"date": dt.date.today().isoformat(), "machine": machine(), "papers": args.papers,
                 "corpus": synth(corpus, args.papers, 0), "nights": []}
    lake = work / "lake"
    shutil.rmtree(lake, ignore_errors=True)  # every night published afresh: the first publish is the first
    runs = [work / "run-0", work / "run-1", work / "run-2"]
    for k, run in enumerate(runs):
        made = (run / "manifest.json").exists()  # a run already there is published as it is (not edited again)
        edited = edit(corpus, 0.01, 1000 + k) if k == 1 and not made else 0
        cmd = ["chunk", "--input", str(corpus), "--output", str(run), "--num-cpus", str(args.num_cpus),
               "--run-id", f"n{k}", *(["--previous", str(runs[k - 1])] if k else [])]
        if not made:
            chunk = run_cli(cmd, logs / f"chunk-{k}.log", env)
        else:
            chunk = {"skipped": "already there"}
        before = lake_files(lake) if lake.exists() else {"files": 0, "bytes": 0}
        pub = run_cli(["publish", str(run), "--warehouse", str(lake)], logs / f"publish-{k}.log", env)
        after = lake_files(lake)
        facts = snapshot_facts(lake, f"n{k}")
        chunks = json.loads((run / "manifest.json").read_text())["tables"]["chunks"]["rows"]
        res["nights"].append({"night": k, "papers_edited": edited, "chunks": chunks, "chunk_run": chunk,
                              "publish": pub, "lake_data_files_written": after["files"] - before["files"],
                              "lake_bytes_written": after["bytes"] - before["bytes"], **facts,
                              "rows_written_share": round(facts["added_records"] / chunks, 4) if chunks else None})
        args.out.write_text(json.dumps(res, indent=1))
    first = res["nights"][0]["publish"]["tree_cpu_s"]
    res["ratios_to_first_publish"] = {f"night {n['night']}": round(n["publish"]["tree_cpu_s"] / first, 3)
                                      for n in res["nights"]}
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res["ratios_to_first_publish"]))


if __name__ == "__main__":
    main()
