"""A refusal before work leaves nothing, and a chain checks everything it reads before its first stage."""

from __future__ import annotations

import json
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


def test_ctrl_c_ends_a_run_with_one_line_and_no_traceback(tmp_path):
    """SIGINT to the command's process group (what Ctrl-C sends) while a stage runs: exit 130, one line."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())", "run",
           "--input", str(EXAMPLES / "corpus"), "--queries", str(EXAMPLES / "queries.jsonl"), "--output",
           str(tmp_path / "chain"), "--num-cpus", "2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default. CI may start the suite with SIGINT
    # ignored (a background job), which the child would inherit and keep: the driver would never see the Ctrl-C.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("[embed]"):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(300), "".join(lines[-20:])
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)  # every line the command wrote, before any is judged (its last one may still be unread)
    err = "".join(lines)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("verbatim-batch run: interrupted; committed work is kept")
    assert (tmp_path / "chain" / "chunks" / "manifest.json").is_file()  # the committed stage stays
    # no --run-id was given: the line names the one the run used, and a rerun with it resumes (issue 53, item 3)
    import re

    run_id = re.search(r"rerun with the same --run-id to resume: --run-id (\S+)\)$", lines[-1].strip()).group(1)
    rerun = subprocess.run([*cmd, "--run-id", run_id], capture_output=True, text=True,
                           env=env, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming run {run_id}: chunks" in rerun.stderr and "taken as committed" in rerun.stderr, rerun.stderr
    assert json.loads((tmp_path / "chain" / "chunks" / "manifest.json").read_text())["run_id"] == run_id


@pytest.mark.parametrize("argv", [
    ["extract", "--pairs", "{fifo}", "--output", "{tmp}/o"],
    ["evaluate", "--gold", "{fifo}", "--predictions", "{tmp}/p"],
    ["evaluate-retrieval", "--retrieval", "{tmp}/r", "--qrels", "{fifo}"],
    ["retrieve", "--index", "{tmp}/i", "--queries", "{fifo}", "--output", "{tmp}/o"],
    ["chunk", "--input", "/dev/zero", "--output", "{tmp}/o"],
    ["train", "--train", "{fifo}", "--output", "{tmp}/o"],
])
def test_special_files_as_option_files_are_refused_before_they_are_opened(tmp_path, capsys, argv):
    """A named pipe given as a file option used to hang (nothing ever writes to it); every path option is
    checked where the options are read."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(capsys, [a.format(fifo=fifo, tmp=tmp_path) for a in argv], "is not a regular file or a folder")


def test_a_pipe_named_in_a_manifest_is_never_opened(tmp_path):
    import os

    from verbatim_batch.core.records import iter_records

    os.mkfifo(tmp_path / "q.jsonl")
    with pytest.raises(ValueError, match="not a regular file"):
        next(iter_records(str(tmp_path / "q.jsonl")))


def test_each_refusal_class_leaves_nothing(tmp_path, capsys):
    """Wrong run kind, a folder that is no run, a bad config value: one line, exit 2, and no output folder."""
    notrun = tmp_path / "notrun"
    notrun.mkdir()
    (tmp_path / "bad.yaml").write_text("embed:\n  batch_rows: -1\n")
    cases = [
        (["embed", "--chunks", str(notrun), "--output", str(tmp_path / "o1")], "not a committed run"),
        (["index", "--embeddings", str(notrun), "--chunks", str(notrun), "--output", str(tmp_path / "o2")],
         "not a committed run"),
        (["extract", "--retrieval", str(notrun), "--output", str(tmp_path / "o3")], "not a committed run"),
        (["embed", "--config", str(tmp_path / "bad.yaml"), "--chunks", str(notrun), "--output", str(tmp_path / "o4")],
         "embed.batch_rows must be >= 1"),
    ]
    for argv, message in cases:
        try:
            code = main(argv)
        except SystemExit as exc:  # a config error is the parser's: it exits
            code = exc.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and err.count("\n") == 0, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "notrun"]


def test_an_error_caused_by_ctrl_c_counts_as_the_interrupt():
    """Ray Data may turn the KeyboardInterrupt raised while a dataset runs into its own failure (seen under load:
    exit 1 instead of 130): an error whose chain holds a KeyboardInterrupt, or any error after a SIGINT reached
    the process, ends the command as interrupted."""
    from verbatim_batch.cli import _CTRL_C, interrupted

    _CTRL_C.clear()
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            raise RuntimeError("dataset execution failed") from ki
    except RuntimeError as exc:
        assert interrupted(exc)
    assert not interrupted(RuntimeError("a real failure"))
    _CTRL_C.set()
    try:
        assert interrupted(RuntimeError("after Ctrl-C"))
    finally:
        _CTRL_C.clear()


def test_ray_is_shut_down_only_after_ray_datas_stopping_threads_end(monkeypatch):
    """A Ctrl-C's ending shuts Ray down; Ray Data's executor thread may still be stopping its dataset (it waits
    2 s for it; on a busy machine it runs on) and its next call into a closed core worker ends the process with
    exit 1 (seen on CI). ``stop_ray_quietly`` waits for those threads first. Ray here is a stand-in that records
    when it is shut down: the real one is this test worker's session Ray, which other tests use."""
    import threading
    import time
    import types

    from verbatim_batch import cli

    order: list[str] = []

    def stopping() -> None:
        time.sleep(0.3)
        order.append("executor ended")

    fake = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: order.append("ray shut down"))
    monkeypatch.setitem(__import__("sys").modules, "ray", fake)
    executor = threading.Thread(target=stopping, name="StreamingExecutor-dataset_test_0", daemon=True)
    other = threading.Thread(target=time.sleep, args=(60,), name="not-ray-data", daemon=True)  # not waited for
    executor.start()
    other.start()
    cli.stop_ray_quietly()
    assert order == ["executor ended", "ray shut down"]
    assert other.is_alive()
