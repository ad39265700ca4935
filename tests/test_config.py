"""YAML configs: defaults from a file, flags override, clear errors; the example configs validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from verbatim_batch import config
from verbatim_batch.cli import build_parser, parse_args

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "conf.yaml"
    path.write_text(text)
    return str(path)


def test_file_values_then_section_then_flags(tmp_path):
    conf = _write(tmp_path, """
num-cpus: 3
threshold: 0.4
extract:
  extractor: highlighter
  threshold: 0.25
  no_structured_output: true
  output: /data/spans
""")
    args = parse_args(["extract", "--config", conf, "--pairs", "p.jsonl", "--top-k", "7"])
    assert (args.num_cpus, args.extractor, args.threshold, args.top_k) == (3, "highlighter", 0.25, 7)
    assert args.no_structured_output is True and args.output == "/data/spans"  # a required flag, from the file
    args = parse_args(["extract", "--config", conf, "--pairs", "p.jsonl", "--threshold", "0.5"])
    assert args.threshold == 0.5  # the command line wins
    chunk = parse_args(["chunk", "--config", conf, "--input", "in", "--output", "out"])
    assert chunk.num_cpus == 3  # top-level keys reach every command that has the option


def test_custom_types_take_yaml_lists(tmp_path):
    conf = _write(tmp_path, "chunk:\n  heading_levels: [1, 2]\n  normalize: [crlf, nfc]\n")
    args = parse_args(["chunk", "--config", conf, "--input", "in", "--output", "out"])
    assert args.heading_levels == (1, 2) and args.normalize == ("crlf", "nfc")


@pytest.mark.parametrize("text, message", [
    ("extrct:\n  model: x\n", "unknown key 'extrct'"),
    ("extract:\n  treshold: 0.2\n", "extract: unknown key 'treshold'"),
    ("extract:\n  top_k: five\n", "extract.top_k must be an integer"),
    ("extract:\n  top_k: true\n", "must be an integer"),
    ("extract:\n  extractor: oracle\n", "must be one of semantic, highlighter, llm"),
    ("extract:\n  overwrite: 'yes'\n", "must be true or false"),
    ("extract: [1, 2]\n", "section 'extract' must be a mapping"),
    ("- a\n- b\n", "a config is a mapping"),
    ("a: [unclosed\n", "not valid YAML"),
    ("chunk:\n  heading_levels: [1, x]\n", "comma-separated levels"),
])
def test_bad_configs_name_the_key(tmp_path, text, message):
    conf = _write(tmp_path, text)
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.apply(build_parser(), "chunk" if "heading" in text else "extract", conf)


def test_cli_reports_config_errors_and_exits_2(tmp_path, capsys):
    conf = _write(tmp_path, "extract:\n  treshold: 0.2\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["extract", "--config", conf, "--pairs", "p", "--output", "o"])
    assert exc.value.code == 2 and "treshold" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["local-cpu.yaml", "cluster-gpu.yaml"])
def test_example_configs_validate_for_every_section(name):
    path = str(ROOT / "configs" / name)
    data = config.load(path)
    sections = [k for k, v in data.items() if isinstance(v, dict)]
    assert sections
    for command in sections:
        applied = config.apply(build_parser(), command, path)
        assert set(data[command]) <= {k.replace("_", "-") for k in applied} | set(applied)
