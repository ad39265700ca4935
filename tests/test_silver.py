"""Silver training data: row filters, the query-grouped split, the canonical table, labelled token windows
and Parquet files that Hugging Face ``datasets`` loads."""

from __future__ import annotations

import os
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from verbatim_batch.retrieval.embedder import DEFAULT_MODEL
from verbatim_batch.silver import dataset as silver
from verbatim_batch.silver.dataset import (
    DROP_REASONS,
    SILVER_SCHEMA,
    SILVER_WINDOWS_SCHEMA,
    canonical_table,
    count_citations,
    count_years,
    filter_rows,
    is_reference_heading,
    looks_like_reference_list,
    split_by_query,
    tokenized_windows,
    window_labels,
    write_silver,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# --- realistic texts -------------------------------------------------------------------------------------

ACL_REFERENCES = """Akari Asai, Zeqiu Wu, Yizhong Wang, Avirup Sil, and Hannaneh Hajishirzi. 2024. Self-RAG: \
Learning to retrieve, generate, and critique through self-reflection. In The Twelfth International Conference \
on Learning Representations.

Vladimir Karpukhin, Barlas Oguz, Sewon Min, Patrick Lewis, Ledell Wu, Sergey Edunov, Danqi Chen, and Wen-tau Yih. \
2020. Dense passage retrieval for open-domain question answering. In Proceedings of the 2020 Conference on \
Empirical Methods in Natural Language Processing (EMNLP), pages 6769-6781.

Omar Khattab and Matei Zaharia. 2020. ColBERT: Efficient and effective passage search via contextualized late \
interaction over BERT. In Proceedings of the 43rd International ACM SIGIR Conference, pages 39-48.

Jimmy Lin. 2021. A proposed conceptual framework for a representational approach to information retrieval. \
arXiv preprint arXiv:2110.01529.
"""

IEEE_REFERENCES = """[1] V. Karpukhin, B. Oguz, S. Min, P. Lewis, L. Wu, S. Edunov, D. Chen, and W.-t. Yih, \
"Dense passage retrieval for open-domain question answering," in Proc. EMNLP, 2020, pp. 6769-6781.
[2] O. Khattab and M. Zaharia, "ColBERT: Efficient and effective passage search via contextualized late \
interaction over BERT," in Proc. SIGIR, 2020, pp. 39-48.
[3] S. Robertson and H. Zaragoza, "The probabilistic relevance framework: BM25 and beyond," Found. Trends Inf. \
Retr., vol. 3, no. 4, pp. 333-389, 2009.
[4] A. Vaswani et al., "Attention is all you need," in Advances in Neural Information Processing Systems, 2017.
"""

APA_REFERENCES = """- Karpukhin, V., Oguz, B., Min, S., Lewis, P., Wu, L., Edunov, S., Chen, D., & Yih, W. (2020). \
Dense passage retrieval for open-domain question answering. In Proceedings of EMNLP (pp. 6769-6781).
- Izacard, G., & Grave, E. (2021). Leveraging passage retrieval with generative models for open domain question \
answering. In Proceedings of EACL (pp. 874-880).
- Nogueira, R., & Cho, K. (2019). Passage re-ranking with BERT. arXiv preprint arXiv:1901.04085.
"""

NATURE_REFERENCES = """1. Jumper, J. et al. Highly accurate protein structure prediction with AlphaFold. Nature 596, \
583-589 (2021).
2. Baek, M. et al. Accurate prediction of protein structures and interactions using a three-track neural network. \
Science 373, 871-876 (2021).
3. Senior, A. W. et al. Improved protein structure prediction using potentials from deep learning. Nature 577, \
706-710 (2020).
"""

# A PDF converter ran the entries together into one paragraph.
MERGED_REFERENCES = (
    "[1] V. Karpukhin, B. Oguz, S. Min et al. Dense passage retrieval for open-domain question answering. In EMNLP, "
    "2020. [2] O. Khattab and M. Zaharia. ColBERT: Efficient and effective passage search. In SIGIR, 2020. "
    "[3] S. Robertson and H. Zaragoza. The probabilistic relevance framework: BM25 and beyond. Foundations and "
    "Trends in IR, 3(4):333-389, 2009."
)

# Hard-wrapped entries with no blank line between them.
WRAPPED_REFERENCES = """Vladimir Karpukhin, Barlas Oguz, Sewon Min, Patrick
Lewis, Ledell Wu, Sergey Edunov, Danqi Chen, and Wen-
tau Yih. 2020. Dense passage retrieval for open-
domain question answering. In Proceedings of EMNLP,
pages 6769-6781.
Omar Khattab and Matei Zaharia. 2020. ColBERT: Effi-
cient and effective passage search via contextualized
late interaction over BERT. In Proceedings of SIGIR,
pages 39-48.
Jimmy Lin. 2021. A proposed conceptual framework for
a representational approach to information retrieval.
arXiv preprint arXiv:2110.01529.
"""

METHODS = """## 4.2 Retrieval setup

We index every paper with a dense retriever and a BM25 baseline. Chunks are at most 512 tokens long and overlap \
by 64 tokens, which keeps section boundaries intact in most cases. For the dense retriever we use a \
768-dimensional encoder trained with in-batch negatives, and we normalise all vectors before building the index.

Table 3 shows that the hybrid retriever improves recall@10 from 71.2 to 78.9 on the held-out set, while the \
latency per query grows by only 4 ms. The gain is largest for questions that mention specific numeric results.

We follow the evaluation protocol of Thakur et al. (2021) and report nDCG@10 on all datasets. As a sparse \
baseline we use BM25 [30] with the default parameters k1 = 0.9 and b = 0.4. Dense models are fine-tuned from \
BERT-base (Devlin et al., 2019) on MS MARCO for 40k steps.
"""

PROSE_NAMED = """Karpukhin et al. (2020) show that a dual encoder trained on question-passage pairs outperforms BM25 \
by 9 to 19 points in top-20 accuracy.
Lewis et al. (2020) combine such a retriever with a seq2seq generator and train both end to end."""

RELATED_NUMERIC = (
    "Dense retrieval [12, 15, 21] has largely replaced sparse methods [30, 31] for open-domain question answering "
    "[7, 8, 9]. Late-interaction models [15, 16] and distillation-based approaches [22-24] further narrow the gap "
    "to cross-encoders [27]."
)
RELATED_AUTHOR_YEAR = (
    "Retrieval-augmented generation was introduced by Lewis et al. (2020) and later scaled by Borgeaud et al. "
    "(2022), while Izacard and Grave (2021) fuse passages in the decoder (see also Guu et al., 2020; Karpukhin "
    "et al., 2020)."
)
TIMELINE = (
    "The benchmark was first released in 2016, extended with unanswerable questions in 2018, translated in 2019 "
    "and 2020, and retired in 2023 after saturation."
)
RESULTS_TABLE = """| Model | Year | nDCG@10 | Recall@100 |
|---|---|---|---|
| BM25 | 2009 | 42.3 | 65.1 |
| DPR | 2020 | 33.8 | 59.7 |
| ColBERT | 2020 | 45.2 | 70.4 |
"""

CONCLUSION_THEN_REFS = (
    "## 6 Conclusion\n\nWe presented a batch pipeline for verbatim evidence extraction that runs over millions of "
    "papers, and we showed that the hybrid retriever finds the gold chunk for most questions. Future work will "
    "extend the pipeline to tables and figures, and it will study how the student model transfers to new domains.\n"
    "\nThe code and the silver data are released under a permissive license.\n\n"
    "We thank the reviewers for their comments.\n\n## References\n\n"
    "Jimmy Lin. 2021. A proposed conceptual framework for a representational approach to information retrieval. "
    "arXiv preprint arXiv:2110.01529.\n"
)


def make_row(chunk: str, spans: list[str] = (), *, query_id: str = "q1", rank: int | None = 1,
             source: str = "retrieved", heading_path: list[str] = (), question: str = "How is retrieval set up?",
             chunk_id: str = "c1") -> dict:
    """A teacher row whose spans are the given substrings of the chunk."""
    out = []
    for text in spans:
        start = chunk.index(text)
        out.append({"start": start, "end": start + len(text), "text": text})
    return {"query_id": query_id, "question": question, "paper_id": "p1", "chunk_id": chunk_id, "chunk": chunk,
            "source": source, "rank": rank, "spans": out, "heading_path": list(heading_path),
            "teacher_model": "teacher-x"}


GOOD_SPAN = "the hybrid retriever improves recall@10 from 71.2 to 78.9 on the held-out set"


# --- text signals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [ACL_REFERENCES, IEEE_REFERENCES, APA_REFERENCES, NATURE_REFERENCES,
                                  MERGED_REFERENCES, WRAPPED_REFERENCES,
                                  CONCLUSION_THEN_REFS.split("## References")[1]])
def test_reference_lists_are_recognised(text):
    assert looks_like_reference_list(text)


@pytest.mark.parametrize("text", [METHODS, PROSE_NAMED, RELATED_NUMERIC, RELATED_AUTHOR_YEAR, TIMELINE,
                                  RESULTS_TABLE, CONCLUSION_THEN_REFS, GOOD_SPAN,
                                  METHODS + RELATED_AUTHOR_YEAR + "\n\n" + IEEE_REFERENCES])  # prose holds most words
def test_prose_is_not_a_reference_list(text):
    assert not looks_like_reference_list(text)


def test_single_reference_entry_span_is_a_reference_list():
    entry = IEEE_REFERENCES.splitlines()[2]
    assert looks_like_reference_list(entry)


@pytest.mark.parametrize(("heading", "expected"), [
    ("References", True), ("7 REFERENCES", True), ("**Bibliography**", True), ("Works Cited", True),
    ("A. References", True), ("References and Notes", True), ("Selected references", True),
    ("Cross-references in code review", False), ("Introduction", False), ("Related Work", False),
    ("Handling references to tables", False),
])
def test_reference_headings(heading, expected):
    assert is_reference_heading(heading) is expected


def test_citation_and_year_counts():
    assert count_citations(RELATED_NUMERIC) == 12  # every cited number counts; "[22-24]" is one item
    assert count_citations("values in [0, 1] and the pair [0, 5]") == 0  # intervals, not citations
    assert count_citations("as in [Smi20, Lee19]") == 2
    assert count_citations(RELATED_AUTHOR_YEAR) == 5
    assert count_citations("We use BM25 [30].") == 1
    assert count_years(TIMELINE) == 5
    assert count_years("a batch of 2048 tokens, 1024 dims and 2019a, 2020b") == 2  # 2048 is not a year
    assert count_years("a learning rate of 0.2019 and 12,2019") == 0


# --- filter_rows ---------------------------------------------------------------------------------------


def test_filter_every_reason_and_the_keep_paths():
    rows = {
        # kept
        "positive": make_row(METHODS, [GOOD_SPAN]),
        "gold_rank_none": make_row(METHODS, [GOOD_SPAN], source="gold", rank=None),
        "gold_deep_rank": make_row(METHODS, [GOOD_SPAN], source="gold", rank=9),
        "negative": make_row(METHODS, [], rank=8),
        "negative_no_rank": make_row(METHODS, [], rank=None),
        "one_citation": make_row(METHODS, ["As a sparse baseline we use BM25 [30] with the default parameters"]),
        "named_prose": make_row(PROSE_NAMED, [PROSE_NAMED]),
        "table_with_years": make_row(RESULTS_TABLE, [RESULTS_TABLE.strip()]),
        "prose_before_references": make_row(CONCLUSION_THEN_REFS, ["the hybrid retriever finds the gold chunk"]),
        # dropped
        "neg_in_references_heading": make_row("Some text that is not a list at all.", [],
                                              heading_path=["Paper", "References"]),
        "neg_reference_text": make_row(IEEE_REFERENCES, []),
        "rank": make_row(METHODS, [GOOD_SPAN], rank=4),
        "too_few_words": make_row(METHODS, ["recall@10 from 71.2"]),
        "too_many_words": make_row(METHODS * 3, [(METHODS * 3).strip()]),
        "references_heading": make_row(METHODS, [GOOD_SPAN], heading_path=["Paper", "8 Bibliography"]),
        "references_text": make_row(ACL_REFERENCES, ["Omar Khattab and Matei Zaharia. 2020. ColBERT"]),
        "references_span": make_row(CONCLUSION_THEN_REFS, ["Jimmy Lin. 2021. A proposed conceptual framework"]),
        "citation_dense": make_row(RELATED_NUMERIC, [RELATED_NUMERIC]),
        "citation_dense_author_year": make_row(RELATED_AUTHOR_YEAR, [RELATED_AUTHOR_YEAR]),
        "year_dense": make_row(TIMELINE, [TIMELINE]),
    }
    expected = {
        "neg_in_references_heading": "no_spans_in_references", "neg_reference_text": "no_spans_in_references",
        "rank": "rank", "too_few_words": "too_few_words", "too_many_words": "too_many_words",
        "references_heading": "references", "references_text": "references", "references_span": "references",
        "citation_dense": "citation_dense", "citation_dense_author_year": "citation_dense",
        "year_dense": "year_dense",
    }
    for name, row in rows.items():
        assert silver.drop_reason(row) == expected.get(name), name
    kept, dropped = filter_rows(rows.values())
    assert [r for r in rows.values() if r in kept] == kept
    assert len(kept) == len(rows) - len(expected)
    assert set(dropped) == set(DROP_REASONS)
    assert dropped == {reason: sum(1 for v in expected.values() if v == reason) for reason in DROP_REASONS}
    assert sum(dropped.values()) + len(kept) == len(rows)


def test_filter_parameters():
    deep = make_row(METHODS, [GOOD_SPAN], rank=5)
    assert filter_rows([deep], max_rank=5)[0] == [deep]
    gold_deep = make_row(METHODS, [GOOD_SPAN], source="gold", rank=9)
    assert silver.drop_reason(gold_deep, rank_applies_to_gold=True) == "rank"
    assert silver.drop_reason(make_row(METHODS, [GOOD_SPAN]), max_words=10) == "too_many_words"
    assert silver.drop_reason(make_row(METHODS, [GOOD_SPAN]), min_words=20) == "too_few_words"
    assert silver.drop_reason(make_row(TIMELINE, [TIMELINE]), year_density=0.5) is None
    assert silver.drop_reason(make_row(RELATED_NUMERIC, [RELATED_NUMERIC]), citation_density=0.5) is None
    # spans summed over the row: two short spans together pass the minimum
    two = make_row(METHODS, ["We index every paper", "with a dense retriever"])
    assert silver.drop_reason(two) is None


def test_filter_accepts_array_like_fields():
    row = make_row(METHODS, [GOOD_SPAN], heading_path=["Paper", "References"])
    row["heading_path"] = np.array(row["heading_path"], dtype=object)
    row["spans"] = np.array(row["spans"], dtype=object)
    assert silver.drop_reason(row) == "references"


# --- split ---------------------------------------------------------------------------------------------


def _rows_for(query_ids, per_query=3):
    return [make_row(METHODS, [GOOD_SPAN] if k == 0 else [], query_id=q, chunk_id=f"{q}-{k}")
            for q in query_ids for k in range(per_query)]


def test_split_groups_queries_and_is_order_independent():
    qids = [f"q{i:04d}" for i in range(1000)]
    rows = _rows_for(qids)
    train, dev = split_by_query(rows, dev_fraction=0.1, seed=0)
    assert len(train) + len(dev) == len(rows)
    train_q, dev_q = {r["query_id"] for r in train}, {r["query_id"] for r in dev}
    assert not train_q & dev_q
    assert train_q | dev_q == set(qids)
    assert 0.07 <= len(dev_q) / len(qids) <= 0.13
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    train2, dev2 = split_by_query(shuffled, dev_fraction=0.1, seed=0)
    assert {r["query_id"] for r in dev2} == dev_q
    assert sorted(r["chunk_id"] for r in dev2) == sorted(r["chunk_id"] for r in dev)
    # a query's side does not depend on which other queries are present
    _, dev_half = split_by_query(_rows_for(qids[:500]), dev_fraction=0.1, seed=0)
    assert {r["query_id"] for r in dev_half} == {q for q in dev_q if q in set(qids[:500])}
    # another seed, another split; the same seed, the same split
    _, dev_seed1 = split_by_query(rows, dev_fraction=0.1, seed=1)
    assert {r["query_id"] for r in dev_seed1} != dev_q
    assert {r["query_id"] for r in split_by_query(rows, 0.1, 1)[1]} == {r["query_id"] for r in dev_seed1}


def test_split_edges():
    rows = _rows_for([f"q{i}" for i in range(50)], per_query=1)
    assert split_by_query(rows, dev_fraction=0.0) == (rows, [])
    assert split_by_query(rows, dev_fraction=1.0) == ([], rows)
    with pytest.raises(ValueError):
        split_by_query(rows, dev_fraction=1.5)


# --- canonical table -----------------------------------------------------------------------------------


def test_canonical_table():
    rows = [make_row(METHODS, [GOOD_SPAN, "We index every paper"], source="gold", rank=None),
            make_row(METHODS, [], rank=2, query_id="q2")]
    table = canonical_table(rows)
    assert table.schema == SILVER_SCHEMA
    out = table.to_pylist()
    assert [r["label"] for r in out] == [1, 0]
    assert [r["rank"] for r in out] == [None, 2]
    spans = out[0]["spans"]
    assert [s["start"] for s in spans] == sorted(s["start"] for s in spans)  # sorted by offset
    assert all(METHODS[s["start"]:s["end"]] == s["text"] for s in spans)
    assert out[1]["spans"] == []
    assert "heading_path" not in table.column_names


def test_canonical_table_rejects_misaligned_spans():
    row = make_row(METHODS, [GOOD_SPAN])
    row["spans"][0]["start"] += 1
    with pytest.raises(ValueError, match="does not match"):
        canonical_table([row])
    row["spans"][0].update(start=0, end=len(METHODS) + 5)
    with pytest.raises(ValueError, match="outside"):
        canonical_table([row])


# --- token windows -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEFAULT_MODEL)


def test_window_labels_overlap_rule():
    offsets = np.array([[0, 0], [0, 4], [0, 0], [0, 5], [5, 9], [10, 14], [15, 20], [0, 0]])
    seq = [None, 0, None, 1, 1, 1, 1, None]
    starts, ends = np.array([7, 18]), np.array([12, 19])  # [7, 12) and [18, 19)
    labels = window_labels(offsets, seq, starts, ends)
    assert labels.tolist() == [-100, -100, -100, 0, 1, 1, 1, -100]
    assert window_labels(offsets, seq, np.array([9]), np.array([10])).tolist() == [-100, -100, -100, 0, 0, 0, 0, -100]


LONG_CHUNK = METHODS.replace("## 4.2 Retrieval setup\n\n", "")
LONG_SPANS = [
    "We index every paper with a dense retriever and a BM25 baseline",
    "the hybrid retriever improves recall@10 from 71.2 to 78.9",
    "report nDCG@10 on all datasets",
    "Dense models are fine-tuned from BERT-base (Devlin et al., 2019) on MS MARCO for 40k steps",
]


def _window_rows():
    return [
        make_row(LONG_CHUNK, LONG_SPANS, question="How are the retrievers set up and evaluated?"),
        make_row("A short chunk with no evidence in it at all.", [], query_id="q2", chunk_id="c2"),
        make_row(GOOD_SPAN, [GOOD_SPAN], query_id="q3", chunk_id="c3", question="What does the hybrid gain?"),
    ]


def test_windows_labels_align_with_spans(tokenizer):
    rows = _window_rows()
    stats: dict[str, int] = {}
    table = tokenized_windows(rows, tokenizer, max_length=64, stride=16, stats=stats)
    assert table.schema == SILVER_WINDOWS_SCHEMA
    assert stats == {"pairs": 3, "windows": table.num_rows, "skipped_long_query": 0}
    out = table.to_pylist()
    by_pair = {}
    for r in out:
        by_pair.setdefault(r["chunk_id"], []).append(r)
    assert len(by_pair["c1"]) > 1  # the long chunk needs several windows
    assert [r["window"] for r in by_pair["c1"]] == list(range(len(by_pair["c1"])))
    assert len(by_pair["c2"]) == len(by_pair["c3"]) == 1
    assert set(by_pair["c2"][0]["labels"]) == {-100, 0}
    assert set(by_pair["c3"][0]["labels"]) == {-100, 1}  # the whole chunk is the span

    for row in rows:
        windows = by_pair[row["chunk_id"]]
        enc = tokenizer(row["question"], row["chunk"], truncation="only_second", max_length=64, stride=16,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
        assert [w["input_ids"] for w in windows] == enc["input_ids"]
        q_ids = tokenizer(row["question"], add_special_tokens=False)["input_ids"]
        positive_offsets, span_offsets = set(), set()
        for k, w in enumerate(windows):
            ids, labels = w["input_ids"], w["labels"]
            assert len(ids) <= 64 and len(ids) == len(labels) == len(w["attention_mask"])
            assert set(w["attention_mask"]) == {1}
            assert ids[1:1 + len(q_ids)] == q_ids
            assert labels[:len(q_ids) + 2] == [-100] * (len(q_ids) + 2)  # [CLS] query [SEP]
            assert labels[-1] == -100  # the closing [SEP]
            for t, (sid, (s, e)) in enumerate(zip(enc.sequence_ids(k), enc["offset_mapping"][k], strict=True)):
                overlaps = any(s < sp["end"] and sp["start"] < e for sp in row["spans"])
                if sid != 1:
                    assert labels[t] == -100
                    continue
                assert labels[t] == int(overlaps)
                if overlaps:
                    span_offsets.add((s, e))
                if labels[t] == 1:
                    positive_offsets.add((s, e))
            # decoded runs of positive tokens lie inside a span
            run: list[int] = []
            for t, lab in enumerate(labels + [-100]):
                if lab == 1:
                    run.append(ids[t])
                elif run:
                    decoded = tokenizer.decode(run).replace(" ", "")
                    assert any(decoded in sp["text"].lower().replace(" ", "") for sp in row["spans"]), decoded
                    run = []
        # every chunk token that overlaps a span is positive in at least one window
        alone = tokenizer(row["chunk"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        expected = {(s, e) for s, e in alone if any(s < sp["end"] and sp["start"] < e for sp in row["spans"])}
        assert expected == span_offsets == positive_offsets


def test_windows_skip_long_queries_and_need_a_fast_tokenizer(tokenizer):
    long_q = make_row(GOOD_SPAN, [GOOD_SPAN], question=" ".join(["retrieval"] * 40))
    stats: dict[str, int] = {}
    table = tokenized_windows([long_q] + _window_rows()[1:], tokenizer, max_length=64, stride=16, stats=stats)
    assert stats["skipped_long_query"] == 1 and stats["pairs"] == 2
    assert set(table.column("chunk_id").to_pylist()) == {"c2", "c3"}
    assert tokenized_windows([], tokenizer, max_length=64, stride=16).num_rows == 0
    with pytest.raises(ValueError):
        tokenized_windows([], object())
    with pytest.raises(ValueError):
        tokenized_windows([], tokenizer, max_length=64, stride=40)


# --- files ---------------------------------------------------------------------------------------------


def test_write_silver_loads_with_hf_datasets(tmp_path, tokenizer):
    datasets = pytest.importorskip("datasets")
    rows = _window_rows() + [make_row(METHODS, [GOOD_SPAN], query_id="q4", chunk_id="c4", rank=None,
                                      source="gold")]
    train, dev = rows[:3], rows[3:]
    counts = write_silver(tmp_path / "silver", train, dev, tokenizer, max_length=64, stride=16)
    assert counts["train_rows"] == 3 and counts["dev_rows"] == 1
    assert counts["train_positive"] == 2 and counts["dev_positive"] == 1
    assert counts["train_queries"] == 3
    assert counts["train_windows"] == pq.read_metadata(tmp_path / "silver/windows/train.parquet").num_rows
    assert pq.read_schema(tmp_path / "silver/train.parquet").equals(SILVER_SCHEMA)

    cache = str(tmp_path / "hf-cache")
    ds = datasets.load_dataset("parquet", cache_dir=cache, data_files={
        "train": str(tmp_path / "silver/train.parquet"), "dev": str(tmp_path / "silver/dev.parquet")})
    assert ds["train"].num_rows == 3 and ds["dev"].num_rows == 1
    expected = canonical_table(train).to_pylist()
    assert [dict(r) for r in ds["train"]] == expected
    first = ds["train"][0]
    assert first["spans"][0] == {"start": LONG_CHUNK.index(LONG_SPANS[0]),
                                 "end": LONG_CHUNK.index(LONG_SPANS[0]) + len(LONG_SPANS[0]), "text": LONG_SPANS[0]}
    assert ds["dev"][0]["rank"] is None and ds["dev"][0]["label"] == 1

    win = datasets.load_dataset("parquet", cache_dir=cache, data_files={
        "train": str(tmp_path / "silver/windows/train.parquet"), "dev": str(tmp_path / "silver/windows/dev.parquet")})
    assert win["train"].num_rows == counts["train_windows"]
    assert win["dev"].num_rows == counts["dev_windows"]
    direct = pq.read_table(tmp_path / "silver/windows/train.parquet").to_pylist()
    assert [dict(r) for r in win["train"]] == direct
    assert min(min(r["labels"]) for r in direct) == -100
    with_torch = win["train"].with_format("torch")
    assert with_torch[0]["input_ids"].dtype.is_floating_point is False


def test_write_silver_without_tokenizer_and_empty_dev(tmp_path):
    datasets = pytest.importorskip("datasets")
    train = canonical_table(_window_rows())
    counts = write_silver(tmp_path, train, [])
    assert counts == {"train_rows": 3, "train_positive": 2, "train_queries": 3, "dev_rows": 0, "dev_positive": 0,
                      "dev_queries": 0}
    assert not (tmp_path / "windows").exists()
    empty = pq.read_table(tmp_path / "dev.parquet")
    assert empty.num_rows == 0 and empty.schema.equals(SILVER_SCHEMA)
    # datasets refuses empty splits ("corresponds to no data"), so only the train split is loaded here
    ds = datasets.load_dataset("parquet", cache_dir=str(tmp_path / "hf-cache"),
                               data_files={"train": str(tmp_path / "train.parquet")})
    assert ds["train"].num_rows == 3
