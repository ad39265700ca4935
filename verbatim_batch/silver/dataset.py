"""Silver training data for the highlighter, built from an LLM teacher's span annotations.

Pure functions over row dicts (no Ray), one row per (query, chunk) pair the teacher saw::

    {"query_id", "question", "paper_id", "chunk_id", "chunk", "source": "gold" | "retrieved",
     "rank": int | None, "spans": [{"start", "end", "text"}], "heading_path": [str], "teacher_model"}

``filter_rows`` removes pairs that would teach the student the wrong thing (deep retrieval
hits, tiny or huge annotations, reference lists, citation- or year-heavy spans);
``split_by_query`` makes a train/dev split that never puts one query on both sides;
``canonical_table`` and ``tokenized_windows`` turn rows into the two tables that
``write_silver`` stores as Parquet files readable by ``datasets.load_dataset("parquet", ...)``.

Windows are tokenised exactly as the highlighter tokenises at inference time: the pair
(question, chunk), ``truncation="only_second"``, overlapping windows of ``max_length``
tokens sharing ``stride`` tokens. A context token is labelled 1 when its character range
overlaps a span by at least one character, 0 otherwise; query, special tokens get -100.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from verbatim_batch.core import storage, tables
from verbatim_batch.corpus import markdown as md
from verbatim_batch.extract.highlighter_spans import default_query_tokens, window_problem

# --- thresholds --------------------------------------------------------------------------------------------
# A retrieved pair deeper than this rank is dropped: the teacher rarely finds real evidence there, and the
# spans it does return on such pairs are mostly loosely related sentences.
MAX_RANK = 3
# Total words over a row's spans. Below 6 words a span is a fragment ("in Table 3") rather than evidence;
# above 220 words (about a full paragraph and a half) the teacher has copied the chunk rather than selected.
MIN_WORDS = 6
MAX_WORDS = 220
# Citation markers per span word ("[3, 5]" counts 2, "(Lee, 2019; Wu, 2020)" counts 2). Evidence in methods and
# results cites now and then (about 0.05: "we use BM25 [30] ... fine-tuned from BERT (Devlin et al., 2019)");
# related-work enumerations cite every 3-8 words (0.13-0.4). A row is dropped above 0.1 *and* with at least
# MIN_CITATIONS markers, so a single citation in a short span never trips it.
CITATION_DENSITY = 0.1
MIN_CITATIONS = 3
# Years (1900-2039) per span word, markdown table rows left out. Prose mentions a year or two (under 0.05);
# author-year related work, citation strings the marker patterns miss ("Smith 2020; Lee 2019") and dataset
# timelines have one every 4-8 words (0.13-0.25). Same structure: above 0.1 and at least MIN_YEARS years.
YEAR_DENSITY = 0.1
MIN_YEARS = 3
# A text is a reference list when entries that look like bibliography entries (non-empty lines, with runs of
# "[n]" entries that a PDF converter merged into one line split apart again) hold more than this share of its words.
REFERENCE_LINE_SHARE = 0.5
# A bibliography entry is short: longer lines are prose (or several entries merged, see _entries).
MAX_ENTRY_WORDS = 90
# Share of "prose words" (pronouns, auxiliaries, connectives) at or above which a line is prose, not an entry.
# Reference entries sit at 0-0.06 (titles only); running text at 0.10-0.25.
PROSE_WORD_RATE = 0.09
# The same rate over a whole text for the fallback that judges a text without splitting it into entries.
BIBLIOGRAPHY_PROSE_RATE = 0.035

DROP_REASONS = (
    "no_spans_in_references", "rank", "too_few_words", "too_many_words", "references", "citation_dense",
    "year_dense",
)
REFERENCE_HEADINGS = ("references", "bibliography", "works cited", "literature cited", "reference list")
# A whole heading (numbering and markup removed) that names a bibliography: "References", "7 REFERENCES",
# "Selected References", "References and Notes"; not a title that merely contains the word.
_REFERENCE_HEADING = re.compile(
    rf"(?:selected |cited |select )?(?:{'|'.join(REFERENCE_HEADINGS)})(?: and notes| cited)?"
)
LABEL_IGNORE = -100
SILVER_SCHEMA, SILVER_WINDOWS_SCHEMA = tables.SILVER, tables.SILVER_WINDOWS

# --- text signals ------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\S+")
_YEAR = re.compile(r"(?<![\w.])(?<!\d,)(?:19\d\d|20[0-3]\d)[a-z]?(?![\w])(?![.,]\d)")
_NUM_ITEM = r"\d{1,4}(?:\s*[-–—]\s*\d{1,4})?"
_NUM_CITE = re.compile(rf"\[\s*({_NUM_ITEM}(?:\s*[,;]\s*{_NUM_ITEM})*)\s*\]")
_ALPHA_ITEM = r"[A-Z][A-Za-z+]{1,6}\s?\d{2}[a-z]?"
_ALPHA_CITE = re.compile(rf"\[({_ALPHA_ITEM}(?:\s*[,;]\s*{_ALPHA_ITEM})*)\]")
_PAREN = re.compile(r"\(([^()]{4,400})\)")
_NAME = r"[A-Z][\w'’\-]+"
_PAREN_ITEM = re.compile(rf"{_NAME}[^;]{{0,80}}?(?<![\w.])(?:19\d\d|20[0-3]\d)[a-z]?\b")
_NARRATIVE = re.compile(
    rf"\b{_NAME}(?:\s+(?:et\s+al\.?|(?:and|&)\s+{_NAME}))?\s*\((?:19\d\d|20[0-3]\d)[a-z]?(?:[,;]\s*[^()]{{0,30}})?\)"
)

_BULLET = re.compile(r"^[-*+•]\s+")
_LABEL = re.compile(r"^(?:\[\d{1,4}\]|\[[A-Z][A-Za-z+]{1,6}\d{2}[a-z]?\]|\(\d{1,4}\)|\d{1,4}\.(?=\s))\s*")
_AUTHOR_START = re.compile(
    rf"^(?:{_NAME},\s+(?:[A-Z]\.\s?-?)+"  # Smith, J.   Smith, J. K.
    rf"|(?:[A-Z]\.\s?-?)+\s*{_NAME}"  # J. Smith   J.-P. Dupont
    rf"|{_NAME}\s+(?:[A-Z]\.\s?)*{_NAME}(?:,|\s+and\b|\s+et\s+al|\.\s)"  # John Smith, ...   John A. Smith and
    rf"|{_NAME},\s+{_NAME}(?:\s+[A-Z]\.)?(?:,|\s+and\b|\.)"  # Smith, John,
    rf"|{_NAME}\s+[A-Z]{{1,3}}(?:,|\s)"  # Smith JK,  (Vancouver)
    rf"|{_NAME}\s+et\s+al\.)"
)
_VENUE = re.compile(
    r"\b(?:In\s+Proc|Proceedings|Proc\.|Conference|Conf\.|Symposium|Workshop|Journal|J\.|Trans\.|Transactions|"
    r"arXiv|preprint|CoRR|abs/|Press|Springer|Elsevier|IEEE|ACM|ACL|NAACL|EMNLP|EACL|COLING|TACL|NeurIPS|NIPS|"
    r"ICML|ICLR|AAAI|IJCAI|SIGIR|CIKM|WSDM|KDD|WWW|CVPR|ICCV|ECCV|Nature|Science|Letters|Review|Advances\s+in|"
    r"volume|vol\.|pages|pp\.|doi|https?://|Technical\s+report|Ph\.?D\.?\s+thesis|Retrieved|URL)\b",
)
_PAGES = re.compile(r"\b\d{1,6}\s*[-–—]{1,2}\s*\d{1,6}\b|\b\d{1,4}\s*\(\d{1,4}\)|:\d{1,6}\b")
_PROSE_WORDS = frozenset(
    """we our us i is are was were be been being this that these those which it its they their them can
    could would should may might will has have had do does did not but however thus therefore hence since
    because while also than when where whereas here there such both each our further""".split()
)
_PROSE_RE = re.compile(rf"(?<![\w'’-])(?:{'|'.join(sorted(_PROSE_WORDS))})(?![\w'’-])")
_HEADING_NUMBER = re.compile(r"^(?:[A-Z]\.|[IVXLC]+\.?|\d+(?:\.\d+)*\.?)\s+")
_MERGED_ENTRY = re.compile(r"\s+(?=\[\d{1,4}\]\s+[A-Z])")
_ENTRY_START = re.compile(r"^\[\d{1,4}\]\s")


def count_words(text: str) -> int:
    """Whitespace-separated tokens that contain at least one letter or digit."""
    return sum(1 for t in _TOKEN.findall(text) if any(c.isalnum() for c in t))


def count_years(text: str) -> int:
    """Four-digit numbers that read as years (1900-2039, an optional letter suffix as in "2020a")."""
    return len(_YEAR.findall(text))


def count_citations(text: str) -> int:
    """Citation markers: "[12]", "[3, 5-7]" (one per item), "[Smi20]", "(Smith et al., 2020; Lee, 2019)"
    (one per cited work) and narrative "Smith and Lee (2020)"."""
    n = 0
    for m in _NUM_CITE.finditer(text):
        items = re.split(r"\s*[,;]\s*", m.group(1))
        if any(re.fullmatch(r"0+", i) for i in items):  # "[0, 1]" is an interval, not a citation
            continue
        n += len(items)
    for m in _ALPHA_CITE.finditer(text):
        n += len(re.split(r"\s*[,;]\s*", m.group(1)))
    for m in _PAREN.finditer(text):
        n += sum(1 for part in m.group(1).split(";") if _PAREN_ITEM.search(part.strip()))
    n += len(_NARRATIVE.findall(text))
    return n


def _prose_rate(text: str) -> float:
    """Share of whitespace tokens that are prose words."""
    n = len(text.split())
    return len(_PROSE_RE.findall(text.lower())) / n if n else 0.0


def is_reference_heading(heading: str) -> bool:
    """A heading that opens a bibliography ("References", "7 REFERENCES", "**Works Cited**", ...)."""
    h = heading.strip().strip("#*_ ").strip()
    h = " ".join(_HEADING_NUMBER.sub("", h).strip(" .:").lower().split())
    return bool(_REFERENCE_HEADING.fullmatch(h))


def looks_like_reference_entry(line: str) -> bool:
    """Whether one line reads as a bibliography entry: authors (or an entry label), a year, venue or pages,
    no running prose."""
    text = _BULLET.sub("", line.strip())
    words = text.split()
    if len(words) < 4 or len(words) > MAX_ENTRY_WORDS:
        return False
    label = _LABEL.match(text)
    body = text[label.end():] if label else text
    authors = bool(_AUTHOR_START.match(body))
    if not (label or authors):
        return False
    year = bool(_YEAR.search(body))
    venue = bool(_VENUE.search(body))
    pages = bool(_PAGES.search(body))
    punct = (body.count(",") + body.count(".")) / max(1, len(words))
    if _prose_rate(text) >= PROSE_WORD_RATE:
        return False
    evidence = int(bool(label)) + int(authors) + int(venue) + int(pages) + int(punct >= 0.3)
    return (year and evidence >= 2) or evidence >= 4


def _split_merged(entry: str) -> list[str]:
    """Split "[1] ... [2] ... [3] ..." (entries a converter ran together) into one entry each."""
    if _ENTRY_START.match(entry) and _MERGED_ENTRY.search(entry):
        return [p for p in _MERGED_ENTRY.split(entry) if p.strip()]
    return [entry]


def _headings(text: str) -> tuple[md.Scan, dict[int, tuple[int, str]]]:
    """``text`` scanned, and its headings by line: (level, title) of its markdown headings and of its bold lines
    (``**References**``, level 7) of up to six words."""
    scan = md.scan(text)
    bold = {i: (7, b.group(1)) for i, (line, kind) in enumerate(zip(scan.lines, scan.kinds, strict=True))
            if kind == md.TEXT and (b := md.BOLD_HEADING.match(line)) and len(line.split()) <= 6}
    return scan, dict(sorted({**scan.headings, **bold}.items()))


def _entries(text: str, by: str = "line") -> list[str]:
    """Candidate bibliography entries of ``text``, headings left out: one per non-empty line (``by="line"``) or
    one per blank-line-separated paragraph with its lines joined (``by="paragraph"``, for hard-wrapped entries)."""
    scan, headings = _headings(text)
    lines = ["" if i in headings else ln.strip() for i, ln in enumerate(scan.lines)]
    if by == "line":
        blocks = [ln for ln in lines if ln]
    else:
        blocks, current = [], []
        for ln in lines + [""]:
            if ln:
                current.append(ln)
            elif current:
                blocks.append(" ".join(current))
                current = []
    return [e for b in blocks for e in _split_merged(b)]


def _reads_as_bibliography(text: str) -> bool:
    """Whole-text fallback for entries that no line split recovers: several years, venue or page markers for
    most of them, and almost no prose words."""
    n_words = len(text.split())
    if n_words < 40:
        return False
    n_years = count_years(text)
    if n_years < 3 or n_years / n_words < 0.02 or _prose_rate(text) > BIBLIOGRAPHY_PROSE_RATE:
        return False
    return len(_VENUE.findall(text)) + len(_PAGES.findall(text)) >= n_years / 2


@functools.lru_cache(maxsize=1024)  # a chunk comes back once per query that retrieved it
def looks_like_reference_list(text: str) -> bool:
    """Whether ``text`` reads as a bibliography: lines (or paragraphs, for hard-wrapped entries) that look like
    entries hold more than ``REFERENCE_LINE_SHARE`` of its words, or the text as a whole reads as one.

    Shares are by words, not lines, so that a few short entries under a long paragraph of prose do not
    outvote it."""
    for by in ("line", "paragraph"):
        entries = _entries(text, by)
        sizes = [len(e.split()) for e in entries]
        cited = sum(n for e, n in zip(entries, sizes, strict=True) if looks_like_reference_entry(e))
        if entries and cited / sum(sizes) > REFERENCE_LINE_SHARE:
            return True
    return _reads_as_bibliography(text)


def _reference_regions(chunk: str) -> list[tuple[int, int]]:
    """Character ranges of ``chunk`` under a references heading (a bold one of at most four words), up to the
    next heading of the same or a higher level (or the chunk's end)."""
    regions: list[tuple[int, int]] = []
    open_at: tuple[int, int] | None = None  # (start, level)
    scan, headings = _headings(chunk)
    for i, (level, title) in headings.items():
        if level == 7 and len(title.split()) > 4:
            continue
        pos = scan.starts[i]
        if open_at is not None and level <= open_at[1]:
            regions.append((open_at[0], pos))
            open_at = None
        if open_at is None and is_reference_heading(title):
            open_at = (pos, level)
    if open_at is not None:
        regions.append((open_at[0], len(chunk)))
    return regions


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value)


def _spans_of(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(s) for s in _as_list(row.get("spans"))]


def chunk_is_references(row: Mapping[str, Any]) -> bool:
    """The row's chunk belongs to a bibliography: by its heading path or by its text."""
    if any(is_reference_heading(str(h)) for h in _as_list(row.get("heading_path"))):
        return True
    return looks_like_reference_list(row.get("chunk") or "")


def _spans_in_references(row: Mapping[str, Any], spans: Sequence[Mapping[str, Any]]) -> bool:
    regions = _reference_regions(row.get("chunk") or "")
    for s in spans:
        start = int(s["start"])
        if any(a <= start < b for a, b in regions):
            return True
        if looks_like_reference_list(str(s["text"])):
            return True
    return False


def drop_reason(row: Mapping[str, Any], *, max_rank: int = MAX_RANK, min_words: int = MIN_WORDS,
                max_words: int = MAX_WORDS, citation_density: float = CITATION_DENSITY,
                year_density: float = YEAR_DENSITY, rank_applies_to_gold: bool = False) -> str | None:
    """Why ``filter_rows`` drops this row (a ``DROP_REASONS`` value), or None when it is kept."""
    spans = _spans_of(row)
    if not spans:
        return "no_spans_in_references" if chunk_is_references(row) else None
    rank = row.get("rank")
    if rank is not None and int(rank) > max_rank and (rank_applies_to_gold or row.get("source") != "gold"):
        return "rank"
    text = "\n".join(str(s["text"]) for s in spans)
    n_words = count_words(text)
    if n_words < min_words:
        return "too_few_words"
    if n_words > max_words:
        return "too_many_words"
    if chunk_is_references(row) or _spans_in_references(row, spans):
        return "references"
    n_cites = count_citations(text)
    if n_cites >= MIN_CITATIONS and n_cites / n_words > citation_density:
        return "citation_dense"
    scan = md.scan(text)  # table rows left out: their cells hold years
    prose = "\n".join(ln for ln, kind in zip(scan.lines, scan.kinds, strict=True) if kind != md.TABLE)
    n_years = count_years(prose)
    if n_years >= MIN_YEARS and n_years / max(1, count_words(prose)) > year_density:
        return "year_dense"
    return None


def filter_rows(rows: Iterable[Mapping[str, Any]], *, max_rank: int = MAX_RANK, min_words: int = MIN_WORDS,
                max_words: int = MAX_WORDS, citation_density: float = CITATION_DENSITY,
                year_density: float = YEAR_DENSITY,
                rank_applies_to_gold: bool = False) -> tuple[list[Mapping[str, Any]], dict[str, int]]:
    """Rows worth training on, and how many were dropped for each reason (every reason listed, zeros too).

    Rows without spans are negatives, kept unless their chunk is part of a bibliography. Rows with spans are
    dropped for a retrieval rank above ``max_rank``, a total span word count outside ``[min_words, max_words]``,
    a bibliography chunk or span, or citation-/year-dense spans (checked in that order; a row counts once).
    A row without a rank is never dropped for rank, and neither is a gold row (the chunk the query was
    written from) unless ``rank_applies_to_gold``: its spans are evidence wherever retrieval put it.
    """
    kept: list[Mapping[str, Any]] = []
    dropped = dict.fromkeys(DROP_REASONS, 0)
    for row in rows:
        reason = drop_reason(row, max_rank=max_rank, min_words=min_words, max_words=max_words,
                             citation_density=citation_density, year_density=year_density,
                             rank_applies_to_gold=rank_applies_to_gold)
        if reason is None:
            kept.append(row)
        else:
            dropped[reason] += 1
    return kept, dropped


# --- split ------------------------------------------------------------------------------------------------


def dev_score(query_id: str, seed: int = 0) -> float:
    """A query's position in [0, 1): a stable hash of (seed, query id)."""
    return int(tables.stable_hash("silver-split", str(seed), str(query_id), size=8), 16) / 2.0**64


def split_by_query(rows: Iterable[Mapping[str, Any]], dev_fraction: float = 0.1,
                   seed: int = 0) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(train, dev): a query goes to dev when its ``dev_score`` is below ``dev_fraction``.

    Each query is decided by its id and the seed alone, so the split does not depend on row order or on
    which other queries are present, and all rows of a query land on the same side. Rows keep their order.
    """
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction must be in [0, 1], got {dev_fraction}")
    train: list[Mapping[str, Any]] = []
    dev: list[Mapping[str, Any]] = []
    decided: dict[str, bool] = {}
    for row in rows:
        qid = str(row["query_id"])
        if qid not in decided:
            decided[qid] = dev_score(qid, seed) < dev_fraction
        (dev if decided[qid] else train).append(row)
    return train, dev


# --- tables ---------------------------------------------------------------------------------------------


def _checked_spans(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row's spans as sorted {start, end, text} dicts; offsets must index the chunk exactly."""
    chunk = row.get("chunk") or ""
    out = []
    for s in _spans_of(row):
        start, end = int(s["start"]), int(s["end"])
        text = s.get("text")
        if not 0 <= start < end <= len(chunk):
            raise ValueError(f"span [{start}, {end}) outside chunk {row.get('chunk_id')!r} ({len(chunk)} chars)")
        if text is None:
            text = chunk[start:end]
        elif chunk[start:end] != text:
            raise ValueError(f"span [{start}, {end}) of chunk {row.get('chunk_id')!r} does not match its text")
        out.append({"start": start, "end": end, "text": str(text)})
    out.sort(key=lambda s: (s["start"], s["end"]))
    return out


def canonical_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows as a ``SILVER_SCHEMA`` table (extra row keys such as heading_path are left out)."""
    out = []
    for row in rows:
        spans = _checked_spans(row)
        rank = row.get("rank")
        out.append({
            "question": row["question"], "paper_id": row.get("paper_id"), "chunk_id": row.get("chunk_id"),
            "chunk": row.get("chunk") or "", "label": 1 if spans else 0, "spans": spans,
            "source": row.get("source") or "retrieved", "rank": None if rank is None else int(rank),
            "teacher_model": row.get("teacher_model"), "query_id": str(row["query_id"]),
        })
    return pa.Table.from_pylist(out, schema=SILVER_SCHEMA)


def _merged_intervals(spans: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint (starts, ends) covering the spans."""
    pairs = sorted((int(s["start"]), int(s["end"])) for s in spans if int(s["end"]) > int(s["start"]))
    starts: list[int] = []
    ends: list[int] = []
    for a, b in pairs:
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def window_labels(offsets: np.ndarray, sequence_ids: Sequence[int | None], starts: np.ndarray,
                  ends: np.ndarray) -> np.ndarray:
    """Labels of one window: 1 for context tokens overlapping an interval by a character, 0 for other
    context tokens, -100 elsewhere. ``starts``/``ends`` are sorted disjoint intervals."""
    seq = np.fromiter((-1 if s is None else s for s in sequence_ids), dtype=np.int64, count=len(sequence_ids))
    labels = np.full(len(seq), LABEL_IGNORE, dtype=np.int8)
    context = seq == 1
    labels[context] = 0
    if len(starts) and context.any():
        tok_s, tok_e = offsets[:, 0], offsets[:, 1]
        idx = np.searchsorted(ends, tok_s, side="right")  # first interval ending after the token starts
        hit = idx < len(starts)
        hit[hit] = starts[idx[hit]] < tok_e[hit]
        labels[context & hit & (tok_e > tok_s)] = 1
    return labels


def _list_array(chunks: list[np.ndarray], dtype: pa.DataType) -> pa.Array:
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int32, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(chunks) if chunks else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, dtype))


def _window_batch(rows: Sequence[Mapping[str, Any]], enc: Any) -> pa.RecordBatch:
    """One tokenizer call's windows, labelled, as a record batch."""
    intervals = [_merged_intervals(_spans_of(r)) for r in rows]
    query_ids, chunk_ids, window_no, ids_list, labels_list = [], [], [], [], []
    seen = [0] * len(rows)
    for w, owner in enumerate(enc["overflow_to_sample_mapping"]):
        offsets = np.asarray(enc["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
        ids_list.append(np.asarray(enc["input_ids"][w], dtype=np.int32))
        labels_list.append(window_labels(offsets, enc.sequence_ids(w), *intervals[owner]))
        query_ids.append(str(rows[owner]["query_id"]))
        chunk_ids.append(rows[owner].get("chunk_id"))
        window_no.append(seen[owner])
        seen[owner] += 1
    return pa.RecordBatch.from_arrays([
        pa.array(query_ids, pa.string()),
        pa.array(chunk_ids, pa.string()),
        pa.array(window_no, pa.int32()),
        _list_array(ids_list, pa.int32()),
        _list_array([np.ones(len(i), dtype=np.int8) for i in ids_list], pa.int8()),  # windows are unpadded
        _list_array(labels_list, pa.int8()),
    ], schema=SILVER_WINDOWS_SCHEMA)


def tokenized_windows(rows: Iterable[Mapping[str, Any]], tokenizer: Any, max_length: int = 8192, stride: int = 256,
                      *, max_query_tokens: int | None = None, batch_size: int = 256,
                      stats: dict[str, int] | None = None) -> pa.Table:
    """Token windows of each (question, chunk) pair with per-token labels, as a ``SILVER_WINDOWS_SCHEMA`` table.

    Pairs whose question is longer than ``max_query_tokens`` (default ``min(512, max_length // 4)``, as in the
    highlighter) are skipped; ``stats`` (when given) receives ``pairs``, ``windows`` and ``skipped_long_query``.
    Rows are tokenised ``batch_size`` at a time, one table chunk per batch.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("a fast tokenizer (with offsets) is required")
    if problem := window_problem(max_length, stride, max_query_tokens):
        raise ValueError(problem)
    if max_query_tokens is None:
        max_query_tokens = default_query_tokens(max_length)
    counts = stats if stats is not None else {}
    for key in ("pairs", "windows", "skipped_long_query"):
        counts.setdefault(key, 0)
    batches: list[pa.RecordBatch] = []
    rows = list(rows)
    for b in range(0, len(rows), batch_size):
        batch = rows[b:b + batch_size]
        q_lens = [len(ids) for ids in tokenizer([r["question"] for r in batch], add_special_tokens=False)["input_ids"]]
        ok = [r for r, n in zip(batch, q_lens, strict=True) if n <= max_query_tokens]
        counts["skipped_long_query"] += len(batch) - len(ok)
        if not ok:
            continue
        enc = tokenizer([r["question"] for r in ok], [r.get("chunk") or "" for r in ok], truncation="only_second",
                        max_length=max_length, stride=stride, return_overflowing_tokens=True,
                        return_offsets_mapping=True, padding=False)
        batches.append(_window_batch(ok, enc))
        counts["pairs"] += len(ok)
        counts["windows"] += batches[-1].num_rows
    return pa.Table.from_batches(batches, schema=SILVER_WINDOWS_SCHEMA)


def _write_parquet(table: pa.Table, path: str) -> None:
    """Write one Parquet file (local or a URI); an empty table gets no row group at all, which ``datasets``
    reads as zero rows (a zero-row row group makes it fail)."""
    if table.num_rows:
        storage.write_parquet(table, path, compression="snappy")
    else:
        fs, local = storage.resolve(path)
        pq.ParquetWriter(local, table.schema, filesystem=fs).close()


def _as_canonical(data: pa.Table | Iterable[Mapping[str, Any]]) -> pa.Table:
    if isinstance(data, pa.Table):
        return data.select(SILVER_SCHEMA.names).cast(SILVER_SCHEMA)
    return canonical_table(data)


def write_silver(out_dir: str | Path, train: pa.Table | Iterable[Mapping[str, Any]],
                 dev: pa.Table | Iterable[Mapping[str, Any]], tokenizer: Any = None, *, max_length: int = 8192,
                 stride: int = 256, max_query_tokens: int | None = None) -> dict[str, int]:
    """Write ``train.parquet``/``dev.parquet`` (``SILVER_SCHEMA``) and, with a tokenizer,
    ``windows/train.parquet``/``windows/dev.parquet`` (``SILVER_WINDOWS_SCHEMA``); returns row counts.

    ``datasets.load_dataset("parquet", data_files={"train": ..., "dev": ...})`` loads either pair of files;
    an empty split is still written (a valid zero-row file) but ``datasets`` refuses to load empty splits.
    """
    out = storage.normalize(str(out_dir))
    storage.makedirs(out)
    counts: dict[str, int] = {}
    for split, data in (("train", train), ("dev", dev)):
        table = _as_canonical(data)
        _write_parquet(table, storage.join(out, f"{split}.parquet"))
        labels = table.column("label").to_numpy(zero_copy_only=False)
        counts[f"{split}_rows"] = table.num_rows
        counts[f"{split}_positive"] = int((labels == 1).sum())
        counts[f"{split}_queries"] = len(set(table.column("query_id").to_pylist()))
        if tokenizer is not None:
            stats: dict[str, int] = {}
            windows = tokenized_windows(table.to_pylist(), tokenizer, max_length, stride,
                                        max_query_tokens=max_query_tokens, stats=stats)
            storage.makedirs(storage.join(out, "windows"))
            _write_parquet(windows, storage.join(out, "windows", f"{split}.parquet"))
            counts[f"{split}_windows"] = windows.num_rows
            counts[f"{split}_skipped_long_query"] = stats["skipped_long_query"]
    return counts
