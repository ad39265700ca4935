"""docs/troubleshooting.md lists the one-line errors the CLI prints, each with its fix (issue 43).

Each row of the page's ``| line | exit | it means | do |`` tables is a pattern of a line (``...`` stands for
any text) and its exit code. Every row a command reaches before it starts Ray is driven here by a real bad input
through the CLI's ``main`` (and one through the installed ``verbatim-batch`` script): the command must end with
that exit code and one line on stderr, no traceback, that matches the row, with nothing written and no Ray
started. The other rows (faults while a stage runs, signals) name the test that checks them in ``ELSEWHERE``, or
say in ``UNREACHED`` why no test reaches them; those are checked against the package's source instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.runs import build_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
HEADER = ["line", "exit", "it means", "do"]
PREFIX = re.compile(r"^verbatim-batch(?: [a-z][a-z-]*)?: ")  # the part every line starts with, not in the table
EXAMPLES = ROOT / "verbatim_batch" / "examples"


@dataclass(frozen=True)
class Row:
    """One row of the page: the line's pattern, its exit code, and where it is on the page."""

    pattern: str
    exit: int
    lineno: int

    def matches(self, line: str) -> bool:
        """Whether ``line`` (without its ``verbatim-batch COMMAND: `` prefix) is this row's line."""
        regex = ".*".join(re.escape(part) for part in self.pattern.split("..."))
        return re.fullmatch(regex, line, re.S) is not None


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row (``\\|`` is a ``|`` inside a cell)."""
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def page_rows(text: str) -> list[Row]:
    """The rows of every table on the page whose header is ``HEADER``."""
    rows: list[Row] = []
    in_table = False
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells == HEADER:
            in_table = True
        elif in_table and not set("".join(cells)) <= set("-: "):
            m = re.fullmatch(r"`([^`]+)`", cells[0])
            assert m and cells[1].isdigit(), f"troubleshooting.md:{lineno}: not `line` | exit: {line}"
            rows.append(Row(m.group(1), int(cells[1]), lineno))
    return rows


ROWS = page_rows(PAGE.read_text(encoding="utf-8"))


def row_of(key: str) -> Row:
    """The one row whose pattern contains ``key``."""
    found = [r for r in ROWS if key in r.pattern]
    assert len(found) == 1, f"{key!r} names {len(found)} rows of docs/troubleshooting.md, not one"
    return found[0]


# Rows no case here reaches cheaply: the test that checks each line (tests/<module>::<function>).
ELSEWHERE = {
    "was started with other settings":
        "test_retrieval_pipeline.py::test_a_killed_run_resumed_with_other_settings_is_refused_never_mixed",
    "needs ...: pip install":
        "test_publish.py::test_without_the_iceberg_extra_publish_and_a_publishing_night_name_it_exit_2",
    "out of memory in this process":
        "test_worker_faults.py::test_machine_limits_in_the_driver_end_with_one_line_and_exit_2",
    "cannot start a thread": "test_worker_faults.py::test_machine_limits_in_the_driver_end_with_one_line_and_exit_2",
    "was killed for memory":
        "test_worker_faults.py::test_a_worker_out_of_memory_ends_with_the_figures_and_the_option_to_lower",
    "died more often": "test_worker_faults.py::test_a_worker_killed_at_every_batch_stops_the_stage_and_the_run_resumes",
    "stopped: it lost":
        "test_worker_faults.py::test_a_lost_raylet_ends_the_stage_with_a_line_of_ours_and_the_run_resumes",
    "interrupted;": "test_refusals.py::test_ctrl_c_ends_a_run_with_one_line_and_no_traceback",
    "terminated (SIGTERM)": "test_worker_faults.py::test_sigterm_mid_stage_ends_with_one_line_143_and_leaves_no_lock",
    "is not YAML it accepts": "test_troubleshooting.py::test_a_bad_pyiceberg_configuration_file_is_one_line",
    "cannot ... s3://": "test_troubleshooting.py::test_an_object_store_that_cannot_be_reached_is_one_line",
    "is inside the nightly root": "test_folder_kinds.py::test_report_on_a_nightly_root_reports_its_current_night",
    "a local Ray did not start":
        "test_environment.py::test_a_tmpdir_too_deep_for_rays_sockets_is_one_line_with_the_fix",
}
# Rows no test reaches, and why; their text is checked against the package's source.
UNREACHED: dict[str, str] = {}


@dataclass(frozen=True)
class Case:
    """A bad command line (``{name}``: a path of the ``world`` fixture; ``{out}``: an output that must not be
    written) and the key of the row its line must match."""

    name: str
    argv: tuple[str, ...]
    row: str
    as_root: bool = True  # False: root is exempt from what the case relies on (file permissions)


CASES = [
    # the command line
    Case("unknown command", ("chunks", "--input", "{corpus}"), "argument command: invalid choice"),
    Case("misspelt flag", ("embed", "--chunkz", "{chunk_run}", "--output", "{out}"), "did you mean"),
    Case("stage flag to one stage", ("embed", "--chunks", "{chunk_run}", "--output", "{out}", "--threshold", "0.3"),
         "did you mean"),
    Case("stray word", ("chunk", "--input", "{corpus}", "--output", "{out}", "stray"), "unrecognized arguments:"),
    Case("required flag missing", ("chunk", "--input", "{corpus}"), "the following arguments are required"),
    Case("required flag missing in a chain", ("nightly", "--input", "{corpus}", "--queries", "{queries}"),
         "the following arguments are required"),
    Case("value not a choice", ("chunk", "--input", "{corpus}", "--output", "{out}", "--format", "pdf"),
         "error: argument --...: ..."),
    Case("value out of range", ("extract", "--pairs", "{pairs}", "--output", "{out}", "--threshold", "2"),
         "error: argument --...: ..."),
    Case("value not an integer", ("chunk", "--input", "{corpus}", "--output", "{out}", "--max-chars", "1.5"),
         "error: argument --...: ..."),
    Case("value not a list", ("evaluate", "--gold", "{gold}", "--sweep-threshold", "0.2,x"),
         "error: argument --...: ..."),
    Case("--config without its file", ("chunk", "--input", "{corpus}", "--output", "{out}", "--config"),
         "error: argument --...: ..."),
    Case("run id with a slash", ("chunk", "--input", "{corpus}", "--output", "{out}", "--run-id", "../r1"),
         "error: argument --...: ..."),
    Case("address not an address", ("chunk", "--input", "{corpus}", "--output", "{out}", "--address", "nonsense"),
         "Ray address"),
    Case("address with nothing behind it", ("chunk", "--input", "{corpus}", "--output", "{out}", "--address",
                                            "{free_address}"), "no Ray cluster answers"),
    # the config file
    Case("config missing", ("extract", "--config", "{nowhere}.yaml", "--pairs", "{pairs}", "--output", "{out}"),
         "is not a file"),
    Case("config not YAML", ("extract", "--config", "{not_yaml}", "--pairs", "{pairs}", "--output", "{out}"),
         "not valid YAML"),
    Case("config key unknown", ("extract", "--config", "{unknown_key}", "--pairs", "{pairs}", "--output", "{out}"),
         "(not an option of any command)"),
    Case("config section key unknown", ("extract", "--config", "{unknown_section_key}", "--pairs", "{pairs}",
                                        "--output", "{out}"), "takes: ..."),
    Case("config value out of range", ("embed", "--config", "{bad_value}", "--chunks", "{chunk_run}", "--output",
                                       "{out}"), "config error: ...: ..., got ..."),
    # inputs
    Case("input missing", ("chunk", "--input", "{nowhere}", "--output", "{out}"), "not found..."),
    Case("query file missing", ("run", "--input", "{corpus}", "--queries", "{nowhere}.jsonl", "--output", "{out}"),
         "not found..."),
    Case("metadata missing", ("run", "--input", "{corpus}", "--queries", "{queries}", "--metadata",
                              "{nowhere}.jsonl", "--output", "{out}"), "not found..."),
    Case("pairs file missing", ("extract", "--pairs", "{nowhere}.jsonl", "--output", "{out}"), "not found..."),
    Case("publish source missing", ("publish", "{nowhere}", "--warehouse", "{out}"), "not found..."),
    Case("gold file missing", ("evaluate", "--gold", "{nowhere}.jsonl", "--predictions", "{extract_run}"),
         "not found..."),
    Case("input a pipe", ("chunk", "--input", "{fifo}", "--output", "{out}"), "is not a regular file or a folder"),
    Case("gold by chunk id without --chunks", ("evaluate", "--gold", "{gold}", "--predictions", "{extract_run}"),
         "names its chunk (chunk_id)"),
    Case("qrels record of another kind", ("evaluate-retrieval", "--retrieval", "{retrieve_run}", "--qrels",
                                          "{queries}"), "error: ..., line ...: ..."),
    Case("folder that is no run", ("embed", "--chunks", "{plain_folder}", "--output", "{out}"), "has no manifest.json"),
    Case("run missing", ("verify", "{nowhere}"), "has no manifest.json"),
    Case("run of the wrong kind", ("embed", "--chunks", "{extract_run}", "--output", "{out}"),
         "expects a committed run"),
    Case("run of the wrong kind to extract", ("extract", "--retrieval", "{chunk_run}", "--output", "{out}"),
         "expects a committed run"),
    Case("run folder as a corpus", ("chunk", "--input", "{chunk_run}", "--output", "{out}"), "not a corpus"),
    Case("run folder as a nightly root", ("nightly", "--root", "{chunk_run}", "--input", "{corpus}", "--queries",
                                          "{queries}"), "error: --root ... is ...: give --root ..."),
    Case("query file of plain text", ("run", "--input", "{corpus}", "--queries", "{plain_folder}/notes.txt",
                                      "--output", "{out}"), "a query file holds one JSON object per line"),
    Case("manifest not JSON", ("embed", "--chunks", "{broken_run}", "--output", "{out}"), "/manifest.json is"),
    # outputs
    Case("output is a run", ("chunk", "--input", "{corpus}", "--output", "{chunk_run}"), "pass --overwrite"),
    Case("output is no run", ("chunk", "--input", "{corpus}", "--output", "{plain_folder}", "--overwrite"),
         "exists and is not a run folder"),
    Case("output a symbolic link", ("chunk", "--input", "{corpus}", "--output", "{link}", "--overwrite"),
         "is a symbolic link"),
    Case("output inside the input", ("chunk", "--input", "{corpus}", "--output", "{corpus}/runs"),
         "is inside the input folder"),
    Case("output locked", ("chunk", "--input", "{corpus}", "--output", "{busy}"), "is being written by another run"),
    Case("output name too long", ("chunk", "--input", "{corpus}", "--output", "{long_name}"), "bytes; at most"),
    Case("output parent read-only", ("chunk", "--input", "{corpus}", "--output", "{read_only}/out"),
         "cannot write run folders", as_root=False),
    # options that go together
    Case("llm extractor without a model", ("extract", "--pairs", "{pairs}", "--output", "{out}", "--extractor", "llm"),
         "error: ... needs --..."),
    Case("option of another extractor", ("extract", "--pairs", "{pairs}", "--output", "{out}", "--base-url",
                                         "http://127.0.0.1:1/v1"), "do(es) not apply"),
    Case("evaluate with nothing to score", ("evaluate", "--gold", "{gold}"), "give --predictions"),
    Case("sweep of the llm extractor", ("evaluate", "--gold", "{gold}", "--sweep-threshold", "0.2",
                                        "--extractor", "llm"), "--sweep-threshold works with"),
    Case("train without dev pairs", ("train", "--train", "{chunk_run}", "--output", "{out}"), "--eval is required"),
    Case("run without its config", ("evaluate-retrieval", "--retrieval", "{no_config_run}", "--qrels", "{queries}"),
         "records no config"),
    Case("retrieval run without its query file", ("extract", "--retrieval", "{retrieve_run}", "--output", "{out}"),
         "records no query file"),
    Case("publish without a catalog", ("publish", "{extract_run}"), "cannot open the Iceberg catalog"),
]


def _fake_run(path: Path, command: str, tables: list[str]) -> str:
    """A committed run folder as the tool writes it: a manifest of ours naming ``tables`` (empty ones)."""
    path.mkdir(parents=True)
    manifest = build_manifest(run_id="r1", command=command, config={}, inputs=[],
                              tables={t: {"rows": 0, "files": 0} for t in tables}, counts={}, timings_s={})
    write_manifest(str(path), manifest)
    return str(path)


def _no_config_run(path: Path) -> str:
    """A retrieve run whose manifest records no config (written by hand, or by another tool)."""
    _fake_run(path, "retrieve", ["retrieval"])
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["config"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    return str(path)


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The files and folders the cases refer to, made once."""
    tmp = tmp_path_factory.mktemp("troubleshooting")
    corpus = tmp / "corpus"
    corpus.mkdir()
    shutil.copyfile(next(iter(sorted((EXAMPLES / "corpus").glob("*.md")))), corpus / "paper.md")
    (tmp / "queries.jsonl").write_text('{"query": "what is measured"}\n')
    (tmp / "pairs.jsonl").write_text('{"query": "what is measured", "chunk": "We measure recall."}\n')
    (tmp / "gold.jsonl").write_text('{"query": "q", "chunk_id": "c1", "relevant": true, "gold_spans": []}\n')
    (tmp / "not_yaml.yaml").write_text("extract: [\n")
    (tmp / "unknown_key.yaml").write_text("threshhold: 0.3\n")
    (tmp / "unknown_section_key.yaml").write_text("extract:\n  treshold: 0.3\n")
    (tmp / "bad_value.yaml").write_text("embed:\n  batch_rows: -1\n")
    (tmp / "plain").mkdir()
    (tmp / "plain" / "notes.txt").write_text("not a run\n")
    (tmp / "broken").mkdir()
    (tmp / "broken" / "manifest.json").write_text("{")
    os.mkfifo(tmp / "fifo")
    chunk_run = _fake_run(tmp / "chunks", "chunk", ["papers", "chunks"])
    os.symlink(chunk_run, tmp / "link")
    busy = tmp / "busy"
    (tmp / ".busy.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "run_id": "r0"}))
    (tmp / ".pyiceberg.yaml").write_text("catalog:\n  another:\n    type: in-memory\n")  # none named verbatim
    read_only = tmp / "read_only"
    read_only.mkdir(mode=0o555)
    return {
        "tmp": str(tmp), "corpus": str(corpus), "queries": str(tmp / "queries.jsonl"),
        "pairs": str(tmp / "pairs.jsonl"), "gold": str(tmp / "gold.jsonl"), "nowhere": str(tmp / "nowhere"),
        "not_yaml": str(tmp / "not_yaml.yaml"), "unknown_key": str(tmp / "unknown_key.yaml"),
        "unknown_section_key": str(tmp / "unknown_section_key.yaml"), "bad_value": str(tmp / "bad_value.yaml"),
        "plain_folder": str(tmp / "plain"), "broken_run": str(tmp / "broken"), "fifo": str(tmp / "fifo"),
        "chunk_run": chunk_run, "extract_run": _fake_run(tmp / "spans", "extract", ["spans", "pairs"]),
        "retrieve_run": _fake_run(tmp / "retrieval", "retrieve", ["retrieval"]), "link": str(tmp / "link"),
        "busy": str(busy), "long_name": str(tmp / ("x" * 300)), "read_only": str(read_only),
        "free_address": _free_address(), "no_config_run": _no_config_run(tmp / "no_config"),
    }


def _argv(case: Case, world: dict[str, str], out: Path) -> list[str]:
    return [a.format(out=out, **world) for a in case.argv]


def _ray_started() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray and ray.is_initialized())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_refusal_is_one_line_of_the_page(case: Case, world: dict[str, str], capsys, monkeypatch) -> None:
    if not case.as_root and os.geteuid() == 0:
        pytest.skip("root may write any folder")
    row = row_of(case.row)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name in [k for k in os.environ if k.startswith("PYICEBERG_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYICEBERG_HOME", world["tmp"])  # its .pyiceberg.yaml, read first, configures no catalog
    out = Path(world["tmp"]) / ("out-" + re.sub(r"\W+", "-", case.name))
    argv = _argv(case, world, out)
    try:
        code = main(argv)
    except SystemExit as exc:  # the parser's refusals exit
        code = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, f"{argv}: not one line:\n{err}"
    line = PREFIX.sub("", lines[0])
    assert row.matches(line), f"{argv}: {line!r} is not the line of troubleshooting.md:{row.lineno}: {row.pattern!r}"
    assert code == row.exit, f"{argv}: exit {code}, troubleshooting.md:{row.lineno} says {row.exit}"
    assert not out.exists(), f"{argv}: refused, but wrote {out}"
    assert not _ray_started(), f"{argv}: started Ray before refusing"


def test_the_installed_command_prints_the_same_line(tmp_path: Path) -> None:
    """The console script as a user runs it: the process's own exit code and stderr."""
    script = Path(sys.executable).with_name("verbatim-batch")
    if not script.is_file():
        pytest.skip(f"no {script}: the package is not installed in this environment")
    done = subprocess.run([str(script), "embed", "--chunkz", str(tmp_path), "--output", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert row_of("did you mean").matches(PREFIX.sub("", line)), line


def test_a_bad_pyiceberg_configuration_file_is_one_line(tmp_path: Path) -> None:
    """pyiceberg parses its configuration file when it is imported, so this runs in a process of its own."""
    pytest.importorskip("pyiceberg")
    (tmp_path / ".pyiceberg.yaml").write_text("catalog:\n  default:\n    type: [\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYICEBERG_")} | {"PYICEBERG_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())",
                           "publish", str(tmp_path), "--warehouse", str(tmp_path / "lake")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert row_of("is not YAML it accepts").matches(PREFIX.sub("", line)), line
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("command", [("nightly", "--queries", "{tmp}/q.jsonl", "--root", "{tmp}/out"),
                                     ("chunk", "--output", "{tmp}/out")])
def test_an_object_store_that_cannot_be_reached_is_one_line(command: tuple[str, ...], tmp_path: Path) -> None:
    """An S3 input behind an endpoint where nothing listens (a closed loopback port: no network needed), in a
    process of its own, as the endpoint comes from the environment."""
    (tmp_path / "q.jsonl").write_text('{"query": "q"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ENDPOINT_URL": f"http://{_free_address()}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    argv = [command[0], "--input", "s3://some-bucket/papers", *(a.format(tmp=tmp_path) for a in command[1:])]
    done = subprocess.run([sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())",
                           *argv], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert row_of("cannot ... s3://").matches(PREFIX.sub("", line)), line
    assert not (tmp_path / "out").exists()


def test_every_row_is_reached_by_a_case_or_named_elsewhere() -> None:
    here = {row_of(c.row) for c in CASES}
    named = {row_of(k): f"ELSEWHERE[{k!r}]" for k in ELSEWHERE} | {row_of(k): f"UNREACHED[{k!r}]" for k in UNREACHED}
    assert not here & set(named), f"rows both reached here and named: {[named[r] for r in here & set(named)]}"
    missing = [f"troubleshooting.md:{r.lineno}: {r.pattern}" for r in ROWS if r not in here and r not in named]
    assert not missing, "rows no case reaches and no test is named for:\n" + "\n".join(missing)


def test_the_tests_named_for_other_rows_exist() -> None:
    for key, test in ELSEWHERE.items():
        module, _, function = test.partition("::")
        path = Path(__file__).with_name(module)
        assert path.is_file() and f"def {function}(" in path.read_text(encoding="utf-8"), (key, test)


def _source_text() -> str:
    """The package's source with adjacent string literals joined (a message split over lines reads whole)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "verbatim_batch").rglob("*.py")))
    return re.sub(r"\"\s*\n\s*[rf]*\"", "", text)


def test_the_rows_no_test_reaches_are_the_source_s_words() -> None:
    source = _source_text()
    for key in UNREACHED:
        parts = [p for p in row_of(key).pattern.removeprefix("error: ").split("...") if p.strip()]
        missing = [p for p in parts if p not in source]
        assert not missing, f"{key!r}: the package prints no {missing}"


def test_the_patterns_match_as_documented() -> None:
    row = Row("error: ... exists; pass --overwrite to replace it", 2, 0)
    assert row.matches("error: /runs/a exists; pass --overwrite to replace it")
    assert not row.matches("error: /runs/a exists; pass --overwrite to replace it, or not")
    assert not row.matches("error: /runs/a is missing")
    assert PREFIX.sub("", "verbatim-batch evaluate-retrieval: error: x") == "error: x"
    assert _cells(r"| `a \| b` | 2 | c | d |") == ["`a | b`", "2", "c", "d"]
    assert len(ROWS) >= 30 and all(r.exit in (2, 3, 130, 143) for r in ROWS)
