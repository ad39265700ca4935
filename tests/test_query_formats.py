"""A query file in the wrong shape is refused in the user's terms (issue 53, item 2): the expected format (one
JSON object per line with query_id and query, or a Parquet/CSV table with those columns) and the line or row
that failed, never an internal column name (``__error__``, ``__line__``)."""

from __future__ import annotations

import json
from importlib import resources

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.records import read_queries

EXAMPLES = resources.files("verbatim_batch") / "examples"
FORMAT = 'one JSON object per line with "query_id" and "query"'


def _shapes(tmp_path):
    (tmp_path / "plain.txt").write_text("what is measured\nhow thick is the wall\n")
    (tmp_path / "array.json").write_text(json.dumps([{"query_id": "q1", "query": "what is measured"}]) + "\n")
    (tmp_path / "pretty.json").write_text(json.dumps([{"query": "what is measured"}], indent=2) + "\n")
    (tmp_path / "nocol.csv").write_text("id,question\nq1,what is measured\n")
    pq.write_table(pa.table({"question": ["what is measured"]}), tmp_path / "nocol.parquet")
    (tmp_path / "nokey.jsonl").write_text('{"question": "what is measured"}\n')
    return {"plain.txt": "line 1 is not JSON", "array.json": "line 1 is not a JSON object",
            "pretty.json": "line 1 is not JSON", "nocol.csv": "row 1 has no 'query' (its fields: id, question)",
            "nocol.parquet": "row 1 has no 'query' (its fields: question)",
            "nokey.jsonl": "line 1 has no 'query' (its fields: question)"}


def test_a_query_file_of_another_shape_names_the_format_and_the_line(tmp_path):
    for name, says in _shapes(tmp_path).items():
        with pytest.raises(ValueError) as err:
            read_queries(str(tmp_path / name))
        message = str(err.value)
        assert says in message and FORMAT in message and "Parquet/CSV table" in message, message
        assert "__" not in message.replace(str(tmp_path), ""), message


def test_a_good_file_with_a_bad_line_still_reads(tmp_path):
    """One malformed line among queries is a rejected row, as before (not a refusal)."""
    (tmp_path / "q.jsonl").write_text('{"query_id": "q1", "query": "what is measured"}\nnot json\n')
    table, rejected = read_queries(str(tmp_path / "q.jsonl"))
    assert table["query"].to_pylist() == ["what is measured"] and rejected == 1


def test_the_chain_refuses_it_with_one_line_before_any_work(tmp_path, capsys):
    _shapes(tmp_path)
    assert main(["run", "--input", str(EXAMPLES / "corpus"), "--queries", str(tmp_path / "plain.txt"),
                 "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "line 1 is not JSON" in err and FORMAT in err and "__error__" not in err, err
    assert not (tmp_path / "out").exists()
