"""Re-check a committed chunk run against its manifest and its own papers table.

``verify_run`` checks, and reports what it could not check:

* the folder against the manifest: each table's number of Parquet files and rows (an extra, missing or
  truncated file is an error);
* every paper with stored text: ``sha256(markdown)`` equals its ``sha256`` and ``len(markdown)`` its
  ``n_chars``;
* every chunk: ``papers.markdown[start:end] == text``, byte offsets match the UTF-8 encoding, chunk
  indexes run 0..n-1 with ``n == papers.n_chunks``, ``paper_sha256`` is its paper's ``sha256``, and
  across each paper every non-whitespace character is in exactly one chunk;
* ids: no paper id twice, no chunk id twice, no chunk without its paper.

Papers written with ``--no-store-text`` have no text to check against: their chunks get the checks that
need no text (lengths, order, hashes), and they are counted in ``unchecked``.

Papers and chunks written by one task share a file name; carried rows (``--previous``) do not, so chunks
are found through a paper-id index of the chunk files, and the check streams one papers file at a time.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import storage
from .chunking import Chunk, ChunkInvariantError, verify_chunks
from .runs import read_manifest

PAPER_COLUMNS = ["paper_id", "sha256", "n_chars", "n_chunks", "markdown"]
CHUNK_COLUMNS = ["chunk_id", "paper_id", "chunk_index", "start", "end", "byte_start", "byte_end", "text",
                 "paper_sha256"]


def _parquet_files(folder: str) -> list[str]:
    return [n for n in storage.listdir(folder) if n.endswith(".parquet")]


def _rows(path: str) -> int:
    fs, local = storage.resolve(path)
    return pq.ParquetFile(local, filesystem=fs).metadata.num_rows


def check_folder(root: str, manifest: dict, errors: list[str]) -> dict[str, int]:
    """Files and rows of each table the manifest lists, against the folder; returns rows per table."""
    rows: dict[str, int] = {}
    for table, entry in sorted(manifest.get("tables", {}).items()):
        folder = storage.join(root, table)
        if not storage.isdir(folder):
            errors.append(f"{table}/: listed in the manifest, missing from the folder")
            continue
        names = storage.listdir(folder)
        files = [n for n in names if n.endswith(".parquet")]
        others = [n for n in names if not n.endswith(".parquet")]
        if others:
            errors.append(f"{table}/: files that are not Parquet: {others[:5]}")
        if len(files) != entry.get("files"):
            errors.append(f"{table}/: {len(files)} Parquet files, the manifest says {entry.get('files')}")
        n = 0
        for name in files:
            try:
                n += _rows(storage.join(folder, name))
            except (OSError, pa.ArrowException) as exc:
                errors.append(f"{table}/{name}: unreadable ({exc})")
        rows[table] = n
        if n != entry.get("rows"):
            errors.append(f"{table}/: {n} rows, the manifest says {entry.get('rows')}")
    return rows


def iter_paper_checks(root: str) -> Iterator[tuple[str, list[str], bool, int]]:
    """``(paper_id, problems, checked_against_text, n_chunks)`` for every paper row of a chunk run folder,
    plus ``("", [problem], False, 0)`` for chunk-level problems that belong to no paper (duplicate chunk
    ids, chunks without a paper)."""
    papers_dir, chunks_dir = storage.join(root, "papers"), storage.join(root, "chunks")
    chunk_files: dict[str, set[str]] = defaultdict(set)  # paper_id -> chunk files holding its chunks
    seen_chunks: set[str] = set()
    for name in _parquet_files(chunks_dir):
        t = storage.read_parquet(storage.join(chunks_dir, name), columns=["chunk_id", "paper_id"])
        for cid, pid in zip(t["chunk_id"].to_pylist(), t["paper_id"].to_pylist(), strict=True):
            if cid in seen_chunks:
                yield "", [f"chunk id {cid} appears twice"], False, 0
            seen_chunks.add(cid)
            chunk_files[pid].add(name)
    del seen_chunks
    seen_papers: set[str] = set()
    for name in _parquet_files(papers_dir):
        papers = storage.read_parquet(storage.join(papers_dir, name), columns=PAPER_COLUMNS)
        if not papers.num_rows:
            continue
        ids = papers["paper_id"].to_pylist()
        wanted = sorted({f for pid in ids for f in chunk_files.get(pid, ())})
        by_paper: dict[str, list[dict]] = defaultdict(list)
        value_set = pa.array(sorted(set(ids)), pa.string())
        for f in wanted:
            t = storage.read_parquet(storage.join(chunks_dir, f), columns=CHUNK_COLUMNS)
            for row in t.filter(pc.is_in(t["paper_id"], value_set=value_set)).to_pylist():
                by_paper[row["paper_id"]].append(row)
        for paper in papers.to_pylist():
            pid = paper["paper_id"]
            if pid in seen_papers:
                yield pid, [f"paper id {pid} appears twice"], False, 0
                continue
            seen_papers.add(pid)
            rows = sorted(by_paper.pop(pid, []), key=lambda r: r["chunk_index"])
            chunk_files.pop(pid, None)
            problems = check_paper(paper, rows)
            yield pid, problems, paper["markdown"] is not None, len(rows)
    for pid in chunk_files:
        yield "", [f"chunks of {pid} have no paper row"], False, 0


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
    """``{"papers", "chunks", "errors", "n_errors", "checked", "unchecked"}`` for a committed chunk run.

    ``errors`` lists the first ``max_errors`` problems (``n_errors`` counts all); ``checked`` counts what
    was checked against stored text; ``unchecked`` counts what could not be (papers without stored text
    and their chunks): a non-zero ``unchecked`` means the run is only partly verified.
    """
    manifest = read_manifest(run_dir)
    root = storage.normalize(run_dir)
    for table in ("papers", "chunks"):
        if not storage.isdir(storage.join(root, table)):
            return {"papers": 0, "chunks": 0, "errors": [f"{run_dir} has no {table}/ table: not a chunk run"],
                    "n_errors": 1, "checked": {}, "unchecked": {}}
    errors: list[str] = []
    rows = check_folder(root, manifest, errors)
    n_errors = len(errors)
    counts: Counter = Counter()
    for pid, problems, with_text, n_chunks in iter_paper_checks(root):
        if pid:
            counts["papers"] += 1
            counts["chunks"] += n_chunks
            counts["papers_with_text" if with_text else "papers_without_text"] += 1
            counts["chunks_with_text" if with_text else "chunks_without_text"] += n_chunks
        n_errors += len(problems)
        errors.extend(problems[: max(0, max_errors - len(errors))])
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
