"""Hostile input and operator mistakes at the CLI's entry points: options, YAML configs, run folders, pairs
files, gold files. The contract: rc 0 with every valid row landed and each bad one recorded with its
reason, or rc 2 with one clear line and no traceback; a user's files are never touched; nothing hangs.
(Corpus readers have their own module, tests/test_hostile_readers.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verbatim_batch.cli import build_parser, config, main
from verbatim_batch.core.runs import read_table
from verbatim_batch.engine.ray_env import actor_pool
from verbatim_batch.extract.pairs import pairs_from_records, read_pair_records

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "verbatim_batch" / "examples" / "corpus"


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """(rc, stderr) of the CLI in-process; argparse's own exits count as rc too."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if "error" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("argv, says", [
    (["retrieve", "--index", "i", "--queries", "q", "--output", "o", "--rrf-k", "-60"], "--rrf-k: must be >= 0"),
    (["chunk", "--input", "i", "--output", "o", "--max-paper-mb", "-1"], "--max-paper-mb: must be > 0"),
    (["embed", "--chunks", "c", "--output", "o", "--num-cpus", "0"], "--num-cpus: must be >= 1"),
    (["extract", "--pairs", "p", "--output", "o", "--threshold", "1.5"], "--threshold: must be >= 0 and <= 1"),
    (["extract", "--pairs", "p", "--output", "o", "--batch-rows", "nan"], "--batch-rows: expected an integer"),
    (["chunk", "--input", "i", "--output", "o", "--run-id", "x" * 300], "run id"),
    (["chunk", "--input", "i", "--output", "o", "--run-id", "../up"], "run id"),
])
def test_bad_options_are_refused_before_anything_runs(capsys, tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    rc, err = run_cli(capsys, *argv)
    assert rc == 2 and says in one_error_line(err)
    assert not (tmp_path / "o").exists()


def test_cluster_resources_always_leave_room_to_make_progress():
    """A CPU actor pool never holds every CPU: the read/write tasks around it must be able to run."""
    for n_cpus in range(1, 9):
        for concurrency in range(1, 6):
            for per_actor in (0.5, 1.0):
                actors, cpus = actor_pool(n_cpus, concurrency, per_actor)
                assert 1 <= actors <= concurrency
                assert actors * cpus <= max(0, n_cpus - 1) + 1e-9, (n_cpus, concurrency, per_actor)
    assert actor_pool(1, 1, 1.0) == (1, 0.0) and actor_pool(16, 4, 1.0) == (4, 1.0)


@pytest.mark.slow
def test_embed_on_one_cpu_does_not_deadlock(ray_local, tmp_path):
    """`--num-cpus 1` used to hang: the embedding actor took the only CPU and the read could never run."""
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    papers = tmp_path / "papers"
    papers.mkdir()
    for f in sorted(CORPUS.glob("*.md"))[:2]:
        (papers / f.name).write_bytes(f.read_bytes())
    chunks, _ = run_chunk(ChunkJob(input=str(papers), output=str(tmp_path / "chunks")))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "verbatim_batch.cli", "embed", "--chunks", chunks, "--output",
                           str(tmp_path / "emb"), "--num-cpus", "1"], env=env, capture_output=True, text=True)
    # no timeout of its own: a hang is caught by the test's pytest-timeout, which a busy machine (load 40 on two
    # cores, where this took over 240 s) does not reach
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_table(str(tmp_path / "emb"), "embeddings").num_rows == read_table(chunks, "chunks").num_rows > 0


# --- configs ---------------------------------------------------------------------------------------------------

ALIAS_BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"] + [
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefg", "bcdefgh", strict=True)]
) + "\nchunk:\n  min_chars: *h\n"


@pytest.mark.parametrize("text, says", [
    (ALIAS_BOMB, "aliases"),
    ("chunk: [1, 2]\n", "must be a mapping"),
    ("[1, 2]\n", "a config is a mapping"),
    ("chunk:\n  min_chars: true\n", "min_chars"),
    ("chunk:\n  nonsense: 3\n", "unknown key"),
    ("1: 2\n", "option names are strings"),
    ("chunk:\n  min_chars: " + "[" * 40 + "1" + "]" * 40 + "\n", "min_chars"),
    ("chunk:\n  min_chars: " + "[" * 40 + "\n", "not valid YAML"),
    ("\x00\xff\xfe", "config"),
])
def test_bad_configs_give_one_line(capsys, tmp_path, text, says):
    conf = tmp_path / "conf.yaml"
    conf.write_text(text, encoding="latin-1")
    rc, err = run_cli(capsys, "chunk", "--config", str(conf), "--input", str(CORPUS), "--output", str(tmp_path / "o"))
    assert rc == 2 and says in one_error_line(err)


def test_null_config_values_keep_the_defaults(tmp_path):
    conf = tmp_path / "conf.yaml"
    conf.write_text("address:\nchunk:\n  min_chars: null\n  heading_levels:\n  no_store_text: null\n")
    from verbatim_batch.cli import parse_args

    args = parse_args(["chunk", "--config", str(conf), "--input", "i", "--output", "o"])
    assert (args.min_chars, args.heading_levels, args.no_store_text, args.address) == (500, (1, 2, 3, 4), False,
                                                                                       None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_config_loader_fuzz(tmp_path, data):
    """Any bytes: a mapping, or ConfigError; never another exception."""
    conf = tmp_path / "fuzz.yaml"
    conf.write_bytes(data)
    try:
        loaded = config.apply(build_parser(), "extract", str(conf))
    except config.ConfigError:
        return
    assert isinstance(loaded, dict)


# --- run folders -----------------------------------------------------------------------------------------------

def test_overwrite_never_replaces_a_folder_this_tool_did_not_write(capsys, tmp_path):
    mine = tmp_path / "my-papers"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    rc, err = run_cli(capsys, "chunk", "--input", str(CORPUS), "--output", str(mine), "--overwrite")
    assert rc == 2 and "not a run folder" in one_error_line(err)
    assert (mine / "notes.txt").read_text() == "precious" and sorted(os.listdir(mine)) == ["notes.txt"]
    fake = tmp_path / "fake-run"
    fake.mkdir()
    (fake / "manifest.json").write_text("[]")
    (fake / "data.csv").write_text("1,2")
    rc, err = run_cli(capsys, "chunk", "--input", str(CORPUS), "--output", str(fake), "--overwrite")
    assert rc == 2 and (fake / "data.csv").exists()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    rc, err = run_cli(capsys, "chunk", "--input", str(CORPUS), "--output", str(a_file), "--overwrite")
    assert rc == 2 and a_file.read_text() == "x"


def test_output_inside_the_input_folder_is_refused(capsys, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\ntext\n")
    rc, err = run_cli(capsys, "chunk", "--input", str(corpus), "--output", str(corpus / "run"))
    assert rc == 2 and "inside the input folder" in one_error_line(err)
    assert sorted(os.listdir(corpus)) == ["a.md"]


@pytest.mark.parametrize("manifest", [None, "[]", "{not json", '{"run_id": 3}', "[[[[[[[[[[[[[[[[[[[[[["])
def test_report_and_verify_on_what_is_not_a_run(capsys, tmp_path, manifest):
    target = tmp_path / "thing"
    if manifest is None:
        target.write_text("a file")
    else:
        target.mkdir()
        (target / "manifest.json").write_text(manifest)
    for command in ("report", "verify"):
        rc, err = run_cli(capsys, command, str(target))
        assert rc == 2, (command, err)
        one_error_line(err)
    assert not (target.is_dir() and (target / "report.html").exists())


# --- pairs files -----------------------------------------------------------------------------------------------

GOOD = {"query": "training data size", "chunk": "We train on 5,000 annotated pairs for three epochs."}
BAD_LINES = [
    ("deep", "[" * 5000 + "]" * 5000, "invalid_json"),
    ("surrogate", json.dumps({"query": "q", "chunk": "bad \udc80 text"}), "invalid_text"),
    ("bool id", json.dumps({"query": "q", "chunk": "x", "query_id": True}), "invalid_id"),
    ("list id", json.dumps({"query": "q", "chunk": "x", "chunk_id": [1]}), "invalid_id"),
    ("not object", "[1, 2]", "invalid_record"),
    ("no query", json.dumps({"chunk": "x"}), "missing_query"),
    ("chunk type", json.dumps({"query": "q", "chunk": 5}), "invalid_chunk"),
    ("truncated", '{"query": "q", "chu', "invalid_json"),
]


def test_bad_pair_lines_become_error_rows_next_to_good_ones(tmp_path):
    path = tmp_path / "pairs.jsonl"
    lines = [json.dumps(GOOD)] + [line for _, line, _ in BAD_LINES] + [json.dumps(GOOD | {"query": "epochs"})]
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n\xff\xfe\n")
    table = pairs_from_records(read_pair_records(str(path)))
    rows = table.to_pylist()
    assert len(rows) == len(lines) + 1  # every line one row, the undecodable one included
    errors = [r["input_error"] for r in rows]
    assert errors[0] is None and errors[len(lines) - 1] is None
    for (name, _, reason), err in zip(BAD_LINES, errors[1:], strict=False):
        assert err and err.startswith(reason), (name, err)


def test_chunk_text_that_contradicts_its_chunk_id_is_an_error_row():
    known = {"c1": {"text": "the real chunk", "start": 10, "paper_id": "P", "chunk_index": 2}}
    rows = pairs_from_records([{"query": "q", "chunk_id": "c1", "chunk": "some other text"},
                               {"query": "q", "chunk_id": "c1", "chunk": "the real chunk"},
                               {"query": "q", "chunk_id": "c1"}], known).to_pylist()
    assert rows[0]["input_error"].startswith("chunk_mismatch")
    assert rows[1]["input_error"] is None and rows[1]["chunk_start"] == 10
    assert rows[2]["input_error"] is not None  # the same pair again: a duplicate


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.binary(max_size=80),
    st.dictionaries(st.sampled_from(["query", "chunk", "query_id", "chunk_id", "paper_id", "chunk_index", "rank"]),
                    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                              st.lists(st.integers(), max_size=3)), max_size=6).map(json.dumps).map(str.encode),
), max_size=12))
def test_pairs_reader_fuzz(tmp_path_factory, lines):
    """Any lines: one PAIR_INPUT row per non-blank line, an error row or a usable pair, never an exception."""
    path = tmp_path_factory.mktemp("fuzz") / "pairs.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    table = pairs_from_records(read_pair_records(str(path)))
    with open(path, encoding="utf-8", errors="replace") as fh:  # universal newlines, as the reader reads
        assert table.num_rows == sum(1 for line in fh if line.strip())
    for r in table.to_pylist():
        assert r["input_error"] is not None or (isinstance(r["query"], str) and isinstance(r["chunk"], str))


# --- gold files ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, says", [
    ("", "no gold pairs"),
    ('{"query": "q", "chunk": "abc def", "gold_spans": "abc"}\n', "'gold_spans' must be a list"),
    ('{"query": "q", "chunk": "abc", "chunk_index": [1]}\n', "'chunk_index' must be an integer"),
    ("[" * 3000 + "\n", "JSON"),
    (b"\xff\xfe{}\n", "not UTF-8"),
])
def test_bad_gold_files_give_one_line(capsys, tmp_path, content, says):
    gold = tmp_path / "gold.jsonl"
    gold.write_bytes(content if isinstance(content, bytes) else content.encode())
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"query": "q", "chunk": "abc def", "spans": []}\n')
    rc, err = run_cli(capsys, "evaluate", "--gold", str(gold), "--predictions", str(preds))
    assert rc == 2 and says in one_error_line(err)
