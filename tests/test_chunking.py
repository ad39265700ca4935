"""Chunker invariants (property tests) and the tricky cases (examples)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verbatim_batch.core.tables import chunk_id
from verbatim_batch.corpus.chunker import (
    FORCED_SPLIT,
    OVERSIZED_BLOCK,
    UNCLOSED_FENCE,
    UNDERSIZED,
    ChunkerConfig,
    build_context,
    chunk_markdown,
    first_heading,
    is_section_heading,
    verify_chunks,
)

# --- generated markdown ------------------------------------------------------------

WORDS = st.sampled_from(
    ["model", "données", "τ", "F1", "BERT", "(Smith et al., 2019)", "45.3%", "a", "the", "naïve",
     "中文", "≤", "&amp;", "x*y", "[12]", "end.", "Fig.", "e.g.", "#tag", "a|b", "`code`", "🙂"]
)
SAFE_LINE = st.lists(WORDS, min_size=1, max_size=25).map(" ".join)


@st.composite
def paragraph(draw):
    return "\n".join(draw(st.lists(SAFE_LINE, min_size=1, max_size=6)))


@st.composite
def heading(draw):
    level = draw(st.integers(1, 6))
    return "#" * level + " " + draw(SAFE_LINE)


@st.composite
def table(draw):
    cols = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 12))
    lines = ["| " + " | ".join(f"h{c}" for c in range(cols)) + " |", "|" + "---|" * cols]
    for _ in range(rows):
        lines.append("| " + " | ".join(draw(WORDS).replace("|", "/") for _ in range(cols)) + " |")
    body = "\n".join(lines)
    where = draw(st.sampled_from(["before", "after", "none"]))
    caption = f"Table {draw(st.integers(1, 9))}: " + draw(SAFE_LINE)
    sep = draw(st.sampled_from(["\n", "\n\n"]))
    if where == "before":
        return caption + sep + body, "table"
    if where == "after":
        return body + "\n\n" + caption, "table_after"
    return body, "table"


@st.composite
def fence(draw):
    char = draw(st.sampled_from(["```", "~~~"]))
    content = draw(
        st.lists(
            st.one_of(SAFE_LINE, st.just("# a comment, not a heading"), st.just("| not | a table |"), st.just("")),
            max_size=8,
        )
    )
    return "\n".join([char + draw(st.sampled_from(["", "python", "json"])), *content, char]), "fence"


@st.composite
def document(draw):
    """Markdown plus the [start, end) spans of blocks that must never be split."""
    blocks = draw(
        st.lists(
            st.one_of(
                heading().map(lambda s: (s, "")),
                paragraph().map(lambda s: (s, "")),
                table(),
                fence(),
                st.just(("~~~~~unclosed fence opener", "")),
            ),
            min_size=1,
            max_size=40,
        )
    )
    parts, protected, pos = [], [], 0
    for k, (text, kind) in enumerate(blocks):
        if k:
            sep = draw(st.sampled_from(["\n\n", "\n\n\n", "\n \n"]))
            if blocks[k - 1][1] == "table_after" and kind.startswith("table"):
                # "T1, caption, T2" is ambiguous; the chunker gives the caption to T2.
                sep = "\n\nSeparator paragraph.\n\n"
            parts.append(sep)
            pos += len(sep)
        if kind:
            protected.append((pos, pos + len(text)))
        parts.append(text)
        pos += len(text)
    doc = "".join(parts) + draw(st.sampled_from(["", "\n", "\n\n  "]))
    if draw(st.booleans()):  # CRLF papers: offsets shift, blocks stay whole
        crlf = doc.replace("\n", "\r\n")
        remap = [0] * (len(doc) + 1)
        extra = 0
        for i, ch in enumerate(doc):
            remap[i] = i + extra
            if ch == "\n":
                extra += 1
        remap[len(doc)] = len(doc) + extra
        protected = [(remap[s], remap[e]) for s, e in protected]
        # a block's end lands after its last char, before the "\r" of its line end
        doc = crlf
    return doc, protected


configs = st.builds(
    lambda lo, hi, levels: ChunkerConfig(min_chars=min(lo, hi), max_chars=hi, heading_levels=levels),
    st.integers(0, 400),
    st.integers(40, 2500),
    st.sets(st.integers(1, 6), min_size=1).map(tuple),
)


def assert_invariants(text: str, chunks, config: ChunkerConfig) -> None:
    verify_chunks(text, chunks)  # exact offsets + every non-whitespace char exactly once
    for k, c in enumerate(chunks):
        assert c.index == k
        assert text[c.start : c.end] == c.text
        assert c.text and not c.text[0].isspace() and not c.text[-1].isspace()
        if c.end - c.start > config.max_chars:
            assert OVERSIZED_BLOCK in c.flags, c
        if UNDERSIZED in c.flags:
            assert len(c.text) < config.min_chars
            # merging with either neighbour would have broken max_chars
            if k + 1 < len(chunks):
                assert chunks[k + 1].end - c.start > config.max_chars
            if k > 0:
                assert c.end - chunks[k - 1].start > config.max_chars
        else:
            assert len(c.text) >= config.min_chars


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document(), configs)
def test_structured_markdown_invariants(doc, config):
    text, protected = doc
    chunks = chunk_markdown(text, config)
    assert_invariants(text, chunks, config)
    for s, e in protected:  # tables (with captions) and code fences are never split
        holders = [c for c in chunks if c.start <= s and e <= c.end + 1]
        assert len(holders) == 1, (text[s:e], [(c.start, c.end) for c in chunks])
    assert chunk_markdown(text, config) == chunks  # pure and deterministic


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab #|`~\n\r\t-*.:é中🙂\u00a0\u2028\x0c")), max_size=3000),
    configs,
)
def test_arbitrary_text_invariants(text, config):
    chunks = chunk_markdown(text, config)
    assert_invariants(text, chunks, config)
    if text.strip():
        assert chunks
    else:
        assert chunks == []


# --- examples --------------------------------------------------------------------

LONG = "Sentence about parsing with beam search and dynamic programming. " * 12


def test_heading_path_and_context_are_separate_from_text():
    md = f"# Paper\n\n## 1 Intro\n\n{LONG}\n\n### 1.1 Motivation\n\n{LONG}\n\n## 2 Method\n\n{LONG}\n"
    chunks = chunk_markdown(md, ChunkerConfig(min_chars=100, max_chars=2000))
    paths = [c.heading_path for c in chunks]
    assert ("Paper", "1 Intro", "1.1 Motivation") in paths
    assert ("Paper", "2 Method") in paths
    ctx = build_context("Paper", ("Paper", "1 Intro", "1.1 Motivation"))
    assert ctx == "Paper > 1 Intro > 1.1 Motivation"
    assert all("1.1 Motivation >" not in c.text for c in chunks)
    assert first_heading(md) == "Paper"


def test_heading_inside_fence_is_not_a_heading():
    md = f"## 1 Code\n\n{LONG}\n\n```python\n## not a section\n# comment\n```\n\n{LONG}\n"
    chunks = chunk_markdown(md, ChunkerConfig(min_chars=10, max_chars=5000))
    assert len(chunks) == 1
    assert all("not a section" not in p for c in chunks for p in c.heading_path)


def test_unclosed_fence_does_not_swallow_later_sections():
    md = f"## 1 A\n\n{LONG}\n\n```python\nx = 1\n\n## 2 B\n\n{LONG}\n\n## 3 C\n\n{LONG}\n"
    chunks = chunk_markdown(md, ChunkerConfig(min_chars=10, max_chars=5000))
    assert [c.heading_path[-1] for c in chunks] == ["1 A", "2 B", "3 C"]
    assert UNCLOSED_FENCE in chunks[0].flags
    verify_chunks(md, chunks)


def test_levels_5_and_6_stay_inside_their_section_and_are_kept():
    md = f"## 1 A\n\n{LONG}\n\n##### Deep five\n\n{LONG}\n\n###### Deep six\n\ntail\n"
    chunks = chunk_markdown(md, ChunkerConfig(min_chars=10, max_chars=5000))
    assert len(chunks) == 1 and "##### Deep five" in chunks[0].text and "###### Deep six" in chunks[0].text


def test_heading_levels_are_configurable():
    md = f"## 1 A\n\n{LONG}\n\n### 1.1 B\n\n{LONG}\n"
    assert len(chunk_markdown(md, ChunkerConfig(min_chars=10, heading_levels=(1, 2, 3)))) == 2
    assert len(chunk_markdown(md, ChunkerConfig(min_chars=10, heading_levels=(1, 2)))) == 1


@pytest.mark.parametrize("before", [True, False])
def test_table_caption_travels_with_table(before):
    rows = "\n".join(f"| row {i} | {i}.5 |" for i in range(80))
    table = f"| name | score |\n|---|---|\n{rows}"
    caption = "Table 2: Scores of every system on the dev set."
    block = f"{caption}\n\n{table}" if before else f"{table}\n\n{caption}"
    md = f"## 1 A\n\n{LONG}\n\n{block}\n\n{LONG}\n"
    chunks = chunk_markdown(md, ChunkerConfig(min_chars=10, max_chars=900))
    holder = [c for c in chunks if "| row 0 |" in c.text]
    assert len(holder) == 1 and caption in holder[0].text and "| row 79 |" in holder[0].text
    assert OVERSIZED_BLOCK in holder[0].flags  # the table is larger than max_chars: whole, flagged
    assert all(len(c.text) <= 900 for c in chunks if c is not holder[0])


def test_long_section_splits_at_blank_lines_and_small_ones_merge():
    paras = [f"Paragraph {i}. " + "word " * 150 for i in range(10)]
    md = "## 1 Long\n\n" + "\n\n".join(paras) + "\n\n## 2 Short\n\nTiny.\n"
    cfg = ChunkerConfig(min_chars=500, max_chars=2000)
    chunks = chunk_markdown(md, cfg)
    assert all(len(c.text) <= 2000 for c in chunks)
    for c in chunks:  # cuts fall between paragraphs, never inside one
        assert c.text.startswith(("## 1 Long", "Paragraph", "## 2 Short"))
    assert "Tiny." in chunks[-1].text and chunks[-1].text.startswith("Paragraph")  # merged back
    assert not any(FORCED_SPLIT in c.flags for c in chunks)


def test_huge_single_line_is_cut_at_spaces_and_flagged():
    md = "word " * 50_000
    chunks = chunk_markdown(md, ChunkerConfig(max_chars=5000))
    assert len(chunks) >= 50
    assert all(len(c.text) <= 5000 and FORCED_SPLIT in c.flags for c in chunks)
    verify_chunks(md, chunks)


def test_text_without_any_whitespace_gets_hard_cuts():
    md = "x" * 12_001
    chunks = chunk_markdown(md, ChunkerConfig(max_chars=5000, min_chars=0))
    assert [len(c.text) for c in chunks] == [5000, 5000, 2001]


def test_crlf_offsets_are_exact():
    md = f"## 1 A\r\n\r\n{LONG}\r\n\r\n## 2 B\r\n\r\n{LONG}\r\n"
    chunks = chunk_markdown(md, ChunkerConfig(min_chars=10))
    assert [c.heading_path for c in chunks] == [("1 A",), ("2 B",)]
    assert all(not c.text.endswith("\r") for c in chunks)
    verify_chunks(md, chunks)


def test_empty_and_whitespace_papers_have_no_chunks():
    assert chunk_markdown("") == []
    assert chunk_markdown(" \n\r\n\t ") == []


def test_chunk_ids_are_deterministic_and_sensitive():
    cfg = ChunkerConfig()
    a = chunk_id("P19-1001", "text", cfg.hash)
    assert a == chunk_id("P19-1001", "text", cfg.hash)
    assert a != chunk_id("P19-1002", "text", cfg.hash)
    assert a != chunk_id("P19-1001", "text!", cfg.hash)
    assert a != chunk_id("P19-1001", "text", ChunkerConfig(max_chars=4000).hash)
    assert a != chunk_id("P19-1001", "text", cfg.hash, occurrence=1)
    assert cfg.hash == ChunkerConfig().hash


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        ChunkerConfig(min_chars=600, max_chars=500)
    with pytest.raises(ValueError):
        ChunkerConfig(heading_levels=(0, 7))


# --- titles ------------------------------------------------------------------------


@pytest.mark.parametrize("heading", [
    "Abstract", "ABSTRACT", "Abstract:", "**Abstract**", "###### Abstract", "Introduction", "1 Introduction",
    "1. Introduction", "2 Related work", "Related Work", "Method", "Methods", "3 Methodology", "Results",
    "4.2 Results", "Conclusion", "Conclusions", "6 Conclusions and Future Work", "References", "Acknowledgments",
    "Acknowledgements", "Appendix", "Appendix A", "Appendix B.2", "A.1 Prompts", "II. Related Work",
    "3 Corpus creation", "3.1 Data collection and preprocessing",
])
def test_section_headings_are_recognised(heading):
    assert is_section_heading(heading)


@pytest.mark.parametrize("title", [
    "Inferential Question Answering", "PeerQA: A Scientific Question Answering Dataset from Peer Reviews",
    "A Survey of Evidence Extraction", "I Know What You Retrieved", "Abstractive Summarization of Papers",
    "Methods Matter: Revisiting BM25", "ACL-Verbatim: hallucination-free question answering for research",
])
def test_titles_are_not_section_headings(title):
    assert not is_section_heading(title)


@pytest.mark.parametrize("text, title", [
    # a web-page dump: metadata lines, then ###### Abstract (seed paper 000): the Title: line, not "Abstract"
    ("Title: ACL-Verbatim: QA for research\n\nURL Source: https://x\n\nMarkdown Content:\nA. Author 1\n\n"
     "###### Abstract\n\nWe study.\n\n## 1 Introduction\n\nText.\n", "ACL-Verbatim: QA for research"),
    # no heading at all (seed paper 001): the first non-empty line
    ("\n\nClaim-Aware Scientific RAG: Evidence First\n\nJ. Chen\n\nAbstract\n\nRAG is...\n",
     "Claim-Aware Scientific RAG: Evidence First"),
    # a title heading above ## Abstract (seed papers 003, 004)
    ("\n\n# PeerQA: A Dataset\n\nT. B.<sup>1</sup>\n\n## Abstract\n\nWe present.\n", "PeerQA: A Dataset"),
    # section headings only: never one of them
    ("## 1 Introduction\n\nBody text here.\n\n## 2 Method\n\nMore.\n", "Body text here."),
    ("<!-- image -->\n\n**Bold Title Line**\n\n## Abstract\n", "Bold Title Line"),
    ("```\n# not a heading\n```\n# Real Title\n", "Real Title"),
    ("# " + "long " * 80 + "\n", ("long " * 80).strip()[:199] + "…"),
    ("", None), ("\n\n   \n", None),
])
def test_first_heading_picks_the_title(text, title):
    assert first_heading(text) == title
