"""Options carry their role (issue 41): an output-deciding option changes what a run is bound to and what the
nights compare, a runtime one (workers, batch sizes, retries, addresses, metrics) never does; and every declared
bound and choice is checked when a config or job is built in Python, as its flag is checked.

The settings are read where runs read them: a chain stage's options through a night's config (the settings hash
of ``nightly``), the chunk stage's and the extract stage's own plans (their settings hashes), the training job's
config, and each model config's hash (the id of what made a row). No Ray: plans are cheap by contract."""

from __future__ import annotations

import dataclasses
import functools
import json
import typing

import pytest

from verbatim_batch.core.options import OptionError, _base, check, is_runtime, options_of
from verbatim_batch.core.tables import config_hash
from verbatim_batch.extract.highlighter import HighlighterConfig
from verbatim_batch.extract.llm import LLMConfig
from verbatim_batch.extract.semantic import SemanticConfig
from verbatim_batch.retrieval.embedder import EmbedderConfig
from verbatim_batch.retrieval.reranker import RerankerConfig
from verbatim_batch.stages.chains import Chain, sections, stage_command, stage_keys
from verbatim_batch.stages.chunk import ChunkJob, ChunkStage
from verbatim_batch.stages.extract import ExtractJob, ExtractStage
from verbatim_batch.stages.nightly import NightlyJob
from verbatim_batch.stages.train import TrainJob

# Values for options whose type alone does not give a second valid value (a parsed list, a model path).
OTHER = {"heading_levels": (2, 3), "normalize": ("nfc",), "methods": ("dense",), "weights": {"dense": 1.0},
         "model": "some/other-model", "revision": "v2", "tokenizer": "some/tokenizer", "bm25": False,
         "dense_kind": "ivf"}
# Options that change nothing while another option keeps them off: set together with the one that turns them on.
TURNED_ON_BY = {"query_threshold": {"query_margin": 0.5}, "rank_weight": {"query_margin": 0.5}}


def _other(of, default):
    """A valid value other than ``default`` for option ``of``, or None when there is none to try."""
    if of.key in OTHER:
        return OTHER[of.key]
    opt, kind = of.option, _base(of.type)[0]
    if kind is bool:
        return True if opt.invert else not default  # an inverted flag (--no-x) is given as true
    if opt.choices:
        rest = [c for c in opt.choices if c != default]
        return rest[0] if rest else None
    if kind in (int, float):
        base = default if default is not None else (opt.low if opt.low is not None else 1)
        for step in (1, -1, 0.5, -0.5, 0.1, -0.1):
            value = kind(base + step) if kind is int else base + step
            if value == default or (kind is int and step % 1):
                continue
            try:
                return check(of, value)
            except OptionError:
                continue
    return None


def _varied(cls, skip=()):
    """``(key, other value, runtime)`` for every option of ``cls`` (a nested config's too) with a second value to
    try; paths are inputs and outputs, not settings."""
    out = []
    for of in options_of(cls):
        if of.key in skip or of.option.path:
            continue
        value = _other(of, of.default)
        if value is not None:
            out.append((of.key, value, of.option.runtime))
    return out


def _night(tmp_path, stages) -> str:
    job = NightlyJob(chain=Chain(input=str(tmp_path), queries=str(tmp_path / "q.jsonl"), stages=stages),
                     root=str(tmp_path / "root"))
    return config_hash(job.config())


@pytest.mark.parametrize("section", sections())
def test_every_chain_stage_option_changes_a_night_exactly_when_it_decides_output(section, tmp_path):
    cls = stage_command(section).job
    base_stages = {"rerank": {"model": "some/cross-encoder"}} if section == "rerank" else {}
    base = _night(tmp_path, base_stages)
    keys = set(stage_keys(section))
    tried = []
    for key, value, runtime in _varied(cls):
        if key not in keys:
            continue
        section_values = base_stages.get(section, {}) | TURNED_ON_BY.get(key, {})
        before = _night(tmp_path, base_stages | {section: section_values})
        try:
            after = _night(tmp_path, base_stages | {section: section_values | {key: value}})
        except (OptionError, ValueError) as exc:  # e.g. an option the default extractor does not take
            if "does not apply" in str(exc) or "do(es) not apply" in str(exc):
                continue
            raise
        tried.append(key)
        if runtime:
            assert after == before, f"{section}.{key} is a runtime option but changed the night's settings"
        else:
            assert after != before, f"{section}.{key} decides output but the night's settings ignore it"
    assert tried, f"no option of {section} was tried"
    assert base == _night(tmp_path, base_stages)  # deterministic


def test_chunk_plan_follows_the_roles(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.md").write_text("# A\n\ntext\n")

    def plan_hash(**kw) -> str:
        return config_hash(ChunkStage(ChunkJob(input=str(tmp_path / "c"), output=str(tmp_path / "o"), **kw))
                           .plan().config)

    base = plan_hash()
    tried = 0
    for key, value, runtime in _varied(ChunkJob):
        of = next(o for o in options_of(ChunkJob) if o.key == key)
        if of.group:
            from verbatim_batch.corpus.chunker import ChunkerConfig

            kw = {"chunker": ChunkerConfig(**{of.field: value})}
        else:
            kw = {of.field: (not value) if of.option.invert else value}
        if key == "format":
            continue  # another format needs another corpus (an input, not a setting)
        tried += 1
        assert (plan_hash(**kw) == base) == runtime, key
    assert tried >= 8


def test_extract_plan_follows_the_roles(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "q", "chunk": "c"}) + "\n")

    def plan_hash(job: ExtractJob) -> str:
        return config_hash(ExtractStage(job).plan().config)

    from verbatim_batch.extract.semantic import SemanticConfig

    base_job = ExtractJob(output=str(tmp_path / "o"), pairs=str(pairs), extractor=SemanticConfig())
    base = plan_hash(base_job)
    tried = 0
    # the model: its weights are fingerprinted from the hub or its folder (tests/test_extract.py covers it)
    for key, value, runtime in _varied(ExtractJob, skip={"extractor", "model", "revision"}):
        of = next(o for o in options_of(ExtractJob) if o.key == key)
        if of.group:
            if of.kinds and "semantic" not in of.kinds:
                continue  # another extractor's option: the selector changes the run id (below)
            extra = TURNED_ON_BY.get(key, {})
            before = plan_hash(dataclasses.replace(base_job, extractor=SemanticConfig(**extra)))
            after = plan_hash(dataclasses.replace(base_job, extractor=SemanticConfig(**extra, **{of.field: value})))
        else:
            before, after = base, plan_hash(dataclasses.replace(base_job, **{of.field: value}))
        tried += 1
        assert (after == before) == runtime, key
    assert tried >= 15


def test_training_config_follows_the_roles(tmp_path):
    base = TrainJob(output=str(tmp_path / "o"), train="t.jsonl")
    for f in dataclasses.fields(TrainJob):
        if "option" not in f.metadata or f.metadata["option"].path:
            continue
        of = next(o for o in options_of(TrainJob) if o.field == f.name)
        value = _other(of, getattr(base, f.name))
        if value is None:
            continue
        changed = dataclasses.replace(base, **{f.name: value})
        assert (changed.config() == base.config()) == is_runtime(f), f.name


def test_metrics_and_run_options_are_runtime_everywhere():
    from verbatim_batch.engine.stage import RunOptions

    for f in dataclasses.fields(RunOptions):
        assert is_runtime(f), f"{f.name}: a run option never decides output"


# --- bounds: declared once, checked on construction ------------------------------------------------------------

def _configs():
    from verbatim_batch.corpus.chunker import ChunkerConfig
    from verbatim_batch.extract.highlighter import HighlighterConfig
    from verbatim_batch.extract.llm import LLMConfig
    from verbatim_batch.extract.semantic import SemanticConfig
    from verbatim_batch.retrieval.embedder import EmbedderConfig
    from verbatim_batch.retrieval.reranker import RerankerConfig
    from verbatim_batch.retrieval.retriever import RetrieverConfig

    return [(ChunkerConfig, {}), (EmbedderConfig, {}), (HighlighterConfig, {}), (SemanticConfig, {}),
            (RetrieverConfig, {}), (RerankerConfig, {"model": "m"}),
            (LLMConfig, {"model": "m", "base_url": "http://127.0.0.1:1/v1"}),
            (TrainJob, {"output": "/tmp/o", "train": "t.jsonl"})]


@pytest.mark.parametrize(("cls", "required"), _configs(), ids=lambda x: getattr(x, "__name__", ""))
def test_python_built_configs_take_exactly_the_declared_bounds(cls, required):
    """Each declared bound is the one a Python-built config takes: the bound itself (unless open) is accepted,
    the first value past it is refused with the option named. The semantic extractor's threshold is one that
    had drifted ([0, 1] declared, [-1, 1] accepted in Python)."""
    checked = 0
    for of in options_of(cls):
        if of.group or _base(of.type)[0] not in (int, float) or of.option.parse:
            continue
        kind = _base(of.type)[0]
        step = 1 if kind is int else 1e-6
        for bound, past, is_open in ((of.option.low, -step, of.option.low_open),
                                     (of.option.high, step, of.option.high_open)):
            if bound is None:
                continue
            with pytest.raises(ValueError, match=of.key):
                cls(**required, **{of.field: kind(bound + past) if kind is int else bound + past})
            if not is_open:
                try:
                    cls(**required, **{of.field: kind(bound)})
                except ValueError as exc:  # a check across options may refuse the bound with the defaults: it
                    # names the other option (min_chars > max_chars, a stride past half of max_length)
                    others = [o.key for o in options_of(cls) if o.key != of.key and o.key in str(exc)]
                    assert of.key not in str(exc).split()[0] or others, f"{cls.__name__}.{of.key}: {exc}"
            checked += 1
    assert checked >= 1


def test_choices_are_checked_when_built_in_python():
    from verbatim_batch.extract.semantic import SemanticConfig
    from verbatim_batch.retrieval.embedder import EmbedderConfig

    with pytest.raises(ValueError, match="output_dtype must be one of"):
        EmbedderConfig(output_dtype="int8")
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        SemanticConfig(threshold=-0.5)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        ExtractJob(output="/tmp/o", pairs="p.jsonl", top_k=0)
    assert typing.get_type_hints(ExtractJob)  # the hints resolve without Ray-only names


@pytest.mark.parametrize("argv", [
    ["silver", "--chunks", "{t}/c", "--index", "{t}/i", "--model", "m", "--output", "{t}/o", "--stride", "100000"],
    ["train", "--train", "{t}/t.jsonl", "--output", "{t}/o", "--stride", "5000"],
    ["extract", "--pairs", "{t}/p.jsonl", "--output", "{t}/o", "--extractor", "highlighter", "--model", "m",
     "--stride", "4096"],
    ["silver", "--chunks", "{t}/c", "--index", "{t}/i", "--model", "m", "--output", "{t}/o", "--max-length", "16",
     "--stride", "7"],  # fits max_length / 2, but leaves the query's share (4) no context
])
def test_the_window_rule_is_declared_once_and_refuses_before_any_work(argv, tmp_path, capsys):
    """The highlighter's window rule (``highlighter_spans.window_problem``) refuses a stride the windows cannot
    hold in every command that cuts such windows, in one line before any input is read (silver before its
    first LLM call: its inputs here do not even exist) and before any folder is written."""
    from verbatim_batch.cli import main

    assert main([a.format(t=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stride" in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def _plain_bounded(cls):
    return [f for f in dataclasses.fields(cls) if "bounds" in f.metadata]


@pytest.mark.parametrize("make", [
    EmbedderConfig, functools.partial(RerankerConfig, model="m"), HighlighterConfig, SemanticConfig,
    functools.partial(LLMConfig, model="m"),
], ids=["embedder", "reranker", "highlighter", "semantic", "llm"])
def test_plain_fields_take_their_declared_bounds_when_built(make):
    """A plain field (no flag) declared with bounds (``runtime(256, low=1)``, ``bounded(0.5, ...)``) is checked
    when its config is built, with the one-line ``OptionError`` naming it, as an option is: the bounds live on
    the declaration, not in a hand check beside it."""
    cls = type(make())
    fields = _plain_bounded(cls)
    assert fields, f"{cls.__name__}: no plain field declares bounds"
    for f in fields:
        opt = f.metadata["bounds"]
        outside = []
        if opt.low is not None:
            outside.append(opt.low if opt.low_open else opt.low - 1)
        if opt.high is not None:
            outside.append(opt.high if opt.high_open else opt.high + 1)
        for value in outside:
            with pytest.raises(OptionError, match=rf"^{f.name} must be "):
                make(**{f.name: type(f.default)(value)})


def test_a_pair_carries_across_its_inputs_and_the_pair_choice_only(tmp_path):
    """What a previous extract run's pairs carry across is derived from the declarations
    (``options.carried_across``: the inputs and the options declared ``selects``, here ``method`` and ``top_k``):
    a previous run with another top-k or method or other inputs still carries; one with another value of an option
    that decides what a pair gives does not."""
    from verbatim_batch.core.options import carried_across
    from verbatim_batch.core.runs import build_manifest, write_manifest
    from verbatim_batch.stages.extract import same_extractor

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "q", "chunk": "c"}) + "\n")
    config = ExtractStage(ExtractJob(output=str(tmp_path / "o"), pairs=str(pairs), extractor=SemanticConfig())) \
        .plan().config
    assert {"method", "top_k", "pairs", "retrieval"} <= set(carried_across(ExtractJob))

    def carries(**changed) -> bool:
        run = tmp_path / f"prev-{len(list(tmp_path.iterdir()))}"
        write_manifest(str(run), build_manifest(run_id="p", command="extract", config=dict(config) | changed,
                                                inputs=[], tables={}, counts={}, timings_s={}))
        return same_extractor(str(run), dict(config))

    assert carries()
    assert carries(top_k=config.get("top_k", 5) + 3, method="dense", pairs="elsewhere.jsonl")
    assert not carries(max_chunk_chars=config["max_chunk_chars"] + 1)
    assert not carries(extractor_hash="another")


def test_a_group_that_fixes_the_backend_takes_that_backends_options_only():
    """querygen and silver ask an endpoint: they take the LLM options declared for the HTTP backend (``when``) and
    those of any backend, never the vLLM engine's nor the extraction prompt's (``omit``); the help says which
    backend an option is for, from the same declaration."""
    from verbatim_batch.core.options import options_of
    from verbatim_batch.extract.llm import LLMConfig
    from verbatim_batch.stages.querygen import QueryGenJob
    from verbatim_batch.stages.silver import SilverJob

    declared = {of.key: dict(of.option.when).get("backend") for of in options_of(LLMConfig)}
    assert {b for b in declared.values()} == {None, "http", "vllm"}
    for job in (QueryGenJob, SilverJob):
        taken = {of.key for of in options_of(job) if of.group == "llm"}
        assert taken == {k for k, b in declared.items() if b in (None, "http")} - {"backend", "style",
                                                                                  "docs_per_request"}, job
    for of in options_of(LLMConfig):
        if backend := dict(of.option.when).get("backend"):
            assert of.help_text().startswith(f"{backend}: "), of.key
