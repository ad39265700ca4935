"""The offline default extractor: sentence units scored against the query, in their paragraph.

Each chunk is cut into units (``sentences.units``) and paragraphs; non-body units (``sentences.NON_BODY``) are left
out unless ``keep_non_body``, and a run-in heading goes with the sentence it opens. A unit's score mixes its cosine
similarity to the query (``unit``), the share of the query's content words in it (``lexical``), its paragraph's
similarity (``paragraph``) and its and its neighbours' (``context``, which a long paragraph's vector dilutes). A
table row is evidence only when the query names something in its cells, and scores at least as its caption.

A pair whose best unit is under ``threshold`` abstains (its ``relevance`` is that best); else units from
``max(threshold - unit_slack, best - margin)`` are evidence, whole paragraphs by ``paragraph_fill`` or
``paragraph_select``, merged within ``merge_gap`` (never across a blank line), bounded by ``max_spans`` and
``max_share``. Defaults set on hand-labelled papers (docs/extraction.md#semantic-the-default-offline-cpu).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from verbatim_batch.core import limits, tables
from verbatim_batch.core.options import Declared, bounded, option, runtime, settings
from verbatim_batch.extract.kind import ExtractorKind
from verbatim_batch.extract.sentences import CAPTION, NON_BODY, RUN_IN, TABLE_ROW, Unit, units
from verbatim_batch.extract.spans import PairResult, Span, postprocess

SEMANTIC_VERSION = "3"  # 3: unit kinds, table rows the query names, bounds

_WORD = re.compile(r"[^\W_]+")
_STOP_WORDS = frozenset(
    """a an the of in on for to and or nor with by from at as is are be been being was were this that these those
    it its their there our we you they he she using use used uses based via vs versus than then into onto over
    under between about across what which how when where why who whom whose does do did done can could should
    would will may might must not no any all each per such other some more most less least only also very
    has have had having""".split()
)


_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*(?:\n|#)")  # a blank line, or a heading line between two units


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]  # plural: "spans" meets "span"
    return word[:5]


def _stems(text: str) -> set[str]:
    """Content words of a text, lower-cased, without a plural s, cut to their first five letters."""
    return {_stem(w) for w in _WORD.findall(text.casefold()) if len(w) > 1 and w not in _STOP_WORDS}


def lexical_overlap(query: str, units: Sequence[str]) -> np.ndarray:
    """For each unit, the share of the query's content words (``_stems``) it contains; 0 for a query without any."""
    terms = _stems(query)
    if not terms:
        return np.zeros(len(units), dtype=np.float32)
    return np.array([len(terms & _stems(u)) / len(terms) for u in units], dtype=np.float32)


def paragraph_ids(chunk: str, segments: Sequence[tuple[int, int]], kinds: Sequence[str] | None = None) -> np.ndarray:
    """Paragraph number of each unit: new after a blank or heading line; a heading unit is a paragraph of its own."""
    out = np.zeros(len(segments), dtype=np.int64)
    current = 0
    for i in range(1, len(segments)):
        if _PARAGRAPH_BREAK.search(chunk, segments[i - 1][1], segments[i][0]) or (
                kinds is not None and "heading" in (kinds[i - 1], kinds[i])):
            current += 1
        out[i] = current
    return out


def candidate_units(chunk: str, keep_non_body: bool = False) -> list[Unit]:
    """The units of a chunk the extractor scores: body units only (``sentences.NON_BODY`` left out), or all."""
    return [u for u in units(chunk) if keep_non_body or u.kind not in NON_BODY]


def context_windows(chunk: str, segments: Sequence[tuple[int, int]], paragraphs: np.ndarray) -> list[str]:
    """Each unit's text with its neighbours in its paragraph, if any."""
    out = []
    n = len(segments)
    for i in range(n):
        a = i - 1 if i > 0 and paragraphs[i - 1] == paragraphs[i] else i
        b = i + 1 if i + 1 < n and paragraphs[i + 1] == paragraphs[i] else i
        out.append(chunk[segments[a][0]:segments[b][1]])
    return out


def table_captions(kinds: Sequence[str]) -> np.ndarray:
    """For each table row, its table's caption unit (just before the first row or after the last; else -1)."""
    out = np.full(len(kinds), -1, dtype=np.int64)
    i = 0
    while i < len(kinds):
        if kinds[i] != TABLE_ROW:
            i += 1
            continue
        j = i
        while j + 1 < len(kinds) and kinds[j + 1] == TABLE_ROW:
            j += 1
        if i > 0 and kinds[i - 1] == CAPTION:
            out[i:j + 1] = i - 1
        elif j + 1 < len(kinds) and kinds[j + 1] == CAPTION:
            out[i:j + 1] = j + 1
        i = j + 1
    return out


def row_names_query(query_terms: set[str], row: str) -> bool:
    """Whether one of the query's content words (``_stems``) is in the row's own cells (not its caption's)."""
    return bool(query_terms & _stems(row))


@dataclass(frozen=True)
class SemanticConfig(Declared):
    """Settings of the semantic extractor (see the module docs)."""

    kind: ClassVar[str] = "semantic"

    model: str | None = option(None, "the extractor's model: hub id or local path; for an LLM, the name the "
                               "endpoint serves", default_help="semantic: the bundled all-MiniLM-L6-v2, highlighter: "
                               "KRLabsOrg/acl-verbatim-modernbert")
    threshold: float = option(0.50, "keep tokens / sentences scoring at least this", low=0, high=1)
    lexical_weight: float = 0.4  # weight of the query-word overlap in the score
    paragraph_weight: float = 0.2  # weight of the paragraph's similarity in the score
    context_weight: float = 0.3  # weight of the similarity of the unit with its neighbours in the paragraph
    unit_slack: float = bounded(0.05, low=0)  # units of an answering pair are kept from threshold - unit_slack
    # select a whole paragraph when this share of its characters is selected (1: never)
    paragraph_fill: float = bounded(0.5, low=0, low_open=True, high=1)
    paragraph_select: float = 0.75  # ... or when it holds a selected unit and its similarity reaches this (1: never)
    margin: float | None = option(0.18, "keep only sentences within this of the pair's best one (1: off)", low=0)
    min_chars: int = option(10, "drop spans shorter than this", low=0, high=limits.CHARS)
    merge_gap: int = option(20, "merge spans at most this many characters apart", low=0, high=limits.CHARS)
    max_spans: int = option(6, "at most this many spans per pair, the best ones (0: no limit)", low=0,
                            high=limits.PER_QUERY)
    max_share: float = option(1.0, "at most this share of a chunk's characters in one pair's spans, the best "
                              "units first (1: no limit)", low=0, high=1, low_open=True)
    query_margin: float = option(1.0, "pairs from retrieval (a rank per pair): a pair answers only when its best "
                                 "sentence is within this of the best across its query's retrieved chunks (1: off, "
                                 "each pair alone)", low=0, high=1)
    query_threshold: float = option(0.50, "pairs from retrieval: a query answers when the best sentence across its "
                                    "retrieved chunks reaches this (its best chunk may answer below --threshold)",
                                    low=0, high=1)
    query_max_spans: int = option(0, "pairs from retrieval: at most this many spans per query across its retrieved "
                                  "chunks, the best ones (0: no limit)", low=0, high=limits.PER_QUERY)
    rank_weight: float = 0.0  # pairs from retrieval: a pair's best counts this much less per retrieval rank below 1
    keep_non_body: bool = option(False, "also take evidence from reference lists, tables of contents, author, "
                                 "affiliation and e-mail lines and bare headings (off: body text only)")
    row_gate: bool = True  # a table row is evidence only when the query names something in its own cells
    max_units: int = 2_000  # units per chunk; a pair beyond this is an error row
    device: str = runtime("auto")
    token_budget: int = option(16384, "padded tokens per forward pass", low=1, high=limits.TOKENS, runtime=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        weights = (self.lexical_weight, self.paragraph_weight, self.context_weight)
        if min(weights) < 0 or sum(weights) > 1 + 1e-9:
            raise ValueError("lexical_weight, paragraph_weight and context_weight must be >= 0 and sum to at most 1")

    def embedder_config(self):
        from verbatim_batch.retrieval.embedder import EmbedderConfig

        kw = {"device": self.device, "token_budget": self.token_budget}
        return EmbedderConfig(model=self.model, **kw) if self.model else EmbedderConfig(**kw)

    @property
    def hash(self) -> str:
        d = settings(self)
        d.pop("model")  # the embedder's hash below stands for it
        if not judges_queries(self):  # selection per query off: its settings change nothing (earlier runs carry)
            for k in ("query_margin", "query_threshold", "query_max_spans", "rank_weight"):
                d.pop(k)
        d["embedder"] = self.embedder_config().hash
        return tables.config_hash({"semantic_version": SEMANTIC_VERSION, **d})


@dataclass
class UnitScores:
    """The signals of one pair's units (see the module docs)."""

    segments: list[tuple[int, int]]
    paragraphs: np.ndarray  # paragraph number of each unit
    unit: np.ndarray  # cosine similarity of unit and query
    lexical: np.ndarray  # share of query words in the unit
    paragraph: np.ndarray  # cosine similarity of the unit's paragraph and the query
    kinds: tuple[str, ...] | None = None  # each unit's kind (``sentences.UNIT_KINDS``); None: all prose
    eligible: np.ndarray | None = None  # units that may be evidence (a table row the query names nothing of: not)
    context: np.ndarray | None = None  # cosine similarity of the unit with its neighbours and the query
    caption: np.ndarray | None = None  # a table row's caption unit (-1: none); a row the query names scores as it

    def combined(self, config: SemanticConfig) -> np.ndarray:
        wl, wp, wc = config.lexical_weight, config.paragraph_weight, config.context_weight
        context = self.context if self.context is not None else self.unit
        return ((1.0 - wl - wp - wc) * self.unit + wl * self.lexical + wp * self.paragraph
                + wc * context).astype(np.float32)


def _bounded(selected: np.ndarray, score: np.ndarray, lengths: np.ndarray, budget: float) -> np.ndarray:
    """The selected units, best score first, while their characters fit ``budget`` (the best one always)."""
    keep = np.zeros_like(selected)
    used = 0
    for i in np.argsort(-score, kind="stable"):
        if not selected[i]:
            continue
        if keep.any() and used + lengths[i] > budget:
            continue
        keep[i] = True
        used += int(lengths[i])
    return keep


def _unit_evidence(scores: UnitScores, config: SemanticConfig) -> tuple[np.ndarray, np.ndarray]:
    """Each unit's combined score (a named table row raised to its caption's) and whether it may be evidence."""
    score = scores.combined(config)
    eligible = np.ones(len(score), dtype=bool)
    if config.row_gate and scores.eligible is not None:
        eligible = scores.eligible
        if scores.caption is not None:  # a row the query names is as good evidence as its table's caption
            rows = np.flatnonzero((scores.caption >= 0) & eligible)
            score[rows] = np.maximum(score[rows], score[scores.caption[rows]])
    return score, eligible


def pair_best(scores: UnitScores, config: SemanticConfig) -> float:
    """A pair's best unit score (its ``relevance``): 0 when no unit may be evidence."""
    if not scores.segments:
        return 0.0
    score, eligible = _unit_evidence(scores, config)
    return float(score[eligible].max()) if eligible.any() else 0.0


def judges_queries(config: SemanticConfig) -> bool:
    """Whether ``config`` judges a query's retrieved pairs together (``select_query``)."""
    return config.query_margin < 1.0 or config.query_max_spans > 0


def select_query(scores: Sequence[UnitScores], chunks: Sequence[str], ranks: Sequence[int],
                 config: SemanticConfig, threshold: float | None = None) -> list[PairResult]:
    """One query's retrieved pairs judged together (``query_margin`` < 1, else each alone): a pair answers when its
    best (less ``rank_weight`` per rank below 1) reaches ``query_threshold`` and is within ``query_margin`` of the
    query's best, then selects as ``select_spans``; ``threshold`` (a sweep) moves both cuts alike."""
    if config.query_margin >= 1.0:
        return _query_bound([select_spans(s, c, config, threshold) for s, c in zip(scores, chunks, strict=True)],
                            config.query_max_spans)
    qt = config.query_threshold if threshold is None else config.query_threshold + threshold - config.threshold
    bests = [pair_best(s, config) for s in scores]
    adjusted = [b - config.rank_weight * max(0, (r or 1) - 1) for b, r in zip(bests, ranks, strict=True)]
    top = max(adjusted, default=0.0)
    out = []
    for s, c, b, a in zip(scores, chunks, bests, adjusted, strict=True):
        if top < qt or b < qt or a < top - config.query_margin:
            out.append(PairResult([], b))
        else:
            out.append(select_spans(s, c, config, min(b, config.threshold if threshold is None else threshold)))
    return _query_bound(out, config.query_max_spans)


def _query_bound(results: list[PairResult], limit: int) -> list[PairResult]:
    """At most ``limit`` spans over a query's pairs, the best scoring ones (0: all)."""
    ranked = sorted(((-sp.score, i, j) for i, r in enumerate(results) for j, sp in enumerate(r.spans)))
    if not limit or len(ranked) <= limit:
        return results
    keep = {(i, j) for _, i, j in ranked[:limit]}
    return [dataclasses.replace(r, spans=[sp for j, sp in enumerate(r.spans) if (i, j) in keep])
            for i, r in enumerate(results)]


def select_spans(scores: UnitScores, chunk: str, config: SemanticConfig, threshold: float | None = None) -> PairResult:
    """A pair's spans from its unit signals under ``config`` (``threshold`` overrides the configured one)."""
    if not scores.segments:
        return PairResult([], 0.0)
    t = config.threshold if threshold is None else threshold
    score, eligible = _unit_evidence(scores, config)
    if not eligible.any():
        return PairResult([], 0.0)
    best = float(score[eligible].max())
    if best < t:
        return PairResult([], best)  # abstain
    floor = t - config.unit_slack
    cut = floor if config.margin is None else max(floor, best - config.margin)
    selected = (score >= cut) & eligible
    lengths = np.array([e - s for s, e in scores.segments], dtype=np.int64)
    if selected.any() and (config.paragraph_fill < 1.0 or config.paragraph_select < 1.0):
        for p in np.unique(scores.paragraphs[selected]):
            members = scores.paragraphs == p
            if (lengths[members & selected].sum() >= config.paragraph_fill * lengths[members].sum()
                    or float(scores.paragraph[members][0]) >= config.paragraph_select):
                selected |= members & eligible
    if selected.any() and config.max_share < 1.0:
        selected = _bounded(selected, score, lengths, config.max_share * len(chunk))
    if scores.kinds is not None:  # a run-in heading goes with the sentence it opens, never alone
        for i in range(len(selected) - 1):
            if (scores.kinds[i] == RUN_IN and selected[i + 1] and not selected[i]
                    and scores.paragraphs[i] == scores.paragraphs[i + 1]):
                selected[i] = True
    spans: list[Span] = []
    for p in np.unique(scores.paragraphs[selected]):
        kept = [Span(s, e, float(v)) for (s, e), v, k, q in
                zip(scores.segments, score, selected, scores.paragraphs == p, strict=True) if k and q]
        spans.extend(postprocess(kept, config.min_chars, config.merge_gap, chunk))
    if config.max_spans and len(spans) > config.max_spans:
        best_spans = sorted(range(len(spans)), key=lambda i: (-spans[i].score, i))[:config.max_spans]
        spans = [spans[i] for i in sorted(best_spans)]
    return PairResult(spans, best)


_DESCRIBED = ("threshold", "margin", "lexical_weight", "paragraph_weight", "context_weight", "unit_slack",
              "paragraph_fill", "paragraph_select", "max_spans", "max_share", "keep_non_body")


class SemanticExtractor:
    """Sentence-level extraction with a sentence embedder (see the module docs)."""

    name = "semantic"

    def __init__(self, config: SemanticConfig | None = None, embedder=None) -> None:
        from verbatim_batch.retrieval.embedder import Embedder

        self.config = config = config or SemanticConfig()
        self.embedder = embedder or Embedder(config.embedder_config())
        self.stats: dict[str, Any] = dict(pairs=0, units=0, unique_units=0)
        self._embedding_units = False  # the unit texts' embedding (most of a call's time) is under way

    @property
    def live_fraction(self) -> float | None:
        """How much of the current call's unit texts has been embedded; None outside that (the rest is short)."""
        return self.embedder.live_fraction if self._embedding_units else None

    def describe(self) -> dict[str, Any]:
        info = self.embedder.describe()
        return {"extractor": self.name, "model_id": info["model_id"], "model_revision": info["model_revision"],
                "config_hash": self.config.hash, "device": info["device"],
                **{k: getattr(self.config, k) for k in _DESCRIBED}}

    def unit_scores(self, queries: Sequence[str], chunks: Sequence[str]) -> list[UnitScores | str]:
        """Per pair, the chunk's units and their signals (or an error string); each distinct text embedded once."""
        cands = [candidate_units(c, self.config.keep_non_body) for c in chunks]
        units = [[(u.start, u.end) for u in us] for us in cands]
        kinds = [tuple(u.kind for u in us) for us in cands]
        paras = [paragraph_ids(c, segs, ks) for c, segs, ks in zip(chunks, units, kinds, strict=True)]
        para_text: list[list[str]] = []
        windows: list[list[str]] = []
        for c, segs, pid in zip(chunks, units, paras, strict=True):
            first = {int(p): i for i, p in reversed(list(enumerate(pid)))}
            last = {int(p): i for i, p in enumerate(pid)}
            para_text.append([c[segs[first[p]][0]:segs[last[p]][1]] for p in sorted(first)])
            windows.append(context_windows(c, segs, pid) if self.config.context_weight > 0 else [])
        q_text = sorted(set(queries))
        d_text = sorted({c[s:e] for c, segs in zip(chunks, units, strict=True) for s, e in segs}
                        | {t for ts in para_text for t in ts} | {t for ws in windows for t in ws})
        q_vec = dict(zip(q_text, self.embedder.embed(q_text, is_query=True)[0], strict=True)) if q_text else {}
        self.embedder.live_done, self.embedder.live_total = 0, len(d_text)  # not the queries' call, just ended
        self._embedding_units = True
        try:
            d_vec = dict(zip(d_text, self.embedder.embed(d_text)[0], strict=True)) if d_text else {}
        finally:
            self._embedding_units = False
        out: list[Any] = []
        for q, c, us, segs, ks, pid, ptexts, wins in zip(queries, chunks, cands, units, kinds, paras, para_text,
                                                          windows, strict=True):
            if len(segs) > self.config.max_units:
                out.append(f"too_many_units: {len(segs)} sentences > {self.config.max_units}")
                continue
            if not segs:
                z = np.zeros(0, dtype=np.float32)
                out.append(UnitScores(segs, np.zeros(0, dtype=np.int64), z, z, z, ks, np.zeros(0, dtype=bool)))
                continue
            texts = [c[s:e] for s, e in segs]
            unit = np.stack([d_vec[t] for t in texts]) @ q_vec[q]
            para = (np.stack([d_vec[t] for t in ptexts]) @ q_vec[q])[pid]
            terms = _stems(q)
            eligible = np.array([u.kind != RUN_IN and (u.kind != TABLE_ROW or row_names_query(terms, t))
                                 for u, t in zip(us, texts, strict=True)], dtype=bool)
            context = (np.stack([d_vec[t] for t in wins]) @ q_vec[q]).astype(np.float32) if wins else None
            out.append(UnitScores(segs, pid, unit.astype(np.float32), lexical_overlap(q, texts),
                                  para.astype(np.float32), ks, eligible, context, table_captions(ks)))
        self.stats["pairs"] += len(queries)
        self.stats["units"] += sum(len(s) for s in units)
        self.stats["unique_units"] += len(d_text)
        return out

    def spans_from_scores(self, scores: UnitScores, chunk: str, threshold: float | None = None) -> PairResult:
        return select_spans(scores, chunk, self.config, threshold)

    groups_queries = True  # ``extract`` takes each pair's query id and retrieval rank (``gate.PairExtractor``)

    def sweep(self, queries: Sequence[str], chunks: Sequence[str], thresholds: Sequence[float],
              query_ids: Sequence[str] | None = None,
              ranks: Sequence[int | None] | None = None) -> dict[float, list[PairResult]]:
        scored = self.unit_scores(queries, chunks)
        return {t: self.select(scored, chunks, t, query_ids, ranks) for t in thresholds}

    def select(self, scored: Sequence[UnitScores | str], chunks: Sequence[str], threshold: float | None = None,
               query_ids: Sequence[str] | None = None,
               ranks: Sequence[int | None] | None = None) -> list[PairResult]:
        """Each pair's result: pairs with a rank judged with their query's (``select_query``), the others alone."""
        out: list[PairResult | None] = [PairResult([], None, s) if isinstance(s, str) else None for s in scored]
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(scored):
            if out[i] is not None:
                continue
            if query_ids is None or ranks is None or ranks[i] is None or not judges_queries(self.config):
                out[i] = select_spans(s, chunks[i], self.config, threshold)
            else:
                groups.setdefault(query_ids[i], []).append(i)
        for members in groups.values():
            got = select_query([scored[i] for i in members], [chunks[i] for i in members],
                               [ranks[i] for i in members], self.config, threshold)
            for i, r in zip(members, got, strict=True):
                out[i] = r
        return out  # type: ignore[return-value]

    def extract(self, queries: Sequence[str], chunks: Sequence[str], query_ids: Sequence[str] | None = None,
                ranks: Sequence[int | None] | None = None) -> list[PairResult]:
        """One result per pair; with ``query_ids`` and ``ranks``, each query's pairs are judged together."""
        return self.select(self.unit_scores(queries, chunks), chunks, None, query_ids, ranks)


def _fingerprint(config: SemanticConfig) -> str:
    from verbatim_batch.retrieval.embedder import embedder_fingerprint

    return embedder_fingerprint(config.embedder_config())


EXTRACTOR = ExtractorKind("semantic", SemanticConfig, build=lambda config: SemanticExtractor(config),
                          fingerprint=_fingerprint)
