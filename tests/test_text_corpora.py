"""Plain-text corpora (issue 43): a folder of ``.txt`` papers (the seeds as they come) is read like markdown, and
any file a corpus folder does not read is counted and named, in the output and the manifest, never skipped
without a word."""

from __future__ import annotations

import json

from verbatim_batch.corpus import readers as corpus


def _folder(tmp_path):
    c = tmp_path / "c"
    (c / "sub").mkdir(parents=True)
    (c / "2023.acl-long.1.txt").write_text("A plain-text paper.\n\nIts second paragraph says more.\n")
    (c / "sub" / "notes.markdown").write_text("# Notes\n\nMarkdown under another name.\n")
    (c / "paper.md").write_text("# Paper\n\nBody.\n")
    (c / "scan.pdf").write_bytes(b"%PDF-1.7")
    (c / "sub" / "table.docx").write_bytes(b"PK")
    (c / "metadata.jsonl").write_text(json.dumps({"paper_id": "paper", "title": "T"}) + "\n")
    return c


def test_text_files_are_papers_named_by_their_stem(tmp_path):
    c = _folder(tmp_path)
    assert corpus.detect_format(str(c)) == "md"
    _, files = corpus.list_sources(str(c), "md")
    assert sorted(corpus.md_paper_id(f.path) for f in files) == ["2023.acl-long.1", "notes", "paper"]
    only_txt = tmp_path / "t"
    only_txt.mkdir()
    (only_txt / "a.txt").write_text("text")
    assert corpus.detect_format(str(only_txt)) == "md"


def test_files_a_folder_does_not_read_are_counted_and_named(tmp_path):
    c = _folder(tmp_path)
    n, first = corpus.skipped_files(str(c), "md", ignore=(str(c / "metadata.jsonl"),))
    assert (n, first) == (2, [str(c / "scan.pdf"), str(c / "sub" / "table.docx")])
    n, first = corpus.skipped_files(str(c), "md", limit=1)
    assert (n, first) == (3, [str(c / "metadata.jsonl")])
    assert corpus.skipped_files(str(c / "paper.md"), "md") == (0, [])  # a file input skips nothing


def test_a_chunk_run_says_what_it_skipped(ray_local, tmp_path, capsys):
    from verbatim_batch.cli import main

    c = _folder(tmp_path)
    out = tmp_path / "run"
    assert main(["chunk", "--input", str(c), "--output", str(out), "--metadata", str(c / "metadata.jsonl")]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["papers"] == 3 and manifest["counts"]["files_skipped"] == 2
    assert manifest["skipped_files"] == {"count": 2, "first": [str(c / "scan.pdf"), str(c / "sub" / "table.docx")],
                                         "why": "not .md/.markdown/.txt files"}
    said = [line for line in printed.splitlines() if "not read" in line]
    assert said == [f"  2 file(s) in the corpus folder not read, not .md/.markdown/.txt files: {c / 'scan.pdf'}, "
                    f"{c / 'sub' / 'table.docx'}"]
