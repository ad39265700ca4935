"""The LLM HTTP client against hostile endpoints (issue 22): real HTTP servers on 127.0.0.1 in threads play
each behaviour; the real client (``OpenAIClient`` / ``LLMExtractor``) runs against them. No Ray.

Every test is bounded by the client's own timeout (1-2 s) and the servers give up on their own."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from verbatim_batch.extract.gate import PairExtractor
from verbatim_batch.extract.llm import HttpError, LLMConfig, LLMExtractor, OpenAIClient
from verbatim_batch.extract.pairs import pairs_from_records

KEY = "sk-test-SECRET-1234"
DOC_A = "The learning rate is 2e-5, chosen on the dev set."
DOC_B = "Our model reaches 29.1 BLEU on WMT14."
MARGIN = 3.0  # seconds of slack over the client's timeout on a loaded machine


def answer(obj) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": json.dumps(obj)}}]}).encode()


GOOD = answer({"doc_0": ["The learning rate is 2e-5"]})


class Server:
    """A threaded HTTP server whose handler calls ``behave(handler, request)``; every request is recorded."""

    def __init__(self, behave: Callable, tls: ssl.SSLContext | None = None) -> None:
        self.behave = behave
        self.requests: list[dict] = []
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                request = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body,
                           "stop": server.stop}
                server.requests.append(request)
                self.close_connection = True
                try:
                    server.behave(self, request)
                except OSError:  # the client hung up: what a hostile server may expect
                    pass

            do_GET = do_POST = _any

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls:  # the handshake happens in the handler's thread
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.origin = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.base_url = self.origin + "/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def serve(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", KEY)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    servers: list[Server] = []

    def start(behave: Callable, tls: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(behave, tls))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def config(server: Server, **kw) -> LLMConfig:
    base = {"model": "m", "base_url": server.base_url, "api_key_env": "TEST_LLM_KEY", "timeout_s": 2.0,
            "request_retries": 0, "backoff_s": 0.01, "docs_per_request": 1}
    return LLMConfig(**(base | kw))


def reply(h, body: bytes, status: int = 200, ctype: str = "application/json", headers: dict | None = None) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(body)


def redirect(h, status: int, location: str) -> None:
    h.send_response(status)
    h.send_header("Location", location)
    h.send_header("Content-Length", "0")
    h.end_headers()


def extract_one(cfg: LLMConfig, doc: str = DOC_A):
    return LLMExtractor(cfg).extract(["what learning rate"], [doc])[0]


# --- redirects ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [302, 307])
def test_cross_origin_redirect_never_carries_the_key(serve, status):
    other = serve(lambda h, r: reply(h, GOOD))
    first = serve(lambda h, r: redirect(h, status, other.origin + "/v1/chat/completions"))
    client = OpenAIClient(config(first))
    try:
        client.chat([{"role": "user", "content": "hi"}])
    except HttpError:
        pass  # a GET after a 302 may fail; the key must not have gone anywhere
    assert first.requests[0]["headers"].get("Authorization") == f"Bearer {KEY}"
    assert other.requests, "the redirect was followed"
    for req in other.requests:
        assert not any(k.lower() == "authorization" for k in req["headers"])
        assert KEY.encode() not in req["body"] and KEY not in json.dumps(req["headers"])
    if status == 307:  # method and body kept: the answer comes from the other server
        assert other.requests[0]["method"] == "POST" and other.requests[0]["body"]


def test_same_origin_redirect_keeps_the_key_and_the_body(serve):
    def behave(h, r):
        if r["path"].startswith("/v1/"):
            redirect(h, 308, "/v2/chat/completions")
        else:
            reply(h, GOOD)

    server = serve(behave)
    res = extract_one(config(server))
    assert res.error is None and [s.text for s in res.spans] == ["The learning rate is 2e-5"]
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions", "/v2/chat/completions"]
    assert all(r["headers"].get("Authorization") == f"Bearer {KEY}" for r in server.requests)
    assert server.requests[1]["body"] == server.requests[0]["body"]


@pytest.mark.parametrize("location,reason", [
    ("file:///etc/passwd", "redirect_refused"),
    ("ftp://127.0.0.1/x", "redirect_refused"),
    ("http://user:pw@127.0.0.1:1/x", "redirect_refused"),
    ("/v1/chat/completions", "too_many_redirects"),  # a loop
])
def test_bad_redirects_are_per_row_errors(serve, location, reason):
    server = serve(lambda h, r: redirect(h, 307, location))
    t0 = time.monotonic()
    res = extract_one(config(server, request_retries=2))
    assert res.error and res.error.startswith(f"llm_request_failed: {reason}")
    assert "pw" not in res.error and KEY not in res.error
    assert len(server.requests) <= 6 and time.monotonic() - t0 < 2 + MARGIN  # not retried


# --- time ---------------------------------------------------------------------------------------------------


def _trickle(where: str):
    def behave(h, r):
        stop = time.monotonic() + 15
        if where == "headers":
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            while time.monotonic() < stop and not r["stop"].is_set():
                h.wfile.write(b"X-Slow: 1\r\n")
                h.wfile.flush()
                time.sleep(0.1)
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if where == "chunked":
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", "100000")
        h.end_headers()
        while time.monotonic() < stop and not r["stop"].is_set():  # a byte (a chunk) every 0.1 s, never the end
            h.wfile.write(b"1\r\n \r\n" if where == "chunked" else b" ")
            h.wfile.flush()
            time.sleep(0.1)

    return behave


@pytest.mark.parametrize("where", ["body", "chunked", "headers"])
def test_timeout_bounds_the_whole_request_against_a_trickling_server(serve, where):
    server = serve(_trickle(where))
    t0 = time.monotonic()
    res = extract_one(config(server, timeout_s=1.0))
    elapsed = time.monotonic() - t0
    assert res.error and res.error.startswith("llm_request_failed: timeout"), res.error
    assert elapsed <= 1.0 + MARGIN, elapsed


def _tls_context(tmp_path, monkeypatch) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate for 127.0.0.1, which clients made from now on
    trust (``SSL_CERT_FILE``)."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def test_timeout_bounds_a_tls_request_too(serve, tmp_path, monkeypatch):
    tls = _tls_context(tmp_path, monkeypatch)
    good = serve(lambda h, r: reply(h, GOOD), tls=tls)
    assert extract_one(config(good)).error is None  # the certificate is trusted: TLS works
    slow = serve(_trickle("body"), tls=tls)
    t0 = time.monotonic()
    res = extract_one(config(slow, timeout_s=1.0))
    assert res.error.startswith("llm_request_failed: timeout"), res.error
    assert time.monotonic() - t0 <= 1.0 + MARGIN


def test_timeout_is_per_attempt_and_retries_stay_bounded(serve):
    server = serve(_trickle("body"))
    t0 = time.monotonic()
    res = extract_one(config(server, timeout_s=0.5, request_retries=1))
    assert res.error.startswith("llm_request_failed: timeout")
    assert len(server.requests) == 2 and time.monotonic() - t0 <= 1.0 + MARGIN


def test_a_content_length_lie_is_an_error_not_a_hang(serve):
    def short_then_close(h, r):
        h.send_response(200)
        h.send_header("Content-Length", "5000")
        h.end_headers()
        h.wfile.write(GOOD)  # fewer bytes than announced, then the connection closes

    server = serve(short_then_close)
    res = extract_one(config(server))
    assert res.error.startswith("llm_request_failed: connection: the body ended after"), res.error


# --- size ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("announced", [True, False])
def test_a_huge_answer_is_a_per_row_error(serve, announced):
    block = b" " * (1 << 16)

    def huge(h, r):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if announced:
            h.send_header("Content-Length", str(50 << 20))
        h.end_headers()
        for _ in range(50 << 4):  # 50 MB, unless the client hangs up first
            h.wfile.write(block)

    server = serve(huge)
    t0 = time.monotonic()
    res = extract_one(config(server, max_response_mb=1, timeout_s=5.0))
    assert res.error.startswith("llm_request_failed: response_too_large"), res.error
    assert len(server.requests) == 1 and time.monotonic() - t0 < 5.0


def test_a_huge_error_page_is_read_only_in_part(serve):
    page = b"<html><body>" + b"x" * (20 << 20) + b"</body></html>"
    server = serve(lambda h, r: reply(h, page, status=500, ctype="text/html"))
    res = extract_one(config(server))
    assert res.error.startswith("llm_request_failed: http_500: <html><body>xxx")
    assert len(res.error) < 400


# --- answers of the wrong kind -----------------------------------------------------------------------------


@pytest.mark.parametrize("body,ctype,reason", [
    (b"<html><h1>502 Bad Gateway</h1></html>", "text/html", "bad_response: not JSON (text/html)"),
    (b"", "application/json", "bad_response: empty body"),
    (b"[1, 2]", "application/json", "bad_response: no choices[0].message"),
    (b'{"choices": "x"}', "application/json", "bad_response: no choices[0].message"),
    (b'{"choices": [{"message": ["a"]}]}', "application/json", "bad_response: no choices[0].message"),
    (b'{"error": {"message": "quota exceeded"}}', "application/json", "bad_response: error"),
    (b"[" * 200_000 + b"]" * 200_000, "application/json", "bad_response: nested too deeply"),
    (b"\xff\xfe{}", "application/json", "bad_response: not JSON"),
])
def test_answers_of_the_wrong_kind_are_per_row_errors(serve, body, ctype, reason):
    server = serve(lambda h, r: reply(h, body, ctype=ctype))
    res = extract_one(config(server, request_retries=2))
    assert res.error.startswith("llm_request_failed: " + reason), res.error
    assert len(server.requests) == 1  # not retried: the same answer would come back


def test_a_status_line_of_garbage_is_a_connection_error(serve):
    def garbage(h, r):
        h.wfile.write(b"SPEAKING NONSENSE\r\n\r\n")

    server = serve(garbage)
    res = extract_one(config(server))
    assert res.error.startswith("llm_request_failed: connection"), res.error


def test_content_with_lone_surrogates_is_written_not_crashed_on(serve):
    raw = '{"choices": [{"message": {"content": "{\\"doc_0\\": [\\"The learning rate is 2e-5\\", \\"\\ud800\\"]}"}}]}'
    server = serve(lambda h, r: reply(h, raw.encode()))
    batch = pairs_from_records([{"query": "what learning rate", "chunk": DOC_A}])
    out = PairExtractor(LLMExtractor(config(server)), "run")(batch)
    assert out["pairs"].num_rows == 1 and out["pairs"]["error"].to_pylist() == [None]
    assert out["spans"]["text"].to_pylist() == ["The learning rate is 2e-5"]


def test_retries_and_the_structured_output_fallback_still_work(serve):
    def behave(h, r):
        if b"response_format" in r["body"]:
            reply(h, b'{"error": "no structured output here"}', status=400)
        elif len(server.requests) < 4:
            reply(h, b"busy", status=503, headers={"Retry-After": "0"})
        else:
            reply(h, GOOD)

    server = serve(behave)
    client = OpenAIClient(config(server, request_retries=2))
    assert json.loads(client.chat([{"role": "user", "content": "hi"}], n_docs=1)) == {
        "doc_0": ["The learning rate is 2e-5"]}
    assert client.stats == {"requests": 1, "retries": 2, "failures": 0, "structured_fallbacks": 1}


# --- nothing is sent twice ---------------------------------------------------------------------------------


def _by_doc(server: Server) -> Counter:
    return Counter("A" if DOC_A.encode() in r["body"] else "B" for r in server.requests if r["method"] == "POST")


@pytest.mark.parametrize("bad", [
    lambda h: reply(h, b'{"choices": [{"message": ["not an object"]}]}'),
    lambda h: reply(h, b"[" * 100_000),
    lambda h: reply(h, b"oops", status=500),
])
def test_a_failing_request_never_resends_its_batch_mates(serve, bad):
    def behave(h, r):
        if DOC_A.encode() in r["body"]:
            reply(h, GOOD)
        else:
            bad(h)

    server = serve(behave)
    batch = pairs_from_records([{"query": "what learning rate", "chunk": DOC_A},
                                {"query": "what learning rate", "chunk": DOC_B}])
    out = PairExtractor(LLMExtractor(config(server, request_retries=1)), "run")(batch)
    errors = out["pairs"]["error"].to_pylist()
    assert errors[0] is None and errors[1].startswith("llm_request_failed")
    counts = _by_doc(server)
    assert counts["A"] == 1, counts  # the good pair went once; only the failed one may have been retried
    assert counts["B"] <= 2


def test_a_batch_retried_after_a_later_failure_reuses_the_answers(serve):
    from verbatim_batch.engine.batches import with_retries

    server = serve(lambda h, r: reply(h, GOOD))
    stage = PairExtractor(LLMExtractor(config(server)), "run")
    batch = pairs_from_records([{"query": "what learning rate", "chunk": DOC_A},
                                {"query": "which BLEU", "chunk": DOC_B}])
    calls = []

    def flaky(b):
        out = stage(b)
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the write failed after the answers came")
        return out["pairs"]

    pairs = with_retries(flaky, batch, 1, "test")
    assert len(calls) == 2 and pairs.num_rows == 2
    assert _by_doc(server) == Counter({"A": 1, "B": 1})


# --- configuration ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url,words", [
    ("http://user:hunter2@127.0.0.1:8000/v1", "credentials"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("ftp://127.0.0.1/v1", "scheme 'ftp'"),
    ("http:///v1", "no host"),
    ("http://127.0.0.1:99999/v1", "invalid port"),
    ("http://127.0.0.1:8000/v1\r\nX-Evil: 1", "control characters"),
])
def test_bad_base_urls_are_one_line_config_errors(url, words, monkeypatch):
    with pytest.raises(ValueError, match=words) as info:
        LLMConfig(model="m", base_url=url)
    assert "hunter2" not in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv("OPENAI_BASE_URL", url)  # read where the config is made: the CLI's rc 2, not an actor's
    with pytest.raises(ValueError, match=f"OPENAI_BASE_URL: .*{words}") as info:
        LLMConfig(model="m")
    assert "hunter2" not in str(info.value)


def test_an_api_key_that_cannot_be_a_header_is_refused_without_echoing_it(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-abc\r\nX-Evil: 1")
    with pytest.raises(ValueError, match=r"\$TEST_LLM_KEY") as info:
        LLMConfig(model="m", base_url="http://127.0.0.1:1/v1", api_key_env="TEST_LLM_KEY")
    assert "sk-abc" not in str(info.value)
    monkeypatch.setenv("TEST_LLM_KEY", "  sk-abc\n")  # a key file's trailing newline is fine
    assert OpenAIClient(LLMConfig(model="m", base_url="http://127.0.0.1:1/v1",
                                  api_key_env="TEST_LLM_KEY")).api_key == "sk-abc"


def test_max_response_mb_is_a_runtime_setting():
    assert LLMConfig(model="m", max_response_mb=1).hash == LLMConfig(model="m").hash
    with pytest.raises(ValueError):
        LLMConfig(model="m", max_response_mb=0)


def test_querygen_rows_fail_alone_on_a_trickling_server(serve):
    import pyarrow as pa

    from verbatim_batch.silver.querygen import QueryGenerator

    server = serve(_trickle("body"))
    gen = QueryGenerator(OpenAIClient(config(server, timeout_s=0.5)).chat, "m")
    t0 = time.monotonic()
    rows = gen(pa.Table.from_pylist([{"paper_id": "p", "chunk_id": "c", "chunk_index": 0, "text": DOC_A}]))
    assert rows.num_rows == 1 and rows["error"].to_pylist()[0].startswith("types: timeout")
    assert time.monotonic() - t0 <= 0.5 + MARGIN
