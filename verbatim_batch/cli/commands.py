"""The commands: each turns parsed options into a job, runs it, and prints where its outputs are."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.engine.stage import Command
from verbatim_batch.report.summary import print_run

EXAMPLES = resources.files("verbatim_batch") / "examples"


def values_of(args: argparse.Namespace) -> dict[str, Any]:
    """The option values of the parsed command line (or ``build_job``'s), by key; a chain's stage options as
    ``{"stages": {stage: {option: value}}}`` (given ones only)."""
    from verbatim_batch.cli.options import COMMANDS, command_flags, stage_sections

    values = {key: getattr(args, key, None) for key in command_flags(args.command)}
    if COMMANDS[args.command].chain:
        values = {k: v for k, v in values.items() if "." not in k} | {"stages": stage_sections(values)}
    return values


def job_of(args: argparse.Namespace, **override: Any) -> Any:
    """The job (or options object) the parsed options describe: built from the command's option fields, the
    defaults declared there for everything unset, local paths made absolute."""
    from verbatim_batch.cli.options import COMMANDS, flag_of
    from verbatim_batch.core.options import build

    spec = COMMANDS[args.command]
    if spec.chain and getattr(args, "embed.model", None) is None:  # the bundled embedder needs no hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return build(spec.job, values_of(args) | override, lambda of: flag_of(args.command, of.key))


def cmd_evaluate(args: argparse.Namespace) -> int:
    from verbatim_batch.extract.registry import build_extractor
    from verbatim_batch.quality.evaluate import evaluate_files, evaluate_predictions, format_sweep, gold_key, load_gold
    from verbatim_batch.quality.metrics import format_table

    kind = args.extractor or "semantic"
    if args.sweep_threshold is not None and kind not in ("highlighter", "semantic"):
        raise ValueError("--sweep-threshold works with the highlighter and semantic extractors")
    thresholds = args.sweep_threshold
    opts = job_of(args, threshold=thresholds[0]) if thresholds else job_of(args)
    report_dir = opts.report
    detail: list[dict[str, Any]] | None = [] if report_dir else None
    if thresholds is None:
        if not opts.predictions:
            raise ValueError("give --predictions, or --sweep-threshold to run an extractor on the gold pairs")
        result = evaluate_files(opts.gold, opts.predictions, detail, chunks=opts.chunks)
        print(json.dumps(result, indent=2) if opts.json else format_table(result))
        if report_dir:
            _evaluation_report(report_dir, result, detail, None, f"evaluation of {opts.predictions}", opts.json)
        return 0
    gold = load_gold(opts.gold, opts.chunks)
    ext = build_extractor(opts.extractor)
    runs = ext.sweep([g["query"] for g in gold], [g["chunk"] for g in gold], thresholds)
    results, details = {}, {}
    for t, pair_results in runs.items():
        preds = {gold_key(g): [(s.start, s.end) for s in r.spans] for g, r in zip(gold, pair_results, strict=True)}
        details[str(t)] = [] if report_dir else None
        results[str(t)] = evaluate_predictions(gold, preds, details[str(t)])
    if opts.json:
        print(json.dumps({"extractor": ext.describe(), "thresholds": results}, indent=2))
    else:
        print(format_sweep(results, kind))
    if report_dir:
        best = max(results, key=lambda t: results[t]["word"]["micro_f1"])
        _evaluation_report(report_dir, results[best], details[best], results,
                           f"{kind} threshold sweep", opts.json)
    return 0


def _evaluation_report(folder: str, result: dict, rows: list | None, sweep: dict | None, title: str,
                       quiet: bool) -> None:
    from verbatim_batch.report.build import write_evaluation_report

    path = write_evaluation_report(storage.normalize(folder), result, rows or [], sweep, title)
    print(f"report: {path}", file=sys.stderr if quiet else sys.stdout)  # --json keeps stdout pure JSON


def demo_chain(n_papers: int | None = None, scratch: str | None = None):
    """The demo's chain: the bundled example corpus and labelled queries, offline defaults. With ``n_papers``,
    the first N papers (by name) that have labelled queries, and those queries, copied into ``scratch`` (a paper
    no query is about would leave a run with nothing to retrieve)."""
    from verbatim_batch.stages.chains import Chain

    corpus_dir, queries = str(EXAMPLES / "corpus"), str(EXAMPLES / "queries.jsonl")
    if n_papers is not None and scratch is not None:
        asked = {json.loads(line).get("paper_id") for line in
                 (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()}
        names = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md") if p.stem in asked)[:n_papers]
        ids = {n.removesuffix(".md") for n in names}
        corpus_dir = os.path.join(scratch, "corpus")
        os.makedirs(corpus_dir)
        for name in names:
            shutil.copyfile(EXAMPLES / "corpus" / name, os.path.join(corpus_dir, name))
        for name in ("corpus/metadata.jsonl", "queries.jsonl"):  # both keyed by paper_id
            lines = (EXAMPLES / name).read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if line.strip() and json.loads(line).get("paper_id") in ids]
            with open(os.path.join(scratch, name), "w", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in kept))
        queries = os.path.join(scratch, "queries.jsonl")
    return Chain(input=corpus_dir, queries=queries, format="md", metadata=os.path.join(corpus_dir, "metadata.jsonl"))


def cmd_demo(args: argparse.Namespace) -> int:
    """chunk -> embed -> index -> retrieve -> extract on the bundled corpus and queries, offline on CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = storage.normalize(args.output)
    with tempfile.TemporaryDirectory(prefix="verbatim-demo-") as scratch:
        return _demo(args, out, demo_chain(args.n_papers, scratch))


def _demo(args: argparse.Namespace, out: str, chain) -> int:
    from verbatim_batch.core.records import read_rows
    from verbatim_batch.core.runs import read_manifest, read_table
    from verbatim_batch.retrieval.retriever import recall_at
    from verbatim_batch.stages.chains import run_chain

    def show(stage: str) -> None:
        path = os.path.join(out, stage)
        print(f"\n== {stage} ==")
        print_run(path, read_manifest(path))

    run_chain(chain, out, overwrite=True, address=args.address, num_cpus=args.num_cpus, after_stage=show)
    labels, _ = read_rows(chain.queries, columns=["query_id", "chunk_id"])
    recall = recall_at(read_table(os.path.join(out, "retrieval"), "retrieval"),
                       {r["query_id"]: r["chunk_id"] for r in labels.to_pylist()}, k=5)
    print(f"\nrecall@5 on the {labels.num_rows} bundled labelled queries: "
          + ", ".join(f"{m} {v:.2f}" for m, v in recall.items()))
    _show_spans(os.path.join(out, "spans"))
    print(f"\nA readable report with the spans highlighted: {os.path.join(out, 'spans', 'report.html')}")
    print(f"\nOutputs under {out}. Load the span table with:")
    print(f"  {sys.executable} -c \"import pyarrow.parquet as pq; "
          f"print(pq.read_table('{out}/spans/spans').to_pandas().head())\"")
    return 0


def _show_spans(run_dir: str, n: int = 3) -> None:
    """A few extracted spans, best first, so a new user sees what the run produced."""
    from verbatim_batch.core.runs import read_table

    spans = read_table(run_dir, "spans", ["query", "paper_id", "text", "score"]).to_pylist()
    spans.sort(key=lambda r: -(r["score"] or 0))
    print(f"\n{len(spans)} verbatim spans; the top {min(n, len(spans))}, each under the query it answers:")
    for r in spans[:n]:
        text = " ".join(r["text"].split())
        print(f"  query: {r['query']}\n    span (score {r['score'] or 0:.2f}, paper {r['paper_id']}): "
              f"\"{text[:160]}{'...' if len(text) > 160 else ''}\"")


def cmd_report(args: argparse.Namespace) -> int:
    from verbatim_batch.core.runs import committed_folder
    from verbatim_batch.report.build import REPORT_HTML, REPORT_JSON, write_report

    args.run_dir = committed_folder(args.run_dir, "report")  # a nightly root: its current night
    result = write_report(args.run_dir, n_samples=args.samples)
    print(f"{result['command']} run {result['run_id']}:")
    print(f"  {os.path.join(args.run_dir, REPORT_JSON)}\n  {os.path.join(args.run_dir, REPORT_HTML)}")
    return 0


# ``verify`` starts a local Ray (no --address, no RAY_ADDRESS) only for a chunk run of more papers row groups than
# this: a row group (about 32 MB in memory) costs about 0.4 CPU-s to check, a local Ray's start 8 to 12 CPU-s.
VERIFY_LOCAL_RAY_UNITS = 32


def cmd_verify(args: argparse.Namespace) -> int:
    from verbatim_batch.core.runs import run_of
    from verbatim_batch.quality.verify import paper_units, verify_run

    args.run_dir = run_of(args.run_dir)  # a nightly root: its current run
    units = paper_units(args.run_dir)  # 0 for an extract run: its checks run in this process
    address = args.address or os.environ.get("RAY_ADDRESS")
    if units > 1 and args.num_cpus != 1 and (address or args.num_cpus or (
            units > VERIFY_LOCAL_RAY_UNITS and (os.cpu_count() or 1) > 1)):
        from verbatim_batch.core.tasks import install_runner
        from verbatim_batch.engine.ray_env import init_ray
        from verbatim_batch.engine.sink import in_tasks

        init_ray(args.address, args.num_cpus)
        install_runner(in_tasks)  # the checks then run as Ray tasks (verify.check_papers)
    result = verify_run(args.run_dir)
    print(json.dumps(result, indent=2))
    return 1 if result["errors"] else 0


def cmd_evaluate_retrieval(args: argparse.Namespace) -> int:
    from verbatim_batch.quality.retrieval_eval import evaluate_retrieval, format_results

    opts = job_of(args)
    result = evaluate_retrieval(opts.retrieval, opts.qrels, level=opts.level, chunks=opts.chunks,
                                queries=opts.queries, recall_at=list(opts.recall_at))
    print(json.dumps(result, indent=2) if opts.json else format_results(result))
    return 0


def _stage_handler(command: Command) -> Callable[[argparse.Namespace], int]:
    """A registered stage's (or chain's) handler: its job from the parsed options, its run, its summary."""
    def handle(args: argparse.Namespace) -> int:
        job = job_of(args, **{name: getattr(args, name) for name, _ in command.positional})
        result = command.run(job)
        if command.summary is not None:
            command.summary(job, result)
        else:
            print_run(*result)
        return 0

    return handle


# the CLI's own commands (``options.CLI_COMMANDS``); every other command is a registered stage's or a chain's
OWN_HANDLERS = {"evaluate": cmd_evaluate, "evaluate-retrieval": cmd_evaluate_retrieval, "demo": cmd_demo,
                "report": cmd_report, "verify": cmd_verify}


def handler(name: str) -> Callable[[argparse.Namespace], int]:
    """The handler of command ``name``."""
    from verbatim_batch.cli.options import COMMANDS

    return OWN_HANDLERS.get(name) or _stage_handler(COMMANDS[name])


def build_job(command: str, config: str | None = None, **options: Any):
    """The job a command would run, from Python: option values by their key (the YAML key; a chain's stage
    options as ``extract={"threshold": 0.3}``), over a YAML ``config`` file's, over the declared defaults. Pass
    it to the stage's ``run_*``.

        job = build_job("extract", config="conf.yaml", retrieval="runs/retrieval", output="runs/spans")
        path, manifest = verbatim_batch.stages.extract.run_extract(job)
    """
    from verbatim_batch.cli import config as configs
    from verbatim_batch.cli.options import COMMANDS, command_flags, convert
    from verbatim_batch.core.options import OptionError

    jobs = [c for c in COMMANDS if c not in ("demo", "report", "verify")]
    spec = COMMANDS.get(command)
    if command not in jobs:
        raise ValueError(f"no job for {command!r} (one of {', '.join(jobs)})")
    flags = command_flags(command)
    given = dict(options)
    for stage, section in list(given.items()):
        if spec.chain and isinstance(section, dict):  # extract={"threshold": 0.3}
            del given[stage]
            given |= {f"{stage}.{k}": v for k, v in section.items()}
    unknown = set(given) - set(flags)
    if unknown:
        raise ValueError(f"{command} takes no option {sorted(unknown)}; it takes: "
                         f"{', '.join(sorted(k for k in flags if '.' not in k))}")
    values = {key: flag.default for key, flag in flags.items()}
    values |= configs.load_config(config, command) if config else {}
    for key, value in given.items():
        try:
            values[key] = convert(flags[key], value)
        except OptionError as exc:
            raise ValueError(f"{command}: {key} {exc}") from None
    missing = [flags[k].flags[-1] for k in flags if flags[k].required and values.get(k) is None]
    if missing:
        raise ValueError(f"{command} needs {', '.join(missing)}")
    return job_of(argparse.Namespace(command=command, **values))
