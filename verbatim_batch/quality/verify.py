"""Re-check a committed run against its manifest and its own tables; report what could not be checked.

A chunk run (``verify_run``): files and rows per table against the manifest; each stored paper's ``sha256`` and
``n_chars``; each chunk's text at its char and byte offsets, indexes 0..n-1, ``paper_sha256``, and every
non-whitespace character in exactly one chunk; no id twice, no chunk without its paper. Papers written with
``--no-store-text`` get the checks that need no text and are counted in ``unchecked``. An extract run
(``verify_span_run``): every span against the chunk (and paper) text it claims to quote, and every span's pair
in the pairs table with its ``n_spans``.

A damaged, edited or non-plain file is a one-line finding, never a traceback, and a non-plain file is never
opened. Only the run folder is read, whatever its manifest names; an extract run's chunk run and pairs file are
read only when they are a committed chunk run and a regular file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from verbatim_batch.core import storage
from verbatim_batch.core.runs import manifest_problems, plain_relpath, read_files_index, read_manifest
from verbatim_batch.core.tasks import run_each
from verbatim_batch.corpus.chunker import Chunk, ChunkInvariantError, verify_chunks

log = logging.getLogger(__name__)

PAPER_COLUMNS = ["paper_id", "sha256", "n_chars", "n_chunks", "markdown"]
CHUNK_COLUMNS = ["chunk_id", "paper_id", "chunk_index", "start", "end", "byte_start", "byte_end", "text",
                 "paper_sha256"]


READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
               pa.ArrowException)  # what a damaged or forged file can raise while it is read and checked


def _one_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _parquet_files(folder: str) -> list[str]:
    return [n for n in storage.listdir(folder) if n.endswith(".parquet")]


def _short(path: str) -> str:
    """``table/file`` of a file path, for a finding."""
    return "/".join(path.replace("\\", "/").rstrip("/").split("/")[-2:])


def check_folder(root: str, manifest: dict, errors: list[str], bad: set[str] | None = None) -> dict[str, int]:
    """Files and rows of each table against the manifest, and bytes against ``files.json``; rows per table.
    A file that is not plain or cannot be read is a finding and joins ``bad`` (later checks leave it alone)."""
    bad = set() if bad is None else bad
    rows: dict[str, int] = {}
    tables = manifest.get("tables")
    index, problems = read_files_index(root)
    errors.extend(problems)
    for table, entry in sorted(tables.items() if isinstance(tables, dict) else [], key=lambda kv: str(kv[0])):
        if not plain_relpath(table) or "/" in table:
            errors.append(f"table {str(table)[:80]!r}: not a table name (a forged manifest?); not read")
            continue
        if not isinstance(entry, dict):
            entry = {}
        folder = storage.join(root, table)
        if storage.exists(folder + ".parquet") and not storage.isdir(folder):  # a one-file table (index ids)
            files, folder, rel = [table + ".parquet"], root, ""
        elif not storage.real_dir(folder):
            errors.append(f"{table}/: a link or file, not a folder of the run; not read" if storage.exists(folder)
                          else f"{table}/: listed in the manifest, missing from the folder")
            bad.add(table)
            continue
        else:
            names = storage.listdir(folder)
            files = [n for n in names if n.endswith(".parquet")]
            others = [n for n in names if not n.endswith(".parquet")]
            rel = table + "/"
            if others:
                errors.append(f"{table}/: files that are not Parquet: {others[:5]}")
        if len(files) != entry.get("files"):
            errors.append(f"{table}/: {len(files)} Parquet files, the manifest says {entry.get('files')}")
        listed = index.get(table) if index is not None else None
        n = 0
        for name in files:
            path = storage.join(folder, name)
            if not storage.regular_file(path):
                errors.append(f"{rel}{name}: not a plain file (a link, pipe or device); not read")
                bad.add(rel + name)
                continue
            if listed is not None:
                known = listed.get(name)
                if known is None:
                    errors.append(f"{rel}{name}: not in files.json (added after the commit?)")
                elif storage.file_digest(path) != known["digest"]:
                    errors.append(f"{rel}{name}: its bytes differ from files.json (damaged or edited after the "
                                  "commit)")
            try:
                n += storage.parquet_file(path).metadata.num_rows
            except READ_ERRORS as exc:
                errors.append(f"{rel}{name}: unreadable ({_one_line(exc)})")
                bad.add(rel + name)
        if listed is not None:
            errors.extend(f"{rel}{name}: in files.json, missing from the folder" for name in sorted(set(listed)
                                                                                                   - set(files)))
        rows[table] = n
        if n != entry.get("rows"):
            errors.append(f"{table}/: {n} rows, the manifest says {entry.get('rows')}")
    return rows


def _first_occurrences(values: pa.Array) -> pa.Array:
    """Indices of ``values`` that are not the value's first occurrence, ascending."""
    idx = pa.array(np.arange(len(values), dtype=np.int64))
    firsts = pa.table({"v": values, "i": idx}).group_by("v", use_threads=False).aggregate([("i", "min")])
    if firsts.num_rows == len(values):
        return pa.array([], pa.int64())
    return idx.filter(pc.invert(pc.is_in(idx, value_set=firsts["i_min"].combine_chunks())))


def check_units(root: str, bad: set[str] | None = None) -> tuple[list[str], list[tuple], list[str]]:
    """``(problems before, units, problems after)`` of a chunk run's papers check, planned from ids alone, in Arrow.

    A unit is one papers row group: ``(papers file, row group, [(chunks file, row group)] holding its papers'
    chunks, its rows that repeat an earlier paper id)``, what ``check_unit`` takes. Chunk ids seen twice come
    first, chunks without a paper row last. A file that is not plain or cannot be read is a problem before, never
    read further; its ``table/name`` joins ``bad`` (which names the files found bad already)."""
    bad = set() if bad is None else bad
    unreadable: list[str] = []

    def id_groups(table: str, columns: list[str]) -> list[tuple]:
        """``(file, row group, *columns as strings)`` of each row group of the plain, readable files of a table."""
        out = []
        for name in _parquet_files(storage.join(root, table)):
            path = storage.join(root, table, name)
            if f"{table}/{name}" in bad:
                continue
            if not storage.regular_file(path):
                unreadable.append(f"{table}/{name}: not a plain file (a link, pipe or device); not read")
                bad.add(f"{table}/{name}")
                continue
            try:
                pf, parts = storage.parquet_file(path), []
                for group in range(pf.num_row_groups):
                    t = pf.read_row_group(group, columns=columns)
                    parts.append((name, group, *(t[c].combine_chunks().cast(pa.string()) for c in columns)))
            except READ_ERRORS as exc:  # chunks: their papers do not verify; papers: not checked, nor carried
                unreadable.append(f"{table}/{name}: unreadable ({_one_line(exc)})")
                bad.add(f"{table}/{name}")
                continue
            out.extend(parts)
        return out

    groups: list[tuple[str, int]] = []
    cids, cpids, cgs = [], [], []
    for name, group, cid, cpid in id_groups("chunks", ["chunk_id", "paper_id"]):
        cids.append(cid)
        cpids.append(cpid)
        cgs.append(pa.repeat(pa.scalar(len(groups), pa.int32()), len(cid)))
        groups.append((name, group))
    chunk_ids = pa.concat_arrays(cids) if cids else pa.array([], pa.string())
    chunk_pids = pa.concat_arrays(cpids) if cpids else pa.array([], pa.string())
    before = unreadable + [f"chunk id {cid} appears twice"
                           for cid in chunk_ids.take(_first_occurrences(chunk_ids)).to_pylist()]
    unreadable.clear()
    del chunk_ids, cids
    chunk_groups = pa.table({"paper_id": chunk_pids, "cg": pa.concat_arrays(cgs) if cgs else pa.array([], pa.int32())}
                            ).group_by(["paper_id", "cg"], use_threads=False).aggregate([])
    units: list[tuple] = []
    ppids, pus = [], []
    for name, group, ids in id_groups("papers", ["paper_id"]):
        if len(ids):
            ppids.append(ids)
            pus.append(pa.repeat(pa.scalar(len(units), pa.int32()), len(ids)))
            units.append((name, group))
    before += unreadable
    paper_ids = pa.concat_arrays(ppids) if ppids else pa.array([], pa.string())
    unit_of = pa.concat_arrays(pus) if pus else pa.array([], pa.int32())
    offsets = np.cumsum([0, *map(len, ppids)]).tolist()  # each unit's first row in paper_ids
    repeats: dict[int, list[int]] = defaultdict(list)
    for i in _first_occurrences(paper_ids).to_pylist():  # rows that repeat a paper id: few, if any
        u = unit_of[i].as_py()
        repeats[u].append(i - offsets[u])
    wanted: dict[int, list[tuple[str, int]]] = defaultdict(list)
    pairs = pa.table({"paper_id": paper_ids, "pu": unit_of}).join(chunk_groups, "paper_id", join_type="inner",
                                                                  use_threads=False)
    pairs = pairs.group_by(["pu", "cg"], use_threads=False).aggregate([])
    for u, g in zip(pairs["pu"].to_pylist(), pairs["cg"].to_pylist(), strict=True):  # units x groups: small
        wanted[u].append(groups[g])
    orphans = pa.table({"paper_id": chunk_pids, "i": pa.array(np.arange(len(chunk_pids), dtype=np.int64))})
    orphans = orphans.filter(pc.invert(pc.is_in(orphans["paper_id"], value_set=paper_ids)))
    orphans = orphans.group_by("paper_id", use_threads=False).aggregate([("i", "min")]).sort_by("i_min")
    after = [f"chunks of {pid} have no paper row" for pid in orphans["paper_id"].to_pylist()]
    return before, [(name, group, sorted(wanted[u]), repeats[u]) for u, (name, group) in enumerate(units)], after


def check_unit(fs: pafs.FileSystem, papers_file: str, group: int, chunk_groups: list[tuple[str, int]],
               repeats: list[int], max_errors: int, want_rejected: bool) -> dict:
    """One papers row group against the chunk row groups holding its chunks (a Ray task when Ray is up; ``fs``
    travels with it): ``{"counts", "n_errors", "errors", "rejected", "io_error"}``; ``rejected`` (when asked): the
    papers that did not verify or have no stored text."""

    def read(path: str, g: int, columns: list[str]) -> pa.Table:
        return pq.ParquetFile(fs.open_input_file(path)).read_row_group(g, columns=columns)

    try:
        papers = read(papers_file, group, PAPER_COLUMNS)
        papers_rows = papers.to_pylist()
    except READ_ERRORS as exc:  # a damaged row group: a finding; its papers (if their ids read) are rejected
        try:
            ids = read(papers_file, group, ["paper_id"])["paper_id"].to_pylist()
        except READ_ERRORS:
            ids = []
        return {"counts": {"papers": len(ids)}, "n_errors": 1,
                "errors": [f"{_short(papers_file)} row group {group}: unreadable ({_one_line(exc)})"][:max_errors],
                "rejected": [i for i in ids if isinstance(i, str)] if want_rejected else [],
                "io_error": isinstance(exc, OSError)}
    value_set = pa.array(sorted({p for p in papers["paper_id"].to_pylist() if isinstance(p, str)}), pa.string())
    by_paper: dict[str, list[dict]] = defaultdict(list)
    errors: list[str] = []
    n_errors = 0
    lost = False  # a chunk row group could not be read: none of this unit's papers is trusted
    io_error = False  # a read failed in the file system (not in the file): another process may read it
    for f, g in chunk_groups:
        try:
            t = read(f, g, CHUNK_COLUMNS)
            rows = t.filter(pc.is_in(t["paper_id"].cast(pa.string()), value_set=value_set)).to_pylist()
        except READ_ERRORS as exc:
            n_errors += 1
            errors.append(f"{_short(f)} row group {g}: unreadable ({_one_line(exc)})")
            lost, io_error = True, io_error or isinstance(exc, OSError)
            continue
        for row in rows:
            by_paper[row["paper_id"]].append(row)
    counts: Counter = Counter()
    rejected: list[str] = []
    skip = set(repeats)
    for i, paper in enumerate(papers_rows):
        pid = paper["paper_id"]
        if i in skip:
            problems, with_text, n_chunks = [f"paper id {pid} appears twice"], False, 0
        else:
            try:
                rows = sorted(by_paper.pop(pid, []), key=lambda r: r["chunk_index"])
                problems, with_text, n_chunks = check_paper(paper, rows), paper["markdown"] is not None, len(rows)
            except READ_ERRORS as exc:  # values of the wrong type (a forged file)
                problems, with_text, n_chunks = [f"{pid}: values of the wrong type ({_one_line(exc)})"], False, 0
        if lost and not problems and want_rejected:
            rejected.append(pid)
        text = "with_text" if with_text else "without_text"
        counts.update({"papers": 1, "chunks": n_chunks, f"papers_{text}": 1, f"chunks_{text}": n_chunks})
        n_errors += len(problems)
        errors.extend(problems[: max(0, max_errors - len(errors))])
        if want_rejected and (problems or not with_text):
            rejected.append(pid)
    return {"counts": dict(counts), "n_errors": n_errors, "errors": errors[:max_errors], "rejected": rejected,
            "io_error": io_error}


def _units_in_tasks(calls: list[tuple], root: str) -> list:
    """The units as Ray tasks; one a worker could not read (``io_error``: credentials this process has and its
    workers lack) is checked again here, with one warning."""
    try:
        results = run_each(check_unit, calls)
    except Exception as exc:  # noqa: BLE001 - RayTaskError wraps the worker's OSError
        if not isinstance(exc, OSError) and not isinstance(getattr(exc, "cause", None), OSError):
            raise
        results = [{"io_error": True, "errors": [str(exc).splitlines()[-1][:200]]} for _ in calls]
    if again := [i for i, r in enumerate(results) if r.get("io_error")]:
        log.warning("the Ray workers could not read %d of %d units of %s (%s): checking them in this process",
                    len(again), len(results), root, results[again[0]]["errors"][:1])
        for i in again:
            results[i] = check_unit(*calls[i])
    return results


def check_papers(root: str, max_errors: int = 20, want_rejected: bool = False, bad: set[str] | None = None) -> dict:
    """Every paper and chunk row of a chunk run checked (``check_paper``), and the ids across files: ``{"counts",
    "n_errors", "errors" (the first max_errors), "rejected", "units"}``.

    One unit per papers row group, as Ray tasks when Ray is up, else in this process: the same result either
    way, and only counts and first errors come back, never rows."""
    before, units, after = check_units(root, bad)
    fs = storage.resolve(root)[0]

    def where(table: str, name: str) -> str:
        return storage.resolve(storage.join(root, table, name))[1]

    calls = [(fs, where("papers", name), group, [(where("chunks", f), g) for f, g in chunk_groups], repeats,
              max_errors, want_rejected) for name, group, chunk_groups, repeats in units]
    # an fsspec memory:// store lives in this process only: its checks cannot leave it
    results = [check_unit(*c) for c in calls] if root.startswith("memory://") else _units_in_tasks(calls, root)
    counts: Counter = Counter()
    errors = before[:max_errors]
    n_errors = len(before)
    rejected: set[str] = set()
    for r in results:
        counts.update(r["counts"])
        n_errors += r["n_errors"]
        errors.extend(r["errors"][: max(0, max_errors - len(errors))])
        rejected.update(r["rejected"])
    n_errors += len(after)
    errors.extend(after[: max(0, max_errors - len(errors))])
    return {"counts": counts, "n_errors": n_errors, "errors": errors, "rejected": rejected, "units": len(units)}


def paper_units(run_dir: str) -> int:
    """Row groups of a chunk run's papers table (the units ``check_papers`` runs); 0 for anything else."""
    papers_dir = storage.join(storage.normalize(run_dir), "papers")
    if not storage.isdir(papers_dir):
        return 0
    n = 0
    for name in _parquet_files(papers_dir):
        path = storage.join(papers_dir, name)
        if not storage.regular_file(path):  # never opened: verify_run reports it
            continue
        with contextlib.suppress(*READ_ERRORS):  # verify_run reports it
            n += storage.parquet_file(path).num_row_groups
    return n


def check_paper(paper: dict, rows: list[dict]) -> list[str]:
    """Problems of one paper row and its chunk rows (sorted by index); ``[]`` when all hold."""
    pid, text, sha = paper["paper_id"], paper["markdown"], paper["sha256"]
    problems: list[str] = []
    if [r["chunk_index"] for r in rows] != list(range(len(rows))):
        problems.append(f"chunk indexes are not 0..{len(rows) - 1}")
    if len(rows) != paper["n_chunks"]:
        problems.append(f"{len(rows)} chunks, the paper row says {paper['n_chunks']}")
    bad_sha = [r["chunk_index"] for r in rows if r["paper_sha256"] != sha]
    if bad_sha:
        problems.append(f"chunks {bad_sha[:5]} carry another paper_sha256")
    for r in rows:  # checks that need no paper text
        n_bytes = len(r["text"].encode("utf-8", "surrogatepass"))
        if r["end"] - r["start"] != len(r["text"]) or r["byte_end"] - r["byte_start"] != n_bytes:
            problems.append(f"chunk {r['chunk_index']}: offsets do not span its text")
            break
    if text is None:
        return [f"{pid}: {p}" for p in problems]
    if hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() != sha:
        problems.append("sha256 of the stored text differs from the paper row's sha256")
    if len(text) != paper["n_chars"]:
        problems.append(f"stored text has {len(text)} characters, the paper row says {paper['n_chars']}")
    try:
        verify_chunks(text, [Chunk(r["chunk_index"], r["start"], r["end"], r["text"], (), ()) for r in rows])
        char_pos = byte_pos = 0  # chunks are in order and apart (verified above): offsets add up, linear time
        for r in rows:
            byte_pos += len(text[char_pos : r["start"]].encode("utf-8", "surrogatepass"))
            char_pos = r["start"]
            b0 = byte_pos
            if (r["byte_start"], r["byte_end"]) != (b0, b0 + len(r["text"].encode("utf-8", "surrogatepass"))):
                raise ChunkInvariantError(f"chunk {r['chunk_index']}: byte offsets disagree")
    except ChunkInvariantError as exc:
        problems.append(str(exc))
    return [f"{pid}: {p}" for p in problems]


def verify_run(run_dir: str, max_errors: int = 20) -> dict:
    """``{"papers", "chunks", "errors", "n_errors", "checked", "unchecked"}`` for a committed chunk run (an
    extract run: ``verify_span_run``; a composite: ``verify_composite``).

    ``errors``: the first ``max_errors`` problems (``n_errors`` counts all); a non-zero ``unchecked`` (papers
    without stored text, their chunks) means only partly verified. A folder that is not a run raises."""
    manifest = read_manifest(run_dir, strict=False)
    problems = [f"manifest.json: {p} (a forged or damaged manifest?)" for p in manifest_problems(manifest)]
    try:
        result = _verify(run_dir, manifest, max_errors)
    except READ_ERRORS as exc:  # whatever a damaged run raises that no check above caught: one finding
        result = {"errors": [f"could not be checked to the end: {_one_line(exc)}"], "n_errors": 1, "checked": {},
                  "unchecked": {}}
    if problems:
        result["errors"] = (problems + result["errors"])[:max_errors]
        result["n_errors"] += len(problems)
    return result


def _verify(run_dir: str, manifest: dict, max_errors: int) -> dict:
    root = storage.normalize(run_dir)
    command = manifest.get("command")
    if command == "extract":
        return verify_span_run(run_dir, max_errors, manifest)
    if command in COMPOSITES:
        return verify_composite(root, manifest, max_errors)
    if command != "chunk":
        errors: list[str] = []
        rows = check_folder(root, manifest, errors)
        return {"tables": rows, "errors": errors[:max_errors], "n_errors": len(errors),
                "checked": {"tables": len(rows)}, "unchecked": {}}
    for table in ("papers", "chunks"):
        if not storage.real_dir(storage.join(root, table)):
            return {"papers": 0, "chunks": 0, "errors": [f"{run_dir} has no {table}/ table: not a chunk run"],
                    "n_errors": 1, "checked": {}, "unchecked": {}}
    errors: list[str] = []
    bad: set[str] = set()
    rows = check_folder(root, manifest, errors, bad)
    checked = check_papers(root, max_errors=max(0, max_errors - len(errors)), bad=bad)
    counts = checked["counts"]
    n_errors = len(errors) + checked["n_errors"]
    errors.extend(checked["errors"])
    return {
        "papers": counts["papers"],
        "chunks": counts["chunks"],
        "errors": errors[:max_errors],
        "n_errors": n_errors,
        "checked": {"tables": len(rows), "papers_text_sha256": counts["papers_with_text"],
                    "chunks_against_text": counts["chunks_with_text"]},
        "unchecked": {k: v for k, v in (("papers_without_text", counts["papers_without_text"]),
                                         ("chunks_without_text", counts["chunks_without_text"])) if v},
    }


COMPOSITES = ("run", "nightly", "silver")  # runs whose stages are committed runs in their subfolders


def verify_composite(root: str, manifest: dict, max_errors: int = 20) -> dict:
    """A chain, nightly or silver run: each stage run inside it checked as its own kind; a stage name that is no
    plain folder of the run, or a stage that is not a committed run, is a finding."""
    listed = manifest.get("stages")
    names = list(listed) if isinstance(listed, (dict, list)) and listed else sorted(
        n for n in storage.listdir(root) if storage.exists(storage.join(root, n, "manifest.json")))
    stages, errors, n_errors = {}, [], 0
    for name in names:
        problem = None
        if not isinstance(name, str) or not plain_relpath(name) or "/" in name:
            problem = f"stage {str(name)[:80]!r}: not a folder of this run"  # a forged manifest never leads out
        elif not storage.real_dir(storage.join(root, name)):
            problem = (f"stage {name}: a link or file, not a folder of this run; not read"
                       if storage.exists(storage.join(root, name)) else f"stage {name}: missing from the folder")
        if problem is None:
            try:
                result = verify_run(storage.join(root, name), max_errors)
            except (FileNotFoundError, ValueError) as exc:  # not a committed run: the composite is not whole
                problem = f"stage {name}: {_one_line(exc)}"
        if problem is not None:
            errors.append(problem)
            n_errors += 1
            continue
        stages[name] = result
        n_errors += result["n_errors"]
        errors.extend(f"{name}: {e}" for e in result["errors"])
    return {"stages": stages, "errors": errors[:max_errors], "n_errors": n_errors}


SPAN_COLUMNS = ["pair_id", "chunk_id", "paper_id", "start", "end", "paper_start", "paper_end", "text"]


def _span_sources(manifest: dict) -> tuple[str | None, str | None]:
    """``(chunk run, pairs file)`` an extract run read its texts from, each None unless a committed chunk run and
    a regular file (never a pipe, whatever a forged config names)."""
    try:
        config = json.loads(manifest.get("config") or "{}")
    except (TypeError, ValueError, RecursionError):
        return None, None
    config = config if isinstance(config, dict) else {}
    chunks_run = storage.normalize(config["chunks"]) if isinstance(config.get("chunks"), str) else None
    if chunks_run is not None:
        try:
            is_chunk_run = read_manifest(chunks_run, strict=False)["command"] == "chunk"
        except (OSError, ValueError):
            is_chunk_run = False
        if not is_chunk_run or not storage.real_dir(storage.join(chunks_run, "chunks")):
            chunks_run = None
    pairs = config.get("pairs")
    if not isinstance(pairs, str) or not pairs:
        return chunks_run, None
    ok = storage.isfile(pairs) if storage.is_remote(pairs) else os.path.isfile(storage.normalize(pairs))
    return chunks_run, (pairs if ok else None)


def _pair_chunks(pairs_file: str, chunks_dir: str | None, pair_ids: set[str]) -> dict[str, dict]:
    """pair_id -> ``{"text", "start"}`` of the chunk a pairs-file pair carried (or named by id)."""
    from verbatim_batch.extract.pairs import chunk_lookup, pairs_from_records, read_pair_records

    records = list(read_pair_records(pairs_file))
    known = chunk_lookup(chunks_dir, [r.get("chunk_id") for r in records if isinstance(r.get("chunk_id"), str)]) \
        if chunks_dir else {}
    table = pairs_from_records(records, known)
    return {r["pair_id"]: {"text": r["chunk"], "start": r["chunk_start"]} for r in table.to_pylist()
            if r["pair_id"] in pair_ids and r["chunk"] is not None}


def _paper_texts(chunks_run: str, paper_ids: set[str]) -> dict[str, str | None]:
    """paper_id -> stored markdown (None when the chunk run kept no text) from the chunk run's papers table."""
    papers_dir = storage.join(chunks_run, "papers")
    if not paper_ids or not storage.isdir(papers_dir):
        return {}
    table = storage.dataset(papers_dir).to_table(columns=["paper_id", "markdown"],
                                                 filter=pc.field("paper_id").isin(sorted(paper_ids)))
    return dict(zip(table["paper_id"].to_pylist(), table["markdown"].to_pylist(), strict=True))


def check_spans(spans: list[dict], chunks: dict[str, dict], papers: dict[str, str | None]) -> tuple[
        list[str], Counter]:
    """Problems of span rows against their chunks (``chunk_id`` or ``pair_id`` -> ``{"text", "start"}``) and
    papers (``paper_id`` -> markdown or None), and counts of what was checked."""
    problems: list[str] = []
    counts: Counter = Counter()
    for s in spans:
        where = f"span {s['pair_id']}[{s['start']}:{s['end']}]"
        chunk = chunks.get(s["pair_id"]) or chunks.get(s["chunk_id"])
        if chunk is None:
            counts["spans_without_chunk_text"] += 1
        else:
            counts["spans_against_chunk_text"] += 1
            if not 0 <= s["start"] < s["end"] <= len(chunk["text"]):
                problems.append(f"{where}: offsets outside its chunk ({len(chunk['text'])} characters)")
                continue
            if chunk["text"][s["start"]:s["end"]] != s["text"]:
                problems.append(f"{where}: its text is not the chunk's text at its offsets")
            if chunk.get("start") is not None and s["paper_start"] is not None and (
                    s["paper_start"], s["paper_end"]) != (chunk["start"] + s["start"], chunk["start"] + s["end"]):
                problems.append(f"{where}: paper offsets {s['paper_start']}:{s['paper_end']} are not the chunk's "
                                f"offset {chunk['start']} plus its own")
        if s["paper_start"] is None:
            continue
        text = papers.get(s["paper_id"])
        if text is None:
            counts["spans_without_paper_text"] += 1
            continue
        counts["spans_against_paper_text"] += 1
        if text[s["paper_start"]:s["paper_end"]] != s["text"]:
            problems.append(f"{where}: its text is not paper {s['paper_id']}'s text at {s['paper_start']}:"
                            f"{s['paper_end']}")
    return problems, counts


def verify_span_run(run_dir: str, max_errors: int = 20, manifest: dict | None = None) -> dict:
    """``{"spans", "pairs", "errors", "n_errors", "checked", "unchecked"}`` for a committed extract run; spans
    whose chunk text cannot be found (its chunk run or pairs file gone) are ``unchecked``, not errors."""
    manifest = manifest or read_manifest(run_dir, strict=False)
    root = storage.normalize(run_dir)
    errors: list[str] = []
    for table in ("spans", "pairs"):
        if not storage.real_dir(storage.join(root, table)):
            return {"spans": 0, "pairs": 0, "errors": [f"{run_dir} has no {table}/ table: not an extract run"],
                    "n_errors": 1, "checked": {}, "unchecked": {}}
    bad: set[str] = set()
    rows = check_folder(root, manifest, errors, bad)
    n_errors = len(errors)

    def add(problems: list[str]) -> None:
        nonlocal n_errors
        n_errors += len(problems)
        errors.extend(problems[: max(0, max_errors - len(errors))])

    def table_files(table: str) -> list[str]:
        """The plain, readable files of a table of this run (a bad one was reported by check_folder)."""
        folder = storage.join(root, table)
        return [storage.join(folder, n) for n in _parquet_files(folder)
                if f"{table}/{n}" not in bad and storage.regular_file(storage.join(folder, n))]

    expected: dict[str, int] = {}
    for path in table_files("pairs"):
        try:
            pairs = storage.read_parquet(path, columns=["pair_id", "n_spans"]).to_pydict()
        except READ_ERRORS as exc:
            add([f"{_short(path)}: unreadable ({_one_line(exc)})"])
            continue
        for pid, n in zip(pairs["pair_id"], pairs["n_spans"], strict=True):
            if pid in expected:
                add([f"pair id {pid} appears twice in pairs/"])
            expected[pid] = n
    chunks_run, pairs_file = _span_sources(manifest)
    chunks_dir = storage.join(chunks_run, "chunks") if chunks_run else None
    pair_chunks: dict[str, dict] | None = None
    found: Counter = Counter()
    counts: Counter = Counter()
    for path in table_files("spans"):
        try:
            spans = storage.read_parquet(path, columns=SPAN_COLUMNS).to_pylist()
        except READ_ERRORS as exc:
            add([f"{_short(path)}: unreadable ({_one_line(exc)})"])
            continue
        if not spans:
            continue
        found.update(s["pair_id"] for s in spans)
        chunks: dict[str, dict] = {}
        papers: dict[str, str | None] = {}
        try:  # what the run read its texts from: outside the run, so a failure there is named as such
            if pairs_file is not None:
                if pair_chunks is None:
                    pair_chunks = _pair_chunks(pairs_file, chunks_dir, set(expected))
                chunks.update(pair_chunks)
            if chunks_dir is not None:
                from verbatim_batch.extract.pairs import chunk_lookup

                chunks.update(chunk_lookup(chunks_dir, [s["chunk_id"] for s in spans if s["pair_id"] not in chunks]))
            if chunks_run:
                papers = _paper_texts(chunks_run, {s["paper_id"] for s in spans if s["paper_start"] is not None})
        except READ_ERRORS as exc:
            add([f"the chunk run or pairs file this run read ({chunks_run or pairs_file}) is unreadable "
                 f"({_one_line(exc)}): spans of {_short(path)} not checked against it"])
            chunks, papers = {}, {}
        try:
            problems, c = check_spans(spans, chunks, papers)
        except READ_ERRORS as exc:  # values of the wrong type (a forged file)
            problems, c = [f"{_short(path)}: values of the wrong type ({_one_line(exc)})"], Counter()
        counts.update(c)
        add(problems)
    add([f"span of pair {pid}: no such pair in pairs/" for pid in sorted(set(found) - set(expected))])
    add([f"pair {pid}: n_spans {n}, spans/ holds {found.get(pid, 0)}" for pid, n in sorted(expected.items())
         if n != found.get(pid, 0)])
    return {
        "spans": sum(found.values()),
        "pairs": len(expected),
        "errors": errors[:max_errors],
        "n_errors": n_errors,
        "checked": {"tables": len(rows), "spans_against_chunk_text": counts["spans_against_chunk_text"],
                    "spans_against_paper_text": counts["spans_against_paper_text"]},
        "unchecked": {k: counts[k] for k in ("spans_without_chunk_text", "spans_without_paper_text") if counts[k]},
    }
