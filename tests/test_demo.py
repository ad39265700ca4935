"""``demo --n-papers N``: the first N bundled papers, their metadata and only the queries labelled with them.
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
    chain = demo_chain(3, str(tmp_path))
    names = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md"))
    assert sorted(p.name for p in Path(chain.input).glob("*.md")) == names[:3]
    ids = {n.removesuffix(".md") for n in names[:3]}
    assert {r["paper_id"] for r in _jsonl(chain.metadata)} == ids
    queries = _jsonl(chain.queries)
    every = _jsonl(str(EXAMPLES / "queries.jsonl"))
    assert queries == [q for q in every if q["paper_id"] in ids] and 0 < len(queries) < len(every)
    whole = demo_chain()
    assert whole.input == str(EXAMPLES / "corpus") and whole.queries == str(EXAMPLES / "queries.jsonl")


def test_n_papers_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse: one line, exit 2
        main(["demo", "--n-papers", "0", "--output", "unused"])
    assert exc.value.code == 2 and "--n-papers" in capsys.readouterr().err
