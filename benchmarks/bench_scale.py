"""Corpus scale (issue 20): full chunk runs at 1% / 10% / 100% of ACL size, three nightly `chunk --previous`
runs at 10% with 1% of the papers edited each night, `verify` of the full runs, and `check_paper` on one
paper of 0.5 / 2 / 8 MB. Every figure is CPU-seconds, not wall time (the machine's cores are shared).

    .venv/bin/python benchmarks/bench_scale.py --sizes 1,10,100 --nights 3 --num-cpus 2 \
        --out benchmarks/results-scale.json

ACL is 114k papers / 5.1 GB: 1% is 1,140 synthetic papers (`python -m verbatim_synth --n 1140`), 10% is
11,400. The 100% corpus is the 10% corpus ten times over (hard links in ten subfolders, a suffix on every
file stem, since paper_id = file stem) with metadata.jsonl rewritten to the suffixed ids.

Every CLI call runs as a subprocess of this script, in a cgroup-v1 ``cpuacct`` group of its own (made under
/sys/fs/cgroup/cpuacct, removed after the call; this needs root), which every process of the call's tree
(driver, GCS, raylet, Ray workers, the reaper) inherits. This script is also a child subreaper
(``PR_SET_CHILD_SUBREAPER``) and waits until every descendant is gone before the next call. So:

* ``tree_cpu_s``: the CPU (user + system) of the whole process tree, summed by the kernel
  (``cpuacct.usage``): exact, whatever the process and however it ended;
* ``tree_cpu_rusage_s``: the change in this script's ``getrusage(RUSAGE_CHILDREN)``: counts only processes
  that were waited for (Ray's workers mostly are not: it reads low), and ``tree_cpu_s`` where no cgroup
  can be made;
* ``tree_cpu_sampled_s``: the psutil process tree sampled every 0.2 s, the last ``cpu_times``
  (user + system) seen for each process summed (misses what a process spent after its last sample);
* ``driver_cpu_s``: the CLI process alone, read from its zombie (``waitid(WNOWAIT)``) before it is reaped;
* ``driver_peak_rss_mb`` and ``tree_peak_rss_mb``: sampled maxima (the tree's is the largest sum of RSS over
  one sample; shared pages, e.g. Ray's object store, count once per process that maps them).

Runs: the full runs write ``RUN-<pct>``; the nights at 10% edit 1% of the papers (seeded, a sentence inserted in
the middle of each, as benchmarks/bench_nightly.py does), then `chunk --previous` the night before. A night
with nothing changed (previous = the full run) gives the fixed cost. Each run's files per table, hard-linked
(carried by reference) files, and the manifest's counts are recorded. Night 3's papers are checked against
the corpus (sha256 of every file) and every run is verified (`verbatim-batch verify`).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import hashlib
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]
ACL_PAPERS = 114_000
TABLES = ("papers", "chunks", "quarantine")
COUNT_PREFIXES = ("rows_", "carried_files.", "files_compacted", "papers", "chunks", "quarantined", "records_in",
                  "previous_papers_rejected", "duplicate_ids")
PR_SET_CHILD_SUBREAPER = 36


def subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuCgroup:
    """A cgroup-v1 cpuacct group of its own for one call's process tree: the kernel sums the CPU of every
    process in it, however it ends (killed, never waited for) and whoever its parent is. None where this
    script may not create one (then the rusage figure is all there is)."""

    def __init__(self, name: str) -> None:
        self.path = CPUACCT / name
        self.path.mkdir()

    @classmethod
    def make(cls, name: str) -> CpuCgroup | None:
        try:
            return cls(name)
        except OSError:
            return None

    def enter(self) -> None:  # runs in the child between fork and exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self) -> tuple[float, float, float]:
        """(total, user, system) CPU-seconds."""
        read = lambda f: int((self.path / f).read_text()) / 1e9  # noqa: E731
        return read("cpuacct.usage"), read("cpuacct.usage_user"), read("cpuacct.usage_sys")

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError as exc:
            print(f"  cgroup {self.path} not removed: {exc}", flush=True)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class TreeSampler:
    """Samples this script's descendants every ``interval`` s: last cpu_times per process, peak RSS sums."""

    def __init__(self, driver: int, interval: float = 0.2) -> None:
        self.driver, self.interval = driver, interval
        self.cpu: dict[tuple[int, float], float] = {}
        self.names: dict[tuple[int, float], str] = {}
        self.driver_cpu = 0.0
        self.driver_peak = self.tree_peak = self.max_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def kind(self, p: psutil.Process) -> str:
        """What a process of the tree is: driver, ray worker, gcs_server, raylet, an agent, the reaper."""
        if p.pid == self.driver:
            return "driver"
        argv = p.cmdline()
        cmd, exe = " ".join(argv), os.path.basename(argv[0]) if argv else ""
        if cmd.startswith("ray::") or "default_worker.py" in cmd:
            return "ray_worker"
        if exe in ("gcs_server", "raylet"):
            return exe
        for needle, kind in (("reaper.py", "reaper"), ("dashboard_agent", "dashboard_agent"),
                             ("runtime_env", "runtime_env_agent"), ("log_monitor", "log_monitor")):
            if needle in cmd:
                return kind
        return exe or p.name()

    def sample(self) -> None:
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        total, n = 0, 0
        for p in procs:
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                    rss = p.memory_info().rss
                    if key not in self.names:
                        self.names[key] = self.kind(p)
            except psutil.Error:
                continue
            self.cpu[key] = max(self.cpu.get(key, 0.0), t.user + t.system)
            total += rss
            n += 1
            if p.pid == self.driver:
                self.driver_cpu = max(self.driver_cpu, t.user + t.system)
                self.driver_peak = max(self.driver_peak, rss)
        self.tree_peak = max(self.tree_peak, total)
        self.max_procs = max(self.max_procs, n)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def reap_all(timeout: float = 120.0) -> list[str]:
    """Wait for every remaining descendant (orphans come to this subreaper); returns those still alive after
    ``timeout`` s (then killed, by pid: they are this script's own descendants)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return []
        if pid:
            continue
        if time.monotonic() > deadline:
            left = []
            for p in psutil.Process().children(recursive=True):
                try:
                    left.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
                    p.kill()
                except psutil.Error:
                    pass
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    return left
        time.sleep(0.05)


def measure(args: list[str], log: Path, env: dict[str, str]) -> dict:
    """Run ``args``; its whole process tree's CPU, the driver's CPU, peak RSS, wall time, exit status."""
    reap_all(5)
    cg = CpuCgroup.make(f"bench-scale-{os.getpid()}-{time.monotonic_ns()}")
    before = children_cpu()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                preexec_fn=cg.enter if cg else None)
    sampler = TreeSampler(proc.pid)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: its own times are final
    try:
        t = psutil.Process(proc.pid).cpu_times()
        driver_cpu = t.user + t.system
    except psutil.Error:
        driver_cpu = None
    wall = time.perf_counter() - t0
    rc = proc.wait()
    left = reap_all()
    sampler.sample()
    sampler.stop()
    rusage = children_cpu() - before
    if cg:
        tree, user, system = cg.usage()
        cg.remove()
    else:
        tree, user, system = rusage, None, None
    sampled = sum(sampler.cpu.values())
    by_name: dict[str, float] = {}
    for key, cpu in sampler.cpu.items():
        by_name[sampler.names.get(key, "?")] = by_name.get(sampler.names.get(key, "?"), 0.0) + cpu
    return {
        "rc": rc, "wall_s": round(wall, 1), "tree_cpu_s": round(tree, 2),
        "tree_cpu_method": "cgroup cpuacct" if cg else "getrusage(RUSAGE_CHILDREN)",
        **({"tree_cpu_user_s": round(user, 2), "tree_cpu_system_s": round(system, 2)} if cg else {}),
        "tree_cpu_rusage_s": round(rusage, 2), "tree_cpu_sampled_s": round(sampled, 2),
        "driver_cpu_s": round(driver_cpu if driver_cpu is not None else sampler.driver_cpu, 2),
        "driver_peak_rss_mb": round(sampler.driver_peak / 2**20), "tree_peak_rss_mb": round(sampler.tree_peak / 2**20),
        "max_processes": sampler.max_procs,
        "cpu_by_process_kind_sampled_s": {k: round(v, 2) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])
                                          if v >= 0.05},
        **({"left_running_killed": left} if left else {}),
    }


def run_cli(cmd: list[str], log: Path, env: dict[str, str]) -> dict:
    print(f"$ verbatim-batch {' '.join(cmd)}", flush=True)
    m = measure(CLI + cmd, log, env)
    print(f"  rc {m['rc']}  tree {m['tree_cpu_s']} CPU-s (sampled {m['tree_cpu_sampled_s']})  "
          f"driver {m['driver_cpu_s']} CPU-s  wall {m['wall_s']} s", flush=True)
    m["command"] = "verbatim-batch " + " ".join(cmd)
    if m["rc"] and cmd[0] != "verify":
        raise RuntimeError(f"{m['command']} exited {m['rc']}:\n{log.read_text()[-5000:]}")
    return m


def run_facts(run: Path) -> dict:
    manifest = json.loads((run / "manifest.json").read_text())
    files, linked, nbytes = {}, {}, 0
    for t in TABLES:
        names = [p for p in (run / t).iterdir() if p.suffix == ".parquet"]
        files[t] = len(names)
        linked[t] = sum(1 for p in names if p.stat().st_nlink > 1)
        nbytes += sum(p.stat().st_size for p in names)
    counts = {k: v for k, v in sorted(manifest["counts"].items()) if k.startswith(COUNT_PREFIXES)}
    return {"files_per_table": files, "files_hard_linked": linked, "tables_mb": round(nbytes / 1e6, 1),
            "tables": manifest["tables"], "counts": counts,
            "timings_s": {k: round(v, 2) for k, v in manifest["timings_s"].items()}}


def verify(run: Path, logs: Path, env: dict[str, str]) -> dict:
    log = logs / f"verify-{run.name}.log"
    m = run_cli(["verify", str(run)], log, env)
    text = log.read_text()
    result = json.loads(text[text.index("{"):])
    m.update(papers=result["papers"], chunks=result["chunks"], n_errors=result["n_errors"],
             errors=result["errors"][:5], unchecked=result["unchecked"])
    if m["rc"] or result["n_errors"]:
        raise RuntimeError(f"verify {run} found errors: {result['errors'][:5]}")
    return m


def synth(out: Path, n: int, seed: int) -> dict:
    if not (out / "_done.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "verbatim_synth", "--out", str(out), "--n", str(n), "--seed", str(seed),
                        "--format", "md"], check=True, capture_output=True, cwd=REPO)
        mds = list(out.glob("*.md"))
        (out / "_done.json").write_text(json.dumps({"papers": len(mds), "bytes": sum(p.stat().st_size for p in mds)}))
    return json.loads((out / "_done.json").read_text())


def tenfold(src: Path, out: Path) -> dict:
    """The 10% corpus ten times: hard links in ten subfolders, ``-cK`` on every stem; metadata rewritten.
    Papers an append night added (``-new``) are left out: the 100% corpus is ten times the full run's."""
    if not (out / "_done.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        meta = [m for m in map(json.loads, (src / "metadata.jsonl").read_text(encoding="utf-8").splitlines())
                if not m["paper_id"].endswith("-new")]
        out.mkdir(parents=True)
        with open(out / "metadata.jsonl", "w", encoding="utf-8") as f:
            for k in range(10):
                sub = out / f"copy{k}"
                sub.mkdir()
                for p in src.glob("*.md"):
                    if p.stem.endswith("-new"):
                        continue
                    os.link(p, sub / f"{p.stem}-c{k}.md")
                for m in meta:
                    f.write(json.dumps(m | {"paper_id": f"{m['paper_id']}-c{k}"}, ensure_ascii=False) + "\n")
        info = json.loads((src / "_done.json").read_text())
        (out / "_done.json").write_text(json.dumps({"papers": 10 * info["papers"], "bytes": 10 * info["bytes"]}))
    return json.loads((out / "_done.json").read_text())


def edit(corpus: Path, fraction: float, seed: int) -> int:
    """Insert a sentence in the middle of ``fraction`` of the papers (seeded); returns how many."""
    papers = sorted(corpus.glob("*.md"))
    edited = random.Random(seed).sample(papers, max(1, round(fraction * len(papers))))
    for p in edited:
        text = p.read_text(encoding="utf-8")
        cut = len(text) // 2
        p.write_text(text[:cut] + f"\n\nA sentence added by the benchmark's nightly edit {seed}.\n\n" + text[cut:],
                     encoding="utf-8")
    return len(edited)


def add_papers(corpus: Path, fraction: float, seed: int, work: Path) -> int:
    """Add ``fraction`` new papers (another seed, ``-new`` on every stem) and their metadata rows."""
    n = max(1, round(fraction * len(list(corpus.glob("*.md")))))
    new = work / "corpus-new"
    shutil.rmtree(new, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "verbatim_synth", "--out", str(new), "--n", str(n), "--seed", str(seed),
                    "--format", "md"], check=True, capture_output=True, cwd=REPO)
    with open(corpus / "metadata.jsonl", "a", encoding="utf-8") as f:
        for line in (new / "metadata.jsonl").read_text(encoding="utf-8").splitlines():
            m = json.loads(line)
            f.write(json.dumps(m | {"paper_id": f"{m['paper_id']}-new"}, ensure_ascii=False) + "\n")
    for p in new.glob("*.md"):
        shutil.move(p, corpus / f"{p.stem}-new.md")
    shutil.rmtree(new)
    return n


def check_against_corpus(run: Path, corpus: Path) -> dict:
    """Every paper row's sha256 is the sha256 of its file now; every file has its row."""
    import pyarrow.parquet as pq

    t = pq.read_table(run / "papers", columns=["paper_id", "sha256"])
    rows = dict(zip(t["paper_id"].to_pylist(), t["sha256"].to_pylist(), strict=True))
    want = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in corpus.rglob("*.md")}
    wrong = sorted(k for k in want if rows.get(k) != want[k])
    extra = sorted(set(rows) - set(want))
    if wrong or extra or len(rows) != t.num_rows:
        raise RuntimeError(f"{run}: {len(wrong)} papers differ from the corpus (e.g. {wrong[:3]}), "
                           f"{len(extra)} extra rows, {t.num_rows} rows for {len(rows)} ids")
    return {"papers_checked": len(want), "all_sha256_match": True}


def single_papers(sizes_mb: list[float], seed: int, work: Path, reps: int = 3) -> list[dict]:
    """``verify.check_paper`` on one generated paper of each size (its rows made by the chunk stage's own
    reader and ingest, in this process): CPU-seconds, best of ``reps``."""
    sys.path.insert(0, str(REPO))
    from verbatim_batch.corpus.ingest import DEFAULT_MAX_PAPER_BYTES, IngestStage
    from verbatim_batch.corpus.readers import list_sources, read_md_files
    from verbatim_batch.quality.verify import check_paper
    from verbatim_synth.corpus import generate_paper

    out = []
    for mb in sizes_mb:
        target = int(mb * 1e6)
        p = generate_paper(seed, 7, target)
        text = p.markdown
        while len(text.encode()) < target:  # the generator may stop short of a huge target: repeat it
            text += "\n\n" + p.markdown
        data = text.encode()[:target].decode("utf-8", "ignore")
        folder = work / f"paper-{mb:g}mb"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / f"{p.paper_id}.md").write_text(data, encoding="utf-8")
        fs, sources = list_sources(str(folder), "md")
        tables = IngestStage()(next(read_md_files(fs, sources, DEFAULT_MAX_PAPER_BYTES)))
        paper = tables["papers"].to_pylist()[0]
        rows = sorted(tables["chunks"].to_pylist(), key=lambda r: r["chunk_index"])
        best = math.inf
        for _ in range(reps):
            c0 = time.process_time()
            problems = check_paper(paper, rows)
            best = min(best, time.process_time() - c0)
        if problems:
            raise RuntimeError(f"check_paper on a {mb} MB paper: {problems[:3]}")
        out.append({"paper_mb": round(len(data.encode()) / 1e6, 2), "chunks": len(rows),
                    "check_paper_cpu_s": round(best, 4)})
        print(f"  check_paper {out[-1]}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    return out


def exponent(a: float, b: float, factor: float) -> float | None:
    return round(math.log(b / a) / math.log(factor), 2) if a and b and a > 0 and b > 0 else None


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    return (f"{model}, {psutil.cpu_count()} cores (shared with other work), "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,10,100", help="percent of ACL size: 1, 10 and/or 100 (100 = 10 x 10%%)")
    ap.add_argument("--nights", type=int, default=3, help="nights at 10%% (0: none)")
    ap.add_argument("--changed", type=float, default=0.01, help="fraction of papers edited each night")
    ap.add_argument("--append", action="store_true", help="after the nights, one that only adds --changed papers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--paper-mb", default="0.5,2,8", help="single-paper check sizes (MB)")
    ap.add_argument("--work", default="/tmp/bench-scale", help="corpora and runs (deleted at the end)")
    ap.add_argument("--max-100-min", type=float, default=40, help="skip 100%% when estimated longer")
    ap.add_argument("--no-fixed", dest="fixed", action="store_false", help="skip the 10-paper run")
    ap.add_argument("--keep", action="store_true", help="keep --work")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results-scale.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    subreaper()
    work = Path(args.work)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}
    ray = ["--num-cpus", str(args.num_cpus)]
    res: dict = {"date": dt.date.today().isoformat(), "machine": machine(), "python": sys.version.split()[0],
                 "command": " ".join([Path(sys.executable).name, *sys.argv]), "num_cpus": args.num_cpus,
                 "seed": args.seed, "full": {}, "verify": {}, "nights": [], "single_paper": None}

    def save() -> None:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")

    def full(pct: int, corpus: Path) -> None:
        run = work / f"run-{pct}"
        shutil.rmtree(run, ignore_errors=True)
        m = run_cli(["chunk", "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
                     "--output", str(run), *ray], logs / f"chunk-{pct}.log", env)
        res["full"][str(pct)] = {"corpus": res["corpora"][str(pct)], **m, **run_facts(run)}
        save()
        res["verify"][str(pct)] = verify(run, logs, env)
        save()

    t_start = time.perf_counter()
    res["corpora"] = {}
    c1, c10 = work / "corpus-1", work / "corpus-10"
    if args.fixed:  # the fixed cost: a chunk run of 10 papers (Ray start and stop, the run's own overhead)
        tiny = work / "corpus-tiny"
        res["corpora"]["tiny"] = synth(tiny, 10, args.seed)
        run = work / "run-tiny"
        shutil.rmtree(run, ignore_errors=True)
        res["fixed"] = run_cli(["chunk", "--input", str(tiny), "--metadata", str(tiny / "metadata.jsonl"),
                                "--output", str(run), *ray], logs / "chunk-tiny.log", env)
        res["fixed_cpu_s"] = res["fixed"]["tree_cpu_s"]
        save()
    if 1 in sizes:
        res["corpora"]["1"] = synth(c1, ACL_PAPERS // 100, args.seed)
        full(1, c1)
    if 10 in sizes or args.nights or 100 in sizes:
        res["corpora"]["10"] = synth(c10, ACL_PAPERS // 10, args.seed)
    if 10 in sizes:
        full(10, c10)
    if args.nights:
        base = work / "run-10"
        unchanged = work / "night-unchanged"
        shutil.rmtree(unchanged, ignore_errors=True)
        m = run_cli(["chunk", "--input", str(c10), "--metadata", str(c10 / "metadata.jsonl"), "--output",
                     str(unchanged), "--previous", str(base), *ray], logs / "night-unchanged.log", env)
        res["night_unchanged"] = {**m, **run_facts(unchanged)}
        save()
        shutil.rmtree(unchanged, ignore_errors=True)
        prev = base
        for k in range(1, args.nights + 1):
            n_edit = edit(c10, args.changed, args.seed * 1000 + k)
            run = work / f"night-{k}"
            shutil.rmtree(run, ignore_errors=True)
            m = run_cli(["chunk", "--input", str(c10), "--metadata", str(c10 / "metadata.jsonl"), "--output",
                         str(run), "--previous", str(prev), *ray], logs / f"night-{k}.log", env)
            res["nights"].append({"night": k, "papers_edited": n_edit, **m, **run_facts(run)})
            save()
            prev = run
        if args.append:  # a night that only adds papers (the usual ACL night): every previous file is unchanged
            n_new = add_papers(c10, args.changed, args.seed + 1, work)
            run = work / "night-append"
            shutil.rmtree(run, ignore_errors=True)
            m = run_cli(["chunk", "--input", str(c10), "--metadata", str(c10 / "metadata.jsonl"), "--output",
                         str(run), "--previous", str(prev), *ray], logs / "night-append.log", env)
            res["night_append"] = {"papers_added": n_new, "previous": prev.name, **m, **run_facts(run)}
            save()
            prev = run
        res["night_last_check"] = {"run": prev.name, **check_against_corpus(prev, c10),
                                   "verify": verify(prev, logs, env)}
        nights = [work / f"night-{k}" for k in range(1, args.nights + 1)]
        nights += [work / "night-append"] if args.append else []
        du = subprocess.run(["du", "-sm", str(base), *map(str, nights)],
                            capture_output=True, text=True).stdout
        res["disk_mb_full_run_and_nights_hard_links_once"] = {Path(line.split()[1]).name: int(line.split()[0])
                                                             for line in du.splitlines()}
        save()
        for run in nights:
            shutil.rmtree(run, ignore_errors=True)
    if args.paper_mb:
        res["single_paper"] = single_papers([float(x) for x in args.paper_mb.split(",")], args.seed, work)
        save()
    skip = None
    if 100 in sizes and "10" in res["full"]:
        est = 10 * (res["full"]["10"]["wall_s"] + res["verify"]["10"]["wall_s"]) / 60
        if est > args.max_100_min:
            skip = (f"estimated {est:.0f} min (10 x the 10% run and verify, at this machine's load) > "
                    f"--max-100-min {args.max_100_min}")
            res["skipped_100"] = skip
            print(f"100% skipped: {skip}", flush=True)
    if 100 in sizes and not skip:
        c100 = work / "corpus-100"  # 10 copies of the 10% corpus (as the nights left it)
        res["corpora"]["100"] = tenfold(c10, c100)
        full(100, c100)
    res["growth_exponents"] = growth(res)
    res["headline"] = headline(res)
    res["bench_wall_s"] = round(time.perf_counter() - t_start)
    save()
    print(json.dumps({"headline": res["headline"], "growth_exponents": res["growth_exponents"]}, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def growth(res: dict) -> dict:
    """log(figure at the larger size / at the smaller) / log(size ratio), per figure."""
    out = {}
    pairs = [("1", "10", 10), ("10", "100", 10), ("1", "100", 100)]
    for a, b, f in pairs:
        fa, fb = res["full"].get(a), res["full"].get(b)
        if not fa or not fb:
            continue
        va, vb = res["verify"].get(a, {}), res["verify"].get(b, {})
        out[f"{a}%->{b}%"] = {
            "full_tree_cpu_s": exponent(fa["tree_cpu_s"], fb["tree_cpu_s"], f),
            "full_tree_cpu_s_less_fixed": None,
            "full_driver_cpu_s": exponent(fa["driver_cpu_s"], fb["driver_cpu_s"], f),
            "full_driver_peak_rss_mb": exponent(fa["driver_peak_rss_mb"], fb["driver_peak_rss_mb"], f),
            "full_tree_peak_rss_mb": exponent(fa["tree_peak_rss_mb"], fb["tree_peak_rss_mb"], f),
            "files_per_table_chunks": exponent(fa["files_per_table"]["chunks"], fb["files_per_table"]["chunks"], f),
            "verify_cpu_s": exponent(va.get("tree_cpu_s"), vb.get("tree_cpu_s"), f),
        }
        fixed = res.get("fixed_cpu_s")
        if fixed:
            out[f"{a}%->{b}%"]["full_tree_cpu_s_less_fixed"] = exponent(fa["tree_cpu_s"] - fixed,
                                                                         fb["tree_cpu_s"] - fixed, f)
    return out


def headline(res: dict) -> dict:
    full10 = res["full"].get("10")
    h: dict = {}
    if full10 and res["nights"]:
        h["night_over_full_tree_cpu"] = [round(n["tree_cpu_s"] / full10["tree_cpu_s"], 2) for n in res["nights"]]
        h["night_driver_cpu_s"] = [n["driver_cpu_s"] for n in res["nights"]]
        h["full_driver_cpu_s"] = full10["driver_cpu_s"]
        h["files_per_table"] = {"full": full10["files_per_table"],
                                **{f"night{n['night']}": n["files_per_table"] for n in res["nights"]}}
        if "night_append" in res:
            h["night_append_over_full_tree_cpu"] = round(res["night_append"]["tree_cpu_s"] / full10["tree_cpu_s"], 2)
        if "night_unchanged" in res:
            h["night_unchanged_over_full_tree_cpu"] = round(res["night_unchanged"]["tree_cpu_s"] /
                                                            full10["tree_cpu_s"], 2)
    return h


if __name__ == "__main__":
    main()
