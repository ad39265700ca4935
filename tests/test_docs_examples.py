"""Every code example in README.md, docs/*.md and docs/reference/*.md is checked (issue 43).

- Shell blocks (``bash``, ``sh``, ``shell``; in ``console`` and unlabelled blocks only the ``$ `` lines): every
  ``verbatim-batch COMMAND ...`` (also ``.venv/bin/verbatim-batch`` and ``python jobs/COMMAND.py ...``, which run
  the same command) is parsed by the CLI's own parser, without running it. Placeholders in capitals (``RUN_DIR``,
  ``N``) stand for any value; ``[--flag VALUE]`` is an optional flag (``a|b``: each is checked); a line that leaves
  arguments out (``...``, ``[options]``) is not checked for required options, nor is one whose ``--config`` file is
  not in the repository (the file may give them).
- ``python`` blocks compile, and every name they take from ``verbatim_batch`` (imports, and attributes of its
  modules) exists; a block marked ``<!-- docs-test: run -->`` also runs, in an empty folder (only cheap,
  self-contained ones: no Ray; ``tests/test_api.py`` runs the API guide's example with Ray).
- ``yaml`` blocks load with the project's config loader, so an unknown key or a bad value fails; ``json`` blocks
  are one JSON document or JSON lines.
- ``text`` blocks (output samples, layouts) are not checked; nor is a block marked
  ``<!-- docs-test: skip (reason) -->`` on the line before its fence.
- Shell blocks are also run: ``tests/test_docs_cli_run.py`` runs each one, on its page's small prepared folder,
  unless it is marked ``<!-- docs-test: parse-only (reason) -->`` on the line before its fence, the reason saying
  what it needs that a test machine has not (``needs a GPU``, ``needs a Ray cluster address``, ``s3://``); such a
  block is still parsed as above. A marker may come before other HTML comments that precede the fence
  (``<!-- cluster-example -->``).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from docblocks import CONSOLE, ROOT, SHELL, Block, all_blocks, blocks_of, invocations, logical_lines, variants

NOT_CHECKED = {"text"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(?:[/.][\w./-]*)?$")  # RUN_DIR, N, STUDENT/model


# --- shell: command lines (found by docblocks.py) -----------------------------------------------------------------


def _placeholders(command: str, argv: list[str]) -> list[str]:
    """``argv`` with a placeholder value of a typed option (``--k N``) replaced by the option's default, or the
    flag and its placeholder dropped when it has none: a placeholder stands for any valid value."""
    from verbatim_batch.cli.options import COMMANDS, command_flags, convert
    from verbatim_batch.core.options import OptionError, show

    if command not in COMMANDS:
        return argv
    flags = {f: flag for flag in command_flags(command).values() for f in flag.flags}
    out: list[str] = []
    i = 0
    while i < len(argv):
        word, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        flag = flags.get(word)
        if flag is not None and not flag.of.is_bool and value is not None and PLACEHOLDER.match(value):
            try:
                convert(flag, value, text=True)
            except OptionError:
                if flag.of.default is not None:
                    out += [word, show(flag.of.default)]
                i += 2
                continue
        out.append(word)
        i += 1
    return out


def check_command(argv: list[str], elided: bool) -> str | None:
    """None if the CLI's parser takes ``argv`` (a command and its arguments), else what it said."""
    from verbatim_batch.cli import build_parser, parse_args

    if not argv:
        return "no command after verbatim-batch"
    command = argv[0]
    if command == "synth":  # the generator has its own parser, which only runs; its name is what is checked
        return None
    argv = _placeholders(command, argv)
    if "--config" in argv:
        i = argv.index("--config")
        path = ROOT / argv[i + 1] if i + 1 < len(argv) else None
        if path is not None and path.is_file():
            argv = [*argv[: i + 1], str(path), *argv[i + 2:]]
        else:  # a file of the reader's: it may give the required options
            argv, elided = argv[:i] + argv[i + 2:], True
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):  # --help prints
            if elided:
                build_parser().parse_args(argv)
            else:
                parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def shell_problems(block: Block) -> list[str]:
    problems = []
    for n, line in logical_lines(block):
        for argv, elided in invocations(line):
            said = check_command(argv, elided)
            if said:
                problems.append(f"{block.page}:{n}: {' '.join(argv)}\n    {said}")
    return problems


# --- python ------------------------------------------------------------------------------------------------------


def _resolve(module: ModuleType, name: str) -> Any:
    """``module.name``: an attribute, or a submodule not imported yet; AttributeError if neither."""
    if hasattr(module, name):
        return getattr(module, name)
    try:
        return importlib.import_module(f"{module.__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {module.__name__} has no {name}") from None


def python_problems(block: Block) -> list[str]:
    """A block that does not compile, or names something of ``verbatim_batch`` that does not exist."""
    try:
        tree = ast.parse(block.text, filename=block.where)
    except SyntaxError as exc:
        return [f"{block.page}:{block.line + (exc.lineno or 0)}: does not compile: {exc.msg}"]
    problems: list[str] = []
    bound: dict[str, Any] = {"verbatim_batch": importlib.import_module("verbatim_batch")}

    def where(node: ast.AST) -> str:
        return f"{block.page}:{block.line + getattr(node, 'lineno', 0)}"

    for node in ast.walk(tree):
        try:
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verbatim_batch":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    bound[alias.asname or alias.name] = _resolve(module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "verbatim_batch":
                        module = importlib.import_module(alias.name)
                        bound[alias.asname or alias.name.split(".")[0]] = (
                            module if alias.asname else importlib.import_module("verbatim_batch"))
        except (ImportError, AttributeError) as exc:
            problems.append(f"{where(node)}: {exc}")
    for node in ast.walk(tree):  # module.attr.attr ... of the names bound above, as far as the modules go
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in bound:
            continue
        obj = bound[base.id]
        for attr in chain:
            if not isinstance(obj, ModuleType):
                break
            try:
                obj = _resolve(obj, attr)
            except AttributeError as exc:
                problems.append(f"{where(node)}: {exc}")
                break
    return sorted(set(problems))


# --- yaml --------------------------------------------------------------------------------------------------------


def yaml_problems(block: Block, folder: Path) -> list[str]:
    """A job config that the config loader refuses (an unknown key, a bad value)."""
    import yaml

    from verbatim_batch.cli import config
    from verbatim_batch.cli.options import COMMANDS

    try:
        data = yaml.safe_load(block.text)
    except yaml.YAMLError as exc:
        return [f"{block.where}: not YAML: {exc}"]
    if not isinstance(data, dict):
        return [f"{block.where}: not a job config (a mapping of options)"]
    path = folder / f"block-{block.line}.yaml"
    path.write_text(block.text, encoding="utf-8")
    command = next((k for k in data if k in COMMANDS), "run")
    try:
        config.load_config(str(path), command)  # every section's every key is checked, whichever command
    except config.ConfigError as exc:
        return [f"{block.where}: {str(exc).replace(str(path), 'the block')}"]
    return []


def json_problems(block: Block) -> list[str]:
    """A JSON example that is neither one JSON document nor JSON lines."""
    try:
        json.loads(block.text)
        return []
    except ValueError:
        pass
    problems = []
    for n, line in enumerate(block.text.splitlines(), block.line + 1):
        try:
            if line.strip():
                json.loads(line)
        except ValueError as exc:
            problems.append(f"{block.page}:{n}: not JSON (nor JSON lines): {exc}")
    return problems


# --- the checks --------------------------------------------------------------------------------------------------


def problems_of(block: Block, folder: Path) -> list[str]:
    """What is wrong with a block (empty when it is right, or not checked)."""
    if block.marker == "skip" or block.lang in NOT_CHECKED:
        return []
    if block.lang in SHELL | CONSOLE:
        return shell_problems(block)
    if block.lang == "python":
        return python_problems(block)
    if block.lang == "yaml":
        return yaml_problems(block, folder)
    if block.lang in ("json", "jsonl"):
        return json_problems(block)
    return [f"{block.where}: no check for ```{block.lang} blocks: add one here, or mark the block "
            "<!-- docs-test: skip (reason) -->"]


BLOCKS = all_blocks()


@pytest.mark.parametrize("page", sorted({b.page for b in BLOCKS}))
def test_every_code_example_of_the_page_is_right(page: str, tmp_path: Path) -> None:
    problems = [p for b in BLOCKS if b.page == page for p in problems_of(b, tmp_path)]
    assert not problems, "\n".join(problems)


RUN_BLOCKS = [b for b in BLOCKS if b.marker == "run"]


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.where for b in RUN_BLOCKS])
def test_the_examples_marked_to_run_run(block: Block, tmp_path: Path, monkeypatch) -> None:
    assert block.lang == "python", f"{block.where}: only python blocks run"
    monkeypatch.chdir(tmp_path)
    exec(compile(block.text, block.where, "exec"), {"__name__": "__docs__"})  # noqa: S102 - the guide's own code


def test_skips_are_few_and_give_their_reason() -> None:
    skipped = [b for b in BLOCKS if b.marker == "skip"]
    assert all(b.reason.strip() for b in skipped), [b.where for b in skipped if not b.reason.strip()]
    assert len(skipped) <= 5, [b.where for b in skipped]


def test_the_shell_examples_are_found() -> None:
    """The examples the checks rely on are there: a guide that lost them would pass with nothing checked."""
    found = [argv[0] for b in BLOCKS if b.lang in SHELL | CONSOLE and b.marker != "skip"
             for _, line in logical_lines(b) for argv, _ in invocations(line)]
    assert {"chunk", "embed", "index", "retrieve", "extract", "run", "nightly", "publish"} <= set(found), found
    assert len(found) >= 30 and any(b.lang == "python" for b in BLOCKS) and any(b.lang == "yaml" for b in BLOCKS)


BAD = """
Text.

```bash
.venv/bin/verbatim-batch chunk --input papers/ \\
    --output RUN_DIR --no-such-flag
verbatim-batch extract --retrieval RET_DIR   # --output is required
verbatim-batch retrieve --index INDEX_DIR --queries q.jsonl --output RET_DIR [--k N] [--methods dense|bm25]
verbatim-batch run --input papers/ ... --threshold 2
ray job submit --working-dir . -- python jobs/embed.py --chunks RUN_DIR --output EMB_DIR --kind flat
verbatim-batch demo && verbatim-batch report RUN_DIR --samples N
```

```console
$ verbatim-batch embed --chunks RUN_DIR --output EMB_DIR --batch-rows many
a line of output --not-a-flag
```

<!-- docs-test: skip (a cluster-only example) -->
```bash
verbatim-batch chunk --bogus
```

```python
from verbatim_batch.api import chunk, no_such_name
from verbatim_batch import api
api.extract(api.NoSuchConfig())
```

```yaml
extract:
  treshold: 0.3
```

```json
{"query": "q", "chunk": "c"}
{"query": 'q'}
```

```toml
[tool]
```
"""


def test_the_checks_find_what_is_wrong(tmp_path: Path) -> None:
    """The checks can fail: a bad flag, a missing required option, bad values, a bad name, a bad key."""
    problems = [p for b in blocks_of(BAD, "bad.md") for p in problems_of(b, tmp_path)]
    text = "\n".join(problems)
    assert "bad.md:5: chunk --input papers/ --output RUN_DIR --no-such-flag" in text, text
    assert "unrecognized arguments: --no-such-flag" in text, text
    assert "bad.md:7: extract" in text and "required: --output" in text, text
    assert "must be >= 0 and <= 1, got 2.0" in text, text
    assert "bad.md:10: embed" in text and "unrecognized arguments: --kind flat" in text, text
    assert "--batch-rows: expected an integer, got 'many'" in text, text
    assert "--bogus" not in text and "--not-a-flag" not in text, text
    assert "no_such_name" in text and "NoSuchConfig" in text, text
    assert "unknown key 'treshold'" in text and "```toml" in text, text
    assert "bad.md:37: not JSON" in text, text
    assert len(problems) == 10, text  # the retrieve, demo and report lines are right


def test_placeholders_and_options_are_written_out() -> None:
    assert variants("x [--kind auto|flat] [--k 5] [options]") == (["x --kind auto --k 5  ", "x --kind flat --k 5  "],
                                                                    True)
    assert invocations("cd /opt && RAY=1 python jobs/nightly.py --run-id n-$(date -u +%Y) >> log 2>&1") == [
        (["nightly", "--run-id", "n-X"], False)]
    assert _placeholders("retrieve", ["retrieve", "--k", "N", "--queries", "Q"]) == [
        "retrieve", "--k", "10", "--queries", "Q"]
