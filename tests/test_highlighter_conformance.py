"""The highlighter's spans equal the released student's post-processing, whatever the batching.

The reference is ``process()`` of the model card code of ``KRLabsOrg/acl-verbatim-modernbert``.
``oracle_spans`` below restates its rules plainly, independent of the package:

* each window of the (query, chunk) pair is run through the model on its own, unpadded;
* a token is positive when it belongs to the chunk, its offsets are non-empty and the sum of
  its non-zero labels' probabilities is at least the threshold;
* in each window, a run of consecutive positive tokens becomes (first start, last end, max p);
* the runs of all windows are sorted, merged into the previous span when they start at most
  ``merge_gap`` characters after its end, and only then spans shorter than ``min_chars`` are
  dropped.

The package adds one step, documented: each span is trimmed of edge whitespace afterwards.
So every package span must be an oracle span with only whitespace removed at its edges.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig
from verbatim_batch.extract.highlighter_spans import TokenScores, highlight_spans
from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# --- the oracle: plain restatement of the reference rules --------------------------------------------


def oracle_postprocess(windows, threshold, min_chars, merge_gap):
    """windows: per window, a list of (is_context, start, end, prob) in token order."""
    raw = []
    for tokens in windows:
        current = None
        for is_context, start, end, prob in tokens:
            if is_context and start != end and prob >= threshold:
                if current is None:
                    current = [start, end, prob]
                else:
                    current = [current[0], end, max(current[2], prob)]
            else:
                if current is not None:
                    raw.append(tuple(current))
                current = None
        if current is not None:
            raw.append(tuple(current))
    raw.sort()
    merged = []
    for start, end, prob in raw:
        if merged and start - merged[-1][1] <= merge_gap:
            merged[-1][1] = max(merged[-1][1], end)
            merged[-1][2] = max(merged[-1][2], prob)
        else:
            merged.append([start, end, prob])
    return [(s, e, p) for s, e, p in merged if e - s >= min_chars]


def drop_then_merge(windows, threshold, min_chars, merge_gap):
    """The old, wrong order (drop short runs first): only used to show the cases tell them apart."""
    raw = []
    for tokens in windows:
        current = None
        for is_context, start, end, prob in tokens + [(False, 0, 0, 0.0)]:
            if is_context and start != end and prob >= threshold:
                current = [start, end] if current is None else [current[0], end]
            elif current is not None:
                raw.append(tuple(current))
                current = None
    raw = sorted(r for r in raw if r[1] - r[0] >= min_chars)
    merged = []
    for start, end in raw:
        if merged and start - merged[-1][1] <= merge_gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(m) for m in merged]


def strip_edges(chunk, start, end):
    while start < end and chunk[start].isspace():
        start += 1
    while end > start and chunk[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def expected(chunk, oracle):
    return [t for s, e, _ in oracle if (t := strip_edges(chunk, s, e)) is not None]


def oracle_windows(model, tokenizer, query, chunk, max_length, stride):
    """Token tuples of each window, each window run through the model alone."""
    enc = tokenizer(query, chunk, return_offsets_mapping=True, max_length=max_length, truncation="only_second",
                    stride=stride, return_overflowing_tokens=True)
    windows = []
    for w in range(len(enc["input_ids"])):
        ids = torch.tensor([enc["input_ids"][w]])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        probs = torch.softmax(logits, dim=-1)[:, 1:].sum(dim=-1).tolist()
        windows.append([(sid == 1, s, e, p) for sid, (s, e), p
                        in zip(enc.sequence_ids(w), enc["offset_mapping"][w], probs, strict=True)])
    return windows


def as_token_scores(windows) -> TokenScores:
    out = []
    for tokens in windows:
        ctx = [t for t in tokens if t[0]]
        out.append((np.array([(s, e) for _, s, e, _ in ctx], dtype=np.int64).reshape(-1, 2),
                    np.array([p for *_, p in ctx], dtype=np.float32)))
    return TokenScores(out)


def package_spans(windows, chunk, threshold, min_chars, merge_gap):
    return [(s.start, s.end) for s in highlight_spans(as_token_scores(windows), chunk, threshold, min_chars, merge_gap)]


# --- hand-built probability sequences ----------------------------------------------------------------


def tokens_of(text, probs, context=True):
    """Whitespace tokens of ``text`` (offsets without the space) with the given probabilities."""
    spans, pos = [], 0
    for word in text.split(" "):
        spans.append((pos, pos + len(word)))
        pos += len(word) + 1
    return [(context, s, e, p) for (s, e), p in zip(spans, probs, strict=True)]


CASES = {  # text, window probabilities, threshold, min_chars, merge_gap, expected spans, order decides
    # two 6-char runs 2 apart: merged they are 14 characters and kept; dropped first, nothing is left
    "short_runs_merge_into_a_long_span": ("abcdef gh ijklmn", [[0.9, 0.0, 0.9]], 0.5, 10, 20, [(0, 16)], True),
    # a one-char run bridges two long runs whose own gap (7) is larger than merge_gap (5)
    "short_run_bridges_long_runs": ("A" * 30 + " x c y " + "B" * 30, [[0.8, 0.1, 0.9, 0.1, 0.8]], 0.5, 10, 5,
                                    [(0, 67)], True),
    # a short run at the edge merges into a long one and survives inside it
    "short_run_at_the_edge": ("ab x cdefghijklmnop", [[0.9, 0.1, 0.9]], 0.5, 10, 20, [(0, 19)], True),
    # the same run split by a low token, in two overlapping windows that disagree
    "windows_disagree": ("abcd efgh ijkl", [[0.9, 0.1, 0.9], [0.9, 0.9, 0.1]], 0.5, 10, 1, [(0, 14)], True),
    # the threshold is inclusive
    "inclusive_threshold": ("alpha beta gamma", [[0.25, 0.25, 0.1]], 0.25, 5, 0, [(0, 10)], False),
    # a lone short run far from everything is dropped
    "lone_short_run": ("xy " + "z" * 40 + " " + "w" * 20, [[0.9, 0.1, 0.9]], 0.5, 10, 5, [(44, 64)], False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_built_sequences(name):
    text, probs, threshold, min_chars, merge_gap, want, order_decides = CASES[name]
    windows = [tokens_of(text, p) for p in probs]
    oracle = oracle_postprocess(windows, threshold, min_chars, merge_gap)
    got = package_spans(windows, text, threshold, min_chars, merge_gap)
    assert got == expected(text, oracle) == want
    old = drop_then_merge(windows, threshold, min_chars, merge_gap)
    assert (old != [(s, e) for s, e, _ in oracle]) == order_decides


def test_runs_are_per_window_not_per_token_maximum():
    """A token positive in one window and negative in the other ends that window's run: with merge gap 0,
    the runs of two windows that meet at a space stay two spans (a per-token maximum would join them)."""
    text = "aaaa bbbb cccc dddd eeee ffff"
    w1 = tokens_of("aaaa bbbb cccc dddd", [0.9, 0.9, 0.9, 0.9])
    w2 = [(True, s + 10, e + 10, p) for _, s, e, p in tokens_of("cccc dddd eeee ffff", [0.1, 0.1, 0.9, 0.9])]
    got = package_spans([w1, w2], text, 0.5, 0, 0)
    assert got == expected(text, oracle_postprocess([w1, w2], 0.5, 0, 0)) == [(0, 19), (20, 29)]


def test_empty_offsets_and_non_context_tokens_end_a_run():
    text = "aaaa bbbb cccc"
    toks = tokens_of(text, [0.9, 0.9, 0.9])
    windows = [[(False, 0, 0, 0.99)] + toks[:1] + [(True, 4, 4, 0.99)] + toks[1:] + [(False, 0, 0, 0.99)]]
    assert package_spans(windows, text, 0.5, 0, -1) == [(0, 4), (5, 14)]
    assert package_spans(windows, text, 0.5, 0, -1) == expected(text, oracle_postprocess(windows, 0.5, 0, -1))


def test_whitespace_is_trimmed_only_after_the_length_test():
    text = "   ab   \n\n  cd ef   "
    windows = [[(True, 0, 9, 0.9), (True, 9, 20, 0.9)]]  # tokens that carry whitespace
    oracle = oracle_postprocess(windows, 0.5, 20, 0)
    assert oracle == [(0, 20, 0.9)]
    assert package_spans(windows, text, 0.5, 20, 0) == [(3, 17)]  # kept (20 chars untrimmed), then trimmed
    assert package_spans([[(True, 0, 8, 0.9)]], "        x", 0.5, 1, 0) == []  # all whitespace: gone


def test_random_sequences_against_the_oracle():
    rng = random.Random(7)
    differs = 0
    for _ in range(1500):
        n_words = rng.randint(1, 60)
        words = ["".join(rng.choice("ab ") for _ in range(rng.randint(1, 9))).strip() or "c" for _ in range(n_words)]
        text = "".join(w + rng.choice([" ", "  ", "\n", ""]) for w in words)
        # byte-level-BPE-like tokens: contiguous pieces, some carrying whitespace, some empty
        cuts = sorted({0, len(text), *(rng.randrange(len(text) + 1) for _ in range(n_words))})
        toks = list(zip(cuts, cuts[1:], strict=False))
        if rng.random() < 0.3:
            toks.insert(rng.randrange(len(toks) + 1), (cuts[len(cuts) // 2],) * 2)
        width = rng.randint(2, max(2, len(toks)))
        step = max(1, width - rng.randint(0, width - 1))
        windows = []
        for start in range(0, len(toks), step):
            part = toks[start:start + width]
            windows.append([(False, 0, 0, rng.random())] +
                           [(True, s, e, rng.choice([rng.random(), 0.5, 0.2])) for s, e in part] +
                           [(False, 0, 0, rng.random())])
            if start + width >= len(toks):
                break
        threshold = rng.choice([0.0, 0.2, 0.5, rng.random(), 1.0])
        min_chars, merge_gap = rng.randint(0, 15), rng.randint(0, 25)
        oracle = oracle_postprocess(windows, threshold, min_chars, merge_gap)
        assert package_spans(windows, text, threshold, min_chars, merge_gap) == expected(text, oracle)
        differs += drop_then_merge(windows, threshold, min_chars, merge_gap) != [(s, e) for s, e, _ in oracle]
    assert differs > 100  # the cases do tell the two orders apart


# --- random small ModernBERT models through the real loading, batching and windowing ------------------

WORDS = ("the model span chunk query evidence retrieval score table F1 3.14 et al. (2020) e.g. BLEU 91.2% "
         "naïve café 中文 — [12] Fig. 3 | row | \n\n ## Results\n").split(" ")


def bpe_tokenizer(path: Path):
    """A byte-level BPE tokenizer trained here: offsets include a token's leading space, as ModernBERT's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(3)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(200)]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["[PAD]", "[CLS]", "[SEP]"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")
    fast.save_pretrained(str(path))
    return fast


def make_model(path: Path, seed: int, tokenizer: str) -> Path:
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    torch.manual_seed(seed)
    rng = random.Random(seed)
    if tokenizer == "bpe":
        tok = bpe_tokenizer(path)
    else:
        tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
        tok.save_pretrained(str(path))
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=32 * rng.randint(1, 3), num_hidden_layers=rng.randint(1, 3),
                           num_attention_heads=2, intermediate_size=96, max_position_embeddings=512,
                           pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                           bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                           global_attn_every_n_layers=2, local_attention=rng.choice([16, 64]),
                           num_labels=rng.choice([2, 2, 3]))
    model = ModernBertForTokenClassification(cfg)
    with torch.no_grad():  # spread the logits so that probabilities vary across tokens
        model.classifier.weight.mul_(rng.choice([8.0, 40.0]))
    model.save_pretrained(str(path))
    return path


def random_chunk(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).replace(" \n\n ", "\n\n")


def away_from(probs: list[float], rng: random.Random, pick: float, eps: float = 1e-4) -> float:
    """``pick`` moved, if needed, so that no probability lies within ``eps`` of it (float rounding of
    batched vs single forward passes must not decide a token)."""
    arr = np.array(probs)
    t = pick
    while len(arr) and np.abs(arr - t).min() < eps:
        t = rng.uniform(0.05, 0.95)
    return t


SETTINGS = [(10, 20), (0, 0), (25, 5), (1, 60)]  # (min_chars, merge_gap): the defaults first


@pytest.mark.parametrize("seed,tokenizer", [(11, "wordpiece"), (12, "bpe"), (13, "wordpiece"), (14, "bpe")])
def test_random_models_match_the_oracle(tmp_path, seed, tokenizer):
    """30 pairs per model, most of them several windows of 256 tokens with a stride of 32, all pairs in one
    batch (windows packed two or three to a forward pass) and again one pair at a time: every span equals
    the oracle's (trimmed) at several thresholds and post-processing settings."""
    from transformers import AutoTokenizer, ModernBertForTokenClassification

    d = make_model(tmp_path / "m", seed, tokenizer)
    rng = random.Random(seed)
    queries = [" ".join(rng.choice(WORDS[:12]) for _ in range(rng.randint(1, 8))).strip() or "query"
               for _ in range(30)]
    chunks = [random_chunk(rng, rng.choice([20, 300, 500, 800])) for _ in range(30)]
    ref_model = ModernBertForTokenClassification.from_pretrained(str(d)).eval()
    ref_tok = AutoTokenizer.from_pretrained(str(d))
    windows = [oracle_windows(ref_model, ref_tok, q, c, 256, 32) for q, c in zip(queries, chunks, strict=True)]
    assert sum(len(w) > 1 for w in windows) >= 15
    all_probs = [p for ws in windows for tokens in ws for ctx, *_, p in tokens if ctx]
    thresholds = sorted({away_from(all_probs, rng, t) for t in (0.2, 0.5, 0.52, rng.uniform(0.05, 0.95))})

    config = HighlighterConfig(model=str(d), max_length=256, stride=32, max_query_tokens=32, device="cpu",
                               token_budget=600, max_batch_rows=3)
    hl = Highlighter(config)
    assert (config.threshold, config.min_chars, config.merge_gap) == (0.2, 10, 20)  # the model card's defaults
    batched = hl.sweep(queries, chunks, thresholds)
    scores = hl.token_scores(queries, chunks)
    hl.config = dataclasses.replace(config, token_budget=1 << 20, max_batch_rows=512)
    one_by_one = [hl.sweep([q], [c], thresholds) for q, c in zip(queries, chunks, strict=True)]
    checked = differs = 0
    for i, (chunk, ws) in enumerate(zip(chunks, windows, strict=True)):
        assert scores[i].n_windows == len(ws)
        for (offsets, probs), tokens in zip(scores[i].windows, ws, strict=True):
            ctx = [(s, e, p) for is_ctx, s, e, p in tokens if is_ctx]
            assert offsets.tolist() == [[s, e] for s, e, _ in ctx]
            np.testing.assert_allclose(probs, [p for *_, p in ctx], atol=2e-5)
        for t in thresholds:
            want = expected(chunk, oracle_postprocess(ws, t, 10, 20))
            assert [(s.start, s.end) for s in batched[t][i].spans] == want, (i, t)
            assert [(s.start, s.end) for s in one_by_one[i][t][0].spans] == want, (i, t)
            for min_chars, merge_gap in SETTINGS:
                oracle = oracle_postprocess(ws, t, min_chars, merge_gap)
                got = [(s.start, s.end) for s in highlight_spans(scores[i], chunk, t, min_chars, merge_gap)]
                assert got == expected(chunk, oracle), (i, t, min_chars, merge_gap)
                for (s, e, _), (gs, ge) in zip([o for o in oracle if strip_edges(chunk, o[0], o[1])], got,
                                               strict=True):
                    assert chunk[s:gs].isspace() or s == gs
                    assert chunk[ge:e].isspace() or ge == e
                differs += drop_then_merge(ws, t, min_chars, merge_gap) != [(s, e) for s, e, _ in oracle]
                checked += 1
    assert checked == 30 * len(thresholds) * len(SETTINGS)
    assert differs > 0  # this model's cases tell merge-then-drop from drop-then-merge


def test_model_card_defaults():
    cfg = HighlighterConfig()
    assert (cfg.threshold, cfg.min_chars, cfg.merge_gap, cfg.max_length, cfg.stride) == (0.2, 10, 20, 8192, 256)
    assert json.loads(json.dumps(cfg.to_dict()))["model"] == "KRLabsOrg/acl-verbatim-modernbert"
