"""The highlighter split into host and model stages gives what the in-process highlighter gives (issue 25).

No Ray here: the stage callables of the extract job run one after another in this process. The Ray run of the
split placement is tests/test_extract_pipeline.py.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pyarrow as pa
import pytest
from helpers import CHUNK, make_token_classifier

from verbatim_batch.extract.gate import DEFAULT_MAX_CHUNK_CHARS, PairExtractor, pack, unpack
from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig, host_describe
from verbatim_batch.extract.highlighter_spans import ContextScores, TokenScores, highlight_spans
from verbatim_batch.extract.pairs import pairs_from_records
from verbatim_batch.extract.spans import Span, merge_runs, postprocess, runs_above

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def random_windows(rng: random.Random):
    """A chunk and the windows of one pair: contiguous pieces, some carrying whitespace, some empty, overlapping."""
    text = "".join(rng.choice("ab  \n.") for _ in range(rng.randint(1, 120))) or "a"
    cuts = sorted({0, len(text), *(rng.randrange(len(text) + 1) for _ in range(rng.randint(1, 40)))})
    toks = list(zip(cuts, cuts[1:], strict=False))
    if rng.random() < 0.3:
        toks.insert(rng.randrange(len(toks) + 1), (cuts[len(cuts) // 2],) * 2)
    width = rng.randint(1, max(1, len(toks)))
    step = rng.randint(1, width)
    windows = []
    for start in range(0, len(toks), step):
        part = toks[start:start + width]
        probs = np.array([rng.choice([rng.random(), 0.5, 0.2, 0.0, 1.0]) for _ in part], dtype=np.float32)
        windows.append((np.array(part, dtype=np.int64).reshape(-1, 2), probs))
        if start + width >= len(toks):
            break
    return text, windows


def per_token(windows, chunk, threshold, min_chars, merge_gap) -> list[Span]:
    """The post-processing as it was before issue 25: a Python loop over every token of every window."""
    runs = [r for o, p in windows for r in runs_above(o.tolist(), p.tolist(), threshold)]
    return postprocess(runs, min_chars, merge_gap, chunk)


def test_flat_postprocessing_equals_the_per_token_loop():
    """Spans and scores are identical (not close), pair by pair and for a whole batch of pairs at once."""
    rng = random.Random(25)
    for _ in range(60):
        pairs = [random_windows(rng) for _ in range(rng.randint(1, 6))]
        threshold = rng.choice([0.0, 0.2, 0.5, float(np.float32(0.2)), rng.random(), 1.0])
        min_chars, merge_gap = rng.randint(0, 12), rng.choice([0, 1, 5, 20, -1, -3])
        want = [per_token(w, c, threshold, min_chars, merge_gap) for c, w in pairs]
        for (chunk, windows), spans in zip(pairs, want, strict=True):
            assert highlight_spans(TokenScores(windows), chunk, threshold, min_chars, merge_gap) == spans
        flat = [(i, o, p) for i, (_, ws) in enumerate(pairs) for o, p in ws]
        scores = ContextScores([None] * len(pairs),
                               np.concatenate([o for _, o, _ in flat]).reshape(-1, 2),
                               np.concatenate([p for *_, p in flat]).astype(np.float32),
                               np.array([len(p) for *_, p in flat]), np.array([i for i, *_ in flat]))
        got = scores.results([c for c, _ in pairs], threshold, min_chars, merge_gap)
        assert [r.spans for r in got] == want
        assert [r.relevance for r in got] == [TokenScores(w).relevance for _, w in pairs]


def test_merge_of_reversed_runs_falls_back_to_the_loop():
    runs = [Span(10, 5, 0.5), Span(0, 8, 0.7), Span(6, 30, 0.6)]
    g, s, e, sc = merge_runs(np.zeros(3), *(np.array([getattr(r, f) for r in runs]) for f in ("start", "end", "score")),
                             0, 2)
    assert [Span(*x) for x in zip(s.tolist(), e.tolist(), sc.tolist(), strict=True)] == postprocess(runs, 0, 2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_token_classifier(tmp_path_factory.mktemp("split") / "m")


@pytest.fixture(scope="module")
def config(model_dir) -> HighlighterConfig:
    return HighlighterConfig(model=str(model_dir), max_length=64, stride=16, max_query_tokens=16, token_budget=512,
                             threshold=0.5)


@pytest.fixture(scope="module")
def hl(config) -> Highlighter:
    return Highlighter(config)


QUERIES = ["what improved", "table", "word " * 40, "naïve café — 3.5% [SEP]", "crf", "x"]
CHUNKS = [CHUNK, CHUNK[:120], CHUNK, "Naïve café prices rose 3.5% (Fig. 3) — e.g. [12]. " * 6, "The CRF layer helps.",
          "  \n\t spaced   out\n\n text  "]


def test_encode_gives_the_reference_windows(hl):
    """The Rust tokenizer copy cuts exactly the windows of the reference tokenizer call."""
    assert hl.host._backends is not None
    ok, enc, too_long = hl._windows(QUERIES, CHUNKS)
    want = hl.host._from_reference(ok, enc, too_long, len(QUERIES))
    got = hl.host.encode(QUERIES, CHUNKS)
    assert got.errors == want.errors and got.errors[2].startswith("query_too_long")
    for field in ("ids", "window_lengths", "window_pair", "context", "offsets", "context_counts"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    assert (np.bincount(got.window_pair) > 3).any()  # some pair has several windows


def pair_rows() -> pa.Table:
    records = [{"query": q, "chunk": c, "paper_id": "P", "chunk_index": i} for i, (q, c) in
               enumerate(zip(QUERIES, CHUNKS, strict=True))]
    records += [{"query": "", "chunk": "x y z"}, {"query": "no chunk here"}]
    return pairs_from_records(records)


def split_path(config, batch: pa.Table, forward_actor=None) -> pa.Table:
    """The three stage callables of the extract job's split placement, as Ray runs them, without Ray."""
    from verbatim_batch.stages.extract import HighlightForwardActor, _highlight_spans, _highlight_tokenize

    tokens = _highlight_tokenize(batch, config, DEFAULT_MAX_CHUNK_CHARS)
    scored = (forward_actor or HighlightForwardActor(config, retries=0))(tokens)
    return _highlight_spans(scored, config, "run", host_describe(config), DEFAULT_MAX_CHUNK_CHARS)


def comparable(packed: pa.Table) -> dict[str, list]:
    from verbatim_batch.engine.batches import strip_internal

    tables = unpack(strip_internal(packed)[0])
    return {name: t.drop_columns([c for c in ("latency_ms",) if c in t.column_names]).to_pylist()
            for name, t in tables.items()}


def test_split_stages_equal_the_in_process_extractor(config, hl):
    batch = pair_rows()
    want = comparable(pack(PairExtractor(hl, "run")(batch)))
    got_packed = split_path(config, batch)
    got = comparable(got_packed)
    assert got == want
    assert want["spans"] and any(r["error"] for r in want["pairs"])
    pairs = unpack(got_packed.drop_columns([c for c in got_packed.column_names if c.startswith("_")]))["pairs"]
    latency = pairs["latency_ms"].to_pylist()
    assert all((v is None) == (e in ("empty_query",) or (e or "").startswith("missing_chunk"))
               for v, e in zip(latency, pairs["error"].to_pylist(), strict=True))
    counts = {c for c in got_packed.column_names if c.startswith("_count_")}
    assert {"_count_time_ms.tokenize", "_count_time_ms.forward", "_count_time_ms.model",
            "_count_time_ms.gate"} <= counts


def test_split_stages_isolate_a_failing_pair_and_a_failed_batch(config, hl, monkeypatch):
    from verbatim_batch.stages.extract import HighlightForwardActor

    batch = pair_rows()
    actor = HighlightForwardActor(config, retries=0)
    real = actor.highlighter.forward_probs
    bad_len = len(hl.host.encode([QUERIES[1]], [CHUNKS[1]]).ids)

    def nan_for_one_pair(ids, lengths):
        if len(ids) == bad_len or len(lengths) > 4:  # the whole batch, or the one pair alone
            raise FloatingPointError("the highlighter produced NaN/inf probabilities")
        return real(ids, lengths)

    monkeypatch.setattr(actor.highlighter, "forward_probs", nan_for_one_pair)
    got = {r["query"]: r for r in comparable(split_path(config, batch, actor))["pairs"]}
    assert got["table"]["error"] == ("extractor_error: FloatingPointError: the highlighter produced NaN/inf "
                                     "probabilities")
    assert got["what improved"]["error"] is None and got["what improved"]["n_spans"] > 0

    def always(ids, lengths):
        raise RuntimeError("CUDA error: device lost")

    monkeypatch.setattr(actor.highlighter, "forward_probs", always)  # every pair fails alone too: error rows
    rows = comparable(split_path(config, batch, actor))["pairs"]
    assert sum(r["error"] == "extractor_error: RuntimeError: CUDA error: device lost" for r in rows) == 5
    assert sum((r["error"] or "").startswith("query_too_long") for r in rows) == 1

    def broken(hl, batch):
        raise MemoryError("out of memory")

    monkeypatch.setattr("verbatim_batch.extract.highlighter_stages.forward_table", broken)  # the stage itself fails
    out = split_path(config, batch, actor)
    rows = comparable(out)
    assert not rows["spans"] and out["_retries"][0].as_py() == 0
    assert all(r["error"] == "stage_failed: MemoryError: out of memory" for r in rows["pairs"])
    assert json.dumps(sorted(r["query"] for r in rows["pairs"])) == json.dumps(sorted(batch["query"].to_pylist()))


# --- the embedder: tokenized on a CPU stage, the forward pass alone on the model actor ---------------------


def test_embed_tokenize_stage_gives_the_in_actor_vectors(tmp_path):
    """``embed_tokenize`` then ``EmbedActor`` write exactly the rows ``EmbedActor`` alone writes, and the tokenize
    stage's time rides through the actor to the sink."""
    from helpers import SENTENCES, tiny_model_dir

    from verbatim_batch.engine.batches import strip_internal
    from verbatim_batch.retrieval.embedder import EmbedderConfig
    from verbatim_batch.stages.embed import EmbedActor, embed_tokenize

    config = EmbedderConfig(model=str(tiny_model_dir(tmp_path / "bert", "bert")), max_length=16, token_budget=64)
    texts = SENTENCES * 3
    batch = pa.table({"chunk_id": [f"c{i}" for i in range(len(texts))], "paper_id": ["p"] * len(texts),
                      "context": [("Paper > Section" if i % 2 else None) for i in range(len(texts))], "text": texts})
    actor = EmbedActor(config, retries=0)
    want, _ = strip_internal(actor(batch))
    tokens = embed_tokenize(batch, config)
    assert tokens.column("_emb_truncated").to_pylist() == want.column("truncated").to_pylist()
    got, counts = strip_internal(actor(tokens))
    assert got.equals(want)  # vectors bit for bit: same tokens, same packing
    assert "time_ms.forward" in counts or counts["padded_tokens"] > 0
    assert actor.embedder.stats["empty"] == 2 * texts.count("")
