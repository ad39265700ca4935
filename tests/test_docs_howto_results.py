"""docs/howto-results.md runs as written: every ```python block of the page, read from the page by a fenced-block
parser, runs against a real night (one `verbatim-batch nightly` over two small papers, on the session's Ray: its
run folder is a chain folder, its root a nightly root) and the Iceberg tables `verbatim-batch publish` makes of it.
Each block names its folder on one line (`run = "..."`, `root = "..."` or `lake = "..."`), which the test points at
the real ones; nothing else of a block is changed."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
from pathlib import Path

import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.runs import read_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "howto-results.md"
FOLDER_LINE = re.compile(r'^(run|root|lake) = "[^"]*"$', re.M)

PAPERS = {
    "paper-a": "# Verbatim Evidence for Careful Readers\n\n## Abstract\n\n"
               "Readers of research papers want evidence they can quote word for word.\n\n## 1 Method\n\n"
               + " ".join(["A token classifier marks the evidence tokens of each retrieved chunk."] * 5)
               + "\nThe verbatim gate rejects every span whose text is not found at its offsets in the chunk.\n",
    "paper-b": "# Sparse and Dense Retrieval\n\n## 1 Results\n\n"
               + " ".join(["Dense retrieval embeds every chunk once and answers each query by nearest neighbours."] * 5)
               + "\nSparse retrieval with BM25 remains a strong baseline for exact sentences.\n",
}
QUERIES = [
    {"query_id": "q-gate",
     "query": "The verbatim gate rejects every span whose text is not found at its offsets in the chunk."},
    {"query_id": "q-bm25", "query": "Sparse retrieval with BM25 remains a strong baseline for exact sentences."},
]


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the page's fenced ```python blocks, in order (a fence opens with three or more backticks and
    an info string, and closes with a line of at least as many backticks and nothing else)."""
    blocks, body, fence = [], None, ""
    for line in markdown.splitlines():
        stripped = line.strip()
        if body is None:
            m = re.match(r"^(`{3,})\s*([\w+-]*)", stripped)
            if m:
                fence, info, body = m.group(1), m.group(2), []
                if info != "python":
                    body = ["<not python>"]
        elif re.fullmatch(rf"{fence}`*", stripped):
            if body != ["<not python>"]:
                blocks.append("\n".join(body) + "\n")
            body = None
        elif body != ["<not python>"]:
            body.append(line)
    assert body is None, "a fence is not closed"
    return blocks


def test_the_parser_finds_python_blocks_only():
    page = "x\n```python\na = 1\n```\n```bash\nls\n```\n````python\nb = '```'\n````\n"
    assert python_blocks(page) == ["a = 1\n", "b = '```'\n"]


@pytest.fixture(scope="module")
def night(ray_local, tmp_path_factory):
    """One committed night (its root, its run folder) and the Iceberg warehouse it was published to."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = tmp_path_factory.mktemp("howto")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for name, text in PAPERS.items():
        (corpus / f"{name}.md").write_text(text, encoding="utf-8")
    queries = tmp / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in QUERIES), encoding="utf-8")
    root, lake = tmp / "nightly", tmp / "lake"
    assert main(["nightly", "--input", str(corpus), "--queries", str(queries), "--root", str(root),
                 "--run-id", "night-1", "--top-k", "2"]) == 0
    assert main(["publish", str(root), "--warehouse", str(lake)]) == 0
    run = root / "runs" / "night-1"
    assert read_table(str(run / "spans"), "spans").num_rows > 0  # datasets refuses an empty table (the page says so)
    return {"run": str(run), "root": str(root), "lake": str(lake)}


def test_every_python_block_of_the_page_runs(night, tmp_path, monkeypatch):
    import datasets

    # the examples' load_dataset, with its cache in this test's folder rather than the user's
    monkeypatch.setattr(datasets, "load_dataset", functools.partial(datasets.load_dataset,
                                                                    cache_dir=str(tmp_path / "hf")))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # a relative path in an example would resolve here, to nothing
    blocks = python_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 8, f"the page has {len(blocks)} python blocks"
    spans = read_table(str(Path(night["run"]) / "spans"), "spans").to_pylist()
    for i, block in enumerate(blocks, 1):
        names = FOLDER_LINE.findall(block)
        assert len(names) == 1, f"block {i} names no folder, or several, on a line of its own: {block}"
        assert 3 <= len(block.splitlines()) <= 6, f"block {i} is not 3-6 lines: {block}"
        code = FOLDER_LINE.sub(lambda m: f"{m.group(1)} = {night[m.group(1)]!r}", block)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{PAGE.name}, python block {i}", "exec"), {"__name__": "howto"})  # noqa: S102
        if "print(" in block or ".show()" in block:
            assert out.getvalue().strip(), f"block {i} printed nothing"
            shown = out.getvalue()
            assert any(s["paper_id"] in shown or s["query"][:20] in shown for s in spans) or "night-1" in shown, \
                f"block {i} shows none of the run's spans: {shown}"
