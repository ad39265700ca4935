"""YAML configs: defaults from a file, flags override, clear errors; the example configs validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from verbatim_batch.cli import build_parser, config, parse_args

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
    from verbatim_batch.stages.extract import ExtractJob
    from verbatim_batch.stages.nightly import NightlyJob

    conf = _write(tmp_path, "batch-retries: 5\nextract:\n  extractor: highlighter\n  threshold: 0.25\n  top-k: 3\n")
    assert config.load_config(conf, "extract") == {"batch_retries": 5, "extractor": "highlighter",
                                                   "threshold": 0.25, "top_k": 3}
    job = build_job("extract", config=conf, pairs="p.jsonl", output="out", threshold=0.5)
    assert isinstance(job, ExtractJob) and job.top_k == 3 and job.batch_retries == 5
    assert job.extractor.threshold == 0.5 and type(job.extractor).kind == "highlighter"
    plain = build_job("extract", pairs="p.jsonl", output="out")
    assert (plain.top_k, plain.method, plain.batch_rows) == (ExtractJob.top_k, ExtractJob.method, ExtractJob.batch_rows)
    night = build_job("nightly", input="in", queries="q.jsonl", root="r")
    assert isinstance(night, NightlyJob) and night.keep_runs == 7
    assert night.chain.stage_jobs()["spans"].top_k == ExtractJob.top_k
    night = build_job("nightly", input="in", queries="q.jsonl", root="r", extract={"top_k": 2})
    assert night.chain.stage_jobs()["spans"].top_k == 2
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


# --- one declaration per option (issue 31) ------------------------------------------------------------------


def test_a_new_field_reaches_cli_yaml_api_and_reference(tmp_path, monkeypatch):
    """One edit: a field with ``option(...)`` on the extract job. It becomes a flag with its default in --help,
    a checked YAML key, a ``build_job`` argument and a row of the option reference."""
    import dataclasses

    from verbatim_batch.cli import options as cli_options
    from verbatim_batch.cli import reference
    from verbatim_batch.cli.commands import build_job
    from verbatim_batch.core import options
    from verbatim_batch.stages import extract

    @dataclasses.dataclass
    class Job(extract.ExtractJob):
        window_overlap: int = options.option(3, "overlap of the test's windows", low=0)

    monkeypatch.setitem(cli_options.COMMANDS, "extract",
                        dataclasses.replace(cli_options.COMMANDS["extract"], job=Job))
    cli_options.command_flags.cache_clear()
    try:
        help_text = build_parser().commands["extract"].format_help()
        assert "--window-overlap" in help_text and "overlap of the test's windows (default: 3)" in " ".join(
            help_text.split())
        args = parse_args(["extract", "--pairs", "p.jsonl", "--output", "o", "--window-overlap", "7"])
        assert args.window_overlap == 7
        conf = _write(tmp_path, "extract:\n  window_overlap: 9\n")
        assert config.load_config(conf, "extract")["window_overlap"] == 9
        bad = _write(tmp_path, "extract:\n  window_overlap: -1\n")
        with pytest.raises(config.ConfigError, match="extract.window_overlap must be >= 0"):
            config.load_config(bad, "extract")
        assert build_job("extract", pairs="p.jsonl", output="o", window_overlap=5).window_overlap == 5
        assert build_job("extract", pairs="p.jsonl", output="o").window_overlap == 3
        assert "| `--window-overlap` | `window_overlap` | 3 |" in reference.markdown()
    finally:
        cli_options.command_flags.cache_clear()


def test_every_declared_option_has_help_and_a_unique_flag():
    from verbatim_batch.cli.options import COMMANDS, command_flags

    for command in COMMANDS:
        seen: dict[str, str] = {}
        for key, flag in command_flags(command).items():
            assert flag.of.option.help.strip(), f"{command} {key} has no help"
            assert "(default" not in flag.of.option.help, f"{command} {key}: a literal default in its help"
            for f in flag.flags:
                assert f not in seen, f"{command}: {f} is both {seen[f]} and {key}"
                seen[f] = key


def test_help_shows_the_declared_default_not_a_copy():
    from verbatim_batch.extract.highlighter import HighlighterConfig
    from verbatim_batch.stages.embed import EmbedJob
    from verbatim_batch.stages.extract import ExtractJob

    def helptext(command):
        return " ".join(build_parser().commands[command].format_help().split())

    assert f"(default: {EmbedJob.batch_rows})" in helptext("embed")
    text = helptext("extract")
    assert f"(default: {ExtractJob.top_k})" in text
    assert f"highlighter {HighlighterConfig.threshold:g}" in text


@pytest.mark.parametrize("text, where", [
    ("retrieve:\n  k: ten\n", "retrieve.k must be an integer"),
    ("extract:\n  threshold: .nan\n", "extract.threshold expected a finite number"),
    ("embed:\n  token_budget: -5\n", "embed.token_budget must be >= 1"),
    ("extract:\n  extractor: nonexistent\n", "extract.extractor must be one of"),
    ("index:\n  kind: hnsw\n", "index.kind must be one of"),
    ("nightly:\n  keep_runs: 0\n", "nightly.keep_runs must be >= 1"),
])
@pytest.mark.parametrize("command", ["chunk", "embed", "extract", "run", "nightly", "evaluate", "verify"])
def test_a_bad_value_in_any_section_fails_every_command_in_one_line(tmp_path, capsys, text, where, command):
    conf = _write(tmp_path, text)
    with pytest.raises(SystemExit) as exc:
        parse_args([command, "--config", conf])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and where in err and err.count("\n") == 0, err


def test_run_takes_stage_sections_and_prefixed_flags(tmp_path, capsys):
    from verbatim_batch.cli.commands import build_job, job_of

    conf = _write(tmp_path, "chunk:\n  max_chars: 3000\nembed:\n  batch_rows: 32\nindex:\n  max_drift: 0.5\n"
                  "retrieve:\n  k: 7\nextract:\n  threshold: 0.6\n  top_k: 2\n")
    args = parse_args(["run", "--config", conf, "--input", "in", "--queries", "q.jsonl", "--output", "out",
                       "--retrieve-k", "8", "--min-chars", "12"])
    assert "not used" not in capsys.readouterr().err  # every section is the chain's
    jobs = job_of(args).chain.stage_jobs("out")
    assert jobs["chunks"].chunker.max_chars == 3000 and jobs["embeddings"].batch_rows == 32
    assert jobs["index"].max_drift == 0.5 and jobs["retrieval"].retriever.k == 8  # the flag wins
    assert jobs["spans"].extractor.threshold == 0.6 and jobs["spans"].top_k == 2
    assert jobs["spans"].extractor.min_chars == 12  # the extract stage's options also go unprefixed
    assert jobs["chunks"].chunker.min_chars == 500  # ... and never reach another stage
    night = build_job("nightly", config=conf, input="in", queries="q.jsonl", root="r")
    assert night.chain.stage_jobs()["spans"].extractor.threshold == 0.6


def test_unknown_flag_suggests_the_closest(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["retrieve", "--index", "i", "--queries", "q", "--output", "o", "--topk", "3"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "did you mean --k?" in err and err.count("\n") == 0
    with pytest.raises(SystemExit):
        parse_args(["extract", "--pairs", "p", "--output", "o", "--treshold", "0.3"])
    assert "did you mean --threshold?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["extract", "--pairs", "p", "--output", "o", "--topk", "3"])
    assert "did you mean --top-k?" in capsys.readouterr().err


def test_local_cpu_config_is_the_defaults_written_out():
    """configs/local-cpu.yaml says it is the defaults: every value it sets equals the declared default."""
    from verbatim_batch.cli.options import command_flags

    data = config.load(str(ROOT / "configs" / "local-cpu.yaml"))
    for command, section in data.items():
        if command == "nightly":
            continue  # where nightly writes is the user's choice
        flags = command_flags(command)
        loaded = config.load_config(str(ROOT / "configs" / "local-cpu.yaml"), command)
        for key in section:
            flag = flags[key.replace("-", "_")]
            declared = flag.of.default if not flag.of.kinds else dict(flag.of.defaults)["semantic"]
            assert loaded[key] == declared, f"{command}.{key}: {loaded[key]!r}, declared {declared!r}"


def test_the_option_reference_is_current():
    """docs/reference/options.md is generated from the declarations; regenerate it with
    `python -m verbatim_batch.cli.reference > docs/reference/options.md`."""
    from verbatim_batch.cli.reference import markdown

    assert (ROOT / "docs" / "reference" / "options.md").read_text(encoding="utf-8") == markdown()
