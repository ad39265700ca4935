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


def test_python_callers_build_jobs_from_a_config_file(tmp_path):
    """``load_config`` and ``build_job`` give Python what the CLI gives the command line: values by name, the
    file's under the caller's, the job dataclasses' own defaults for everything unset."""
    from verbatim_batch.cli.commands import build_job
    from verbatim_batch.pipeline import ExtractJob, NightlyJob

    conf = _write(tmp_path, "batch-retries: 5\nextract:\n  extractor: highlighter\n  threshold: 0.25\n  top-k: 3\n")
    assert config.load_config(conf, "extract") == {"batch_retries": 5, "extractor": "highlighter",
                                                   "threshold": 0.25, "top_k": 3}
    job = build_job("extract", config=conf, pairs="p.jsonl", output="out", threshold=0.5)
    assert isinstance(job, ExtractJob) and job.top_k == 3 and job.batch_retries == 5
    assert job.extractor.threshold == 0.5 and type(job.extractor).kind == "highlighter"
    plain = build_job("extract", pairs="p.jsonl", output="out")
    assert (plain.top_k, plain.method, plain.batch_rows) == (ExtractJob.top_k, ExtractJob.method, ExtractJob.batch_rows)
    night = build_job("nightly", input="in", queries="q.jsonl", root="r")
    assert isinstance(night, NightlyJob) and night.chain.top_k == ExtractJob.top_k and night.keep_runs == 7
    with pytest.raises(ValueError, match="needs --pairs|needs --output|takes no option"):
        build_job("extract", pairs="p.jsonl", outptu="x")
    with pytest.raises(ValueError, match="needs --input"):
        build_job("chunk", output="o")


def test_required_options_may_come_from_the_file_and_are_checked_after_it(tmp_path, capsys):
    conf = _write(tmp_path, "chunk:\n  input: corpus\n")
    assert parse_args(["chunk", "--config", conf, "--output", "o"]).input == "corpus"
    with pytest.raises(SystemExit) as exc:
        parse_args(["chunk", "--output", "o"])
    assert exc.value.code == 2 and "--input" in capsys.readouterr().err


def test_what_a_command_does_not_use_is_named_in_one_line_and_every_section_is_checked(tmp_path, capsys):
    """Other commands' sections and keys are ignored the same way everywhere, and said so in one line; a typo
    in another command's section fails every command (the file is checked whole)."""
    conf = _write(tmp_path, "threshold: 0.4\nnum-cpus: 2\nextract:\n  top_k: 3\nembed:\n  batch_rows: 8\n")
    args = parse_args(["chunk", "--config", conf, "--input", "in", "--output", "out"])
    assert args.num_cpus == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not used by chunk" in err
    assert "section 'extract'" in err and "section 'embed'" in err and "key 'threshold'" in err
    parse_args(["extract", "--config", conf, "--pairs", "p", "--output", "o"])
    err = capsys.readouterr().err
    assert "section 'embed'" in err and "section 'extract'" not in err and "threshold" not in err
    bad = _write(tmp_path, "extract:\n  treshold: 0.2\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["chunk", "--config", bad, "--input", "in", "--output", "out"])
    assert exc.value.code == 2 and "extract: unknown key 'treshold'" in capsys.readouterr().err
