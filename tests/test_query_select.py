"""Selection per query (issue 42, item 1): a retrieved pair is judged against the best evidence of its query's other
retrieved chunks; pairs without a rank (a pairs file) keep the per-pair behaviour; the extract stage never splits a
query's pairs between calls."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from verbatim_batch.core.tables import PAIR_INPUT
from verbatim_batch.engine.pair_plan import query_blocks
from verbatim_batch.extract.gate import PairExtractor
from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor, UnitScores, select_query, select_spans
from verbatim_batch.extract.spans import PairResult
from verbatim_batch.stages.extract import judges_queries

CHUNK = "First sentence about one thing.\n\nSecond sentence about another thing."


def _scores(values: list[float]) -> UnitScores:
    """Two prose units in two paragraphs, every signal equal to the given score."""
    segs = [(0, 31), (33, len(CHUNK))]
    v = np.array(values, dtype=np.float32)
    return UnitScores(segs, np.array([0, 1]), v, v, v, ("prose", "prose"), np.ones(2, dtype=bool), v,
                      np.full(2, -1))


PER_QUERY = dataclasses.replace(SemanticConfig(), query_margin=0.1, query_threshold=0.45, rank_weight=0.0)


def test_a_query_judges_its_chunks_together():
    # the answer sits in the third chunk, under the per-pair cut (0.47 < 0.50): per pair all abstain
    scores = [_scores([0.30, 0.20]), _scores([0.35, 0.10]), _scores([0.47, 0.20])]
    per_pair = [select_spans(s, CHUNK, PER_QUERY) for s in scores]
    assert all(not r.spans for r in per_pair)
    got = select_query(scores, [CHUNK] * 3, [1, 2, 3], PER_QUERY)
    assert [len(r.spans) for r in got] == [0, 0, 1]
    assert CHUNK[got[2].spans[0].start:got[2].spans[0].end] == "First sentence about one thing."
    assert [r.relevance for r in got] == [r.relevance for r in per_pair]  # relevance stays the pair's own best
    # a chunk that passes the per-pair cut gets nothing when a clearly better chunk exists for the query
    scores = [_scores([0.80, 0.20]), _scores([0.60, 0.55]), _scores([0.75, 0.20])]
    got = select_query(scores, [CHUNK] * 3, [1, 2, 3], PER_QUERY)
    assert [bool(r.spans) for r in got] == [True, False, True]
    # the whole query abstains when its best is under the query floor
    scores = [_scores([0.40, 0.20]), _scores([0.44, 0.10])]
    assert not any(r.spans for r in select_query(scores, [CHUNK] * 2, [1, 2], PER_QUERY))
    # the rank weight: a lower-ranked chunk counts a little less
    ranked = dataclasses.replace(PER_QUERY, rank_weight=0.05)
    scores = [_scores([0.60, 0.20]), _scores([0.50, 0.20]), _scores([0.68, 0.20])]
    assert [bool(r.spans) for r in select_query(scores, [CHUNK] * 3, [1, 2, 3], ranked)] == [True, False, True]
    # off (query_margin 1): exactly the per-pair results
    off = dataclasses.replace(PER_QUERY, query_margin=1.0)
    scores = [_scores([0.80, 0.20]), _scores([0.60, 0.55]), _scores([0.47, 0.20])]
    assert select_query(scores, [CHUNK] * 3, [1, 2, 3], off) == [select_spans(s, CHUNK, off) for s in scores]


class _Fixed:
    """An extractor whose pairs' signals are given (no model), judged like the semantic extractor."""

    name = "semantic"
    groups_queries = True

    def __init__(self, config: SemanticConfig, scores: dict[str, UnitScores]):
        self.inner = SemanticExtractor.__new__(SemanticExtractor)
        self.inner.config = config
        self.scores = scores
        self.calls: list[tuple] = []

    def describe(self):
        return {"model_id": "none", "model_revision": None, "config_hash": "x"}

    def extract(self, queries, chunks, query_ids=None, ranks=None) -> list[PairResult]:
        self.calls.append((query_ids, ranks))
        return self.inner.select([self.scores[q] for q in queries], chunks, None, query_ids, ranks)


def _rows(ranks: list[int | None]) -> pa.Table:
    n = len(ranks)
    return pa.Table.from_pylist([{
        "pair_id": f"p{i}", "query_id": "q1", "query": f"q{i}", "chunk": CHUNK, "chunk_id": f"c{i}", "paper_id": "x",
        "chunk_index": i, "chunk_start": 0, "rank": ranks[i], "relevant": None, "extra": None, "input_error": None}
        for i in range(n)], schema=PAIR_INPUT)


def test_the_stage_passes_ranks_and_a_pairs_file_keeps_per_pair_behaviour():
    scores = {"q0": _scores([0.30, 0.20]), "q1": _scores([0.35, 0.10]), "q2": _scores([0.47, 0.20])}
    ex = _Fixed(PER_QUERY, scores)
    stage = PairExtractor(ex, "run")
    retrieved = stage(_rows([1, 2, 3]))["pairs"]
    assert retrieved["n_spans"].to_pylist() == [0, 0, 1]
    assert ex.calls[-1] == (["q1"] * 3, [1, 2, 3])
    from_file = stage(_rows([None, None, None]))["pairs"]  # no rank: each pair alone, as before
    assert from_file["n_spans"].to_pylist() == [0, 0, 0]


def test_blocks_of_whole_queries_for_an_extractor_that_judges_queries():
    assert judges_queries(PER_QUERY) and not judges_queries(SemanticConfig(query_margin=1.0))
    table = pa.table({"query_id": ["a"] * 3 + ["b"] * 4 + ["c"] * 2, "x": list(range(9))})
    blocks = query_blocks(table, 2)
    assert [b["query_id"].to_pylist() for b in blocks] == [["a"] * 3, ["b"] * 4, ["c"] * 2]
