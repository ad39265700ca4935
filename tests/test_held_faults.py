"""Three fault classes an operator's held-out round found handled (issue 44, item 5), kept as tests.

- Readers during a night's commit (``test_readers_during_a_nights_commit_see_one_whole_night``): a night
  commits by writing its run folder whole (``manifest.json`` last) and only then moving the root's pointer
  (``runs.set_current``: the ``current`` symlink and the ``CURRENT`` file, each replaced atomically). While a
  real ``verbatim-batch nightly`` process commits night r2 on a copy of the session's baseline root (night r1),
  readers poll the root without pause: the symlink resolved once and the run's tables read under it, the Python
  API (``runs.current_table``), and ``verbatim-batch verify ROOT`` processes. Every read must be one whole
  night, r1 or r2 (row counts and digests of its tables, or verify's report, equal to that night's as
  committed), and no read may fail. r2 finds nothing changed, so it runs no model and starts no Ray; its rows
  equal r1's, so each read is identified by the run its pointer named, and a partly written r2 (a missing
  table, a file still being written) would differ from r2 as committed. An e2e test: it builds on the session's
  ``nightly_baseline`` (the other two use the session Ray: stage). The one-call path idiom
  (``pandas.read_parquet("ROOT/current/spans/spans")``) is not one of these readers: it lists the folder and
  opens the files through the symlink in two steps, so it can straddle a switch.
- Two API threads (``test_two_api_threads_get_what_each_gets_alone``): in one process on the one session Ray,
  one thread runs ``api.chunk`` then ``api.embed`` (model actors) over two bundled papers while the other runs
  ``api.chunk`` (tasks) over two other papers, again and again until the first is done. The API supports
  this (Ray Data runs concurrent datasets from one driver; the processors keep no shared state), so both must
  finish (a hang fails the test, within a limit scaled by the load) with exactly what each gets alone: chunk
  ids, texts and offsets equal, embeddings rows equal and vectors within 1e-5.
- Encodings drifting between nights (``test_encodings_drifting_between_nights_keep_offsets_exact``): a corpus
  whose papers go from UTF-8 to UTF-8 with a byte-order mark, from LF to CRLF, to latin-1 bytes (invalid
  UTF-8), and back, chunked as nights (``--previous``), without normalisation and with ``--normalize crlf``.
  Each night verifies, its stored text is the source decoded as is (a BOM stays a character, counted by the
  offsets) and normalised as configured, every chunk is that text at its character and byte offsets (without
  normalisation, the byte offsets address the source file itself), the undecodable paper is a quarantine row
  with its reason while the others stay, and each night equals a run from scratch over the same files. With
  ``--normalize crlf`` a paper whose bytes went LF -> CRLF normalises to the same text: it used to be carried
  with the sha256 of its old bytes (unlike a run from scratch, and read again every night after); the ingest
  now chunks a paper whose source bytes changed (``IngestStage.source_sha256``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from helpers import EXAMPLES, PAPERS, assert_tables_match, nightly
from promservers import scaled

from verbatim_batch import api
from verbatim_batch.core.runs import current_run, current_table
from verbatim_batch.corpus.chunker import ChunkerConfig
from verbatim_batch.corpus.readers import normalize_text
from verbatim_batch.quality.verify import verify_run
from verbatim_batch.stages.chunk import ChunkJob, run_chunk

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]


# --- readers during a night's commit -----------------------------------------------------------------------------

READ_TABLES = (("chunks", "papers"), ("chunks", "chunks"), ("retrieval", "retrieval"), ("spans", "pairs"),
               ("spans", "spans"))


def _digest(table: pa.Table) -> tuple[int, str]:
    """``(rows, digest of the rows in any order)``: the same rows give the same digest however they are filed."""
    lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())
    return len(lines), hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _night(run: Path) -> dict[str, tuple[int, str]]:
    """Row count and digest of each read table of a run folder."""
    return {f"{stage}/{table}": _digest(pq.read_table(run / stage / table)) for stage, table in READ_TABLES}


def _verify(path: Path) -> tuple[int, str]:
    """``verbatim-batch verify PATH`` in its own process (no Ray): its exit status and its report's stages."""
    done = subprocess.run([*CLI, "verify", str(path), "--num-cpus", "1"], capture_output=True, text=True,
                          timeout=scaled(300), env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    if done.returncode != 0:
        return done.returncode, done.stdout[-2000:] + done.stderr[-2000:]
    return 0, json.dumps(json.loads(done.stdout)["stages"], sort_keys=True)


class Reader(threading.Thread):
    """Calls ``read`` over and over until stopped; keeps ``(when it started, what it returned)`` of each read,
    or the traceback of a read that raised."""

    def __init__(self, name: str, read: Callable[[], Any]):
        super().__init__(name=name, daemon=True)
        self.read_once = read
        self.reads: list[tuple[float, Any]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.reads.append((started, self.read_once()))
            except Exception:  # noqa: BLE001 - reported by the test
                self.errors.append(traceback.format_exc(limit=6))

    def read_since(self, since: float) -> bool:
        return any(started > since for started, _ in self.reads) or bool(self.errors)


def _wait(readers: list[Reader], since: float, what: str) -> None:
    deadline = time.monotonic() + scaled(300)
    while not all(r.read_since(since) for r in readers):
        assert time.monotonic() < deadline, f"a reader made no read {what}: {[(r.name, len(r.reads)) for r in readers]}"
        assert all(r.is_alive() for r in readers), "a reader thread ended"
        time.sleep(0.05)


def test_readers_during_a_nights_commit_see_one_whole_night(nightly_baseline, tmp_path):
    """Symlink, API and ``verify`` readers polling a root while a night commits each see r1 or r2 whole."""
    root = tmp_path / "root"
    shutil.copytree(nightly_baseline["root"], root, symlinks=True)
    assert current_run(str(root)) == "r1"

    def through_link() -> tuple[str, dict]:
        run = Path(os.path.realpath(root / "current"))  # resolved once: the whole read is of that run
        return run.name, _night(run)

    def through_api() -> dict:
        return {f"{stage}/{table}": _digest(current_table(str(root), table, stage)) for stage, table in READ_TABLES}

    readers = [Reader("link", through_link), Reader("api", through_api),
               Reader("verify", lambda: _verify(root))]
    for reader in readers:
        reader.start()
    try:
        _wait(readers, 0.0, "before the night")
        nightly(root, nightly_baseline["corpus"], "r2")  # a real `verbatim-batch nightly` process; asserts exit 0
        committed = time.monotonic()
        _wait(readers, committed, "after the night")
    finally:
        for reader in readers:
            reader.stop.set()
        for reader in readers:
            reader.join(scaled(300))
    assert current_run(str(root)) == "r2"
    for reader in readers:
        assert not reader.errors, f"{reader.name} read failed:\n{reader.errors[0]}"

    nights = {run: _night(root / "runs" / run) for run in ("r1", "r2")}  # each night as committed
    link = readers[0].reads
    seen = [run for _, (run, _) in link]
    assert set(seen) <= set(nights) and seen[0] == "r1" and seen[-1] == "r2", seen
    for started, (run, tables) in link:
        assert tables == nights[run], f"a read of {run} through the link found a partial night ({started})"
    for _, tables in readers[1].reads:
        for name, got in tables.items():
            assert got in (nights["r1"][name], nights["r2"][name]), f"current_table({name!r}) read a partial night"
    reports = {run: _verify(root / "runs" / run) for run in ("r1", "r2")}
    assert all(rc == 0 for rc, _ in reports.values()), reports
    for started, (rc, report) in readers[2].reads:
        assert rc == 0, f"verify ROOT failed during the commit ({started}): {report}"
        assert report in (reports["r1"][1], reports["r2"][1]), f"verify ROOT saw a partial night: {report[:500]}"
    # every reader read both sides of the switch
    assert all(r.reads[0][0] < committed < r.reads[-1][0] for r in readers)


# --- two API threads ------------------------------------------------------------------------------------------

THREAD_TIMEOUT_S = 300  # a pipeline that makes no progress never ends: the test fails instead


def _papers(names: list[str]) -> list[dict[str, str]]:
    return [{"paper_id": n.removesuffix(".md"), "markdown": (EXAMPLES / "corpus" / n).read_text(encoding="utf-8")}
            for n in names]


def _chunk_rows(papers: list[dict[str, str]]) -> list[dict]:
    """Chunk rows of ``papers`` through the API, in chunk id order."""
    return sorted(api.chunk(ray.data.from_items(papers)).take_all(), key=lambda r: r["chunk_id"])


def _chunk_and_embed(papers: list[dict[str, str]]) -> tuple[list[dict], list[dict]]:
    """Chunk rows and embeddings rows of ``papers`` through the API, each list in chunk id order."""
    chunks = api.chunk(ray.data.from_items(papers)).materialize()
    vectors = api.embed(chunks).take_all()
    return sorted(chunks.take_all(), key=lambda r: r["chunk_id"]), sorted(vectors, key=lambda r: r["chunk_id"])


def _same_vectors(got: list[dict], want: list[dict], what: str) -> None:
    strip = lambda rows: [{k: v for k, v in r.items() if k != "vector"} for r in rows]
    assert strip(got) == strip(want), f"{what}: embeddings rows differ"
    np.testing.assert_allclose(np.stack([r["vector"] for r in got]), np.stack([r["vector"] for r in want]),
                               atol=1e-5, err_msg=what)


def test_two_api_threads_get_what_each_gets_alone(ray_local):
    """One thread chunks and embeds two papers (``api.chunk`` -> ``api.embed``: model actors) while another chunks
    two other papers over and over (``api.chunk``: tasks) until the first is done, both on the session Ray."""
    papers_a, papers_b = _papers(PAPERS[:2]), _papers(PAPERS[2:4])
    alone_a, alone_b = _chunk_and_embed(papers_a), _chunk_rows(papers_b)

    got_a: list[Any] = []
    got_b: list[Any] = []
    start, done = threading.Barrier(2), threading.Event()

    def embedding() -> None:
        start.wait()
        try:
            got_a.append(_chunk_and_embed(papers_a))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            got_a.append(exc)
        done.set()

    def chunking() -> None:
        start.wait()
        while True:  # for as long as the other call runs (once at least): every call meets it at some stage
            try:
                got_b.append(_chunk_rows(papers_b))
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                got_b.append(exc)
                return
            if done.is_set():
                return

    threads = [threading.Thread(target=fn, name=fn.__name__, daemon=True) for fn in (embedding, chunking)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + scaled(THREAD_TIMEOUT_S)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    done.set()  # a chunking thread still going stops after its current call
    assert not hung, f"two concurrent API calls made no end (a hang): {hung}"
    errors = [r for r in (*got_a, *got_b) if isinstance(r, BaseException)]
    assert not errors, f"a concurrent API call failed: {errors[0]!r}"

    (chunks, vectors), (chunks_alone, vectors_alone) = got_a[0], alone_a
    assert chunks == chunks_alone, "chunk + embed thread: chunk rows differ from the same call alone"
    assert [v["chunk_id"] for v in vectors] == [c["chunk_id"] for c in chunks]
    _same_vectors(vectors, vectors_alone, "chunk + embed thread")
    assert got_b and all(rows == alone_b for rows in got_b), "chunk thread: rows differ from the same call alone"
    for papers, rows in ((papers_a, chunks), (papers_b, alone_b)):  # each thread's own papers, at exact offsets
        text = {p["paper_id"]: p["markdown"] for p in papers}
        assert {c["paper_id"] for c in rows} == set(text)
        assert all(text[c["paper_id"]][c["start"]:c["end"]] == c["text"] for c in rows)


# --- encodings drifting between nights ------------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"


def _chunk(corpus: Path, out: Path, normalize: tuple[str, ...], previous: Path | None = None) -> dict:
    _, manifest = run_chunk(ChunkJob(input=str(corpus), output=str(out), metadata=str(corpus.parent / "metadata.jsonl"),
                                     previous=str(previous) if previous else None,
                                     chunker=ChunkerConfig(normalization=normalize)))
    return manifest["counts"]


def _check_night(run: Path, normalize: tuple[str, ...]) -> dict[str, dict]:
    """The run verifies; each paper's stored text is its source decoded as is and normalised as configured; each
    chunk is that text at its character and byte offsets (and, without normalisation, the source's bytes at its
    byte offsets). Returns the papers rows by id."""
    report = verify_run(str(run))
    assert report["n_errors"] == 0 and report["chunks"] > 0, report["errors"]
    papers = {p["paper_id"]: p for p in pq.read_table(run / "papers").to_pylist()}
    raws = {pid: Path(p["source"]).read_bytes() for pid, p in papers.items()}
    for pid, p in papers.items():
        assert p["markdown"] == normalize_text(raws[pid].decode("utf-8"), normalize), pid
        assert p["source_sha256"] == hashlib.sha256(raws[pid]).hexdigest(), f"{pid}: not the bytes it has now"
    for c in pq.read_table(run / "chunks").to_pylist():
        text = papers[c["paper_id"]]["markdown"]
        assert text[c["start"]:c["end"]] == c["text"], (c["paper_id"], c["chunk_index"])
        assert text.encode("utf-8")[c["byte_start"]:c["byte_end"]] == c["text"].encode("utf-8")
        if not normalize:
            assert raws[c["paper_id"]][c["byte_start"]:c["byte_end"]] == c["text"].encode("utf-8")
    return papers


def _same_as_scratch(night: Path, scratch: Path) -> None:
    for table in ("papers", "chunks", "quarantine"):
        assert_tables_match(pq.read_table(night / table), pq.read_table(scratch / table), table)


@pytest.mark.parametrize("normalize", [(), ("crlf",)], ids=["as-is", "normalize-crlf"])
def test_encodings_drifting_between_nights_keep_offsets_exact(ray_local, tmp_path, normalize):
    """UTF-8 -> BOM, LF -> CRLF, -> latin-1 and back, over three nights: offsets exact, verify clean, the
    undecodable paper a quarantine row, each night equal to a run from scratch."""
    names = PAPERS[:5]
    ids = [n.removesuffix(".md") for n in names]
    corpus = tmp_path / "c"
    corpus.mkdir()
    for name in names:
        shutil.copy(EXAMPLES / "corpus" / name, corpus / name)
    shutil.copy(EXAMPLES / "corpus" / "metadata.jsonl", tmp_path / "metadata.jsonl")
    original = {name: (corpus / name).read_bytes() for name in names}
    _chunk(corpus, tmp_path / "n1", normalize)
    first = _check_night(tmp_path / "n1", normalize)

    # night 2: a BOM; CRLF; latin-1 bytes; a BOM, CRLF and an edit; one paper left as it was
    (corpus / names[0]).write_bytes(BOM + original[names[0]])
    (corpus / names[1]).write_bytes(original[names[1]].replace(b"\n", b"\r\n"))
    latin1 = original[names[2]].decode("utf-8").encode("latin-1", "replace")
    with pytest.raises(UnicodeDecodeError):
        latin1.decode("utf-8")
    (corpus / names[2]).write_bytes(latin1)
    (corpus / names[3]).write_bytes(BOM + original[names[3]].replace(b"\n", b"\r\n") + b"\r\nA late erratum.\r\n")
    counts = _chunk(corpus, tmp_path / "n2", normalize, previous=tmp_path / "n1")
    papers = _check_night(tmp_path / "n2", normalize)
    assert sorted(papers) == sorted(ids[:2] + ids[3:])  # the undecodable paper costs itself only
    [bad] = pq.read_table(tmp_path / "n2" / "quarantine").to_pylist()
    assert (bad["paper_id"], bad["reason"]) == (ids[2], "invalid_utf8") and "at byte" in bad["detail"], bad
    assert papers[ids[0]]["markdown"] == "\ufeff" + first[ids[0]]["markdown"]  # the BOM is a character of the text
    # unchanged: the paper left as it was; changed: every paper whose bytes changed, even where its text
    # normalises to the same (its row records the bytes it now has, as a run from scratch does)
    assert (counts["papers_unchanged"], counts["papers_changed"], counts["papers_removed"]) == (1, 3, 0), counts
    if normalize:  # LF -> CRLF normalises to the same text: the same chunks
        same = lambda run: sorted((c["chunk_id"], c["start"], c["end"], c["text"])
                                  for c in pq.read_table(run / "chunks").to_pylist() if c["paper_id"] == ids[1])
        assert same(tmp_path / "n2") == same(tmp_path / "n1")
    else:
        assert "crlf" in papers[ids[1]]["flags"] and "\r\n" in papers[ids[1]]["markdown"]
    _chunk(corpus, tmp_path / "s2", normalize)
    _same_as_scratch(tmp_path / "n2", tmp_path / "s2")

    # night 3: the latin-1 paper and the BOM paper back as they were; the others' bytes as on night 2
    (corpus / names[0]).write_bytes(original[names[0]])
    (corpus / names[2]).write_bytes(original[names[2]])
    counts = _chunk(corpus, tmp_path / "n3", normalize, previous=tmp_path / "n2")
    papers = _check_night(tmp_path / "n3", normalize)
    assert sorted(papers) == sorted(ids) and pq.read_table(tmp_path / "n3" / "quarantine").num_rows == 0
    assert papers[ids[2]]["markdown"] == first[ids[2]]["markdown"]
    # the three papers whose bytes night 2 recorded are not even read; the returning paper is added again
    assert (counts["papers_unread"], counts["papers_added"], counts["papers_changed"]) == (3, 1, 1), counts
    _chunk(corpus, tmp_path / "s3", normalize)
    _same_as_scratch(tmp_path / "n3", tmp_path / "s3")
