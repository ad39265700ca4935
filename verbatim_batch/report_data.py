"""What a run report reads from run folders: a run's tables, error reasons, the chunk texts and paper titles of
the chunk run behind an extract or retrieve run, and a query file's queries and labels (``report``,
``report_sections``)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from . import storage
from .runs import read_manifest


def run_table(run_dir: str, name: str, columns: list[str] | None = None):
    """A table of the run (only the columns it has, of those asked for), or None."""
    path = storage.join(run_dir, name)
    if not storage.isdir(path):
        return None
    if columns is not None:
        have = set(storage.dataset(path).schema.names)
        columns = [c for c in columns if c in have]
    return storage.read_parquet(path, columns=columns)


def count_reasons(values: list[str | None]) -> dict[str, int]:
    return dict(Counter(v.split(":", 1)[0].split(" (", 1)[0] for v in values if v))


def chunks_run_of(manifest: dict[str, Any]) -> str | None:
    """The chunk run an extract or retrieve run's chunks come from (a retrieve run: through its index run)."""
    config = json.loads(manifest.get("config") or "{}")
    if config.get("chunks"):
        return config["chunks"]
    if config.get("index"):
        try:
            return json.loads(read_manifest(config["index"]).get("config") or "{}").get("chunks")
        except (OSError, ValueError):
            return None
    return None


def chunk_texts(config: dict[str, Any], pair_rows: list[dict[str, Any]]) -> dict[str, str]:
    """pair_id -> chunk text, from the pairs file or the chunk run the extraction read."""
    from .extract.pairs import chunk_lookup, pairs_from_records, read_pair_records

    if config.get("pairs") and storage.exists(config["pairs"]):
        table = pairs_from_records(read_pair_records(config["pairs"]))
        wanted = {p["pair_id"] for p in pair_rows}
        return {r["pair_id"]: r["chunk"] for r in table.to_pylist() if r["pair_id"] in wanted and r["chunk"]}
    chunks_run = config.get("chunks")
    if chunks_run and storage.isdir(storage.join(chunks_run, "chunks")):
        known = chunk_lookup(storage.join(chunks_run, "chunks"), [p["chunk_id"] for p in pair_rows])
        return {p["pair_id"]: known[p["chunk_id"]]["text"] for p in pair_rows if p["chunk_id"] in known}
    return {}


def paper_titles(chunks_run: str | None, paper_ids: set[str]) -> dict[str, str]:
    import pyarrow.dataset as pads

    papers = storage.join(chunks_run, "papers") if chunks_run else None
    if not papers or not paper_ids or not storage.isdir(papers):
        return {}
    table = storage.dataset(papers).to_table(columns=["paper_id", "title"],
                                             filter=pads.field("paper_id").isin(sorted(paper_ids)))
    return {p: t for p, t in zip(table["paper_id"].to_pylist(), table["title"].to_pylist(), strict=True) if t}


def query_file(path: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """``({query_id: query}, {query_id: labelled chunk_id})`` of a query file (ids as retrieve assigns them)."""
    from .records import iter_records
    from .tables import query_id_for

    texts: dict[str, str] = {}
    labels: dict[str, str] = {}
    if not path or not storage.exists(path):
        return texts, labels
    try:
        for rec in iter_records(path):
            q = rec.get("query")
            if "__error__" in rec or not isinstance(q, str):
                continue
            qid = str(rec["query_id"]) if rec.get("query_id") is not None else query_id_for(q)
            texts[qid] = q
            if isinstance(rec.get("chunk_id"), str):
                labels[qid] = rec["chunk_id"]
    except (OSError, ValueError):
        return {}, {}
    return texts, labels
