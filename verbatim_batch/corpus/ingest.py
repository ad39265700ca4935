"""The ingest stage: raw records -> papers, chunks and quarantine tables.

``IngestStage`` is a plain callable over an Arrow batch of ``RAW_RECORDS``, the same with or without Ray: every
input row becomes a paper (with its chunks) or a quarantine row with a reason; one bad paper never affects another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pyarrow as pa

from verbatim_batch.core import tables
from verbatim_batch.core.tables import CHUNKS, PAPERS, QUARANTINE, QuarantineReason, chunk_id, stable_hash
from verbatim_batch.corpus import readers as corpus
from verbatim_batch.corpus.chunker import ChunkerConfig, build_context, chunk_markdown, first_heading, verify_chunks
from verbatim_batch.corpus.metadata import load_metadata

DEFAULT_MAX_PAPER_MB = 16.0  # papers larger than this are quarantined (ChunkJob.max_paper_mb)
DEFAULT_MAX_PAPER_BYTES = int(DEFAULT_MAX_PAPER_MB * 1024 * 1024)

# Papers an incremental run found unchanged (internal: the chunk job replaces them with the earlier rows).
UNCHANGED = tables.UNCHANGED_PAPERS
METADATA_FIELDS = ("title", "authors", "year", "venue", "url", "language")


def paper_fingerprint(sha256: str, metadata: tuple) -> str:
    """What a paper's chunks and embeddings depend on: its normalised text and its metadata."""
    return stable_hash(sha256, json.dumps(list(metadata), sort_keys=True, default=str))


@dataclass
class IngestStage:
    """Decode, validate, normalise and chunk a batch of papers."""

    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    metadata_uri: str | None = None
    duplicates: dict[str, str] = field(default_factory=dict)  # paper_id -> source that wins
    store_text: bool = True
    # paper_id -> paper_fingerprint of an earlier run: a paper that still matches is not chunked again
    # but listed in the "unchanged" table, for the job to carry its earlier rows
    unchanged: dict[str, str] = field(default_factory=dict)
    # paper_id -> sha256 of the source bytes that earlier run recorded: a paper whose bytes changed is chunked again
    # even when its text normalises to the same (LF -> CRLF), so its row records its bytes as a run from scratch does
    source_sha256: dict[str, str] = field(default_factory=dict)

    def __call__(self, batch: pa.Table) -> dict[str, pa.Table]:
        meta = load_metadata(self.metadata_uri) if self.metadata_uri else {}
        cfg_hash = self.chunker.hash
        label = corpus.normalization_label(self.chunker.normalization)
        papers = {name: [] for name in PAPERS.names}
        chunks = {name: [] for name in CHUNKS.names}
        bad = {name: [] for name in QUARANTINE.names}
        same = {name: [] for name in UNCHANGED.names}

        def quarantine(pid, source, reason_detail, n_bytes, raw):
            reason, _, detail = reason_detail.partition(": ")
            for key, value in (
                ("paper_id", pid), ("source", source), ("stage", "ingest"), ("reason", reason),
                ("detail", detail), ("n_bytes", n_bytes),
                ("raw_sha256", hashlib.sha256(raw).hexdigest() if raw is not None else None),
            ):
                bad[key].append(value)

        # an empty block may come without columns
        cols = batch.to_pydict() if batch.num_rows else {name: [] for name in tables.RAW_RECORDS.names}
        for pid, source, raw, n_bytes, error in zip(
            cols["paper_id"], cols["source"], cols["raw"], cols["n_bytes"], cols["error"], strict=True
        ):
            if error:
                quarantine(pid, source, error, n_bytes, raw)
                continue
            pid, bad_id = corpus.paper_id_of(pid)  # readers give strings; anything else is set aside
            if bad_id:
                quarantine(None, source, bad_id, n_bytes, raw)
                continue
            pid = pid.strip() if pid is not None else None
            if not pid:
                quarantine(None, source, f"{QuarantineReason.MISSING_ID}: no paper id", n_bytes, raw)
                continue
            winner = self.duplicates.get(pid)
            if winner is not None and winner != source:
                quarantine(pid, source, f"{QuarantineReason.DUPLICATE_ID}: id also at {winner}, which is kept",
                           n_bytes, raw)
                continue
            text, problem = corpus.decode_paper(raw)
            if problem:
                quarantine(pid, source, problem, n_bytes, raw)
                continue
            raw_sha = hashlib.sha256(raw).hexdigest()
            if self.unchanged and pid in self.unchanged and self.source_sha256.get(pid, raw_sha) == raw_sha:
                try:
                    norm = corpus.normalize_text(text, self.chunker.normalization)
                    meta_row = meta.get(pid, (None,) * 6)
                    fp = paper_fingerprint(hashlib.sha256(norm.encode("utf-8")).hexdigest(),
                                           (meta_row[0] or first_heading(norm), *meta_row[1:]))
                except Exception:  # noqa: BLE001 - the full path below quarantines it with a reason
                    fp = None
                if fp == self.unchanged[pid]:
                    same["paper_id"].append(pid)
                    same["source"].append(source)
                    continue
            try:
                text = corpus.normalize_text(text, self.chunker.normalization)
                paper_chunks = chunk_markdown(text, self.chunker)
                verify_chunks(text, paper_chunks)
            except Exception as exc:  # a bug must cost one paper, not the job
                quarantine(pid, source, f"{QuarantineReason.CHUNKER_ERROR}: {type(exc).__name__}: {exc}",
                           n_bytes, raw)
                continue
            if not paper_chunks:
                quarantine(pid, source, f"{QuarantineReason.EMPTY}: no visible text after normalisation",
                           n_bytes, raw)
                continue
            encoded = text.encode("utf-8")
            sha = hashlib.sha256(encoded).hexdigest()
            title, authors, year, venue, url, language = meta.get(pid, (None,) * 6)
            title = title or first_heading(text)
            paper_flags = sorted({f for c in paper_chunks for f in c.flags if f in ("unclosed_fence",)}
                                 | ({"crlf"} if "\r\n" in text else set()))
            for key, value in (
                ("paper_id", pid), ("source", source), ("source_sha256", raw_sha),
                ("sha256", sha), ("n_bytes", len(encoded)),
                ("n_chars", len(text)), ("n_chunks", len(paper_chunks)), ("title", title),
                ("authors", authors), ("year", year), ("venue", venue), ("url", url),
                ("language", language), ("normalization", label), ("flags", paper_flags),
                ("chunker_config_hash", cfg_hash), ("markdown", text if self.store_text else None),
            ):
                papers[key].append(value)
            self._add_chunks(chunks, pid, text, paper_chunks, title, sha, label, cfg_hash)
        return {
            "papers": pa.Table.from_pydict(papers, schema=PAPERS),
            "chunks": pa.Table.from_pydict(chunks, schema=CHUNKS),
            "quarantine": pa.Table.from_pydict(bad, schema=QUARANTINE),
            "unchanged": pa.Table.from_pydict(same, schema=UNCHANGED),
        }

    @staticmethod
    def _add_chunks(out, pid, text, paper_chunks, title, sha, label, cfg_hash) -> None:
        n = len(paper_chunks)
        texts = [c.text for c in paper_chunks]
        starts = [c.start for c in paper_chunks]
        ends = [c.end for c in paper_chunks]
        if text.isascii():
            encoded = texts
            b_starts, b_ends = starts, ends
        else:  # UTF-8 positions: walk the gaps and chunks once
            encoded = [t.encode("utf-8") for t in texts]
            b_starts, b_ends = [], []
            byte_pos, char_pos = 0, 0
            for c, enc in zip(paper_chunks, encoded, strict=True):
                byte_pos += len(text[char_pos : c.start].encode("utf-8"))
                b_starts.append(byte_pos)
                byte_pos += len(enc)
                b_ends.append(byte_pos)
                char_pos = c.end
        seen: dict[str, int] = {}
        ids = []
        for t, enc in zip(texts, encoded, strict=True):
            occurrence = seen.get(t, 0)
            seen[t] = occurrence + 1
            ids.append(chunk_id(pid, enc, cfg_hash, occurrence))
        contexts: dict[tuple[str, ...], str] = {}
        for c in paper_chunks:
            if c.heading_path not in contexts:
                contexts[c.heading_path] = build_context(title, c.heading_path)
        out["chunk_id"] += ids
        out["paper_id"] += [pid] * n
        out["chunk_index"] += range(n)
        out["start"] += starts
        out["end"] += ends
        out["byte_start"] += b_starts
        out["byte_end"] += b_ends
        out["text"] += texts
        out["context"] += [contexts[c.heading_path] for c in paper_chunks]
        out["heading_path"] += [list(c.heading_path) for c in paper_chunks]
        out["n_chars"] += [len(t) for t in texts]
        out["flags"] += [list(c.flags) for c in paper_chunks]
        out["paper_sha256"] += [sha] * n
        out["normalization"] += [label] * n
        out["chunker_config_hash"] += [cfg_hash] * n
