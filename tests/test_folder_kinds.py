"""Every folder a command is given is checked for what it is before any work (issue 53, item 1), through one
resolver (``core.runs.what_folder``): a committed chain or run folder as a nightly ``--root``, a run folder as a
corpus, a nightly root where one run is wanted; each refused with one line naming the right folder, or taken
for what it stands for (a chain folder's stage, a nightly root's current night). Runs are hand-made committed
folders (real manifests and Parquet); the refusals come before Ray starts, so none starts here."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.runs import (
    CHAIN,
    NIGHTLY_ROOT,
    OTHER,
    RUN,
    STAGES,
    build_manifest,
    expect_tables,
    what_folder,
    write_manifest,
)

EXAMPLES = resources.files("verbatim_batch") / "examples"


def _run(path: Path, command: str, tables: dict[str, pa.Table], stages: dict | None = None,
         created: str = "2026-11-28T01:00:00+00:00") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        (path / name).mkdir(exist_ok=True)
        pq.write_table(table, path / name / "part-0.parquet")
    manifest = build_manifest(run_id="n1", command=command, config={}, inputs=[],
                              tables={t: {"rows": v.num_rows, "files": 1} for t, v in tables.items()},
                              counts={}, timings_s={}) | {"created_at": created}
    manifest |= {"stages": stages} if stages else {}
    write_manifest(str(path), manifest)
    return path


CHUNKS = pa.table({"chunk_id": ["c1"], "paper_id": ["p1"], "chunk_index": [0], "text": ["The cell wall is thick."]})


@pytest.fixture()
def night(tmp_path) -> Path:
    """A nightly root holding one committed night (a chain folder of a chunks and a spans stage)."""
    chain = tmp_path / "root" / "runs" / "n1"
    _run(chain / "chunks", "chunk", {"chunks": CHUNKS})
    _run(chain / "spans", "extract", {"spans": pa.table({"query": ["q"]})}, created="2026-11-28T01:30:00+00:00")
    _run(chain, "nightly", {}, {"chunks": "chunks", "spans": "spans"})
    (tmp_path / "root" / "CURRENT").write_text("n1\n")
    (tmp_path / "root" / "current").symlink_to("runs/n1")
    return tmp_path / "root"


def _refused(capsys, argv: list[str], *says: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for s in says:
        assert s in err, err
    return err


def test_what_a_folder_is(night, tmp_path):
    chain = night / "runs" / "n1"
    assert what_folder(str(night)).kind == NIGHTLY_ROOT
    assert (what_folder(str(chain)).kind, what_folder(str(chain)).root) == (CHAIN, str(night))
    assert what_folder(str(night / "current")).root == str(night)  # the link resolved to the night it names
    assert (what_folder(str(chain / "chunks")).kind, what_folder(str(chain / "chunks")).command) == (RUN, "chunk")
    demo = tmp_path / "demo"
    _run(demo / "chunks", "chunk", {"chunks": CHUNKS})
    assert what_folder(str(demo)).kind == STAGES
    assert what_folder(str(EXAMPLES / "corpus")).kind == OTHER
    # a chain folder, a nightly root and a demo's output each stand for the stage run that holds the table
    assert expect_tables(str(night), "--chunks", ("chunks",)) == str(chain / "chunks")
    assert expect_tables(str(chain), "--chunks", ("chunks",)) == str(chain / "chunks")
    assert expect_tables(str(demo), "--chunks", ("chunks",)) == str(demo / "chunks")


@pytest.mark.parametrize("given", ["runs/n1", "current", "runs/n1/chunks", "runs"])
def test_a_nights_folder_as_nightly_root_is_refused_naming_the_root(night, capsys, given):
    before = sorted(str(p) for p in night.rglob("*"))
    _refused(capsys, ["nightly", "--root", str(night / given), "--input", str(EXAMPLES / "corpus"),
                      "--queries", str(EXAMPLES / "queries.jsonl")], f"give --root {night}")
    assert sorted(str(p) for p in night.rglob("*")) == before  # nothing written (no CURRENT, no runs/ inside)


def test_a_chain_folder_as_nightly_root_is_refused(tmp_path, capsys):
    chain = tmp_path / "chain-1"
    _run(chain / "chunks", "chunk", {"chunks": CHUNKS})
    _run(chain, "run", {}, {"chunks": "chunks"})
    _refused(capsys, ["nightly", "--root", str(chain), "--input", str(EXAMPLES / "corpus"),
                      "--queries", str(EXAMPLES / "queries.jsonl")],
             "is a chain folder (a committed `run` run), not a nightly root")
    assert sorted(p.name for p in chain.iterdir()) == ["chunks", "manifest.json"]  # no CURRENT, no runs/


@pytest.mark.parametrize("command", ["run", "chunk"])
def test_a_run_folder_as_input_is_refused(night, tmp_path, capsys, command):
    out = ["--output", str(tmp_path / "out")]
    queries = ["--queries", str(EXAMPLES / "queries.jsonl")] if command == "run" else []
    for given, what in ((night / "runs" / "n1" / "chunks", "is a run folder of stage chunk, not a corpus"),
                        (night / "runs" / "n1", "is a committed night of the nightly root"),
                        (night, "is a nightly root, not a corpus")):
        _refused(capsys, [command, "--input", str(given), *out, *queries], what, "give --input your papers")
    assert not (tmp_path / "out").exists()


def test_report_on_a_nightly_root_reports_its_current_night(night, capsys):
    assert main(["report", str(night)]) == 0
    out = capsys.readouterr().out
    assert str(night / "runs" / "n1" / "report.html") in out
    assert (night / "runs" / "n1" / "report.html").exists()
    _refused(capsys, ["report", str(night / "runs")], f"is inside the nightly root {night}, not a run: give {night}")


def test_evaluate_takes_a_chain_folder_or_a_nightly_root_for_chunks(night, tmp_path, capsys):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"query": "how thick is the wall", "chunk_id": "c1", "spans": []}) + "\n")
    preds = tmp_path / "preds.jsonl"
    preds.write_text("")
    for given in (night, night / "runs" / "n1"):
        assert main(["evaluate", "--gold", str(gold), "--sweep-threshold", "0.5", "--chunks", str(given)]) == 0
        capsys.readouterr()
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(capsys, ["evaluate", "--gold", str(gold), "--sweep-threshold", "0.5", "--chunks", str(empty)],
             f"{empty} has no manifest.json: not a committed run (--chunks takes a run folder")
    shutil.rmtree(empty)
