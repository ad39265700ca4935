"""LLM extraction end to end through the real wire protocol.

A real OpenAI-compatible server (`transformers serve`) runs a tiny random-weight chat model
on localhost; the http backend talks to it from Ray actors. The model's answers are
noise, which is the point: whatever it says, only verbatim spans may come out.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import urllib.request
from pathlib import Path

import pytest
from llmserver import OpenAIServer, make_tiny_chat_model, require_server

from verbatim_batch.core.runs import read_manifest, read_table
from verbatim_batch.core.tables import PAIRS, REJECTS, SPANS
from verbatim_batch.corpus.chunker import chunk_markdown
from verbatim_batch.extract.llm import LLMConfig, LLMExtractor, OpenAIClient
from verbatim_batch.stages.extract import ExtractJob, run_extract

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow
CORPUS = Path(__file__).resolve().parents[1] / "verbatim_batch" / "examples" / "corpus"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_server()
    work = tmp_path_factory.mktemp("llm")
    model = make_tiny_chat_model(work / "model")
    with OpenAIServer(model, work) as srv:
        yield srv


def _chunks(n: int) -> list[str]:
    texts = []
    for path in sorted(CORPUS.glob("*.md"))[:3]:
        texts += [c.text for c in chunk_markdown(path.read_text(encoding="utf-8"))[1:4]]
    return texts[:n]


def _config(server, **kw) -> LLMConfig:
    return LLMConfig(model=server.model, base_url=server.base_url, max_tokens=48, docs_per_request=3,
                     max_in_flight=2, timeout_s=120, **kw)


def test_http_backend_through_ray_writes_only_verbatim_spans(server, ray_local, tmp_path):
    chunks = _chunks(6)
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"query": q, "chunk": c, "paper_id": f"P{i}", "chunk_index": i}
            for q in ("what is trained", "which dataset") for i, c in enumerate(chunks)]
    rows.append({"query": "", "chunk": chunks[0]})  # a bad pair next to good ones
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out, manifest = run_extract(ExtractJob(output=str(tmp_path / "x"), extractor=_config(server), pairs=str(pairs),
                                           batch_rows=6))
    spans, pair_rows, rejects = (read_table(out, t) for t in ("spans", "pairs", "rejects"))
    assert spans.schema.equals(SPANS) and pair_rows.schema.equals(PAIRS) and rejects.schema.equals(REJECTS)
    assert pair_rows.num_rows == len(rows)
    by_pair = {r["pair_id"]: r for r in pair_rows.to_pylist()}
    text_of = {(r["query"], r["paper_id"], r["chunk_index"]): r["chunk"] for r in rows if r["query"]}
    for s in spans.to_pylist():
        assert text_of[(s["query"], s["paper_id"], s["chunk_index"])][s["start"]:s["end"]] == s["text"]
        assert s["align"] in ("exact", "normalized", "fuzzy") and s["extractor"] == "llm"
    errors = [r["error"] for r in by_pair.values() if r["error"]]
    assert errors == ["empty_query"]  # every request reached the server and came back
    # the model's noise went somewhere visible: a reject row per unusable answer or string
    assert rejects.num_rows >= 1 and all(r["raw_output"] is not None for r in rejects.to_pylist())
    assert {r["pair_id"] for r in rejects.to_pylist()} <= set(by_pair)
    counts = manifest["counts"]
    assert counts["rejects"] == rejects.num_rows and counts["verbatim_violations"] == 0
    assert json.loads(read_manifest(out)["config"])["extractor"] == "llm"


class _FlakyProxy(http.server.BaseHTTPRequestHandler):
    """Fault injection in front of the real server: the first ``fail`` POSTs get 503, the rest are forwarded."""

    upstream = ""
    fail = 0
    seen = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            type(self).seen += 1
            failing = type(self).seen <= type(self).fail
        if failing:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        req = urllib.request.Request(self.upstream + self.path.removeprefix("/v1"), data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            payload = resp.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture()
def flaky(server):
    handler = type("Proxy", (_FlakyProxy,), {"upstream": server.base_url, "fail": 2, "seen": 0})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_transient_errors_are_retried_then_succeed(server, flaky):
    handler, url = flaky
    client = OpenAIClient(LLMConfig(model=server.model, base_url=url, max_tokens=8, backoff_s=0.01))
    text = client.chat([{"role": "user", "content": "hello"}])
    assert isinstance(text, str) and handler.seen == 3
    assert client.stats["retries"] == 2 and client.stats["failures"] == 0


def test_a_dead_endpoint_gives_error_rows_not_a_crash(server):
    cfg = LLMConfig(model=server.model, base_url="http://127.0.0.1:9/v1", request_retries=1, backoff_s=0.01,
                    timeout_s=5)
    results = LLMExtractor(cfg).extract(["q", "q"], ["A chunk of text.", "Another chunk."])
    assert all(r.error and r.error.startswith("llm_request_failed: connection") for r in results)
    assert all(r.spans == [] for r in results)
