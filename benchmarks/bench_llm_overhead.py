"""Per-row cost of our LLM pre- and post-processing against generation time, over the real wire protocol.

Starts `transformers serve` with the tiny local chat model of the test suite, then for
each request of 5 example chunks measures, in the same process and run:

- build: prompt construction (``build_messages`` + sampling parameters);
- generate: the HTTP round trip (the server's generation);
- interpret: parsing the answer and aligning every string (``interpret``), on the server's
  answer and on a realistic well-formed answer (5 spans per document copied from it,
  one in ten altered), since the tiny model's answers are mostly unparseable.

    .venv/bin/python benchmarks/bench_llm_overhead.py --requests 20 --json benchmarks/results-llm-overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from llmserver import OpenAIServer, make_tiny_chat_model  # noqa: E402

from verbatim_batch.corpus.chunker import chunk_markdown  # noqa: E402
from verbatim_batch.extract.llm import LLMConfig, OpenAIClient, interpret, sampling  # noqa: E402
from verbatim_batch.extract.prompts import build_messages  # noqa: E402
from verbatim_batch.extract.sentences import sentence_segments  # noqa: E402


def _chunks() -> list[str]:
    out = []
    for path in sorted((ROOT / "verbatim_batch/examples/corpus").glob("*.md")):
        out += [c.text for c in chunk_markdown(path.read_text(encoding="utf-8")) if len(c.text) > 800]
    return out


def _good_answer(docs: list[str], rng: random.Random) -> str:
    answer = {}
    for i, doc in enumerate(docs):
        units = [doc[s:e] for s, e in sentence_segments(doc)]
        picked = rng.sample(units, min(5, len(units)))
        answer[f"doc_{i}"] = [u.upper() if rng.random() < 0.1 else u for u in picked]
    return json.dumps(answer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    rng = random.Random(0)
    chunks = _chunks()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_chat_model(Path(tmp) / "model")
        with OpenAIServer(model, Path(tmp)) as server:
            cfg = LLMConfig(model=server.model, base_url=server.base_url, max_tokens=args.max_tokens)
            client = OpenAIClient(cfg)
            rows = []
            for _ in range(args.requests):
                docs = rng.sample(chunks, 5)
                t0 = time.perf_counter()
                messages = build_messages("which training setup is used", docs, cfg.style)
                sampling(cfg, len(docs))
                t1 = time.perf_counter()
                raw = client.chat(messages, len(docs))
                t2 = time.perf_counter()
                interpret(raw, docs, cfg, "r")
                t3 = time.perf_counter()
                good = _good_answer(docs, rng)
                t4 = time.perf_counter()
                res = interpret(good, docs, cfg, "r")
                t5 = time.perf_counter()
                rows.append({"build_ms": 1e3 * (t1 - t0), "generate_ms": 1e3 * (t2 - t1),
                             "interpret_server_ms": 1e3 * (t3 - t2), "interpret_good_ms": 1e3 * (t5 - t4),
                             "good_spans": sum(len(r.spans) for r in res)})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    per_pair = {k: v / 5 for k, v in med.items() if k.endswith("_ms")}
    result = {
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "date": time.strftime("%Y-%m-%d"), "requests": args.requests, "docs_per_request": 5,
        "max_tokens": args.max_tokens, "median_per_request": med, "median_per_pair": per_pair,
        "overhead_share_of_generation": (med["build_ms"] + med["interpret_good_ms"]) / med["generate_ms"],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
