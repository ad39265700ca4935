"""The CLI parses its options without Ray or the stages' heavy libraries (issue 41): ``verbatim-batch --help`` and
every ``<command> --help`` print each option with its declared default, and a bad option is refused (exit 2, one
line), in a process where Ray, torch, transformers, ``pyarrow.dataset``, FAISS, bm25s and SciPy cannot be
imported. No Ray is started. (What this saves is measured, not asserted: benchmarks/history/structure.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("ray", "torch", "transformers", "pyarrow.dataset", "faiss", "bm25s", "scipy")

# Run in a fresh interpreter: a meta-path finder refuses the heavy modules (and their submodules) and records every
# attempt, so an import swallowed by a ``try`` still counts; the result comes back as one JSON line.
_PRELUDE = textwrap.dedent("""
    import contextlib, importlib.abc, io, json, sys

    HEAVY = {heavy!r}
    tried = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == h or name.startswith(h + ".") for h in HEAVY):
                tried.append(name)
                raise ImportError(f"{{name}} is not importable in this test")
            return None

    sys.meta_path.insert(0, Refuse())

    def run(argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
        return code, out.getvalue(), err.getvalue()

    def loaded():
        return sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
""").format(heavy=HEAVY)


def _run(body: str) -> dict:
    script = _PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _squeezed(text: str) -> str:
    """``text`` without whitespace: argparse wraps help lines wherever it likes."""
    return "".join(text.split())


def test_every_help_lists_its_options_and_defaults_without_the_heavy_modules():
    result = _run("""
        from verbatim_batch.cli import main
        from verbatim_batch.cli.options import COMMANDS, command_flags

        out = {"tried": None, "loaded": None, "top": run(["--help"]), "commands": {}}
        for command in COMMANDS:
            flags = [(list(f.flags), f.of.help_text()) for f in command_flags(command).values()]
            out["commands"][command] = {"run": run([command, "--help"]), "flags": flags}
        out["tried"], out["loaded"] = tried, loaded()
        print(json.dumps(out))
    """)
    assert result["tried"] == [] and result["loaded"] == [], result["tried"] or result["loaded"]
    code, text, _ = result["top"]
    assert code == 0
    commands = result["commands"]
    assert {"chunk", "run", "nightly", "train", "publish"} <= set(commands)
    for command in commands:
        assert command in text
    for command, got in commands.items():
        code, text, err = got["run"]
        assert code == 0, (command, err)
        assert text.startswith(f"usage: verbatim-batch {command}"), text[:200]
        help_text = _squeezed(text)
        assert got["flags"], command
        for flags, help_line in got["flags"]:  # the help with its declared default
            for flag in flags:
                assert flag in text, (command, flag)
            assert _squeezed(help_line) in help_text, (command, flags, help_line)


def test_a_bad_option_is_refused_in_one_line_before_ray_is_imported(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("threshold: 7\n")
    result = _run(f"""
        from verbatim_batch.cli import main

        out = {{"runs": [
            run(["chunk", "--input", "x", "--output", "y", "--num-cpus", "0"]),
            run(["extract", "--retrieval", "r", "--output", "o", "--threshold", "high"]),
            run(["chunk", "--input", "x", "--output", "y", "--num-cpuz", "2"]),
            run(["chunk", "--output", "y"]),
            run(["run", "--config", {str(config)!r}, "--input", "x", "--queries", "q", "--output", "o"]),
            run(["chunk", "--input", {str(tmp_path / "missing")!r}, "--output", {str(tmp_path / "out")!r}]),
        ]}}
        out["tried"], out["loaded"] = tried, loaded()
        print(json.dumps(out))
    """)
    assert result["tried"] == [] and result["loaded"] == [], result["tried"] or result["loaded"]
    expected = ("--num-cpus", "--threshold", "did you mean --num-cpus", "required: --input", "threshold",
                "input not found")
    for (code, out, err), message in zip(result["runs"], expected, strict=True):
        assert code == 2 and out == "", (code, out, err)
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()
