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

A committed **extract run** (``verify SPANS_RUN``) gets ``verify_span_run``: the folder against the manifest,
then every span against the text it claims to quote: ``chunk[start:end] == text`` (the chunk from the chunk
run named in the run's config, or from its pairs file), ``paper_start``/``paper_end`` equal to the chunk's
paper offset plus ``start``/``end`` and ``markdown[paper_start:paper_end] == text`` where the chunk run stored
the paper text; every span's pair is in the pairs table, whose ``n_spans`` counts its spans.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
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


def _row_groups(path: str) -> int:
    return storage.parquet_file(path).num_row_groups


def _read_group(path: str, group: int, columns: list[str]) -> pa.Table:
    return storage.parquet_file(path).read_row_group(group, columns=columns)


def iter_paper_checks(root: str) -> Iterator[tuple[str, list[str], bool, int]]:
    """``(paper_id, problems, checked_against_text, n_chunks)`` for every paper row of a chunk run folder,
    plus ``("", [problem], False, 0)`` for chunk-level problems that belong to no paper (duplicate chunk
    ids, chunks without a paper).

    Memory stays bounded by a few row groups, whatever the files' sizes: chunk files are first indexed by
    row group (ids only), then papers are checked one row group at a time against the chunk row groups that
    hold their chunks (written in paper order, so a papers row group needs a few neighbouring ones).
    """
    papers_dir, chunks_dir = storage.join(root, "papers"), storage.join(root, "chunks")
    chunk_groups: dict[str, set[tuple[str, int]]] = defaultdict(set)  # paper_id -> (file, row group)
    seen_chunks: set[str] = set()
    for name in _parquet_files(chunks_dir):
        path = storage.join(chunks_dir, name)
        for group in range(_row_groups(path)):
            t = _read_group(path, group, ["chunk_id", "paper_id"])
            for cid, pid in zip(t["chunk_id"].to_pylist(), t["paper_id"].to_pylist(), strict=True):
                if cid in seen_chunks:
                    yield "", [f"chunk id {cid} appears twice"], False, 0
                seen_chunks.add(cid)
                chunk_groups[pid].add((name, group))
    del seen_chunks
    seen_papers: set[str] = set()
    for name in _parquet_files(papers_dir):
        path = storage.join(papers_dir, name)
        for group in range(_row_groups(path)):
            papers = _read_group(path, group, PAPER_COLUMNS)
            if not papers.num_rows:
                continue
            ids = papers["paper_id"].to_pylist()
            wanted = sorted({g for pid in ids for g in chunk_groups.get(pid, ())})
            by_paper: dict[str, list[dict]] = defaultdict(list)
            value_set = pa.array(sorted(set(ids)), pa.string())
            for f, g in wanted:
                t = _read_group(storage.join(chunks_dir, f), g, CHUNK_COLUMNS)
                for row in t.filter(pc.is_in(t["paper_id"], value_set=value_set)).to_pylist():
                    by_paper[row["paper_id"]].append(row)
            for paper in papers.to_pylist():
                pid = paper["paper_id"]
                if pid in seen_papers:
                    yield pid, [f"paper id {pid} appears twice"], False, 0
                    continue
                seen_papers.add(pid)
                rows = sorted(by_paper.pop(pid, []), key=lambda r: r["chunk_index"])
                chunk_groups.pop(pid, None)
                problems = check_paper(paper, rows)
                yield pid, problems, paper["markdown"] is not None, len(rows)
    for pid in chunk_groups:
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
    """``{"papers", "chunks", "errors", "n_errors", "checked", "unchecked"}`` for a committed chunk run
    (an extract run: see ``verify_span_run``).

    ``errors`` lists the first ``max_errors`` problems (``n_errors`` counts all); ``checked`` counts what
    was checked against stored text; ``unchecked`` counts what could not be (papers without stored text
    and their chunks): a non-zero ``unchecked`` means the run is only partly verified.
    """
    manifest = read_manifest(run_dir)
    root = storage.normalize(run_dir)
    if manifest.get("command") == "extract":
        return verify_span_run(run_dir, max_errors, manifest)
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


SPAN_COLUMNS = ["pair_id", "chunk_id", "paper_id", "start", "end", "paper_start", "paper_end", "text"]


def _span_sources(manifest: dict) -> tuple[str | None, str | None]:
    """``(chunk run, pairs file)`` an extract run read its chunk texts from (either may be None)."""
    config = json.loads(manifest.get("config") or "{}")
    chunks_run = storage.normalize(config["chunks"]) if config.get("chunks") else None
    if chunks_run is not None and not storage.isdir(storage.join(chunks_run, "chunks")):
        chunks_run = None
    pairs = config.get("pairs")
    return chunks_run, (pairs if pairs and storage.exists(pairs) else None)


def _pair_chunks(pairs_file: str, chunks_dir: str | None, pair_ids: set[str]) -> dict[str, dict]:
    """pair_id -> ``{"text", "start"}`` of the chunk a pairs-file pair carried (or named by id)."""
    from .extract.pairs import chunk_lookup, pairs_from_records, read_pair_records

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
                                                 filter=pads.field("paper_id").isin(sorted(paper_ids)))
    return dict(zip(table["paper_id"].to_pylist(), table["markdown"].to_pylist(), strict=True))


def check_spans(spans: list[dict], chunks: dict[str, dict], papers: dict[str, str | None]) -> tuple[
        list[str], Counter]:
    """Problems of span rows against their chunks (``chunk_id`` or ``pair_id`` -> ``{"text", "start"}``) and
    papers (``paper_id`` -> markdown or None), and what was checked or could not be."""
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
    """``{"spans", "pairs", "errors", "n_errors", "checked", "unchecked"}`` for a committed extract run: the
    folder against the manifest, each span against its chunk's text (and its paper's, where stored), each span's
    pair in the pairs table with ``n_spans`` spans. Spans whose chunk text cannot be found (the chunk run or
    pairs file gone) are counted in ``unchecked``, not errors."""
    manifest = manifest or read_manifest(run_dir)
    root = storage.normalize(run_dir)
    errors: list[str] = []
    for table in ("spans", "pairs"):
        if not storage.isdir(storage.join(root, table)):
            return {"spans": 0, "pairs": 0, "errors": [f"{run_dir} has no {table}/ table: not an extract run"],
                    "n_errors": 1, "checked": {}, "unchecked": {}}
    rows = check_folder(root, manifest, errors)
    n_errors = len(errors)

    def add(problems: list[str]) -> None:
        nonlocal n_errors
        n_errors += len(problems)
        errors.extend(problems[: max(0, max_errors - len(errors))])

    pairs = storage.read_parquet(storage.join(root, "pairs"), columns=["pair_id", "n_spans"])
    expected: dict[str, int] = {}
    for pid, n in zip(pairs["pair_id"].to_pylist(), pairs["n_spans"].to_pylist(), strict=True):
        if pid in expected:
            add([f"pair id {pid} appears twice in pairs/"])
        expected[pid] = n
    chunks_run, pairs_file = _span_sources(manifest)
    chunks_dir = storage.join(chunks_run, "chunks") if chunks_run else None
    pair_chunks: dict[str, dict] | None = None
    found: Counter = Counter()
    counts: Counter = Counter()
    spans_dir = storage.join(root, "spans")
    for name in _parquet_files(spans_dir):
        spans = storage.read_parquet(storage.join(spans_dir, name), columns=SPAN_COLUMNS).to_pylist()
        if not spans:
            continue
        found.update(s["pair_id"] for s in spans)
        chunks: dict[str, dict] = {}
        if pairs_file is not None:
            if pair_chunks is None:
                pair_chunks = _pair_chunks(pairs_file, chunks_dir, set(expected))
            chunks.update(pair_chunks)
        if chunks_dir is not None:
            from .extract.pairs import chunk_lookup

            chunks.update(chunk_lookup(chunks_dir, [s["chunk_id"] for s in spans if s["pair_id"] not in chunks]))
        papers = _paper_texts(chunks_run, {s["paper_id"] for s in spans if s["paper_start"] is not None}) \
            if chunks_run else {}
        problems, c = check_spans(spans, chunks, papers)
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
