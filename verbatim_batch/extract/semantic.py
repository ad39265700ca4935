"""The offline default extractor: sentences scored against the query with a sentence embedder.

Each chunk is cut into sentence units (``sentences.sentence_segments``); the query
and every unit are embedded with the bundled all-MiniLM-L6-v2 (or any embedder);
a unit is evidence when its cosine similarity to the query is at least
``threshold`` and within ``margin`` of the chunk's best unit. Kept neighbours are
merged. The pair's relevance is its best unit's similarity, so callers can abstain
on low-relevance pairs.

It needs no GPU and no download, which makes it the default for the demo and for
CPU runs. It works at sentence granularity, so it cannot select part of a sentence
the way the token-level highlighter can (see the README for how they compare).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import tables
from .sentences import sentence_segments
from .spans import PairResult, Span, postprocess

SEMANTIC_VERSION = "1"


@dataclass(frozen=True)
class SemanticConfig:
    """Settings of the semantic extractor.

    ``threshold`` and ``margin`` were chosen on labelled pairs built from generated papers
    (``benchmarks/tune_semantic.py``; BENCHMARKS.md, "Semantic extractor defaults").
    """

    model: str | None = None  # None: the bundled all-MiniLM-L6-v2
    threshold: float = 0.40
    margin: float = 0.05  # keep units scoring at least best - margin
    min_chars: int = 10
    merge_gap: int = 20
    max_units: int = 2_000  # units per chunk; a pair beyond this is an error row
    device: str = "auto"
    token_budget: int = 16384

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be a cosine similarity in [-1, 1], got {self.threshold}")
        if self.margin < 0 or self.min_chars < 0 or self.merge_gap < 0:
            raise ValueError("margin, min_chars and merge_gap must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def embedder_config(self):
        from ..embedding import EmbedderConfig

        kw = {"device": self.device, "token_budget": self.token_budget}
        return EmbedderConfig(model=self.model, **kw) if self.model else EmbedderConfig(**kw)

    @property
    def hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in ("device", "token_budget", "model")}
        d["embedder"] = self.embedder_config().hash
        return tables.config_hash({"semantic_version": SEMANTIC_VERSION, **d})


class SemanticExtractor:
    """Sentence-level extraction with a sentence embedder (see the module docs)."""

    name = "semantic"

    def __init__(self, config: SemanticConfig | None = None, embedder=None) -> None:
        from ..embedding import Embedder

        self.config = config = config or SemanticConfig()
        self.embedder = embedder or Embedder(config.embedder_config())
        self.stats: dict[str, Any] = dict(pairs=0, units=0, unique_units=0)

    def describe(self) -> dict[str, Any]:
        info = self.embedder.describe()
        return {"extractor": self.name, "model_id": info["model_id"], "model_revision": info["model_revision"],
                "config_hash": self.config.hash, "device": info["device"], "threshold": self.config.threshold,
                "margin": self.config.margin}

    def unit_scores(self, queries: Sequence[str], chunks: Sequence[str]) -> list[tuple[list[tuple[int, int]],
                                                                                       np.ndarray] | str]:
        """Per pair, the chunk's units and their similarity to the query (or an error string).

        Each distinct query and unit text is embedded once per call, however many pairs share it.
        """
        units = [sentence_segments(c) for c in chunks]
        q_text = sorted(set(queries))
        u_text = sorted({c[s:e] for c, segs in zip(chunks, units, strict=True) for s, e in segs})
        q_vec = dict(zip(q_text, self.embedder.embed(q_text, is_query=True)[0], strict=True)) if q_text else {}
        u_vec = dict(zip(u_text, self.embedder.embed(u_text)[0], strict=True)) if u_text else {}
        out: list[Any] = []
        for q, c, segs in zip(queries, chunks, units, strict=True):
            if len(segs) > self.config.max_units:
                out.append(f"too_many_units: {len(segs)} sentences > {self.config.max_units}")
                continue
            if not segs:
                out.append((segs, np.zeros(0, dtype=np.float32)))
                continue
            mat = np.stack([u_vec[c[s:e]] for s, e in segs])
            out.append((segs, (mat @ q_vec[q]).astype(np.float32)))
        self.stats["pairs"] += len(queries)
        self.stats["units"] += sum(len(s) for s in units)
        self.stats["unique_units"] += len(u_text)
        return out

    def spans_from_scores(self, segs: list[tuple[int, int]], sims: np.ndarray, chunk: str,
                          threshold: float | None = None) -> PairResult:
        cfg = self.config
        if not len(sims):
            return PairResult([], 0.0)
        t = cfg.threshold if threshold is None else threshold
        best = float(sims.max())
        cut = max(t, best - cfg.margin)
        kept = [Span(s, e, float(p)) for (s, e), p in zip(segs, sims, strict=True) if p >= cut]
        return PairResult(postprocess(kept, cfg.min_chars, cfg.merge_gap), best)

    def sweep(self, queries: Sequence[str], chunks: Sequence[str],
              thresholds: Sequence[float]) -> dict[float, list[PairResult]]:
        scored = self.unit_scores(queries, chunks)
        return {t: [PairResult([], None, s) if isinstance(s, str) else self.spans_from_scores(*s, c, t)
                    for s, c in zip(scored, chunks, strict=True)] for t in thresholds}

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        return self.sweep(queries, chunks, [self.config.threshold])[self.config.threshold]
