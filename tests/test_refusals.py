"""A refusal before work leaves nothing, and a chain checks everything it reads before its first stage."""

from __future__ import annotations

import shutil
from importlib import resources

import pytest

from verbatim_batch.cli import main

EXAMPLES = resources.files("verbatim_batch") / "examples"


@pytest.fixture()
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    name = sorted(p.name for p in (EXAMPLES / "corpus").iterdir() if p.name.endswith(".md"))[0]
    shutil.copyfile(EXAMPLES / "corpus" / name, folder / name)
    (tmp_path / "queries.jsonl").write_text('{"query": "what is measured"}\n')
    return folder


def _refused(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0, err


@pytest.mark.parametrize("command", ["run", "nightly"])
def test_a_chain_with_a_missing_input_stops_before_chunking_and_leaves_nothing(tmp_path, corpus, capsys, command):
    out = ["--output", str(tmp_path / "out")] if command == "run" else ["--root", str(tmp_path / "out")]
    base = [command, "--input", str(corpus), *out]
    _refused(capsys, [*base, "--queries", str(tmp_path / "querys.jsonl")], "query file not found")
    _refused(capsys, [*base, "--queries", str(tmp_path / "queries.jsonl"), "--metadata", str(tmp_path / "m.jsonl")],
             "metadata not found")
    (tmp_path / "noquery.jsonl").write_text('{"text": "no query column"}\n')
    _refused(capsys, [*base, "--queries", str(tmp_path / "noquery.jsonl")], "needs a 'query' column")
    _refused(capsys, [*base, "--queries", str(tmp_path / "queries.jsonl"), "--extractor", "llm"],
             "the llm extractor needs --model")
    assert not (tmp_path / "out").exists()


def test_an_output_inside_the_input_is_refused_before_the_input_is_listed(tmp_path, corpus, capsys):
    """`chunk --input /` used to list every file on the machine before refusing; the output is checked first."""
    _refused(capsys, ["chunk", "--input", "/", "--output", str(tmp_path / "runs" / "z")],
             "is inside the input folder /")
    _refused(capsys, ["chunk", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "y")], "input not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "queries.jsonl"]
