"""The fenced code blocks of the guide (README.md, docs/*.md, docs/reference/*.md) and the command lines of its shell
blocks: shared by tests/test_docs_examples.py (every block parsed or checked) and tests/test_docs_cli_run.py (the
shell blocks run)."""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "reference").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
CONSOLE = {"console", ""}  # only the `$ ` lines are commands; the rest is their output
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(skip|run|parse-only)(?![\w-])\s*(?:\((.*)\))?\s*-->\s*$")
COMMENT = re.compile(r"^\s*<!--.*-->\s*$")  # an HTML comment on a line of its own (a marker of another test)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it is, its language, its text (dedented), and its ``docs-test`` marker."""

    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None = None  # "skip", "run" or "parse-only"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(text: str, page: str) -> list[Block]:
    """The fenced code blocks of a Markdown page (fences may be indented, as in a list item)."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = textwrap.dedent("\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]))
        mark = None
        for before in reversed(lines[:i]):  # the marker: the nearest line before the fence, past other comments
            mark = MARKER.match(before)
            if mark or (before.strip() and not COMMENT.match(before)):
                break
        out.append(Block(page, i + 1, lang.lower(), body, mark.group(1) if mark else None,
                         (mark.group(2) or "") if mark else ""))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for path in PAGES:
        out += blocks_of(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return out


# --- shell: command lines ----------------------------------------------------------------------------------------


def _job_commands() -> dict[str, str]:
    """``jobs/NAME.py`` -> the command it runs (``main(["chunk", ...])``)."""
    out = {}
    for path in sorted((ROOT / "jobs").glob("*.py")):
        m = re.search(r"main\(\[\"([\w-]+)\"", path.read_text(encoding="utf-8"))
        if m:
            out[f"jobs/{path.name}"] = m.group(1)
    return out


JOBS = _job_commands()


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """``(line on the page, text)`` of each command of a shell block: ``\\`` continuations joined, a ``$ `` prompt
    dropped; in a console block only the prompted lines."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(block.text.splitlines(), block.line + 1):
        if pending is not None:
            text = pending[1] + " " + raw.strip()
            start = pending[0]
        else:
            stripped = raw.strip()
            if block.lang in CONSOLE and not stripped.startswith("$ "):
                continue
            text, start = stripped.removeprefix("$ "), n
        if text.endswith("\\"):
            pending = (start, text[:-1])
            continue
        pending = None
        out.append((start, text))
    if pending is not None:
        out.append(pending)
    return out


def variants(text: str) -> tuple[list[str], bool]:
    """A command line with its optional parts written out: ``[--flag VALUE]`` -> ``--flag VALUE``, ``a|b`` inside
    brackets -> one variant per choice, ``[options]`` dropped. Also whether arguments are left out."""
    elided = False
    groups: list[list[str]] = []

    def group(m: re.Match) -> str:
        nonlocal elided
        inner = m.group(1)
        if not re.search(r"(^|\s)-", inner):  # [options], [extractor options]: words, not flags
            elided = True
            return " "
        words = inner.split()
        n = max(len(w.split("|")) for w in words)
        groups.append([" ".join(w.split("|")[min(k, len(w.split("|")) - 1)] for w in words) for k in range(n)])
        return f"\0{len(groups) - 1}\0"

    text = re.sub(r"(?<!\S)\[([^\[\]]*)\]", group, text)  # [x] after a space: not .[dev]
    n = max((len(g) for g in groups), default=1)
    parts = re.split(r"\0(\d+)\0", text)  # text, group index, text, ...
    out = ["".join(groups[int(p)][min(k, len(groups[int(p)]) - 1)] if i % 2 else p for i, p in enumerate(parts))
           for k in range(n)]
    return out, elided


def invocations(text: str) -> list[tuple[list[str], bool]]:
    """Each CLI invocation on a shell line: ``(argv after the program, whether arguments are left out)``."""
    if not re.search(r"verbatim-batch|jobs/[\w-]+\.py|verbatim_batch\.cli\b", text):
        return []
    text = re.sub(r"\$\([^()]*\)", "X", text)  # $(date ...): a value
    text = re.sub(r"\$\{?\w+\}?", "X", text)  # $VB, ${HOME}
    text = re.sub(r"<(\w+)>", lambda m: m.group(1).upper(), text)  # <run_id>
    choices, elided = variants(text)
    out = []
    for variant in choices:
        lexer = shlex.shlex(variant, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        segments: list[list[str]] = [[]]
        for token in lexer:
            if token and set(token) <= set("&|;<>()"):
                segments.append([])
            else:
                segments[-1].append(token)
        for words in segments:
            # where a program is named: the first word but VAR=value ones, and the word after `--` (ray job submit)
            programs = {next((i for i, w in enumerate(words) if not re.match(r"^\w+=", w)), -1)}
            programs |= {i + 1 for i, w in enumerate(words) if w == "--"}
            for i, word in enumerate(words):
                argv = None
                if i in programs and word.rsplit("/", 1)[-1] == "verbatim-batch":
                    argv = words[i + 1:]
                elif word in JOBS and i > 0 and re.search(r"python[\d.]*$", words[i - 1]):
                    argv = [JOBS[word], *words[i + 1:]]
                elif word == "verbatim_batch.cli" and words[i - 1: i] == ["-m"]:
                    argv = words[i + 1:]
                if argv is not None:
                    cut = [a for a in argv if a in ("...", "…")]
                    out.append(([a for a in argv if a not in cut], elided or bool(cut)))
                    break
    return out
