"""The vLLM backend: generation inside the cluster through ``ray.data.llm`` (the ``llm`` extra), then the
same answer interpretation as the HTTP backend (``llm.interpret``) and the same stage tables.

``vllm_requests`` groups pairs into requests (several documents per prompt) and turns pairs that fail
validation (``--max-chunk-chars``, empty query) into error rows before any GPU sees them; ``vllm_dataset``
runs the engines; ``LLMInterpret`` maps answers back to verbatim spans.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pyarrow as pa
import ray

from .stage import DEFAULT_MAX_CHUNK_CHARS, DEFAULT_MAX_QUERY_CHARS, PairExtractor, pack, validate_pair


class LLMInterpret:
    """vLLM backend, after generation: answers -> spans/pairs/rejects through the same stage code."""

    def __init__(self, config, run_id: str) -> None:
        self.config = config
        self.stage = PairExtractor(VllmModelInfo(config), run_id)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from .llm import interpret
        from .spans import PairResult

        outs = []
        for req in batch.to_pylist():
            rows = json.loads(req["pairs_json"])
            error = req.get("error")
            text = req.get("generated_text")
            if error or text is None:
                results = [PairResult([], None, f"llm_request_failed: {error or 'no output'}") for _ in rows]
            else:
                results = interpret(text, [r["chunk"] for r in rows], self.config, req["request_id"])
            outs.append(self.stage.tables(rows, dict(enumerate(results)), [None] * len(rows), req.get("latency_ms")))
        return pa.concat_tables([pack(o) for o in outs]) if outs else pa.table({})


class VllmModelInfo:
    """What the stage records about an in-cluster vLLM model (the engine itself lives in ray.data.llm)."""

    name = "llm"

    def __init__(self, config) -> None:
        self.config = config

    def describe(self) -> dict[str, Any]:
        return {"model_id": self.config.model, "model_revision": None, "config_hash": self.config.hash}


def vllm_requests(pairs: pa.Table, config, run_id: str,
                  max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS) -> tuple[pa.Table, pa.Table | None]:
    """Request rows for the vLLM stage, and the tables of pairs that never reach it (invalid input)."""
    from .llm import group_requests, request_id

    rows = pairs.to_pylist()
    errors = [validate_pair(r, max_chunk_chars, DEFAULT_MAX_QUERY_CHARS) for r in rows]
    valid = [r for r, e in zip(rows, errors, strict=True) if e is None]
    invalid = [(r, e) for r, e in zip(rows, errors, strict=True) if e is not None]
    requests = []
    for group in group_requests([r["query_id"] for r in valid], config.docs_per_request):
        members = [valid[i] for i in group]
        chunks = [m["chunk"] for m in members]
        requests.append({"request_id": request_id(members[0]["query"], chunks), "query": members[0]["query"],
                         "chunks": chunks, "pairs_json": json.dumps(members)})
    bad = None
    if invalid:
        stage = PairExtractor(VllmModelInfo(config), run_id, max_chunk_chars)
        bad = pack(stage.tables([r for r, _ in invalid], {}, [e for _, e in invalid], None))
    return pa.Table.from_pylist(requests), bad


NEEDS_LLM_EXTRA = "the vllm backend needs the llm extra (pip install 'verbatim-batch[llm]')"


def _local_ray() -> bool:
    """Whether this driver's Ray is a local one on loopback (``pipeline.ray_env.init_local``), so the engines
    would run on this machine. On a cluster only the GPU nodes need vLLM (cluster.yaml), not the driver's."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return len(nodes) == 1 and nodes[0].get("NodeManagerAddress") == "127.0.0.1"


def vllm_dataset(requests: pa.Table, config) -> ray.data.Dataset:
    """Generation with vLLM engines inside the cluster, through ``ray.data.llm`` (needs the ``llm`` extra)."""
    try:
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    except ImportError as exc:
        raise NotImplementedError(NEEDS_LLM_EXTRA) from exc
    if importlib.util.find_spec("vllm") is None and _local_ray():
        raise NotImplementedError(NEEDS_LLM_EXTRA)  # ray.data.llm imports without vLLM, then fails deep inside
    from .llm import sampling
    from .prompts import build_messages

    engine = vLLMEngineProcessorConfig(
        model_source=config.model, concurrency=config.engines, batch_size=config.batch_size,
        should_continue_on_error=True,  # a failed row carries its error instead of failing the job
        engine_kwargs={"tensor_parallel_size": config.tensor_parallel_size, "max_model_len": config.max_model_len,
                       "enable_prefix_caching": True, "gpu_memory_utilization": config.gpu_memory_utilization},
    )

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        params = sampling(config, len(row["chunks"]))
        schema = params.pop("response_format", None)
        if schema is not None:  # vLLM's structured output takes the JSON schema itself
            params["guided_decoding"] = {"json": schema["json_schema"]["schema"]}
        return {**row, "messages": build_messages(row["query"], list(row["chunks"]), config.style),
                "sampling_params": params}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"request_id": row["request_id"], "pairs_json": row["pairs_json"],
                "generated_text": row.get("generated_text"), "error": row.get("__inference_error__") or None,
                "latency_ms": None}

    processor = build_processor(engine, preprocess=preprocess, postprocess=postprocess)
    return processor(ray.data.from_arrow(requests))
