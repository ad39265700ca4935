"""``verify`` and the night's fallback check as Ray tasks: one per papers row group, the same result as in process.

The run's tables are rewritten with small row groups (2 papers, 5 chunks) so that the checks split into several
units, each needing chunk row groups of its own and of its neighbours."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import reindex_files

from verbatim_batch.core import tasks
from verbatim_batch.corpus.chunker import ChunkerConfig
from verbatim_batch.quality import verify


def _paper(k: int) -> str:
    return f"# Paper {k}\n\n## Method\n\n" + "".join(f"Sentence {i} of paper {k} says something.\n\n" for i in range(8))


def _small_groups(run: Path) -> None:
    for table, size in (("papers", 2), ("chunks", 5)):
        for f in sorted((run / table).glob("*.parquet")):
            pq.write_table(pq.read_table(f), f, row_group_size=size)
    reindex_files(run)  # the rows are as committed; their files.json follows the new row groups


@pytest.fixture(scope="module")
def split_run(ray_local, tmp_path_factory):
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    root = tmp_path_factory.mktemp("verify-tasks")
    (root / "c").mkdir()
    for k in range(7):
        (root / "c" / f"p{k}.md").write_text(_paper(k))
    out, _ = run_chunk(ChunkJob(input=str(root / "c"), output=str(root / "run"),
                                chunker=ChunkerConfig(min_chars=0, max_chars=120)))
    _small_groups(Path(out))
    return root, Path(out)


def _tampered(run: Path, dest: Path, table: str, change) -> str:
    shutil.copytree(run, dest)
    f = sorted((dest / table).glob("*.parquet"))[0]
    pq.write_table(change(pq.read_table(f)), f, row_group_size=2 if table == "papers" else 5)
    reindex_files(dest)  # the rows' own checks are under test here, not the byte check
    return str(dest)


def _set_text(t: pa.Table, row: int) -> pa.Table:
    values = t["text"].to_pylist()
    values[row] = "Invented " + values[row][9:]
    return t.set_column(t.schema.get_field_index("text"), "text", pa.array(values, pa.string()))


def _both(run: str, monkeypatch, max_errors: int = 20) -> tuple[dict, dict, list[int]]:
    """``verify_run`` as Ray tasks (the session's local Ray is up), then in this process; and the number of
    calls each ``in_tasks`` was given."""
    from verbatim_batch.engine import sink

    calls: list[int] = []
    original = sink.in_tasks

    def counting(fn, args):
        calls.append(len(args))
        return original(fn, args)

    with monkeypatch.context() as m:
        m.setattr(tasks, "_runner", counting)  # what the engine installs (sink.in_tasks), counted
        in_ray = verify.verify_run(run, max_errors)
    with monkeypatch.context() as m:
        m.setattr(tasks, "_runner", None)  # no runner: in this process
        here = verify.verify_run(run, max_errors)
    return in_ray, here, calls


def test_verify_in_ray_tasks_equals_in_process(split_run, monkeypatch, tmp_path):
    _, run = split_run
    in_ray, here, calls = _both(str(run), monkeypatch)
    assert calls and calls[0] == verify.paper_units(str(run)) >= 4  # one task per papers row group
    assert in_ray == here and in_ray["errors"] == [] and in_ray["papers"] == 7 and in_ray["unchecked"] == {}

    bad = _tampered(run, tmp_path / "text", "chunks", lambda t: _set_text(t, 7))
    in_ray, here, _ = _both(bad, monkeypatch)
    assert in_ray == here and in_ray["n_errors"] >= 1 and any("text differs" in e for e in in_ray["errors"])

    # a papers row twice, a papers row missing (its chunks have no paper), chunks reversed across row groups
    bad = _tampered(run, tmp_path / "rows", "papers",
                    lambda t: pa.concat_tables([t.slice(0, 3), t.slice(4), t.slice(1, 1)]))
    in_ray, here, _ = _both(bad, monkeypatch, max_errors=1)
    assert in_ray == here and len(in_ray["errors"]) == 1 and in_ray["n_errors"] == 2
    in_ray, here, _ = _both(bad, monkeypatch)
    assert in_ray == here
    assert [e for e in in_ray["errors"] if "appears twice" in e or "no paper row" in e] == [
        f"paper id {pq.read_table(run / 'papers')['paper_id'][1]} appears twice",
        f"chunks of {pq.read_table(run / 'papers')['paper_id'][3]} have no paper row"]
    bad = _tampered(run, tmp_path / "reversed", "chunks", lambda t: t.take(list(range(t.num_rows))[::-1]))
    in_ray, here, _ = _both(bad, monkeypatch)
    assert in_ray == here and in_ray["errors"] == []

    # an extra chunk file: every chunk id twice, reported before the papers' own problems
    extra = tmp_path / "extra"
    shutil.copytree(run, extra)
    shutil.copy(sorted((extra / "chunks").glob("*.parquet"))[0], extra / "chunks" / "part-extra.parquet")
    reindex_files(extra)
    in_ray, here, _ = _both(str(extra), monkeypatch)
    assert in_ray == here and "appears twice" in in_ray["errors"][2]


def test_check_papers_rejects_the_same_papers_in_tasks(split_run, monkeypatch, tmp_path):
    _, run = split_run
    bad = _tampered(run, tmp_path / "text", "chunks", lambda t: _set_text(t, 7))
    paper = pq.read_table(bad + "/chunks")["paper_id"][7].as_py()
    in_ray = verify.check_papers(bad, max_errors=0, want_rejected=True)
    monkeypatch.setattr(tasks, "_runner", None)
    here = verify.check_papers(bad, max_errors=0, want_rejected=True)
    assert in_ray["rejected"] == here["rejected"] == {paper} and in_ray["errors"] == []


def test_cli_verify_runs_in_process_unless_large_or_asked(split_run, monkeypatch, capsys):
    import json

    from verbatim_batch.cli import commands, main

    _, run = split_run
    started = []
    monkeypatch.setattr("verbatim_batch.engine.ray_env.init_ray", lambda *a: started.append(a))
    assert main(["verify", str(run)]) == 0 and started == []  # a small run: no Ray started
    assert json.loads(capsys.readouterr().out)["papers"] == 7
    assert main(["verify", str(run), "--num-cpus", "1"]) == 0 and started == []
    assert main(["verify", str(run), "--num-cpus", "2"]) == 0 and started == [(None, 2)]
    monkeypatch.setattr(commands, "VERIFY_LOCAL_RAY_UNITS", 2)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert main(["verify", str(run)]) == 0 and started[-1] == (None, None)


def test_units_a_worker_could_not_read_are_checked_here(split_run, monkeypatch):
    """A unit whose read failed in the file system on a worker (an object store whose credentials only this
    process has; CI saw ACCESS_DENIED from S3 on the workers) is checked again in this process, and this
    process's reading is reported. The worker's failure is a test double (the first two units' results are
    replaced by what a worker that cannot open the files returns): which workers fail cannot be arranged
    on a local Ray, whose workers read what the driver reads."""
    _, run = split_run
    original = verify.run_each

    def failing_workers(fn, calls):
        results = original(fn, calls)
        for i in (0, 1):
            results[i] = {"counts": {"papers": 0}, "n_errors": 1, "rejected": [], "io_error": True,
                          "errors": [f"papers/x row group {i}: unreadable (AWS Error ACCESS_DENIED)"]}
        return results

    monkeypatch.setattr(verify, "run_each", failing_workers)
    checked = verify.verify_run(str(run))
    assert checked["errors"] == [] and checked["papers"] == 7 and checked["unchecked"] == {}
    monkeypatch.setattr(verify, "check_unit", lambda *a: {"counts": {}, "n_errors": 1, "rejected": [],
                                                           "errors": ["read here: unreadable (gone)"]})
    assert "read here: unreadable (gone)" in verify.verify_run(str(run))["errors"]
