"""Hostile input for the corpus readers: one bad input never costs a job, a row or a user's file.

The contract, for every reader case: every input path or record ends as exactly one paper row or one
quarantine row with a true reason; nothing raises; FIFOs and devices are never opened; the user's
files are untouched. Unit tests call the readers and ``IngestStage`` directly (no Ray); the fuzz
tests feed raw bytes through them; the end-to-end tests run ``verbatim-batch chunk`` in-process on a
local Ray over folders mixing every bad case with valid papers.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import reindex_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verbatim_batch.core.tables import RAW_RECORDS, QuarantineReason
from verbatim_batch.corpus import readers as corpus
from verbatim_batch.corpus.chunker import ChunkerConfig, chunk_markdown, verify_chunks
from verbatim_batch.corpus.ingest import IngestStage
from verbatim_batch.corpus.metadata import load_metadata
from verbatim_batch.engine.listing import duplicate_winners
from verbatim_batch.quality.verify import verify_run

PAPER = "# {title}\n\n## Introduction\n\nWe study {title} on real data. It works.\n\n## Method\n\nDetails here.\n"
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def paper(title: str) -> str:
    return PAPER.format(title=title)


# --- helpers: the chunk stage without Ray ------------------------------------------------------------------


def ingest(path: str | Path, fmt: str | None = None, metadata: str | None = None, max_bytes: int = 1 << 20):
    """Papers and quarantine rows for an input, as the chunk job would give them (readers + duplicate scan +
    IngestStage), with the record counts of the scan and the read checked to agree."""
    path = str(path)
    fmt = fmt or corpus.detect_format(path)
    fs, files = corpus.list_sources(path, fmt)
    reader = corpus.READERS[fmt]

    def read(ids_only: bool) -> list[pa.Table]:
        if fmt == "md":
            return list(reader(fs, files, max_bytes, ids_only))
        return [t for f in files for t in reader(fs, f, max_bytes, ids_only)]

    scan = pa.concat_tables([RAW_RECORDS.empty_table(), *read(True)])
    if fmt == "md":
        pairs = [(None if f.problem or f.size > max_bytes else corpus.md_paper_id(f.path), f.path) for f in files]
    else:
        pairs = [(None if e else p, s) for p, s, e in zip(scan["paper_id"].to_pylist(), scan["source"].to_pylist(),
                                                          scan["error"].to_pylist(), strict=True)]
    dups, n_scan = duplicate_winners(pairs)
    records = read(False)
    n_records = sum(t.num_rows for t in records)
    assert n_scan == n_records, "the duplicate scan and the read disagree on the number of records"
    stage = IngestStage(chunker=ChunkerConfig(min_chars=0), metadata_uri=metadata, duplicates=dups)
    outs = [stage(t) for t in records] + [stage(RAW_RECORDS.empty_table()), stage(pa.table({}))]
    papers = pa.concat_tables([o["papers"] for o in outs]).to_pylist()
    quarantine = pa.concat_tables([o["quarantine"] for o in outs]).to_pylist()
    assert len(papers) + len(quarantine) == n_records
    sources = [r["source"] for r in papers + quarantine]
    assert len(sources) == len(set(sources)), "a source has two rows"
    return papers, quarantine


def reasons_by_name(quarantine: list[dict]) -> dict[str, str]:
    return {os.path.basename(r["source"].split("#")[0]) + ("#" + r["source"].split("#")[1] if "#" in r["source"]
            else ""): r["reason"] for r in quarantine}


def write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


@contextlib.contextmanager
def fifo_watch(fifos: list[Path]):
    """Fail if anyone opens one of ``fifos`` for reading, and unblock them if they do (so nothing hangs)."""
    opened: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for f in fifos:
                try:  # succeeds only while a reader has the FIFO open
                    fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno not in (errno.ENXIO, errno.ENOENT):
                        raise
                    continue
                opened.append(str(f))
                os.close(fd)
            stop.wait(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield opened
    finally:
        stop.set()
        t.join()
    assert not opened, f"FIFOs were opened: {opened}"


@contextlib.contextmanager
def time_limit(seconds: int):
    def fail(*_):
        raise TimeoutError(f"took more than {seconds}s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size and (regular files) content hash; links not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            digest = None
            if os.path.isfile(p) and not os.path.islink(p):
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            out[p] = (st_.st_mode, st_.st_size, st_.st_mtime_ns, digest,
                      os.readlink(p) if os.path.islink(p) else None)
    return out


# --- 1. one bad input beside valid ones ------------------------------------------------------------------------


def test_parquet_with_integer_markdown_is_one_quarantine_row(tmp_path):
    write_parquet(tmp_path / "a.parquet", pa.table({"paper_id": ["p1", "p2"], "markdown": [paper("A"), paper("B")]}))
    write_parquet(tmp_path / "b.parquet", pa.table({"paper_id": ["p3"], "markdown": [7]}))
    papers, quarantine = ingest(tmp_path)
    assert sorted(p["paper_id"] for p in papers) == ["p1", "p2"]
    assert [(Path(q["source"]).name, q["reason"]) for q in quarantine] == [("b.parquet", "invalid_record")]
    assert "'markdown' is int64" in quarantine[0]["detail"]


def test_zero_row_parquet_and_blank_jsonl_are_empty(tmp_path):
    write_parquet(tmp_path / "pq" / "a.parquet", pa.table({"paper_id": ["p1"], "markdown": [paper("A")]}))
    write_parquet(tmp_path / "pq" / "b.parquet",
                  pa.table({"paper_id": pa.array([], pa.string()), "markdown": pa.array([], pa.string())}))
    papers, quarantine = ingest(tmp_path / "pq")
    assert [p["paper_id"] for p in papers] == ["p1"]
    assert [(Path(q["source"]).name, q["reason"]) for q in quarantine] == [("b.parquet", "empty")]

    write_jsonl(tmp_path / "js" / "a.jsonl", [{"paper_id": "j1", "markdown": paper("J")}])
    (tmp_path / "js" / "zero.jsonl").write_bytes(b"")
    (tmp_path / "js" / "blank.jsonl").write_bytes(b"\n  \n\t\r\n")
    papers, quarantine = ingest(tmp_path / "js")
    assert [p["paper_id"] for p in papers] == ["j1"]
    assert sorted((Path(q["source"]).name, q["reason"]) for q in quarantine) == [
        ("blank.jsonl", "empty"), ("zero.jsonl", "empty")]


def test_deeply_nested_json_line_is_invalid_record(tmp_path):
    deep = '{"paper_id": "d", "markdown": ' + "[" * 100_000 + "]" * 100_000 + "}"
    write_jsonl(tmp_path / "a.jsonl", [{"paper_id": "ok1", "markdown": paper("A")}, deep,
                                       {"paper_id": "ok2", "markdown": paper("B")}])
    papers, quarantine = ingest(tmp_path)
    assert sorted(p["paper_id"] for p in papers) == ["ok1", "ok2"]
    assert [(q["source"].split("#")[1], q["reason"]) for q in quarantine] == [("line=2", "invalid_record")]
    assert "nested too deeply" in quarantine[0]["detail"]


def test_metadata_with_wrong_field_types_is_ignored_field_by_field(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.md").write_text(paper("A"))
    (tmp_path / "c" / "b.md").write_text(paper("B"))
    meta = tmp_path / "meta.jsonl"
    write_jsonl(meta, [{"paper_id": "a", "title": "T", "authors": 5, "year": [1], "venue": {"x": 1}},
                       {"paper_id": "b", "title": ["x"], "authors": "X and Y", "year": "2021"},
                       {"paper_id": True, "title": "bad id"}])
    assert load_metadata(str(meta)) == {
        "a": ("T", None, None, None, None, None),
        "b": (None, ["X", "Y"], 2021, None, None, None),
    }
    papers, quarantine = ingest(tmp_path / "c", metadata=str(meta))
    assert quarantine == [] and {p["paper_id"]: p["authors"] for p in papers} == {"a": None, "b": ["X", "Y"]}
    # CSV: an integer authors column
    csv = tmp_path / "meta.csv"
    csv.write_text("paper_id,title,authors,year\na,T,17,2020\n")
    assert load_metadata(str(csv))["a"] == ("T", None, 2020, None, None, None)


def test_unreadable_metadata_is_one_line_value_error(tmp_path):
    (tmp_path / "meta.parquet").write_bytes(b"PAR1 garbage\n")
    with pytest.raises(ValueError, match="cannot read it as a table") as exc:
        load_metadata(str(tmp_path / "meta.parquet"))
    assert "\n" not in str(exc.value)
    (tmp_path / "meta.jsonl").write_bytes(b'{"paper_id": "a"\n\xff\xfe garbage')  # no line is a JSON object
    with pytest.raises(ValueError, match="no id column"):
        load_metadata(str(tmp_path / "meta.jsonl"))
    os.mkfifo(tmp_path / "fifo.csv")
    with fifo_watch([tmp_path / "fifo.csv"]), pytest.raises(ValueError, match="not a regular file"):
        load_metadata(str(tmp_path / "fifo.csv"))


# --- 2. every input path one row, never opening FIFOs or devices ------------------------------------------------


def hostile_md_folder(root: Path) -> dict[str, str]:
    """Valid papers plus every path-level bad case; returns {name under root: expected reason or "paper"}."""
    (root / "sub").mkdir(parents=True)
    for name in ("a", "b", "sub/c"):
        (root / f"{name}.md").write_text(paper(name))
    (root / ".md").write_text(paper("hidden"))
    (root / "_.md").write_text(paper("underscore"))
    (root / "cr.md").write_bytes(paper("CR").replace("\n", "\r").encode())
    (root / "bom.md").write_bytes(b"\xef\xbb\xbf" + paper("BOM").encode())
    os.mkfifo(root / "fifo.md")
    os.symlink("/dev/zero", root / "zero.md")
    os.symlink("nowhere.md", root / "gone.md")
    os.symlink("self.md", root / "self.md")
    os.symlink("..", root / "sub" / "loop")  # a loop: sub/loop -> root
    os.symlink("sub", root / "alias")  # the same folder under a second name
    return {"a.md": "paper", "b.md": "paper", "sub/c.md": "paper", "_.md": "paper", "cr.md": "paper",
            "bom.md": "paper", ".md": "missing_id", "fifo.md": "not_a_regular_file",
            "zero.md": "not_a_regular_file", "gone.md": "broken_symlink", "self.md": "symlink_loop",
            "sub/loop": "symlink_loop", "alias": "duplicate_path"}


def test_every_md_path_gets_one_row_with_a_true_reason(tmp_path):
    root = tmp_path / "corpus"
    expected = hostile_md_folder(root)
    with fifo_watch([root / "fifo.md"]), time_limit(60):
        papers, quarantine = ingest(root)
    got = {os.path.relpath(r["source"], root): "paper" for r in papers}
    got |= {os.path.relpath(r["source"], root): r["reason"] for r in quarantine}
    assert got == expected  # no duplicate_id from the loop or the alias, nothing missing
    assert {p["paper_id"] for p in papers} == {"a", "b", "c", "_", "cr", "bom"}
    assert all(q["detail"] for q in quarantine)
    # CR-only and BOM papers keep their heading structure
    by_id = {p["paper_id"]: p for p in papers}
    assert by_id["cr"]["title"] == "CR" and by_id["bom"]["title"] == "BOM"
    assert by_id["cr"]["n_chunks"] == by_id["a"]["n_chunks"] == 3


def test_symlinked_folder_outside_the_input_is_followed_once(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.md").write_text(paper("X"))
    os.symlink(tmp_path / "corpus", outside / "back")  # leads back into the input: never followed
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.md").write_text(paper("A"))
    os.symlink(outside, root / "ext1")
    os.symlink(outside, root / "ext2")
    papers, quarantine = ingest(root)
    assert sorted(os.path.relpath(p["source"], root) for p in papers) == ["a.md", "ext1/x.md"]
    assert sorted((os.path.relpath(q["source"], root), q["reason"]) for q in quarantine) == [
        ("ext1/back", "duplicate_path"), ("ext2", "duplicate_path")]


def test_input_that_is_a_fifo_or_device_is_one_row_never_read(tmp_path):
    os.mkfifo(tmp_path / "in.jsonl")
    with fifo_watch([tmp_path / "in.jsonl"]), time_limit(30):
        papers, quarantine = ingest(tmp_path / "in.jsonl", fmt="jsonl")
    assert papers == [] and [q["reason"] for q in quarantine] == ["not_a_regular_file"]
    os.symlink("/dev/zero", tmp_path / "z.parquet")
    papers, quarantine = ingest(tmp_path / "z.parquet", fmt="parquet")
    assert papers == [] and [q["reason"] for q in quarantine] == ["not_a_regular_file"]


def test_fifo_and_dangling_link_in_parquet_and_jsonl_folders(tmp_path):
    write_parquet(tmp_path / "pq" / "a.parquet", pa.table({"paper_id": ["p1"], "markdown": [paper("A")]}))
    os.mkfifo(tmp_path / "pq" / "f.parquet")
    os.symlink("missing.parquet", tmp_path / "pq" / "g.parquet")
    with fifo_watch([tmp_path / "pq" / "f.parquet"]), time_limit(30):
        papers, quarantine = ingest(tmp_path / "pq")
    assert [p["paper_id"] for p in papers] == ["p1"]
    assert sorted((Path(q["source"]).name, q["reason"]) for q in quarantine) == [
        ("f.parquet", "not_a_regular_file"), ("g.parquet", "broken_symlink")]


# --- 3. ids that are not strings ------------------------------------------------------------------------------


def test_non_string_ids_are_invalid_records_never_coerced(tmp_path):
    rows = [{"paper_id": v, "markdown": paper(f"T{k}")} for k, v in
            enumerate([True, False, ["x"], {"a": 1}, 1.5, "s1", 42, None, "  "])]
    write_jsonl(tmp_path / "a.jsonl", rows)
    papers, quarantine = ingest(tmp_path)
    assert sorted(p["paper_id"] for p in papers) == ["42", "s1"]  # strings and integers are ids
    got = sorted((q["source"].split("#")[1], q["reason"]) for q in quarantine)
    assert got == [(f"line={k}", "invalid_record") for k in range(1, 6)] + [
        ("line=8", "missing_id"), ("line=9", "missing_id")]
    assert not any(q["paper_id"] in ("True", "False", "['x']", "1.5") for q in quarantine)


def test_parquet_bool_id_column_is_invalid_record(tmp_path):
    write_parquet(tmp_path / "a.parquet", pa.table({"paper_id": [True, False], "markdown": ["x", "y"]}))
    write_parquet(tmp_path / "b.parquet", pa.table({"paper_id": [1, 2], "markdown": [paper("A"), paper("B")]}))
    papers, quarantine = ingest(tmp_path)
    assert sorted(p["paper_id"] for p in papers) == ["1", "2"]
    assert [(Path(q["source"]).name, q["reason"]) for q in quarantine] == [("a.parquet", "invalid_record")]


def test_a_rejected_record_does_not_win_a_duplicate_id(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"paper_id": "x", "markdown": 5}, {"paper_id": "x", "markdown": paper("X")}])
    papers, quarantine = ingest(tmp_path)
    assert [p["paper_id"] for p in papers] == ["x"]
    assert [q["reason"] for q in quarantine] == ["invalid_record"]


# --- 4. CR-only line ends and a BOM (offsets exact) -------------------------------------------------------------


def test_cr_only_and_bom_papers_keep_headings_and_exact_offsets():
    base = paper("Title") + "### Deeper\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```\n# not a heading\n```\n"
    want = [(c.start, c.end, c.heading_path) for c in chunk_markdown(base, ChunkerConfig(min_chars=0))]
    assert len(want) == 4
    cr = base.replace("\n", "\r")
    got = chunk_markdown(cr, ChunkerConfig(min_chars=0))
    verify_chunks(cr, got)
    assert [(c.start, c.end, c.heading_path) for c in got] == want
    bom = "\ufeff" + base
    got = chunk_markdown(bom, ChunkerConfig(min_chars=0))
    verify_chunks(bom, got)
    assert [c.heading_path for c in got] == [w[2] for w in want]
    assert got[0].start == 0 and [(c.start, c.end) for c in got[1:]] == [(s + 1, e + 1) for s, e, _ in want[1:]]


# --- 5. verify: manifest, hashes, offsets, duplicates, and what it could not check --------------------------------


@pytest.fixture(scope="module")
def chunk_run(ray_local, tmp_path_factory):
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    root = tmp_path_factory.mktemp("verify")
    (root / "c").mkdir()
    for k in range(6):
        (root / "c" / f"p{k}.md").write_text(paper(f"Paper {k}") + "More text.\n" * k)
    out, _ = run_chunk(ChunkJob(input=str(root / "c"), output=str(root / "run"), chunker=ChunkerConfig(min_chars=0)))
    return root, out


def _rewrite(folder: Path, change) -> None:
    for f in sorted(folder.glob("*.parquet")):
        t = pq.read_table(f)
        if t.num_rows:
            pq.write_table(change(t), f)
            return


def _set(t: pa.Table, column: str, row: int, value) -> pa.Table:
    values = t[column].to_pylist()
    values[row] = value
    return t.set_column(t.schema.get_field_index(column), column, pa.array(values, t.schema.field(column).type))


def test_verify_catches_tampering_and_reports_what_it_could_not_check(chunk_run, tmp_path):
    root, out = chunk_run
    clean = verify_run(out)
    assert clean["errors"] == [] and clean["unchecked"] == {} and clean["papers"] == 6

    def tampered(name: str, table: str, change) -> dict:
        copy = tmp_path / name
        shutil.copytree(out, copy)
        _rewrite(copy / table, change)
        reindex_files(copy)  # the rows' own checks are under test, not the byte check
        return verify_run(str(copy))

    r = tampered("text", "chunks", lambda t: _set(t, "text", 0, "Invented " + t["text"][0].as_py()[9:]))
    assert any("text differs" in e for e in r["errors"])
    r = tampered("sha", "papers", lambda t: _set(t, "markdown", 0, t["markdown"][0].as_py().replace("We", "Wo")))
    assert any("sha256" in e for e in r["errors"])
    r = tampered("nostore", "papers", lambda t: _set(t, "markdown", 0, None))
    assert r["errors"] == [] and r["unchecked"]["papers_without_text"] == 1 and r["unchecked"]["chunks_without_text"]
    # an extra chunk file: more files and rows than the manifest, and chunk ids twice
    copy = tmp_path / "extra"
    shutil.copytree(out, copy)
    first = sorted((copy / "chunks").glob("*.parquet"))[0]
    shutil.copy(first, copy / "chunks" / "part-extra.parquet")
    errors = verify_run(str(copy))["errors"]
    assert any("Parquet files, the manifest says" in e for e in errors)
    assert any("appears twice" in e for e in errors)


def test_previous_run_with_tampered_chunks_is_not_carried(chunk_run, tmp_path):
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    root, out = chunk_run
    prev = tmp_path / "prev"
    shutil.copytree(out, prev)
    _rewrite(prev / "chunks", lambda t: _set(t, "text", 0, "Invented " + t["text"][0].as_py()[9:]))
    new, manifest = run_chunk(ChunkJob(input=str(root / "c"), output=str(tmp_path / "new"), previous=str(prev),
                                       chunker=ChunkerConfig(min_chars=0)))
    assert manifest["counts"]["previous_papers_rejected"] == 1
    assert manifest["counts"]["papers_unchanged"] == 5
    checked = verify_run(new)
    assert checked["errors"] == [] and checked["papers"] == 6
    assert "Invented" not in "".join(pq.read_table(Path(new) / "chunks")["text"].to_pylist())


# --- 6. fuzzing the readers with raw bytes ---------------------------------------------------------------------


@contextlib.contextmanager
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FUZZ
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_fuzz_md_bytes(blobs):
    with scratch() as d:
        for k, b in enumerate(blobs):
            (d / f"p{k}.md").write_bytes(b)
        papers, quarantine = ingest(d, fmt="md")
        assert len(papers) + len(quarantine) == len(blobs)
        assert all(q["reason"] in QuarantineReason.ALL for q in quarantine)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_json_line = st.one_of(
    st.binary(max_size=120),
    st.builds(lambda pid, text: json.dumps({"paper_id": pid, "markdown": text}).encode(), _json_values,
              _json_values | st.text(max_size=200)),
    st.builds(lambda pid, text: json.dumps({"anthology_id": pid, "text": text}).encode(),
              st.text(max_size=10), st.text(max_size=200)),
)


@FUZZ
@given(st.lists(_json_line, max_size=6), st.sampled_from([b"\n", b"\r\n"]))
def test_fuzz_jsonl_bytes(lines, sep):
    with scratch() as d:
        (d / "a.jsonl").write_bytes(sep.join(lines))
        papers, quarantine = ingest(d, fmt="jsonl")
        assert papers or quarantine  # a file is never silent
        assert all(q["reason"] in QuarantineReason.ALL for q in quarantine)
        assert all(isinstance(p["paper_id"], str) for p in papers)


def _valid_parquet_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"paper_id": ["a", "b"], "markdown": [paper("A"), paper("B")]}), sink)
    return sink.getvalue().to_pybytes()


_VALID_PARQUET = _valid_parquet_bytes()
_columns = st.sampled_from([
    pa.array(["x", None]), pa.array([1, 2]), pa.array([True, None]), pa.array([1.5, 2.5]), pa.array([b"a", b"\xff"]),
    pa.array([["a"], []]), pa.array([None, None]), pa.array(["# T\n\nok", "\x00"]),
])


@FUZZ
@given(st.one_of(
    st.binary(max_size=200),
    st.tuples(st.integers(0, len(_VALID_PARQUET) - 1), st.binary(min_size=1, max_size=8)).map(
        lambda a: _VALID_PARQUET[: a[0]] + a[1] + _VALID_PARQUET[a[0] + len(a[1]):]),
    st.tuples(st.sampled_from(["paper_id", "anthology_id", "other"]), _columns,
              st.sampled_from(["markdown", "text", "body"]), _columns).map(
        lambda a: (a[0], a[1], a[2], a[3])),
))
def test_fuzz_parquet_bytes(data):
    with scratch() as d:
        if isinstance(data, tuple):
            id_name, ids, text_name, texts = data
            pq.write_table(pa.table({id_name: ids, text_name: texts}), d / "a.parquet")
        else:
            (d / "a.parquet").write_bytes(data)
        write_parquet(d / "z.parquet", pa.table({"paper_id": ["good"], "markdown": [paper("Good")]}))
        papers, quarantine = ingest(d, fmt="parquet")
        assert "good" in {p["paper_id"] for p in papers}  # the valid file beside it always lands
        assert all(q["reason"] in QuarantineReason.ALL for q in quarantine)


@FUZZ
@given(st.one_of(
    st.binary(max_size=200),
    st.lists(st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=8), min_size=4, max_size=4),
             max_size=4).map(lambda rows: ("paper_id,title,authors,year\n" + "".join(
                 ",".join(json.dumps(c) for c in r) + "\n" for r in rows)).encode()),
))
def test_fuzz_csv_metadata_bytes(data):
    with scratch() as d:
        (d / "meta.csv").write_bytes(data)
        try:
            meta = load_metadata(str(d / "meta.csv"))
        except ValueError as exc:  # the only way out: one clear line
            assert "\n" not in str(exc)
            return
        for pid, row in meta.items():
            assert isinstance(pid, str) and pid
            assert row[1] is None or all(isinstance(a, str) for a in row[1])
            assert row[2] is None or isinstance(row[2], int)


# --- 7. end to end: `verbatim-batch chunk` on hostile folders ---------------------------------------------------


def _cli_chunk(args: list[str]) -> int:
    from verbatim_batch.cli import main

    with time_limit(240):
        return main(["chunk", *args])


def test_cli_chunk_md_folder_with_every_bad_path(ray_local, tmp_path):
    root = tmp_path / "corpus"
    expected = hostile_md_folder(root)
    (root / "bad_utf8.md").write_bytes(b"# X\n\n\xff\xfe")
    expected["bad_utf8.md"] = "invalid_utf8"
    meta = tmp_path / "meta.jsonl"
    write_jsonl(meta, [{"paper_id": "a", "title": "Alpha", "authors": 3}, {"paper_id": [1], "title": "x"}])
    before = snapshot(root)
    meta_bytes = meta.read_bytes()
    with fifo_watch([root / "fifo.md"]):
        rc = _cli_chunk(["--input", str(root), "--output", str(tmp_path / "run"), "--metadata", str(meta),
                         "--min-chars", "0", "--format", "md"])
    assert rc == 0
    assert snapshot(root) == before and meta.read_bytes() == meta_bytes  # user files untouched
    run = tmp_path / "run"
    papers = pq.read_table(run / "papers").to_pylist()
    quarantine = pq.read_table(run / "quarantine").to_pylist()
    got = {os.path.relpath(r["source"], root): "paper" for r in papers}
    got |= {os.path.relpath(r["source"], root): r["reason"] for r in quarantine}
    assert got == expected
    assert {p["paper_id"]: p["title"] for p in papers}["a"] == "Alpha"
    assert verify_run(str(run))["errors"] == []


def test_cli_chunk_with_unreadable_metadata_is_one_line_rc_2(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.md").write_text(paper("A"))
    (tmp_path / "meta.parquet").write_bytes(b"not parquet")
    rc = _cli_chunk(["--input", str(tmp_path / "c"), "--output", str(tmp_path / "run"),
                     "--metadata", str(tmp_path / "meta.parquet")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "cannot read it as a table" in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c", "meta.parquet"]


def test_cli_chunk_jsonl_and_parquet_folders_with_bad_files(ray_local, tmp_path):
    js = tmp_path / "js"
    write_jsonl(js / "a.jsonl", [{"paper_id": "j1", "markdown": paper("J1")},
                                 '{"paper_id": "deep", "markdown": ' + "[" * 5000 + "]" * 5000 + "}",
                                 {"paper_id": True, "markdown": paper("T")},
                                 {"paper_id": "j1", "markdown": paper("again")},
                                 {"paper_id": "j2", "markdown": paper("J2").replace("\n", "\r")}])
    (js / "zero.jsonl").write_bytes(b"")
    (js / "blank.jsonl").write_bytes(b"\n\n")
    os.mkfifo(js / "fifo.jsonl")
    with fifo_watch([js / "fifo.jsonl"]):
        assert _cli_chunk(["--input", str(js), "--output", str(tmp_path / "jrun"), "--min-chars", "0"]) == 0
    papers = pq.read_table(tmp_path / "jrun" / "papers")
    quarantine = pq.read_table(tmp_path / "jrun" / "quarantine").to_pylist()
    assert sorted(papers["paper_id"].to_pylist()) == ["j1", "j2"]
    assert sorted((os.path.relpath(q["source"], js), q["reason"]) for q in quarantine) == [
        ("a.jsonl#line=2", "invalid_record"), ("a.jsonl#line=3", "invalid_record"),
        ("a.jsonl#line=4", "duplicate_id"), ("blank.jsonl", "empty"), ("fifo.jsonl", "not_a_regular_file"),
        ("zero.jsonl", "empty")]

    pqd = tmp_path / "pq"
    write_parquet(pqd / "a.parquet", pa.table({"paper_id": ["p1", "p2"], "markdown": [paper("A"), paper("B")]}))
    write_parquet(pqd / "b.parquet", pa.table({"paper_id": ["p3"], "markdown": [3]}))
    write_parquet(pqd / "c.parquet", pa.table({"paper_id": pa.array([], pa.string()),
                                               "markdown": pa.array([], pa.string())}))
    write_parquet(pqd / "d.parquet", pa.table({"paper_id": [False], "markdown": [paper("D")]}))
    (pqd / "e.parquet").write_bytes(b"PAR1 not really")
    assert _cli_chunk(["--input", str(pqd), "--output", str(tmp_path / "prun"), "--min-chars", "0"]) == 0
    papers = pq.read_table(tmp_path / "prun" / "papers")
    quarantine = pq.read_table(tmp_path / "prun" / "quarantine").to_pylist()
    assert sorted(papers["paper_id"].to_pylist()) == ["p1", "p2"]
    assert sorted((Path(q["source"]).name, q["reason"]) for q in quarantine) == [
        ("b.parquet", "invalid_record"), ("c.parquet", "empty"), ("d.parquet", "invalid_record"),
        ("e.parquet", "read_error")]
