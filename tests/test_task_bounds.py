"""Plain tasks are bounded too, not only actor pools (issue 44, item 1).

Ray Data retries a task forever (``max_retries=-1``): a chunk read task that the kernel's OOM killer ends at each
attempt looped with no progress and no line (before this, the command below was still at ``0/24 rows`` when
killed after 150 s). Every read, tokenize, post-processing and write task of a stage now carries the job's
``--worker-restarts`` as ``max_retries``, and so does every actor and task of the ``ray.data.llm`` processor
behind ``--backend vllm`` (whose configs take no bound of their own).

Real parts: a real local Ray, the real chunk command with its read task killed by SIGKILL at every attempt
(``VERBATIM_BATCH_FAULT=chunk.read``), the Ray Data plans the embed stage and the vLLM processor build. vLLM
itself is not needed to build its processor (it is imported when an engine starts), so the processor's bounds
are checked on its plan, not by killing a live engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from verbatim_batch.engine.worker_faults import EXIT_CODE

CORPUS = Path(__file__).parent.parent / "verbatim_batch" / "examples" / "corpus"


def _chunk(papers: Path, out: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    return subprocess.run([sys.executable, "-m", "verbatim_batch.cli", "chunk", "--input", str(papers), "--output",
                           str(out), "--num-cpus", "2", *extra],
                          env=env | ({"VERBATIM_BATCH_FAULT": fault} if fault else {}), capture_output=True,
                          text=True, timeout=1800)  # never reached unless the bound is lost: then it hangs


def test_a_read_task_killed_at_every_attempt_stops_the_stage_with_one_line(tmp_path: Path) -> None:
    papers = tmp_path / "papers"
    papers.mkdir()
    for name in sorted(p.name for p in CORPUS.glob("*.md"))[:3]:
        (papers / name).write_bytes((CORPUS / name).read_bytes())
    out = tmp_path / "chunks"
    done = _chunk(papers, out, "--worker-restarts", "1", "--run-id", "night-1", fault="chunk.read")
    assert done.returncode == EXIT_CODE, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("verbatim-batch chunk: error: stage chunk stopped: "), done.stderr[-3000:]
    assert "--worker-restarts 1" in last and "--run-id" in last
    assert not (out / "manifest.json").exists()
    again = _chunk(papers, out, "--run-id", "night-1")  # the cause gone, the same run id resumes and commits
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "manifest.json").exists()


def _operators(ds: Any) -> Iterator[Any]:
    stack = [ds._logical_plan.dag]
    while stack:
        op = stack.pop()
        yield op
        stack.extend(op.input_dependencies)


def _bounds(ds: Any) -> list[tuple[str, dict[str, Any]]]:
    """(operator name, its Ray arguments) of every operator that starts tasks or actors (all but the input)."""
    return [(type(op).__name__, dict(op.ray_remote_args or {})) for op in _operators(ds)
            if hasattr(op, "ray_remote_args")]


def _assert_bounded(ops: list[tuple[str, dict[str, Any]]], restarts: int) -> None:
    assert ops, "no operator found: the plan walk is broken"
    for name, args in ops:
        if "max_restarts" in args:  # an actor pool
            assert args["max_restarts"] == args["max_task_retries"] == restarts, (name, args)
        else:
            assert args.get("max_retries") == restarts, (name, args)


def test_the_embed_stage_plan_bounds_its_tasks_and_actors(ray_local: Any) -> None:
    import ray

    from verbatim_batch.engine.resources import Resources
    from verbatim_batch.retrieval.embedder import EmbedderConfig
    from verbatim_batch.stages.embed import embed_dataset

    chunks = ray.data.from_arrow(pa.table({"chunk_id": ["a"], "text": ["x"]}))
    ops = _bounds(embed_dataset(chunks, EmbedderConfig(), Resources(gpus=1, restarts=2)))
    assert sorted("max_restarts" in args for _, args in ops) == [False, True]  # tokenize tasks, model actors
    _assert_bounded(ops, 2)


def test_the_vllm_processor_bounds_every_actor_and_task(ray_local: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.data.llm")
    import warnings

    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from verbatim_batch.engine.vllm import bound_processor

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the build looks the model's config up; none is here
    config = vLLMEngineProcessorConfig(model_source="tiny-model-not-loaded", concurrency=1, batch_size=4,
                                       chat_template_stage={"num_cpus": 0.5}, tokenize_stage={"num_cpus": 0.5},
                                       detokenize_stage=False)
    unbounded = build_processor(config, preprocess=lambda row: row, postprocess=lambda row: row)
    rows = ray.data.from_items([{"messages": []}])
    assert any("max_restarts" not in args and "max_retries" not in args for _, args in _bounds(unbounded(rows))), \
        "ray.data.llm now bounds its stages itself: bound_processor may be needless"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        processor = bound_processor(build_processor(config, preprocess=lambda row: row, postprocess=lambda row: row),
                                    2)
        ops = _bounds(processor(rows))
    assert not [w for w in caught if "ray_remote_args" in str(w.message)]  # Ray's deprecation, off for these
    assert sum("max_restarts" in args for _, args in ops) == len(processor.stages)  # the engine and its helpers
    _assert_bounded(ops, 2)
