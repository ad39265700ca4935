"""The offline default extractor: sentence units scored against the query, in their paragraph.

Each chunk is cut into sentence units (``sentences.sentence_segments``: prose sentences, table
rows, list items, captions, code blocks) and the units into paragraphs (units that no blank line
separates). A unit's score mixes three signals, each in [0, 1] or a cosine similarity:

* ``unit``: cosine similarity of the unit and the query under the sentence embedder (the
  bundled all-MiniLM-L6-v2 by default);
* ``lexical``: the share of the query's content words that occur in the unit (lower-cased,
  stop words left out, a plural s dropped, words compared on their first five letters, so
  "extraction" meets "extracted" and "spans" meets "span"). Queries are keyword searches,
  and the words they name are strong evidence;
* ``paragraph``: cosine similarity of the unit's whole paragraph and the query, so a sentence
  is read in its context (a table row in its table, a short sentence in its argument).

``score = (1 - lexical_weight - paragraph_weight) * unit + lexical_weight * lexical
+ paragraph_weight * paragraph``. Units scoring at least ``threshold`` are evidence. When
selected units make up at least ``paragraph_fill`` of a paragraph's characters, the whole
paragraph is selected (readers mark passages, not isolated sentences). Selected units of one
paragraph merge when at most ``merge_gap`` characters apart; spans never cross a blank line.
A pair whose best unit scores below ``threshold`` gets no span: that is the abstention, and the
pair's ``relevance`` is its best unit's score. An optional ``margin`` keeps only units within
that distance of the best one (off by default: it halves recall on real text).

The defaults were set on hand-labelled real papers (``../shared/devsets``, both annotation
styles; ``benchmarks/bench_offline_extractor.py``, BENCHMARKS.md "Offline extractor on real
text"), with leave-one-paper-out cross-validation. It needs no GPU and no download, which makes
it the default for the demo and for CPU runs. It selects whole sentence units, never part of
one, unlike the token-level highlighter (see the README for how they compare).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from .. import tables
from ..options import option
from .registry import ExtractorKind
from .sentences import sentence_segments
from .spans import PairResult, Span, postprocess

SEMANTIC_VERSION = "2"  # 2: lexical and paragraph signals, paragraph fill, defaults from real text

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


def paragraph_ids(chunk: str, segments: Sequence[tuple[int, int]]) -> np.ndarray:
    """Paragraph number of each unit: a new paragraph starts after a blank line (or a skipped heading line)."""
    out = np.zeros(len(segments), dtype=np.int64)
    current = 0
    for i in range(1, len(segments)):
        if _PARAGRAPH_BREAK.search(chunk, segments[i - 1][1], segments[i][0]):
            current += 1
        out[i] = current
    return out


@dataclass(frozen=True)
class SemanticConfig:
    """Settings of the semantic extractor (see the module docs; README, "Extractors", for where each came from)."""

    kind: ClassVar[str] = "semantic"

    model: str | None = option(None, "the extractor's model: hub id or local path; for an LLM, the name the "
                               "endpoint serves", default_help="semantic: the bundled all-MiniLM-L6-v2, highlighter: "
                               "KRLabsOrg/acl-verbatim-modernbert")
    threshold: float = option(0.50, "keep tokens / sentences scoring at least this", low=0, high=1)
    lexical_weight: float = 0.3  # weight of the query-word overlap in the score
    paragraph_weight: float = 0.4  # weight of the paragraph's similarity in the score
    paragraph_fill: float = 0.5  # select a whole paragraph when this share of its characters is selected (1: never)
    margin: float | None = option(None, "keep only sentences within this of the best one", low=0,
                                  default_help="off")
    min_chars: int = option(10, "drop spans shorter than this", low=0)
    merge_gap: int = option(20, "merge spans at most this many characters apart", low=0)
    max_units: int = 2_000  # units per chunk; a pair beyond this is an error row
    device: str = "auto"
    token_budget: int = option(16384, "padded tokens per forward pass", low=1)

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be a score in [-1, 1], got {self.threshold}")
        if self.margin is not None and self.margin < 0:
            raise ValueError("margin must be >= 0")
        if self.min_chars < 0 or self.merge_gap < 0:
            raise ValueError("min_chars and merge_gap must be >= 0")
        if self.lexical_weight < 0 or self.paragraph_weight < 0 or self.lexical_weight + self.paragraph_weight > 1:
            raise ValueError("lexical_weight and paragraph_weight must be >= 0 and sum to at most 1")
        if not 0.0 < self.paragraph_fill <= 1.0:
            raise ValueError(f"paragraph_fill must be in (0, 1], got {self.paragraph_fill}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def embedder_config(self):
        from ..embed import EmbedderConfig

        kw = {"device": self.device, "token_budget": self.token_budget}
        return EmbedderConfig(model=self.model, **kw) if self.model else EmbedderConfig(**kw)

    @property
    def hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in ("device", "token_budget", "model")}
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

    def combined(self, config: SemanticConfig) -> np.ndarray:
        wl, wp = config.lexical_weight, config.paragraph_weight
        return ((1.0 - wl - wp) * self.unit + wl * self.lexical + wp * self.paragraph).astype(np.float32)


def select_spans(scores: UnitScores, chunk: str, config: SemanticConfig, threshold: float | None = None) -> PairResult:
    """A pair's spans from its unit signals under ``config`` (``threshold`` overrides the configured one)."""
    if not scores.segments:
        return PairResult([], 0.0)
    t = config.threshold if threshold is None else threshold
    score = scores.combined(config)
    best = float(score.max())
    cut = t if config.margin is None else max(t, best - config.margin)
    selected = score >= cut
    if selected.any() and config.paragraph_fill < 1.0:
        lengths = np.array([e - s for s, e in scores.segments], dtype=np.int64)
        for p in np.unique(scores.paragraphs[selected]):
            members = scores.paragraphs == p
            if lengths[members & selected].sum() >= config.paragraph_fill * lengths[members].sum():
                selected |= members
    spans: list[Span] = []
    for p in np.unique(scores.paragraphs[selected]):
        kept = [Span(s, e, float(v)) for (s, e), v, k, q in
                zip(scores.segments, score, selected, scores.paragraphs == p, strict=True) if k and q]
        spans.extend(postprocess(kept, config.min_chars, config.merge_gap, chunk))
    return PairResult(spans, best)


class SemanticExtractor:
    """Sentence-level extraction with a sentence embedder (see the module docs)."""

    name = "semantic"

    def __init__(self, config: SemanticConfig | None = None, embedder=None) -> None:
        from ..embed import Embedder

        self.config = config = config or SemanticConfig()
        self.embedder = embedder or Embedder(config.embedder_config())
        self.stats: dict[str, Any] = dict(pairs=0, units=0, unique_units=0)

    def describe(self) -> dict[str, Any]:
        info = self.embedder.describe()
        c = self.config
        return {"extractor": self.name, "model_id": info["model_id"], "model_revision": info["model_revision"],
                "config_hash": c.hash, "device": info["device"], "threshold": c.threshold, "margin": c.margin,
                "lexical_weight": c.lexical_weight, "paragraph_weight": c.paragraph_weight,
                "paragraph_fill": c.paragraph_fill}

    def unit_scores(self, queries: Sequence[str], chunks: Sequence[str]) -> list[UnitScores | str]:
        """Per pair, the chunk's units and their signals (or an error string).

        Each distinct query, unit and paragraph text is embedded once per call, however many pairs share it.
        """
        units = [sentence_segments(c) for c in chunks]
        paras = [paragraph_ids(c, segs) for c, segs in zip(chunks, units, strict=True)]
        para_text: list[list[str]] = []
        for c, segs, pid in zip(chunks, units, paras, strict=True):
            first = {int(p): i for i, p in reversed(list(enumerate(pid)))}
            last = {int(p): i for i, p in enumerate(pid)}
            para_text.append([c[segs[first[p]][0]:segs[last[p]][1]] for p in sorted(first)])
        q_text = sorted(set(queries))
        d_text = sorted({c[s:e] for c, segs in zip(chunks, units, strict=True) for s, e in segs}
                        | {t for ts in para_text for t in ts})
        q_vec = dict(zip(q_text, self.embedder.embed(q_text, is_query=True)[0], strict=True)) if q_text else {}
        d_vec = dict(zip(d_text, self.embedder.embed(d_text)[0], strict=True)) if d_text else {}
        out: list[Any] = []
        for q, c, segs, pid, ptexts in zip(queries, chunks, units, paras, para_text, strict=True):
            if len(segs) > self.config.max_units:
                out.append(f"too_many_units: {len(segs)} sentences > {self.config.max_units}")
                continue
            if not segs:
                z = np.zeros(0, dtype=np.float32)
                out.append(UnitScores(segs, np.zeros(0, dtype=np.int64), z, z, z))
                continue
            texts = [c[s:e] for s, e in segs]
            unit = np.stack([d_vec[t] for t in texts]) @ q_vec[q]
            para = (np.stack([d_vec[t] for t in ptexts]) @ q_vec[q])[pid]
            out.append(UnitScores(segs, pid, unit.astype(np.float32), lexical_overlap(q, texts),
                                  para.astype(np.float32)))
        self.stats["pairs"] += len(queries)
        self.stats["units"] += sum(len(s) for s in units)
        self.stats["unique_units"] += len(d_text)
        return out

    def spans_from_scores(self, scores: UnitScores, chunk: str, threshold: float | None = None) -> PairResult:
        return select_spans(scores, chunk, self.config, threshold)

    def sweep(self, queries: Sequence[str], chunks: Sequence[str],
              thresholds: Sequence[float]) -> dict[float, list[PairResult]]:
        scored = self.unit_scores(queries, chunks)
        return {t: [PairResult([], None, s) if isinstance(s, str) else self.spans_from_scores(s, c, t)
                    for s, c in zip(scored, chunks, strict=True)] for t in thresholds}

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        return self.sweep(queries, chunks, [self.config.threshold])[self.config.threshold]


def _fingerprint(config: SemanticConfig) -> str:
    from ..embed import embedder_fingerprint

    return embedder_fingerprint(config.embedder_config())


EXTRACTOR = ExtractorKind("semantic", SemanticConfig, build=lambda config: SemanticExtractor(config),
                          fingerprint=_fingerprint)
