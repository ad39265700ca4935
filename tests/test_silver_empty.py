"""`silver` when the teacher gets nothing to do (issue 23): an LLM whose answers yield no query (a tiny random
model does that) leaves the teacher with no pairs; the job must still commit an empty, valid silver run.

The endpoint is a real HTTP server on 127.0.0.1 in a thread, answering every chat request with prose;
chunk, embed, index, retrieve and extract are the real stages on a two-paper corpus."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verbatim_batch.core.runs import read_manifest, read_table
from verbatim_batch.extract.llm import LLMConfig
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
from verbatim_batch.stages.embed import EmbedJob, run_embed
from verbatim_batch.stages.index import IndexJob, run_index
from verbatim_batch.stages.silver import SilverJob, run_silver

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow  # about a minute: chunk, embed, index and the four silver steps on two papers
CORPUS = Path(__file__).resolve().parents[1] / "verbatim_batch" / "examples" / "corpus"


@pytest.fixture()
def prose_server():
    """An OpenAI-compatible endpoint whose every answer is prose: no question types, so no queries."""
    body = json.dumps({"choices": [{"message": {"role": "assistant",
                                                 "content": "I would rather not say."}}]}).encode()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    server.server_close()


def test_silver_with_a_teacher_that_gets_no_pairs_commits_an_empty_run(ray_local, prose_server, tmp_path):
    base_url, seen = prose_server
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in sorted(os.listdir(CORPUS))[:2]:
        if name.endswith(".md"):
            shutil.copy(CORPUS / name, corpus / name)
    chunks, _ = run_chunk(ChunkJob(input=str(corpus), output=str(tmp_path / "chunks"), format="md"))
    emb, _ = run_embed(EmbedJob(chunks=chunks, output=str(tmp_path / "emb")))
    index, _ = run_index(IndexJob(embeddings=emb, chunks=chunks, output=str(tmp_path / "index")))
    llm = LLMConfig(model="tiny", base_url=base_url, max_tokens=32, max_in_flight=2, timeout_s=60, request_retries=0)
    data, manifest = run_silver(SilverJob(chunks=chunks, index=index, output=str(tmp_path / "silver"), llm=llm,
                                          n_papers=2, seed=0))
    assert seen, "the LLM was never asked"
    counts = manifest["counts"]
    assert counts["queries"] == 0 and counts["rows"] == 0 and counts["kept"] == counts["train"] == counts["dev"] == 0
    assert read_manifest(str(tmp_path / "silver" / "teacher"))["counts"]["pairs"] == 0
    assert read_table(str(tmp_path / "silver" / "querygen"), "queries").num_rows > 0  # every one failed
    for split in ("train", "dev"):  # the empty splits are real, readable tables
        table = pq.read_table(str(Path(data) / "data" / f"{split}.parquet"))
        assert table.num_rows == 0 and {"question", "chunk", "spans", "label"} <= set(table.column_names)
