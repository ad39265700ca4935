"""What a run report reads: a run's tables, error reasons, chunk texts and paper titles, a query file's queries."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.runs import read_manifest

TEXT_CHARS = 1_200  # a text column as a report reads it (a page shows less: report_html.FIELD_CHARS)


def run_table(run_dir: str, name: str, columns: list[str] | None = None, cut: int | None = None):
    """A table of the run (the asked-for columns it has), or None; ``cut``: text columns cut to that many characters
    as they are scanned (a 1 MB query on every row is never held whole)."""
    path = storage.join(run_dir, name)
    if not storage.isdir(path):
        return None
    if columns is not None or cut is not None:
        schema = storage.dataset(path).schema
        columns = [c for c in (columns if columns is not None else schema.names) if c in schema.names]
    if cut is None:
        return storage.read_parquet(path, columns=columns)
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = {f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}
    return storage.dataset(path).to_table(columns={
        c: pc.utf8_slice_codeunits(pc.field(c), 0, cut) if c in texts else pc.field(c) for c in columns})


MAX_REASONS = 50  # distinct reasons a report lists (the rest summed as "other reasons")
REASON_CHARS = 80


def count_reasons(values: list[str | None]) -> dict[str, int]:
    """Rows per reason (an error's text up to its first ``:`` or `` (``), the most frequent ``MAX_REASONS``,
    each cut at ``REASON_CHARS``: bounded whatever the errors say."""
    counts = Counter(str(v).split(":", 1)[0].split(" (", 1)[0][:REASON_CHARS] for v in values if v)
    top = dict(counts.most_common(MAX_REASONS))
    if len(counts) > MAX_REASONS:
        top["other reasons"] = sum(counts.values()) - sum(top.values())
    return top


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
    from verbatim_batch.extract.pairs import chunk_lookup, pairs_from_records, read_pair_records

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
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    papers = storage.join(chunks_run, "papers") if chunks_run else None
    if not papers or not paper_ids or not storage.isdir(papers):
        return {}
    table = storage.dataset(papers).to_table(  # titles cut as they are read: a 5 MB title is never held whole
        columns={"paper_id": pads.field("paper_id"), "title": pc.utf8_slice_codeunits(pads.field("title"), 0,
                                                                                      TEXT_CHARS)},
        filter=pads.field("paper_id").isin(sorted(paper_ids)))
    return {p: t for p, t in zip(table["paper_id"].to_pylist(), table["title"].to_pylist(), strict=True) if t}


def query_file(path: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """``({query_id: query}, {query_id: labelled chunk_id})`` of a query file (ids as retrieve assigns them, in
    the file's order); each query cut at ``TEXT_CHARS`` (its id is of the whole text)."""
    from verbatim_batch.core.records import iter_records
    from verbatim_batch.core.tables import query_id_for

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
            texts.setdefault(qid, q[:TEXT_CHARS])
            if isinstance(rec.get("chunk_id"), str):
                labels[qid] = rec["chunk_id"]
    except (OSError, ValueError):
        return {}, {}
    return texts, labels
