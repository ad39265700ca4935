"""The ingest stage: raw records -> papers, chunks and quarantine tables.

``IngestStage`` is a plain callable over an Arrow batch of raw records (see
``tables.RAW_RECORDS``); it runs the same with or without Ray. Every input row
ends up either as a paper (with its chunks) or as a quarantine row with a
reason; nothing is dropped and one bad paper never affects another.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pyarrow as pa

from . import corpus
from .chunking import ChunkerConfig, build_context, chunk_markdown, first_heading, verify_chunks
from .tables import CHUNKS, PAPERS, QUARANTINE, QuarantineReason, chunk_id

DEFAULT_MAX_PAPER_BYTES = 16 * 1024 * 1024


@dataclass
class IngestStage:
    """Decode, validate, normalise and chunk a batch of papers."""

    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    metadata_uri: str | None = None
    duplicates: dict[str, str] = field(default_factory=dict)  # paper_id -> source that wins
    store_text: bool = True

    def __call__(self, batch: pa.Table) -> dict[str, pa.Table]:
        meta = corpus.load_metadata(self.metadata_uri) if self.metadata_uri else {}
        cfg_hash = self.chunker.hash
        label = corpus.normalization_label(self.chunker.normalization)
        papers = {name: [] for name in PAPERS.names}
        chunks = {name: [] for name in CHUNKS.names}
        bad = {name: [] for name in QUARANTINE.names}

        def quarantine(pid, source, reason_detail, n_bytes, raw):
            reason, _, detail = reason_detail.partition(": ")
            for key, value in (
                ("paper_id", pid), ("source", source), ("stage", "ingest"), ("reason", reason),
                ("detail", detail), ("n_bytes", n_bytes),
                ("raw_sha256", hashlib.sha256(raw).hexdigest() if raw is not None else None),
            ):
                bad[key].append(value)

        cols = batch.to_pydict()
        for pid, source, raw, n_bytes, error in zip(
            cols["paper_id"], cols["source"], cols["raw"], cols["n_bytes"], cols["error"], strict=True
        ):
            if error:
                quarantine(pid, source, error, n_bytes, raw)
                continue
            pid = pid.strip() if isinstance(pid, str) else pid
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
                ("paper_id", pid), ("source", source), ("sha256", sha), ("n_bytes", len(encoded)),
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
        }

    @staticmethod
    def _add_chunks(out, pid, text, paper_chunks, title, sha, label, cfg_hash) -> None:
        seen: dict[str, int] = {}
        ascii_text = text.isascii()
        byte_pos, char_pos = 0, 0
        for c in paper_chunks:
            if ascii_text:
                b_start, b_end = c.start, c.end
            else:
                byte_pos += len(text[char_pos : c.start].encode("utf-8"))
                b_start = byte_pos
                byte_pos += len(c.text.encode("utf-8"))
                b_end, char_pos = byte_pos, c.end
            occurrence = seen.get(c.text, 0)
            seen[c.text] = occurrence + 1
            for key, value in (
                ("chunk_id", chunk_id(pid, c.text, cfg_hash, occurrence)), ("paper_id", pid),
                ("chunk_index", c.index), ("start", c.start), ("end", c.end), ("byte_start", b_start),
                ("byte_end", b_end), ("text", c.text), ("context", build_context(title, c.heading_path)),
                ("heading_path", list(c.heading_path)), ("n_chars", len(c.text)), ("flags", list(c.flags)),
                ("paper_sha256", sha), ("normalization", label), ("chunker_config_hash", cfg_hash),
            ):
                out[key].append(value)
