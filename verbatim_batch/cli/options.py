"""The commands and their options, derived from the jobs' option fields (``verbatim_batch.core.options``).

A command names the dataclass whose options it takes; its flags, ``--help``, YAML keys and checks come from its
fields. A chain (``run``, ``nightly``) also takes every stage's options, keyed ``<stage>.<option>``: in a config
section (``extract:``) or as ``--<stage>-<option>`` (the extract stage's also without the prefix: ``--threshold``).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from verbatim_batch.core import limits
from verbatim_batch.core.options import OptionError, OptionField, check, option, options_of
from verbatim_batch.engine.stage import Command, RunOptions
from verbatim_batch.engine.telemetry.options import MetricsOptions
from verbatim_batch.stages import chains, nightly, registry
from verbatim_batch.stages.extract import extractor_group


def _thresholds(value: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected numbers like 0.2,0.3,0.4, got {value!r}") from None
    if not out or any(not 0 <= t <= 1 for t in out):
        raise ValueError(f"expected numbers in [0, 1] like 0.2,0.3,0.4, got {value!r}")
    return out


def _cutoffs(value: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1 or max(ks) > limits.PER_QUERY:
        raise ValueError(f"expected positive integers up to {limits.PER_QUERY} like 5,10,100, got {value!r}")
    return ks


@dataclass(kw_only=True)
class EvaluateOptions(MetricsOptions):
    """``evaluate``: gold pairs against predictions, or an extractor swept over thresholds."""

    gold: str = option(help="pairs file with relevant and gold_spans", path=True)
    predictions: str | None = option(None, "a span table / extract run folder, or JSONL rows with spans", path=True)
    chunks: str | None = option(None, "a chunk run: gold rows may name their chunk (chunk_id, or paper_id and "
                                "chunk_index) instead of giving its text", path=True)
    json: bool = option(False, "print the metrics as JSON")
    sweep_threshold: tuple[float, ...] | None = option(
        None, "run an extractor on the gold pairs at these thresholds, e.g. 0.2,0.3,0.4,0.5, and score each (needs "
        "no --predictions)", parse=_thresholds)
    report: str | None = option(None, "also write DIR/report.html (and report.json): gold and predicted spans side "
                                "by side with per-row F1, and the sweep table", path=True, metavar="DIR")
    extractor: Any = extractor_group()


@dataclass(kw_only=True)
class EvaluateRetrievalOptions(MetricsOptions):
    """``evaluate-retrieval``: nDCG, MRR and Recall of a retrieval run on labelled queries."""

    retrieval: str = option(help="a retrieval or rerank run folder, or a TREC run file", path=True)
    qrels: str = option(help="relevance labels: TREC qrels (qid iter docid rel), BEIR TSV/JSONL (query-id, corpus-id, "
                        "score), or gold pairs as in shared/devsets (query, paper_id, chunk, relevant)", path=True)
    level: str = option("chunk", "judge chunks, or papers (a paper at its best chunk's rank)",
                        choices=("chunk", "paper"))
    recall_at: tuple[int, ...] = option((5, 10, 100), "cutoffs k of Recall@k", parse=_cutoffs)
    chunks: str | None = option(None, "the chunk run gold rows are found in", path=True, default_help="the run's")
    queries: str | None = option(None, "the query file gold rows' queries are found in", path=True,
                                 default_help="the run's")
    json: bool = option(False, "print the metrics as JSON")


@dataclass(kw_only=True)
class RayOptions(MetricsOptions):
    address: str | None = option(None, "Ray cluster address", default_help="RAY_ADDRESS, else a local Ray")
    num_cpus: int | None = option(None, "CPUs for a local Ray", low=1, high=limits.WORKERS, default_help="all")


@dataclass(kw_only=True)
class DemoOptions(RayOptions):
    output: str = option("verbatim-demo", "folder for the demo's runs", path=True)
    n_papers: int | None = option(None, "only the first N bundled papers that have labelled queries, and those "
                                  "queries (a quicker look)", low=1, high=limits.ROWS, default_help="all")


@dataclass(kw_only=True)
class ReportOptions(MetricsOptions):
    samples: int = option(12, "pairs shown per query with their spans in context (extract runs)", low=0,
                          high=limits.PER_QUERY)


@dataclass(kw_only=True)
class VerifyOptions(RayOptions):
    num_cpus: int | None = option(None, "CPUs for a local Ray whose tasks run the checks, one per papers row group "
                                  "(1: in this process)", low=1, high=limits.WORKERS, default_help=(
                                      "a local Ray with all CPUs only for a chunk run of more than 32 papers row "
                                      "groups, else in this process"))


# the CLI's own commands (no run folder; handlers in ``cli.commands``); the rest are the stages' and chains'
CLI_COMMANDS = (
    Command("evaluate", "score predicted spans against a gold pairs file (paper metrics)", EvaluateOptions),
    Command("evaluate-retrieval", "nDCG@10, MRR@10 and Recall@k per method of a retrieval (or rerank) run on "
            "labelled queries, by trec_eval", EvaluateRetrievalOptions),
    Command("demo", "run the pipeline on the bundled example corpus (offline, CPU)", DemoOptions),
    Command("report", "(re)write report.json and report.html of a run folder", ReportOptions,
            positional=(("run_dir", "a run folder"),)),
    Command("verify", "re-check a run: offsets exact, coverage complete (a chain or nightly folder: every stage)",
            VerifyOptions, positional=(("run_dir", "a run folder"),)),
)


class CommandTable(MutableMapping):
    """Every command by name, derived when asked (a stage added with ``registry.add`` included); a test may
    replace one (``monkeypatch.setitem``)."""

    def __init__(self) -> None:
        self.replaced: dict[str, Command] = {}

    def _all(self) -> dict[str, Command]:
        found = {c.name: c for c in (*registry.STAGES, chains.COMMAND, nightly.COMMAND, *CLI_COMMANDS)}
        return found | {k: v for k, v in self.replaced.items() if k in found}

    def __getitem__(self, name: str) -> Command:
        return self._all()[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self.replaced[name] = command

    def __delitem__(self, name: str) -> None:
        del self.replaced[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


COMMANDS = CommandTable()
STAGE_PREFIX_FREE = "extract"  # in a chain, this stage's options also go without their prefix


@dataclass(frozen=True)
class Flag:
    """An option as one command takes it: its key (``<stage>.<option>`` in a chain), field and flags."""

    key: str
    of: OptionField
    flags: tuple[str, ...]
    stage: str | None = None

    @property
    def required(self) -> bool:
        return self.of.required and self.stage is None

    @property
    def default(self) -> Any:
        """The parser's default: the option's own, or None where it depends on a choice (the extractor's)."""
        if self.stage is not None or self.of.kinds:
            return None
        if self.of.is_bool:
            return False
        return self.of.default


def command_flags(command: str) -> dict[str, Flag]:
    """``{key: Flag}`` of every option ``command`` takes."""
    return _command_flags(COMMANDS[command], tuple(chains.steps()))


command_flags.cache_clear = lambda: _command_flags.cache_clear()  # type: ignore[attr-defined]


@cache
def _command_flags(spec: Command, steps: tuple[Command, ...]) -> dict[str, Flag]:
    out = {of.key: Flag(of.key, of, (of.flag,)) for of in options_of(spec.job) if of.key not in spec.omit}
    if spec.chain:
        for step in steps:
            stage, fields = step.name, {of.key: of for of in options_of(step.job)}
            for key in chains.stage_keys(stage):
                flags = ["--" + f"{stage}-{key}".replace("_", "-")]
                if stage == STAGE_PREFIX_FREE and key not in out:
                    flags.insert(0, fields[key].flag)
                out[f"{stage}.{key}"] = Flag(f"{stage}.{key}", fields[key], tuple(flags), stage)
    return out


def convert(flag: Flag, value: Any, text: bool = False) -> Any:
    """A value for ``flag`` checked and converted (``text``: from the command line). None keeps the default."""
    return check(flag.of, value, text)


class Parser(argparse.ArgumentParser):
    """argparse, with an unknown flag answered by the closest valid one, in one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            words = message.split(":", 1)[1].split()
            known = [s for a in self._actions for s in a.option_strings]
            for word in words:
                if word.startswith("--"):
                    close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6)
                    if close:
                        message = f"unrecognized argument {word}: did you mean {close[0]}?"
                        break
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    """Add ``command``'s options to its parser; returns the required keys (checked by ``cli.parse_args`` once a
    config file's values are in)."""
    spec = COMMANDS[command]
    for name, text in spec.positional:
        parser.add_argument(name, help=text)
    parser.add_argument("--config", help="YAML file of options (see docs/configuration.md); flags override it")
    groups: dict[str | None, argparse._ArgumentGroup] = {}
    run_keys = {of.key for of in options_of(RunOptions)}
    required = set()
    for key, flag in command_flags(command).items():
        target: Any = parser
        if key in run_keys:
            if "run" not in groups:
                groups["run"] = parser.add_argument_group("run folder and Ray")
            target = groups["run"]
        elif flag.stage is not None:
            if flag.stage not in groups:
                groups[flag.stage] = parser.add_argument_group(
                    f"{flag.stage} stage (config section '{flag.stage}:')")
            target = groups[flag.stage]
        text = flag.of.help_text().replace("%", "%%")
        if flag.required:
            required.add(key)
            text += " (required)"
        kwargs: dict[str, Any] = {"dest": key, "help": text, "default": flag.default}
        if flag.of.is_bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _argparse_type(flag)
            if flag.of.option.choices:
                kwargs["metavar"] = "{" + ",".join(flag.of.option.choices) + "}"
            elif flag.of.option.metavar:
                kwargs["metavar"] = flag.of.option.metavar
        target.add_argument(*flag.flags, **kwargs)
    return required


def _argparse_type(flag: Flag):
    def parse(text: str) -> Any:
        try:
            return convert(flag, text, text=True)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = flag.key
    return parse


def flag_of(command: str, key: str) -> str:
    """The flag a user gives for option ``key`` of ``command`` (for messages)."""
    flag = command_flags(command).get(key)
    return flag.flags[-1] if flag is not None else "--" + key.replace("_", "-")


def stage_sections(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"extract.threshold": 0.3}`` -> ``{"extract": {"threshold": 0.3}}`` (given values only)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        stage, dot, name = key.partition(".")
        if dot and value is not None:
            out.setdefault(stage, {})[name] = value
    return out
