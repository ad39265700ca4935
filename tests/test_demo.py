"""``demo --n-papers N``: the first N bundled papers that have labelled queries, their metadata and only those
queries.
(The whole demo runs in tests/test_multinode.py, its tables checked by digest; the plain-install check runs
``demo --n-papers`` from a plain install.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verbatim_batch.cli import main
from verbatim_batch.cli.commands import EXAMPLES, demo_chain


def _jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_a_smaller_demo_takes_the_first_papers_and_their_queries(tmp_path):
    every = _jsonl(str(EXAMPLES / "queries.jsonl"))
    asked = {q["paper_id"] for q in every}
    names = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md") if p.stem in asked)
    for n in (1, 2, 3):  # the first two papers by name have no query: a paper of its own would retrieve nothing
        chain = demo_chain(n, str(tmp_path / str(n)))
        assert sorted(p.name for p in Path(chain.input).glob("*.md")) == names[:n]
        ids = {name.removesuffix(".md") for name in names[:n]}
        assert {r["paper_id"] for r in _jsonl(chain.metadata)} == ids
        queries = _jsonl(chain.queries)
        assert queries == [q for q in every if q["paper_id"] in ids] and 0 < len(queries) < len(every)
    whole = demo_chain()
    assert whole.input == str(EXAMPLES / "corpus") and whole.queries == str(EXAMPLES / "queries.jsonl")


def test_n_papers_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse: one line, exit 2
        main(["demo", "--n-papers", "0", "--output", "unused"])
    assert exc.value.code == 2 and "--n-papers" in capsys.readouterr().err
