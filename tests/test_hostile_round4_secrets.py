"""Hostile input, round 4 (issue 34, item 5): secrets are never recorded.

A credential in a URL (a query string's ``?api-key=...``, user info, a fragment, a presigned URL's signature) or
a header is redacted wherever a run records it: manifests (config and inputs), reports, log lines and the one
line of an error. The end-to-end test puts a canary secret in ``extract --base-url`` (an endpoint that refuses
connections: the run commits error rows at once) and looks for it in every file the run wrote, in its stdout
and stderr and in the Ray session's logs. The others need no Ray.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import pytest

from verbatim_batch.core.redact import REDACTED, redact, redact_text, redact_url

CANARY = "CANARY-r4-5f1c0de9"


@pytest.mark.parametrize("url, kept", [
    (f"http://127.0.0.1:8000/v1?api-key={CANARY}", "http://127.0.0.1:8000/v1?api-key="),
    (f"https://user:{CANARY}@llm.example.org/v1", "llm.example.org/v1"),
    (f"https://{CANARY}@github.com/x/y.git", "github.com/x/y.git"),
    (f"https://bucket.s3.amazonaws.com/k.parquet?X-Amz-Credential=AK%2F{CANARY}&X-Amz-Signature={CANARY}",
     "bucket.s3.amazonaws.com/k.parquet?X-Amz-Credential="),
    (f"https://app.example.org/cb#access_token={CANARY}&state=1", "app.example.org/cb#access_token="),
    (f"https://h.example.org/v1?{CANARY}{CANARY}", "h.example.org/v1?"),
])
def test_credentials_in_urls_are_redacted(url, kept):
    assert CANARY not in redact_url(url) and kept in redact_url(url) and REDACTED in redact_url(url)
    assert CANARY not in redact_text(f"could not reach {url}, giving up")


def test_settings_in_urls_and_plain_text_are_kept():
    for text in ("s3://bucket/runs/x?region=eu-west-1&scheme=http", "/data/papers", "max_tokens=2048",
                 "Basic statistics of 5,000 papers", "gs://b/k#1", "design=large"):
        assert redact_text(text) == text
    said = redact_text(f"Authorization: Bearer {CANARY} and x-api-key: {CANARY} and password={CANARY})")
    assert CANARY not in said and said.endswith(")")


def test_manifests_and_reports_never_record_a_credential(tmp_path):
    from verbatim_batch.core.runs import build_manifest, read_manifest, write_manifest
    from verbatim_batch.report.build import write_report

    url = f"http://user:{CANARY}@127.0.0.1:9/v1?api-key={CANARY}"
    config = {"extractor_config": {"base_url": url, "model": "m", "headers": {"Authorization": f"Bearer {CANARY}"}},
              "stages": [{"pairs": f"https://h.example.org/p.jsonl?sig={CANARY}"}], url: 1}
    manifest = build_manifest(run_id="r1", command="extract", config=config, inputs=[url], tables={}, counts={},
                              timings_s={})
    manifest["extra"] = {"endpoint": url}  # what a stage adds to its manifest
    run = tmp_path / "run"
    run.mkdir()
    write_manifest(str(run), manifest, on_commit=lambda d, m: write_report(d, m))
    written = "".join(p.read_text(encoding="utf-8") for p in run.iterdir())
    assert CANARY not in written and "127.0.0.1:9/v1" in written and REDACTED in written
    assert json.loads(read_manifest(str(run))["config"])["extractor_config"]["model"] == "m"
    assert CANARY not in json.dumps(redact(manifest))


def test_log_lines_of_the_package_are_redacted(caplog):
    import verbatim_batch  # noqa: F401 - installs the redaction

    with caplog.at_level(logging.INFO):
        logging.getLogger("verbatim_batch.engine.sink").warning("%s: unreadable", f"s3://b/x?sig={CANARY}")
        logging.getLogger("verbatim_batch.extract.llm").info(f"endpoint http://h/v1?key={CANARY}")
    assert CANARY not in caplog.text and "s3://b/x?sig=" in caplog.text


def test_an_error_line_never_echoes_a_credential(tmp_path, capsys):
    from verbatim_batch.cli import main

    rc = main(["chunk", "--input", f"{tmp_path}/missing?token={CANARY}", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and CANARY not in err and len(err.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_logs() -> Path | None:
    import ray

    try:
        return Path(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001
    except AttributeError:
        return None


def test_a_secret_in_base_url_is_found_nowhere_the_run_writes(ray_local, tmp_path, capsys):
    from verbatim_batch.cli import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"q{i}", "chunk": f"Chunk {i} says something."}) + "\n"
                             for i in range(3)))
    out = tmp_path / "out"
    started = time.time()
    rc = main(["extract", "--pairs", str(pairs), "--extractor", "llm", "--model", "tiny",
               "--base-url", f"http://127.0.0.1:{_free_port()}/v1?api-key={CANARY}&mode=x", "--request-retries", "0",
               "--timeout", "5", "--output", str(out), "--num-cpus", "2"])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr[-2000:]
    assert CANARY not in stdout and CANARY not in stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in files) and any(p.name == "report.html" for p in files)
    for p in files:
        assert CANARY.encode() not in p.read_bytes(), p
    runtime = json.loads((out / "manifest.json").read_text())["runtime"]  # the endpoint: a runtime option
    assert "127.0.0.1" in json.dumps(runtime) and "api-key=REDACTED" in json.dumps(runtime)
    logs = _ray_logs()
    if logs is not None and logs.is_dir():  # what the workers logged during this run
        for p in logs.rglob("*"):
            if p.is_file() and p.stat().st_mtime >= started - 1 and p.stat().st_size < 64 << 20:
                assert CANARY.encode() not in p.read_bytes(), p
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert leftovers == [] and not os.path.exists(str(out) + ".lock")
