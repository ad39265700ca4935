"""Training data for the highlighter: (question, chunk, spans) pairs, labelled windows, packed batches.

Inputs (``read_pairs``): a silver run (its ``train.parquet`` and ``dev.parquet`` for the ``eval`` split), or any
Parquet or JSONL with ``question`` (or ``query``), ``chunk`` and ``spans`` (``{start, end}`` or ``[start, end]``
offsets into ``chunk``; empty: an irrelevant pair). A row without a question or chunk, or with a span outside it,
is skipped and counted by reason. Windows are cut and labelled by ``silver.tokenized_windows``, the tokenizer call
the highlighter makes at inference (span tokens 1, other context 0, question and special tokens -100);
``pack_batches`` groups them into batches, one row each, so every Ray Train worker gets as many.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from verbatim_batch.core import storage, tables
from verbatim_batch.silver.dataset import LABEL_IGNORE, tokenized_windows

TRAIN_PAIRS_SCHEMA, TRAIN_BATCHES_SCHEMA = tables.TRAIN_PAIRS, tables.TRAIN_BATCHES

SKIP_REASONS = ("invalid_record", "missing_question", "missing_chunk", "bad_spans")
SILVER_SPLITS = {"train": "train.parquet", "eval": "dev.parquet"}


def silver_data_dir(path: str) -> str | None:
    """The silver ``data`` run at ``path`` (the run itself or the silver job folder), or None."""
    from verbatim_batch.core.runs import read_manifest

    for loc in (storage.join(path, "data"), path):  # a silver job folder holds its data run in data/
        try:
            if read_manifest(loc).get("command") in ("silver-data", "silver"):
                return loc
        except (FileNotFoundError, NotADirectoryError, ValueError):
            continue
    return None


def _input_files(path: str) -> list[tuple[str, str]]:
    """(format, location) of every Parquet / JSONL file at ``path`` (a file or a folder, searched recursively)."""
    def fmt(name: str) -> str | None:
        jsonl = name.endswith((".jsonl", ".json", ".jsonl.gz"))
        return "parquet" if name.endswith(".parquet") else "jsonl" if jsonl else None

    if storage.isfile(path):
        kind = fmt(path)
        if kind is None:
            raise ValueError(f"{path}: not a .parquet or .jsonl file")
        return [(kind, path)]
    if not storage.isdir(path):
        raise FileNotFoundError(f"training data not found: {path}")
    files = [(k, storage.join(path, rel)) for rel in sorted(storage.walk_files(path))
             if not any(p.startswith((".", "_")) for p in rel.split("/")) and (k := fmt(rel))]
    if not files:
        raise FileNotFoundError(f"{path}: no .parquet or .jsonl files")
    return files


def _raw_rows(path: str) -> Iterable[Mapping[str, Any] | None]:
    """Rows of every input file; None for a JSON line that does not parse (counted as skipped)."""
    for kind, loc in _input_files(path):
        if kind == "parquet":
            yield from storage.read_parquet(loc).to_pylist()
            continue
        for line in storage.read_text(loc).splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                yield None
                continue
            yield row if isinstance(row, dict) else None


def _spans(value: Any, n: int) -> list[dict[str, int]] | None:
    """Spans as sorted ``{start, end}`` dicts, or None when one is malformed or outside ``[0, n]``."""
    out = []
    for s in value or []:
        try:
            start, end = (s["start"], s["end"]) if isinstance(s, Mapping) else s
            start, end = int(start), int(end)
        except (KeyError, TypeError, ValueError):
            return None
        if not 0 <= start < end <= n:
            return None
        out.append({"start": start, "end": end})
    return sorted(out, key=lambda s: (s["start"], s["end"]))


def normalize_rows(rows: Iterable[Mapping[str, Any] | None]) -> tuple[pa.Table, dict[str, int]]:
    """Input rows as a ``TRAIN_PAIRS_SCHEMA`` table, and how many were skipped for each reason."""
    out: list[dict[str, Any]] = []
    skipped = Counter(dict.fromkeys(SKIP_REASONS, 0))
    for row in rows:
        if row is None:
            skipped["invalid_record"] += 1
            continue
        question = row.get("question") if row.get("question") is not None else row.get("query")
        chunk = row.get("chunk")
        if not isinstance(question, str) or not question.strip():
            skipped["missing_question"] += 1
            continue
        if not isinstance(chunk, str) or not chunk.strip():
            skipped["missing_chunk"] += 1
            continue
        spans = _spans(row.get("spans"), len(chunk))
        if spans is None:
            skipped["bad_spans"] += 1
            continue
        qid = row.get("query_id")
        cid = row.get("chunk_id")
        out.append({
            "pair_index": len(out),
            "query_id": str(qid) if qid is not None else "q-" + tables.stable_hash("question", question),
            "chunk_id": str(cid) if cid is not None else tables.text_chunk_id(chunk),
            "question": question, "chunk": chunk, "spans": spans,
        })
    return pa.Table.from_pylist(out, schema=TRAIN_PAIRS_SCHEMA), dict(skipped)


def read_pairs(path: str, split: str) -> tuple[pa.Table, dict[str, Any]]:
    """The pairs of ``path`` for ``split`` (``train`` or ``eval``: a silver run's ``train``/``dev.parquet``, any other
    path whole) and where they came from."""
    if split not in SILVER_SPLITS:
        raise ValueError(f"split must be train or eval, got {split!r}")
    loc = storage.normalize(path)
    silver = silver_data_dir(loc)
    source = storage.join(silver, SILVER_SPLITS[split]) if silver else loc
    table, skipped = normalize_rows(_raw_rows(source))
    return table, {"path": source, "silver_run": silver, "rows": table.num_rows,
                   "skipped": skipped, "sha256": table_hash(table)}


def table_hash(table: pa.Table) -> str:
    """A content hash of a pairs table (question, chunk and spans of every row, in order)."""
    import hashlib

    h = hashlib.sha256()
    for row in table.select(["question", "chunk", "spans"]).to_pylist():
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def windows(pairs: pa.Table, tokenizer: Any, max_length: int, stride: int,
            stats: dict[str, int] | None = None) -> pa.Table:
    """Labelled windows of every pair (``silver.SILVER_WINDOWS_SCHEMA``), cut as the highlighter cuts them."""
    return tokenized_windows(pairs.to_pylist(), tokenizer, max_length, stride, stats=stats)


def pack_batches(windows_table: pa.Table, *, batch_size: int | None = 8, batch_tokens: int | None = None,
                 seed: int = 0) -> pa.Table:
    """Windows grouped into batches, one ``TRAIN_BATCHES_SCHEMA`` row each, in a seeded random order: ``batch_size``
    windows each, or by length so that ``windows * longest <= batch_tokens`` (a longer window alone)."""
    from verbatim_batch.retrieval.embedder import plan_batches

    n = windows_table.num_rows
    ids = windows_table.column("input_ids").to_pylist()
    labels = windows_table.column("labels").to_pylist()
    rng = np.random.default_rng(seed)
    if batch_tokens:
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
        groups = plan_batches(lengths, int(batch_tokens), max_batch_rows=4096)
        groups = [groups[i] for i in rng.permutation(len(groups))]
    else:
        if not batch_size or batch_size <= 0:
            raise ValueError("batch_size must be positive (or give batch_tokens)")
        order = rng.permutation(n)
        groups = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    rows = [{"batch": b, "n_tokens": int(sum(len(ids[i]) for i in g)), "input_ids": [ids[i] for i in g],
             "labels": [labels[i] for i in g]} for b, g in enumerate(groups)]
    return pa.Table.from_pylist(rows, schema=TRAIN_BATCHES_SCHEMA)


def collate(input_ids: list[list[int]], labels: list[list[int]], pad_token_id: int) -> dict[str, Any]:
    """One packed batch as padded tensors (right padding; padded labels are ignored)."""
    import torch

    width = max(len(x) for x in input_ids)
    ids = np.full((len(input_ids), width), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(input_ids), width), dtype=np.int64)
    lab = np.full((len(input_ids), width), LABEL_IGNORE, dtype=np.int64)
    for r, (x, y) in enumerate(zip(input_ids, labels, strict=True)):
        ids[r, : len(x)] = x
        mask[r, : len(x)] = 1
        lab[r, : len(y)] = y
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(lab)}
