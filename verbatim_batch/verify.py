"""Re-check a committed chunk run against its own papers table.

For every chunk: ``papers.markdown[start:end] == text``, the byte offsets match
the UTF-8 encoding, and across each paper every non-whitespace character is in
exactly one chunk. Papers and chunks written by one task share a file name, so
the check streams one file pair at a time.
"""

from __future__ import annotations

from collections import defaultdict

from . import storage
from .chunking import Chunk, ChunkInvariantError, verify_chunks
from .runs import read_manifest


def verify_run(run_dir: str, max_errors: int = 20) -> dict:
    """``{"papers": n, "chunks": n, "errors": [...]}`` for a committed chunk run."""
    read_manifest(run_dir)
    root = storage.normalize(run_dir)
    errors: list[str] = []
    n_papers = n_chunks = 0
    for table in ("papers", "chunks"):
        if not storage.isdir(storage.join(root, table)):
            return {"papers": 0, "chunks": 0, "errors": [f"{run_dir} has no {table}/ table: not a chunk run"]}
    for name in storage.listdir(storage.join(root, "papers")):
        papers = storage.read_parquet(storage.join(root, "papers", name), columns=["paper_id", "markdown"])
        chunk_file = storage.join(root, "chunks", name)
        if papers.num_rows and not storage.exists(chunk_file):
            errors.append(f"{name}: papers without a chunks file")
            continue
        if not papers.num_rows:
            continue
        chunks = storage.read_parquet(
            chunk_file, columns=["paper_id", "chunk_index", "start", "end", "byte_start", "byte_end", "text"]
        ).to_pylist()
        by_paper: dict[str, list[dict]] = defaultdict(list)
        for row in chunks:
            by_paper[row["paper_id"]].append(row)
        for pid, text in zip(papers["paper_id"].to_pylist(), papers["markdown"].to_pylist(), strict=True):
            n_papers += 1
            rows = sorted(by_paper.pop(pid, []), key=lambda r: r["chunk_index"])
            n_chunks += len(rows)
            if text is None:
                continue  # run written without --store-text: nothing to check against
            try:
                verify_chunks(text, [Chunk(r["chunk_index"], r["start"], r["end"], r["text"], (), ()) for r in rows])
                for r in rows:
                    b0 = len(text[: r["start"]].encode("utf-8"))
                    if (r["byte_start"], r["byte_end"]) != (b0, b0 + len(r["text"].encode("utf-8"))):
                        raise ChunkInvariantError(f"chunk {r['chunk_index']}: byte offsets disagree")
            except ChunkInvariantError as exc:
                errors.append(f"{pid}: {exc}")
        for pid in by_paper:
            errors.append(f"{pid}: chunks without a paper row in {name}")
        if len(errors) >= max_errors:
            break
    return {"papers": n_papers, "chunks": n_chunks, "errors": errors[:max_errors]}
