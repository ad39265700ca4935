"""The environment class of issue 44's held-out fault round, kept as tests: a run in a hostile environment (the C
locale, a HOME and a TMPDIR that do not exist, umask 000, odd characters in every path, a secret in an option)
writes the same chunks as a run in a plain one, verifies, writes the secret nowhere, and leaves the local Ray's
auth token readable by this user only; a TMPDIR too deep for Ray's sockets is one line naming the fix; and id
types drifting between nights (integer paper ids one night, the same ids as strings the next) carry the papers as
the same ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import EXAMPLES, PAPERS

from verbatim_batch.stages.chunk import ChunkJob, run_chunk

CHUNK_COLUMNS = ["chunk_id", "paper_id", "chunk_index", "start", "end", "text"]
SECRET = "s3cr3t-Pa55"  # noqa: S105 - a made-up password, looked for in every file the run writes


CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]


def _env() -> dict[str, str]:
    """This environment without what points a command at another Ray or a fault."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT", "RAY_TMPDIR", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env.pop("PYTHONIOENCODING", None)
    return env


def _chunks(run: Path | str) -> list[dict]:
    table = pq.read_table(Path(run) / "chunks", columns=CHUNK_COLUMNS)
    return sorted(table.to_pylist(), key=lambda r: (r["paper_id"], r["chunk_index"]))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_run_in_a_hostile_environment_writes_the_same_chunks_and_no_secret(ray_local, tmp_path):
    """Every hostile part at once, in a process of its own (the environment is the process's): the run commits,
    its chunks equal a plain run's (ids, offsets and text bit-exact), ``verify`` passes in the same environment,
    and the Pushgateway password given in ``--metrics-push`` (to a port where nothing listens) is in no file the
    run wrote and not in its output."""
    plain_in = tmp_path / "plain"
    odd_in = tmp_path / "papers é #1 'q' %20 [x]"
    for folder in (plain_in, odd_in):
        folder.mkdir()
        for name in PAPERS[:2]:
            (folder / name).write_bytes((EXAMPLES / "corpus" / name).read_bytes())
    reference, _ = run_chunk(ChunkJob(input=str(plain_in), output=str(tmp_path / "reference")))

    out = tmp_path / "out ü #2 'r' %41"
    no_tmp = Path(tempfile.mkdtemp(prefix="vb-", dir="/tmp")) / "t"  # short: Ray's sockets live under TMPDIR
    env = _env() | {"LANG": "C", "LC_ALL": "C", "HOME": str(tmp_path / "no-home"), "TMPDIR": str(no_tmp)}
    push = f"http://metrics:{SECRET}@127.0.0.1:{_closed_port()}"
    done = subprocess.run([*CLI, "chunk", "--input", str(odd_in), "--output", str(out), "--num-cpus", "1",
                           "--metrics-push", push], env=env, capture_output=True, text=True, errors="replace",
                          preexec_fn=lambda: os.umask(0), timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "metrics not pushed" in done.stderr  # the gateway is down: a warning, never the run
    assert _chunks(out) == _chunks(reference)

    checked = subprocess.run([*CLI, "verify", str(out)], env=env, capture_output=True, text=True, errors="replace",
                             timeout=300)
    assert checked.returncode == 0, checked.stderr[-3000:]

    assert SECRET not in done.stdout + done.stderr + checked.stdout + checked.stderr
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if SECRET.encode() in p.read_bytes()]
    # the local Ray's auth token: this user's alone, though Ray itself would write it with the umask (0666 here)
    token = tmp_path / "no-home" / ".ray" / "auth_token"
    assert token.is_file() and len(token.read_text()) == 64
    assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in token.parent.iterdir()] == ["auth_token"]  # nothing half written left beside it


def test_a_tmpdir_too_deep_for_rays_sockets_is_one_line_with_the_fix(tmp_path):
    """Ray puts its session folder, and its Unix sockets, under TMPDIR (RAY_TMPDIR first); a deep TMPDIR (a
    scheduler's per-job folder) overflows a socket path's 107 bytes. The command ends at the first attempt with
    one line that names the fix, exit 2, and nothing written."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / PAPERS[0]).write_bytes((EXAMPLES / "corpus" / PAPERS[0]).read_bytes())
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    env = _env() | {"TMPDIR": str(deep)}
    env.pop("RAY_TMPDIR", None)
    done = subprocess.run([*CLI, "chunk", "--input", str(corpus), "--output", str(tmp_path / "out"), "--num-cpus",
                           "1"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.strip().splitlines() if "verbatim-batch" in x]
    assert "did not start after 1 attempt(s)" in line and "set RAY_TMPDIR to a short folder" in line, line
    assert not (tmp_path / "out").exists()


def _parquet_corpus(path: Path, ids: list, texts: list[str]) -> Path:
    path.mkdir()
    id_type = pa.int64() if isinstance(ids[0], int) else pa.string()
    pq.write_table(pa.table({"paper_id": pa.array(ids, id_type), "title": [f"Paper {i}" for i in ids],
                             "markdown": texts}), path / "papers.parquet")
    return path


def test_paper_ids_that_drift_from_integers_to_strings_carry_the_same_papers(ray_local, tmp_path):
    """Night 1 reads a Parquet corpus whose ``paper_id`` column is int64; night 2 the same papers with the ids as
    strings (an export that changed its types). The ids are the same papers: night 2 carries all of them and its
    chunks equal night 1's."""
    texts = [(EXAMPLES / "corpus" / name).read_text(encoding="utf-8") for name in PAPERS[:3]]
    night1, _ = run_chunk(ChunkJob(input=str(_parquet_corpus(tmp_path / "c1", [101, 102, 103], texts)),
                                   output=str(tmp_path / "n1")))
    night2, _ = run_chunk(ChunkJob(input=str(_parquet_corpus(tmp_path / "c2", ["101", "102", "103"], texts)),
                                   output=str(tmp_path / "n2"), previous=night1))
    counts = json.loads((Path(night2) / "manifest.json").read_text())["counts"]
    assert counts["papers_unchanged"] == 3 and counts["papers_chunked"] == 0, counts
    assert _chunks(night2) == _chunks(night1)
    assert {r["paper_id"] for r in _chunks(night1)} == {"101", "102", "103"}
