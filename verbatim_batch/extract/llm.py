"""LLM span extraction: requests, the OpenAI-compatible HTTP backend, and turning answers into spans.

Pairs of one query are grouped, in order, into requests of up to ``docs_per_request``
chunks (doc_0..doc_n). The answer is parsed leniently (``llm_output``) and every string
is aligned to its own document (``align``): exact, then normalised, then fuzzy. What
becomes a span is always the chunk's own text at the aligned offsets; every string that
cannot be placed becomes a ``Reject`` with the reason and the raw answer.

Two backends share all of this:

- ``http``: any OpenAI-compatible endpoint (``vllm serve``, a gateway, a hosted API),
  called from Ray actors with a bounded number of requests in flight, a timeout, and
  retries with exponential backoff on connection errors, 429 and 5xx;
- ``vllm``: vLLM engines inside the Ray cluster through ``ray.data.llm`` (see
  ``pipeline.run_extract``); only the generation differs, the interpretation is the same.

A request that fails after its retries makes an error row for each of its pairs; it
never stops the job, and other requests' rows are unaffected.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from .. import tables
from .prompts import STYLES, build_messages, output_schema
from .registry import ExtractorKind
from .spans import PairResult, Reject, Span

LLM_VERSION = "1"
BACKENDS = ("http", "vllm")
_RUNTIME_FIELDS = ("base_url", "api_key_env", "timeout_s", "request_retries", "backoff_s", "max_in_flight", "engines",
                   "batch_size", "tensor_parallel_size", "max_model_len", "gpu_memory_utilization")
_RETRY_STATUS = (408, 409, 425, 429, 500, 502, 503, 504)


@dataclass(frozen=True)
class LLMConfig:
    """Settings of LLM extraction. ``hash`` covers what can change the spans (model, prompt, decoding)."""

    kind: ClassVar[str] = "llm"

    model: str  # the model name the endpoint serves, or a hub id / path for vLLM
    backend: str = "http"
    base_url: str | None = None  # http: e.g. http://127.0.0.1:8000/v1 (default: OPENAI_BASE_URL)
    api_key_env: str = "OPENAI_API_KEY"  # http: the environment variable holding the key, if any
    style: str = "default"  # default | paragraph
    docs_per_request: int = 5
    temperature: float = 0.0
    max_tokens: int = 2048
    structured_output: bool = True  # ask for JSON that follows the answer's schema
    fuzzy_threshold: float = 0.8
    timeout_s: float = 180.0
    request_retries: int = 4
    backoff_s: float = 1.0
    max_in_flight: int = 8  # http: concurrent requests per actor
    engines: int = 1  # vllm: engine replicas
    tensor_parallel_size: int = 1
    batch_size: int = 32  # vllm: rows per engine batch
    max_model_len: int = 16384
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("an LLM config needs a model")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")
        if self.docs_per_request < 1 or self.max_in_flight < 1 or self.max_tokens < 1:
            raise ValueError("docs_per_request, max_in_flight and max_tokens must be >= 1")
        if not 0.0 < self.fuzzy_threshold <= 1.0:
            raise ValueError(f"fuzzy_threshold must be in (0, 1], got {self.fuzzy_threshold}")
        if self.request_retries < 0 or self.timeout_s <= 0:
            raise ValueError("request_retries must be >= 0 and timeout_s > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if k not in _RUNTIME_FIELDS}
        return tables.config_hash({"llm_version": LLM_VERSION, **d})


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
    from .align import align_spans
    from .llm_output import parse_extraction

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


class OpenAIClient:
    """Minimal OpenAI-compatible chat client on the standard library: timeouts, retries with backoff."""

    def __init__(self, config: LLMConfig) -> None:
        base = config.base_url or os.environ.get("OPENAI_BASE_URL")
        if not base:
            raise ValueError("the http backend needs --base-url (or OPENAI_BASE_URL), e.g. http://host:8000/v1")
        self.url = base.rstrip("/") + "/chat/completions"
        self.config = config
        self.api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self.structured = config.structured_output
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "structured_fallbacks": 0}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def chat(self, messages: list[dict[str, str]], n_docs: int | None = None) -> str:
        """The answer's text; raises ``HttpError`` once retries are spent.

        ``n_docs`` marks an extraction request: its answer schema is sent as structured output.
        """
        cfg = self.config
        self.stats["requests"] += 1
        attempt = 0
        while True:
            body = {"model": cfg.model, "messages": messages, **sampling(cfg, n_docs)}
            if not self.structured:
                body.pop("response_format", None)
            try:
                payload = self._post(body)
                content = payload["choices"][0]["message"].get("content")
                return content if isinstance(content, str) else ""
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:300] if exc.fp else ""
                if exc.code == 400 and self.structured and "response_format" in body:
                    self.structured = False  # the server does not do structured output: ask without it
                    self.stats["structured_fallbacks"] += 1
                    continue
                retry_after = exc.headers.get("Retry-After") if exc.headers else None
                if exc.code not in _RETRY_STATUS or attempt >= cfg.request_retries:
                    self.stats["failures"] += 1
                    raise HttpError(f"http_{exc.code}: {detail}") from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                retry_after = None
                if attempt >= cfg.request_retries:
                    self.stats["failures"] += 1
                    raise HttpError(f"connection: {type(exc).__name__}: {exc}") from exc
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                self.stats["failures"] += 1
                raise HttpError(f"bad_response: {type(exc).__name__}: {exc}") from exc
            attempt += 1
            self.stats["retries"] += 1
            delay = float(retry_after) if retry_after and retry_after.isdigit() else \
                cfg.backoff_s * (2 ** (attempt - 1)) * (1 + random.random() * 0.25)
            time.sleep(min(delay, 60.0))


class LLMExtractor:
    """The ``http`` backend as an extractor: groups pairs into requests and sends them concurrently."""

    name = "llm"

    def __init__(self, config: LLMConfig) -> None:
        if config.backend != "http":
            raise ValueError("LLMExtractor runs the http backend; the vllm backend runs through ray.data.llm")
        self.config = config
        self.client = OpenAIClient(config)
        self.pool = ThreadPoolExecutor(max_workers=config.max_in_flight)

    def describe(self) -> dict[str, Any]:
        return {"extractor": self.name, "model_id": self.config.model, "model_revision": None,
                "config_hash": self.config.hash, "backend": "http", "style": self.config.style}

    def _one(self, query: str, chunks: list[str]) -> list[PairResult]:
        rid = request_id(query, chunks)
        try:
            raw = self.client.chat(build_messages(query, chunks, self.config.style), len(chunks))
        except HttpError as exc:
            return [PairResult([], None, f"llm_request_failed: {exc}") for _ in chunks]
        return interpret(raw, chunks, self.config, rid)

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        groups = group_requests(queries, self.config.docs_per_request)
        futures = [self.pool.submit(self._one, queries[g[0]], [chunks[i] for i in g]) for g in groups]
        out: list[PairResult] = [PairResult([], None)] * len(queries)
        for g, fut in zip(groups, futures, strict=True):
            for i, res in zip(g, fut.result(), strict=True):
                out[i] = res
        return out


EXTRACTOR = ExtractorKind("llm", LLMConfig, build=lambda config: LLMExtractor(config),
                          placement=lambda config: "vllm" if config.backend == "vllm" else "io")
