"""The guide's shell examples run (issue 43, item 6): every shell block of README.md, docs/*.md and
docs/reference/*.md that can run offline on one CPU machine runs here for real, in order, in a folder prepared as
a new reader's would be; every other one is marked ``<!-- docs-test: parse-only (reason) -->`` on the line before
its fence and is only parsed, by the CLI's own parser (tests/test_docs_examples.py). A shell block that is neither
run here nor marked fails ``test_every_shell_block_runs_here_or_says_why_not``.

What runs (``PLANS``: one small, explicit plan per page):

- docs/nightly.md: ``run`` and ``nightly`` on three bundled papers (their metadata, their labelled queries). Its
  folder is the module's ``world``, which later pages read as the folders the reader made before (``RUN_DIR``,
  ``RET_DIR``: its chain's chunk and retrieval runs).
- docs/publish.md: in that folder, as the page assumes (``nightly/``, ``runs/chain-1``): both publishes, then a
  second night that publishes itself (its ``...`` are the nightly page's inputs; the corpus is unchanged, so the
  night carries every stage).
- docs/quickstart.md: ``mkdir``/``cp ~/papers`` (HOME holds two .md papers and a .txt one), the questions' here
  document, then ``run``.
- docs/chunking.md (``chunk``), docs/retrieval.md (``embed``, ``index``, ``retrieve``, ``evaluate-retrieval`` on the
  bundled gold file with the output the page shows, ``rerank`` with a tiny random cross-encoder, ``extract``),
  docs/extraction.md (``extract`` from a retrieval and from a pairs file, ``evaluate``, a threshold sweep of a tiny
  random highlighter; then ``demo`` on its first three papers and ``evaluate`` of it, with the lines the page shows)
  and docs/development.md (the options reference regenerated is the one in the repository).

How a block runs: a line that is one ``verbatim-batch`` command runs through the CLI's ``main`` in this process, on
the session's Ray (what the installed script calls; a Ray of its own per command would cost about a minute each on
a 2-core machine); any other block runs whole in ``bash -e`` with this environment's ``bin`` first on PATH and HOME
a folder of the test's. A plan replaces placeholders (``RUN_DIR``) by its values, in one pass; optional parts
(``[--k 10]``, ``[--kind auto|flat]``) are written out with their first choice and ``[options]`` dropped; text a
plan rewrites beyond that (``demo`` -> ``demo --n-papers 3``, to keep it cheap; a ``...`` filled in) is named in its
``rewrite``, and each value and rewrite must still match a line of its page. Every command must exit 0; where the
page shows output or names the files a command writes, the plan's check looks for those lines and files (numbers
aside: the page's figures come from other inputs).

Only parsed (each marker says why): installs from the package index (network), commands for a Ray cluster
address, GPUs, s3:// object storage, a cloud or Kubernetes cluster, an LLM server or vLLM, a Pushgateway, an
Iceberg REST catalog, a model from the Hugging Face Hub; and the local Ray-head example of docs/cluster.md, which
tests/test_cluster_example.py runs as written (e2e tier).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docblocks import CONSOLE, ROOT, SHELL, Block, all_blocks, blocks_of, invocations, logical_lines, variants
from helpers import EXAMPLES, make_cross_encoder, make_token_classifier
from promservers import scaled

BIN = Path(sys.executable).parent
# Three bundled papers with labelled queries and rows in examples/gold.jsonl (5 of its 12): retrieval and
# extraction are scored on something.
PAPERS = ["2020.emnlp-industry.16", "2021.bionlp-1.23", "2023.acl-short.22"]
WORLD_PAGE = "docs/nightly.md"
REASON = re.compile(r"\b(needs|installs|launches|starts)\b")  # a parse-only marker says what the block needs
WORD = re.compile(r"[A-Za-z_][\w@-]*")  # the words of an output line, numbers aside


@dataclass(frozen=True)
class Ran:
    """One command line of a page: as written, as run, its exit code and output (a bash block: one entry)."""

    where: str
    written: str
    ran: str
    rc: int
    out: str
    err: str


Check = Callable[[Path, list[Ran]], None]


@dataclass(frozen=True)
class Plan:
    """How a page's shell blocks run: what its folder holds first (``setup``), the value of each placeholder and
    the text rewritten in its lines (``{world}``, ``{cross_encoder}``, ``{highlighter}``: the fixtures';
    ``{minilm}``: the bundled embedder), the fixtures it reads (``needs``), whether its commands start Ray, and the
    check of what they wrote and printed."""

    check: Check
    setup: Callable[[Path], None] = lambda folder: None
    values: Mapping[str, str] = field(default_factory=dict)
    rewrite: Mapping[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    ray: bool = True
    in_world: bool = False  # runs in the folder docs/nightly.md ran in, not a fresh one


# --- what a page's folder holds first ---------------------------------------------------------------------------


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _papers(folder: Path, suffixes: dict[str, str] | None = None) -> None:
    """``folder``: the three papers (``suffixes``: a paper's file extension, else .md) and their metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PAPERS:
        shutil.copy(EXAMPLES / "corpus" / f"{name}.md", folder / f"{name}{(suffixes or {}).get(name, '.md')}")
    _write_jsonl(folder / "metadata.jsonl",
                 [r for r in _jsonl(EXAMPLES / "corpus" / "metadata.jsonl") if r["paper_id"] in PAPERS])


def _queries(path: Path) -> None:
    """The bundled queries labelled with the three papers."""
    _write_jsonl(path, [q for q in _jsonl(EXAMPLES / "queries.jsonl") if q["paper_id"] in PAPERS])


def _gold(path: Path) -> None:
    shutil.copy(EXAMPLES / "gold.jsonl", path)


def setup_nightly(folder: Path) -> None:
    _papers(folder / "papers")
    _queries(folder / "queries.jsonl")


def setup_quickstart(folder: Path) -> None:
    _papers(folder / "home" / "papers", {PAPERS[2]: ".txt"})
    (folder / "home" / "papers" / "metadata.jsonl").unlink()  # `cp ~/papers/*.md ~/papers/*.txt`: papers only


def setup_retrieval(folder: Path) -> None:
    _queries(folder / "queries.jsonl")
    _gold(folder / "seeds-dev.jsonl")  # "a dev set in the gold-pairs format"


def setup_extraction(folder: Path) -> None:
    _gold(folder / "gold.jsonl")
    (folder / "verbatim_batch" / "examples").mkdir(parents=True)  # the repository root, where the demo is run
    _gold(folder / "verbatim_batch" / "examples" / "gold.jsonl")
    keep = ("query_id", "query", "paper_id", "chunk_index", "chunk_id", "relevant")  # chunks by id: --chunks
    _write_jsonl(folder / "pairs.jsonl", [{k: g[k] for k in keep} for g in _jsonl(EXAMPLES / "gold.jsonl")
                                           if g["paper_id"] in PAPERS])


def setup_development(folder: Path) -> None:
    (folder / ".venv").symlink_to(BIN.parent)  # the repository root's venv, which the page's command names
    (folder / "docs" / "reference").mkdir(parents=True)


# --- what the pages' commands wrote and printed -----------------------------------------------------------------


def ran_of(ran: list[Ran], written: str) -> Ran:
    """The one command whose line, as the page writes it, contains ``written``."""
    found = [r for r in ran if written in r.written]
    assert len(found) == 1, f"{len(found)} commands of the page contain {written!r}: {[r.written for r in ran]}"
    return found[0]


def assert_shows(shown: str, printed: str, what: str) -> None:
    """Each line the page shows (but ``...``) is a line of ``printed`` with the same words, numbers aside."""
    lines = {tuple(WORD.findall(line)) for line in printed.splitlines()}
    missing = [line for line in shown.splitlines() if line.strip() and line.strip() != "..."
               and tuple(WORD.findall(line)) not in lines]
    assert not missing, f"{what} did not print these lines the page shows:\n" + "\n".join(missing) + \
        f"\n--- it printed:\n{printed}"


def shown_after(page: str, written: str) -> str:
    """The output the page shows for the command line containing ``written``: the ``$`` block's other lines, or
    the ``text`` block right after its shell block."""
    blocks = [b for b in all_blocks() if b.page == page]
    for i, block in enumerate(blocks):
        if block.lang in SHELL | CONSOLE and any(written in text for _, text in logical_lines(block)):
            if block.lang in CONSOLE:
                return "\n".join(ln for ln in block.text.splitlines() if not ln.startswith("$ "))
            assert i + 1 < len(blocks) and blocks[i + 1].lang == "text", f"{block.where}: no output block after it"
            return blocks[i + 1].text
    raise AssertionError(f"{page}: no shell block runs {written!r}")


def committed(*runs: Path) -> None:
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
        assert manifest["status"] == "committed", f"{run}: {manifest['status']}"


def tables(run: Path, *names: str) -> None:
    for name in names:
        assert list((run / name).glob("*.parquet")), f"{run / name}: no Parquet file"


def check_nightly(folder: Path, ran: list[Ran]) -> None:
    chain = folder / "runs" / "chain-1"
    stages = ["chunks", "embeddings", "index", "retrieval", "spans"]
    committed(*(chain / s for s in stages))
    counts = json.loads((chain / "manifest.json").read_text(encoding="utf-8"))["counts"]
    assert counts["chunks.papers"] == 3 and any(k.startswith("spans.") for k in counts), counts  # <stage>.<count>
    root = folder / "nightly"
    night = (root / "CURRENT").read_text(encoding="utf-8").strip()
    run = root / "runs" / night
    assert (root / "current").resolve() == run.resolve()  # current -> runs/<run_id>
    for name in ["_run.json", *stages, "manifest.json", "report.json", "report.html"]:
        assert (run / name).exists(), f"{run / name} is not there (the page's layout)"
    tables(run / "spans", "spans", "pairs")
    assert f"nightly run {night} committed" in ran_of(ran, "verbatim-batch nightly").out


def check_publish(folder: Path, ran: list[Ran]) -> None:
    assert (folder / "lake" / "catalog.db").is_file()  # "pyiceberg's SQL catalog on SQLite, lake/catalog.db"
    # the page's first block (the nightly root's line, by its comment), then the chain folder's
    for line, night in [("# the current night of a nightly root", None), ("publish runs/chain-1", "runs/chain-1")]:
        out = ran_of(ran, line).out
        assert "published from" in out and all(f"verbatim.{t}" in out for t in ("chunks", "retrieval", "pairs",
                                                                                    "spans")), out
        if night:
            assert str(folder / night) in out, out
    nights = sorted(p.name for p in (folder / "nightly" / "runs").iterdir())
    assert len(nights) == 2, nights  # the night that published itself
    assert "published" in ran_of(ran, "--root nightly/ --warehouse lake/").out
    # --keep-nights and --convert on tables already current: the night is there, nothing more to do
    for line in ("--keep-nights 30", "--convert"):
        out = ran_of(ran, line).out
        assert out.count("nothing to do") == 4, out


def check_quickstart(folder: Path, ran: list[Ran]) -> None:
    assert sorted(p.name for p in (folder / "my-papers").iterdir()) == sorted(
        [f"{PAPERS[0]}.md", f"{PAPERS[1]}.md", f"{PAPERS[2]}.txt"])
    assert [q["query"] for q in _jsonl(folder / "questions.jsonl")] == [
        "Which dataset is used for evaluation?", "What Word-F1 does the student model reach?"]
    mine = folder / "runs" / "mine"
    committed(*(mine / s for s in ["chunks", "embeddings", "index", "retrieval", "spans"]))
    tables(mine / "spans", "spans")
    assert (mine / "spans" / "report.html").is_file()
    assert json.loads((mine / "manifest.json").read_text(encoding="utf-8"))["counts"]["chunks.papers"] == 3


def check_chunking(folder: Path, ran: list[Ran]) -> None:
    run = folder / "runs" / "chunks"
    committed(run)
    tables(run, "papers", "chunks", "quarantine")  # the page's RUN_DIR/ layout


def check_retrieval(folder: Path, ran: list[Ran]) -> None:
    runs = folder / "runs"
    committed(runs / "embeddings", runs / "index", runs / "retrieval", runs / "reranked", runs / "spans")
    tables(runs / "retrieval", "retrieval")
    printed = ran_of(ran, "--qrels QRELS").out
    assert json.loads(printed) and all(m in printed for m in ("dense", "bm25", "hybrid")), printed  # --json
    written = "evaluate-retrieval --retrieval RET_DIR --qrels seeds-dev.jsonl"
    printed = ran_of(ran, written).out
    assert_shows(shown_after("docs/retrieval.md", written), printed, written)
    assert re.search(r"^[1-9]\d* queries with a relevant chunk", printed, re.M), printed


def check_extraction(folder: Path, ran: list[Ran]) -> None:
    committed(folder / "runs" / "spans", folder / "runs" / "pair-spans", folder / "verbatim-demo" / "spans")
    pairs = _jsonl(folder / "pairs.jsonl")
    import pyarrow.parquet as pq

    got = pq.read_table(folder / "runs" / "pair-spans" / "pairs").to_pylist()
    assert len(got) == len(pairs) and not any(p.get("error") for p in got), got  # every chunk id resolved
    scores = json.loads(ran_of(ran, "--predictions SPANS_DIR").out)  # --json
    assert scores["n_rows"] == 12 and "diagnostics" in scores, scores
    sweep = ran_of(ran, "--sweep-threshold").out
    assert sweep.startswith("highlighter threshold sweep over 12 gold rows"), sweep
    written = "evaluate --gold verbatim_batch/examples/gold.jsonl --predictions verbatim-demo/spans"
    assert_shows(shown_after("docs/extraction.md", written), ran_of(ran, written).out, written)


def check_development(folder: Path, ran: list[Ran]) -> None:
    written = (folder / "docs" / "reference" / "options.md").read_text(encoding="utf-8")
    assert written == (ROOT / "docs" / "reference" / "options.md").read_text(encoding="utf-8")


PLANS: dict[str, Plan] = {
    "docs/nightly.md": Plan(check_nightly, setup_nightly),
    "docs/publish.md": Plan(check_publish, in_world=True, needs=("world",), rewrite={
        "nightly ... --root": "nightly --input papers/ --metadata papers/metadata.jsonl --queries queries.jsonl "
                              "--root"}),
    "docs/quickstart.md": Plan(check_quickstart, setup_quickstart),
    "docs/chunking.md": Plan(check_chunking, lambda f: _papers(f / "papers"), values={
        "PATH": "papers/", "RUN_DIR": "runs/chunks", "META": "papers/metadata.jsonl"}),
    "docs/retrieval.md": Plan(check_retrieval, setup_retrieval, needs=("world", "cross_encoder"), values={
        "RUN_DIR": "{world}/runs/chain-1/chunks", "EMB_DIR": "runs/embeddings", "INDEX_DIR": "runs/index",
        "RET_DIR": "runs/retrieval", "ID_OR_PATH": "{minilm}", "N": "16384", "QRELS": "seeds-dev.jsonl",
        "CROSS_ENCODER": "{cross_encoder}", "RERANKED_DIR": "runs/reranked", "SPANS_DIR": "runs/spans"}),
    "docs/extraction.md": Plan(check_extraction, setup_extraction, needs=("world", "highlighter"), values={
        "RET_DIR": "{world}/runs/chain-1/retrieval", "RUN_DIR": "{world}/runs/chain-1/chunks",
        "SPANS_DIR": "runs/spans", "ID": "{highlighter}"}, rewrite={
        "--pairs pairs.jsonl --output SPANS_DIR": "--pairs pairs.jsonl --output runs/pair-spans",
        "verbatim-batch demo": "verbatim-batch demo --n-papers 3"}),
    "docs/development.md": Plan(check_development, setup_development, ray=False),
}


# --- running a page ------------------------------------------------------------------------------------------------


def shell_blocks(page: str, blocks: list[Block] | None = None) -> list[Block]:
    """The page's shell blocks that hold a command (a console block without a ``$`` line is output only)."""
    return [b for b in (all_blocks() if blocks is None else blocks)
            if b.page == page and b.lang in SHELL | CONSOLE and logical_lines(b)]


def unrun(blocks: list[Block], plans: Mapping[str, Plan]) -> list[str]:
    """The shell blocks neither run (their page has a plan) nor marked with a reason that says what they need."""
    problems = []
    for page in sorted({b.page for b in blocks}):
        for b in shell_blocks(page, blocks):
            if b.marker in ("parse-only", "skip"):
                if not REASON.search(b.reason):
                    problems.append(f"{b.where}: its {b.marker} marker should say what the block needs that a test "
                                    f"machine has not (needs a GPU, needs a Ray cluster address), not {b.reason!r}")
            elif b.marker is not None:
                problems.append(f"{b.where}: a shell block marked {b.marker!r}")
            elif page not in plans:
                problems.append(f"{b.where}: not run (give {page} a plan in tests/test_docs_cli_run.py) nor marked "
                                "<!-- docs-test: parse-only (what it needs) -->")
    return problems


class Filled:
    """A plan's values and rewrites applied to a page's text, noting which were used."""

    def __init__(self, plan: Plan, context: Mapping[str, str]):
        self.values = {k: v.format_map(context) for k, v in plan.values.items()}
        self.rewrite = {k: v.format_map(context) for k, v in plan.rewrite.items()}
        self.used: set[str] = set()
        names = sorted(self.values, key=len, reverse=True)
        self._names = re.compile(rf"(?<![\w$])({'|'.join(map(re.escape, names))})(?!\w)") if names else None

    def __call__(self, text: str) -> str:
        for old, new in self.rewrite.items():
            if old in text:
                self.used.add(old)
                text = text.replace(old, new)
        if self._names is not None:
            def value(m: re.Match) -> str:
                self.used.add(m.group(1))
                return self.values[m.group(1)]

            text = self._names.sub(value, text)
        return text

    def unused(self) -> list[str]:
        return sorted((set(self.values) | set(self.rewrite)) - self.used)


def cli_argv(text: str) -> list[str] | None:
    """The arguments of a line that is one ``verbatim-batch`` command (comments aside), else None."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # a line of a here document, say
        return None
    if not words or Path(words[0]).name != "verbatim-batch" or any(set(w) <= set("&|;<>()") for w in words):
        return None
    return words[1:]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``verbatim-batch ARGV`` through the CLI's ``main`` in this process: its exit code, stdout and stderr."""
    from verbatim_batch.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return int(rc or 0), out.getvalue(), err.getvalue()


def run_bash(text: str, folder: Path) -> tuple[int, str, str]:
    """A block in ``bash -e`` in ``folder``: this environment's ``bin`` first on PATH, HOME ``folder/home``."""
    (folder / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "HOME": str(folder / "home"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", "-e", "-c", text], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=scaled(300))
    return done.returncode, done.stdout, done.stderr


def run_page(page: str, plan: Plan, folder: Path, context: Mapping[str, str]) -> list[Ran]:
    """Every unmarked shell block of ``page``, in order, in ``folder`` (the current directory): each command must
    exit 0. What each command printed, for the plan's check."""
    filled = Filled(plan, context)
    ran: list[Ran] = []
    blocks = [b for b in shell_blocks(page) if b.marker is None]
    assert blocks, f"{page} has a plan but no shell block to run"
    for block in blocks:
        lines = logical_lines(block)
        argvs = [cli_argv(variants(filled(text))[0][0]) for _, text in lines]
        if all(argv is not None for argv in argvs):
            for (n, text), argv in zip(lines, argvs, strict=True):
                assert argv is not None and not {"...", "…"} & set(argv), \
                    f"{page}:{n}: leaves arguments out: give its plan a rewrite that fills them in"
                rc, out, err = run_cli(argv)
                ran.append(Ran(f"{page}:{n}", text, shlex.join(["verbatim-batch", *argv]), rc, out, err))
                assert rc == 0, f"{page}:{n}: verbatim-batch {shlex.join(argv)} exited {rc}\n{out[-3000:]}\n" \
                                f"{err[-5000:]}"
        elif not any(invocations(text) for _, text in lines):
            script = filled(block.text)
            rc, out, err = run_bash(script, folder)
            ran.append(Ran(block.where, block.text, script, rc, out, err))
            assert rc == 0, f"{block.where}: the block exited {rc} in bash\n{script}\n{out[-3000:]}\n{err[-3000:]}"
        else:
            raise AssertionError(f"{block.where}: verbatim-batch commands and other shell lines in one block: split "
                                 "it, or run it here")
    assert not filled.unused(), f"{page}: the plan's {filled.unused()} match no line of the page: update the plan"
    return ran


@pytest.fixture(scope="module")
def world(ray_local, tmp_path_factory) -> dict:
    """docs/nightly.md run in a fresh folder (its ``run`` chain and its night): what later pages read."""
    folder = tmp_path_factory.mktemp("world")
    plan = PLANS[WORLD_PAGE]
    plan.setup(folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("HF_HUB_OFFLINE", "1")
        ran = run_page(WORLD_PAGE, plan, folder, {})
    return {"folder": folder, "ran": ran}


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    return make_cross_encoder(tmp_path_factory.mktemp("ce") / "m")


@pytest.fixture(scope="module")
def highlighter(tmp_path_factory) -> Path:
    # ModernBERT's own 8192 positions: the highlighter's default window (8192 tokens) fits
    return make_token_classifier(tmp_path_factory.mktemp("hl") / "m", max_positions=8192)


def _run_planned(page: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    plan = PLANS[page]
    context = {"minilm": str(DEFAULT_MODEL)}
    for name in plan.needs:
        value = request.getfixturevalue(name)
        context[name] = str(value["folder"] if name == "world" else value)
    if page == WORLD_PAGE:
        world = request.getfixturevalue("world")
        folder, ran = world["folder"], world["ran"]
    else:
        folder = Path(context["world"]) if plan.in_world else tmp_path
        plan.setup(folder)
        monkeypatch.chdir(folder)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        ran = run_page(page, plan, folder, context)
    plan.check(folder, ran)


RAY_PAGES = [p for p, plan in PLANS.items() if plan.ray]


@pytest.mark.timeout(1800)  # a hang only: the world (two chains) and the page, on a loaded machine
@pytest.mark.parametrize("page", RAY_PAGES)
def test_the_page_runs_on_ray(page: str, ray_local, request, tmp_path, monkeypatch) -> None:
    """The page's commands, in this process, on the session's Ray (the fixture also puts the test in the stage
    tier: tests/conftest.py)."""
    _run_planned(page, request, tmp_path, monkeypatch)


@pytest.mark.parametrize("page", [p for p in PLANS if p not in RAY_PAGES])
def test_the_page_runs_without_ray(page: str, request, tmp_path, monkeypatch) -> None:
    _run_planned(page, request, tmp_path, monkeypatch)


def test_every_shell_block_runs_here_or_says_why_not() -> None:
    problems = unrun(all_blocks(), PLANS)
    assert not problems, "\n".join(problems)
    assert set(PLANS) <= {b.page for b in all_blocks()}, "a plan names a page that is not in the guide"


BAD = """
```bash
verbatim-batch chunk --input papers/ --output RUN_DIR
```

<!-- docs-test: parse-only (needs a GPU) -->
```bash
verbatim-batch embed --chunks RUN_DIR --output EMB_DIR --device cuda
```

<!-- docs-test: parse-only (too slow) -->
<!-- another-test -->
```bash
verbatim-batch nightly --root nightly/
```

```
$ verbatim-batch verify RUN_DIR
RUN_DIR: ok
```

```
a layout, no command
```
"""


def test_an_unmarked_block_not_run_and_a_vague_reason_fail() -> None:
    blocks = blocks_of(BAD, "bad.md")
    problems = unrun(blocks, {})
    assert len(problems) == 3, problems
    assert problems[0].startswith("bad.md:2: not run") and problems[2].startswith("bad.md:17: not run"), problems
    assert problems[1].startswith("bad.md:13: its parse-only marker") and "'too slow'" in problems[1], problems
    assert unrun(blocks, {"bad.md": Plan(check_chunking)}) == [problems[1]]


def test_a_plan_fills_placeholders_once_and_notes_what_it_used() -> None:
    filled = Filled(Plan(check_chunking, values={"N": "{world}/N", "RUN_DIR": "runs/x", "ID": "m"},
                         rewrite={"demo": "demo --n-papers 3"}), {"world": "/w"})
    assert filled("verbatim-batch demo --k N --chunks RUN_DIR --x ID_OR_PATH $N") == \
        "verbatim-batch demo --n-papers 3 --k /w/N --chunks runs/x --x ID_OR_PATH $N"
    assert filled.unused() == ["ID"]
    assert cli_argv(".venv/bin/verbatim-batch run --input a   # a comment") == ["run", "--input", "a"]
    assert cli_argv("verbatim-batch demo && ls") is None and cli_argv("mkdir -p x") is None
