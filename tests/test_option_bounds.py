"""Sizes beyond reason are refused at parse time (issue 54, item 6): every count option, and every size, declares
its ceiling where it is declared (``core.limits``), so a flag, a YAML key and a Python argument past it are
refused alike in one line; ``retrieve --k 4294967296`` once failed inside a Ray task allocating 96 GiB. A ``--k``
above the chunks there are stays allowed, and costs no more than all of them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verbatim_batch.cli import main
from verbatim_batch.cli.options import COMMANDS, command_flags
from verbatim_batch.core import limits
from verbatim_batch.core.options import OptionError, _base

CORPUS = Path(__file__).parent.parent / "verbatim_batch" / "examples" / "corpus"
SIZES = {"target_file_mb", "max_paper_mb", "kv_cache_gb", "engine_cpus", "engine_gpus", "cpus_per_worker"}


def _bounded_flags() -> list[tuple[str, str, object]]:
    """``(command, flag, option)`` of every count or size option of every command (a chain's stage options by
    their stage flag)."""
    out = []
    for command in COMMANDS:
        for flag in command_flags(command).values():
            kind = _base(flag.of.type)[0]
            if (kind is int or (kind is float and flag.of.key in SIZES)) and flag.of.option.parse is None:
                out.append((command, flag.flags[-1], flag.of))
    return out


BOUNDED = _bounded_flags()


def test_every_count_and_size_option_declares_its_ceiling():
    missing = sorted({(command, of.key) for command, _, of in BOUNDED if of.option.high is None})
    assert not missing, f"count or size options with no ceiling (declare high=limits.X): {missing}"
    ceilings = {v for k, v in vars(limits).items() if k.isupper()}
    others = sorted({(of.key, of.option.high) for _, _, of in BOUNDED
                     if of.option.high is not None and of.option.high not in ceilings})
    assert others in ([], [("max_windows", 256)]), others  # a ceiling is one of core.limits' (or tighter)


@pytest.mark.parametrize("command, flag, of", [b for b in BOUNDED if b[2].option.high is not None],
                         ids=[f"{c}{f}" for c, f, of in BOUNDED if of.option.high is not None])
def test_a_value_past_the_ceiling_is_refused_at_parse_time_in_one_line(command, flag, of, capsys):
    """``COMMAND --flag CEILING+1``: exit 2, one line naming the flag and its ceiling; nothing started."""
    too_big = int(of.option.high) + 1 if _base(of.type)[0] is int else of.option.high * 2
    with pytest.raises(SystemExit) as stop:
        main([command, flag, str(too_big)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert f"{flag}: must be" in err and f"<= {int(of.option.high)}, got" in err, err


def test_k_4294967296_is_refused_by_flag_yaml_and_python_alike(tmp_path, capsys):
    from verbatim_batch.retrieval.retriever import RetrieverConfig

    with pytest.raises(SystemExit) as stop:
        main(["retrieve", "--index", "i", "--queries", "q", "--output", "o", "--k", "4294967296"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == ("verbatim-batch retrieve: error: argument --k: must be >= 1 and <= "
                                            "1000000, got 4294967296 (see verbatim-batch retrieve --help)\n"), err
    config = tmp_path / "c.yaml"
    config.write_text("k: 4294967296\n")
    with pytest.raises(SystemExit) as stop:
        main(["retrieve", "--index", "i", "--queries", "q", "--output", "o", "--config", str(config)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "<= 1000000, got 4294967296" in err, err
    with pytest.raises(OptionError, match="k must be >= 1 and <= 1000000, got 4294967296"):
        RetrieverConfig(k=2**32)


def test_recall_cutoffs_are_bounded_too(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate-retrieval", "--retrieval", "r", "--qrels", "q", "--recall-at", f"5,{limits.PER_QUERY + 1}"])
    assert "expected positive integers up to 1000000" in capsys.readouterr().err


@pytest.fixture(scope="module")
def index_run(ray_local, tmp_path_factory) -> dict:
    """One bundled paper chunked, embedded and indexed (the session's Ray), with two queries."""
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk
    from verbatim_batch.stages.embed import EmbedJob, run_embed
    from verbatim_batch.stages.index import IndexJob, run_index

    root = tmp_path_factory.mktemp("bounds")
    (root / "papers").mkdir()
    name = sorted(p.name for p in CORPUS.glob("*.md"))[0]
    shutil.copyfile(CORPUS / name, root / "papers" / name)
    chunks, manifest = run_chunk(ChunkJob(input=str(root / "papers"), output=str(root / "chunks")))
    emb, _ = run_embed(EmbedJob(chunks=chunks, output=str(root / "emb")))
    index, _ = run_index(IndexJob(embeddings=emb, chunks=chunks, output=str(root / "index")))
    queries = root / "queries.jsonl"
    queries.write_text('{"query_id": "a", "query": "what is measured"}\n{"query_id": "b", "query": "results"}\n')
    return {"root": root, "index": index, "queries": str(queries), "chunks": manifest["tables"]["chunks"]["rows"]}


@pytest.mark.parametrize("k", [100_000, limits.PER_QUERY])
def test_k_above_the_chunks_there_are_returns_them_all(index_run, k, capsys):
    out = index_run["root"] / f"retrieval-{k}"
    code = main(["retrieve", "--index", index_run["index"], "--queries", index_run["queries"], "--output", str(out),
                 "--k", str(k), "--methods", "dense,bm25,hybrid"])
    assert code == 0, capsys.readouterr().err[-3000:]
    table = pq.read_table(out / "retrieval").to_pylist()
    n = index_run["chunks"]
    for query in ("a", "b"):
        dense = [r for r in table if r["query_id"] == query and r["method"] == "dense"]
        assert sorted(r["rank"] for r in dense) == list(range(1, n + 1))  # every chunk, once
        hybrid = [r for r in table if r["query_id"] == query and r["method"] == "hybrid"]
        assert len(hybrid) == n
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert (json.loads(config) if isinstance(config, str) else config)["retriever"]["k"] == k
