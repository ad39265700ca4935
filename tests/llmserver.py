"""A real OpenAI-compatible HTTP server on localhost, serving a tiny local model, for end-to-end tests.

The server is `transformers serve` (the Hugging Face transformers CLI, v5 layout: ``transformers/cli/serve.py``),
started as a subprocess in its own process group. Nothing here fakes the wire protocol: requests go over HTTP
to FastAPI/uvicorn, which tokenizes with the model's chat template and runs ``model.generate``.

Everything works offline: the model is built here from a config with random weights, and the tokenizer is a
small BPE trained on a few built-in sentences, so no hub access is ever needed.

Typical use::

    from llmserver import OpenAIServer, make_tiny_chat_model, require_server  # tests/ is on sys.path

    def test_backend(tmp_path):
        require_server()                      # pytest.skip(...) when the serving packages are missing
        model_dir = make_tiny_chat_model(tmp_path / "model")
        with OpenAIServer(model_dir, tmp_path) as server:
            body = server.chat([{"role": "user", "content": "hi"}], temperature=0, max_tokens=16)
            assert isinstance(body["choices"][0]["message"]["content"], str)

What the server honours (transformers 5.23, non-continuous-batching path):

* ``POST /v1/chat/completions`` (JSON, or SSE with ``"stream": true``), ``POST /v1/completions``,
  ``POST /v1/responses``, ``GET /health``. ``GET /v1/models`` lists the hub *cache*, not the served model,
  so readiness is checked on ``/health`` instead.
* The request's ``model`` must be exactly the string the server was started with (``OpenAIServer.model``)
  or be left out; anything else is answered with HTTP 400. Responses report ``"<model>@main"``.
* Honoured: ``messages``, ``max_tokens`` / ``max_completion_tokens`` (without either the server generates up
  to 1024 tokens), ``temperature`` (0 means greedy; otherwise it samples, because the tiny model's generation
  config has ``do_sample=True``), ``top_p``, ``seed`` (reseeds torch globally, so it also affects later
  unseeded requests), ``stop`` (unlike OpenAI, the content keeps the stop string, up to the end of the token
  that completed it), ``logit_bias``, ``frequency_penalty`` (mapped to a repetition penalty), ``stream`` (SSE).
* Accepted but ignored (a warning in the server log, HTTP 200): ``response_format``, ``n``, ``logprobs``,
  ``presence_penalty``, ``tool_choice``, ``user`` and a few others. Output is never schema-constrained.
* Fields outside the OpenAI schema are rejected with HTTP 422.
* Generation for one model runs on a single inference thread: concurrent requests are accepted but served one
  after another, so client timeouts must allow for queueing.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from collections.abc import Sequence
from typing import Any

# ---------------------------------------------------------------------------------------------------------------
# Availability
# ---------------------------------------------------------------------------------------------------------------

_SERVER_MODULES = ("transformers", "torch", "tokenizers", "fastapi", "uvicorn", "openai", "pydantic", "accelerate")


def server_unavailable_reason() -> str | None:
    """Why `transformers serve` cannot run here, or None when it can."""
    missing = [name for name in _SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        return f"OpenAI-compatible test server needs {', '.join(missing)} (pip install -e '.[dev]' installs them)"
    if importlib.util.find_spec("transformers.cli.serve") is None:
        import transformers

        return f"transformers {transformers.__version__} has no `transformers serve` CLI in the v5 layout"
    return None


def require_server() -> None:
    """Skip the calling test when the server's packages are not importable."""
    reason = server_unavailable_reason()
    if reason is not None:
        import pytest

        pytest.skip(reason)


# ---------------------------------------------------------------------------------------------------------------
# Tiny chat model
# ---------------------------------------------------------------------------------------------------------------

# Special tokens are added first, so their ids are fixed whatever the corpus is.
UNK_TOKEN, PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (UNK_TOKEN, PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
UNK_TOKEN_ID, PAD_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID = range(4)

# A ChatML-like template: every message framed by <|im_start|>role ... <|im_end|>; generation ends at <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A few sentences in the register of the project, just enough for BPE to learn some word pieces.
_TOKENIZER_CORPUS = (
    "Retrieval finds candidate passages; extraction keeps only spans copied verbatim from the paper.",
    "The evidence must appear word for word in the source text, otherwise it is dropped.",
    "Our method improves accuracy by 3.5 points over the baseline on the held-out test set.",
    "Table 2 reports precision, recall and F1 for every threshold in the sweep.",
    "We train on 10,000 abstracts and evaluate on 1,200 full papers (see Section 4).",
    'The answer is returned as JSON: {"quote": "...", "start": 12, "end": 48, "score": 0.91}.',
    "Question: does the model generalise? Answer: yes, with a small drop in recall.",
    "A batch job reads Parquet shards, embeds chunks, builds an index and writes span tables.",
)

# Characters the tokenizer always knows (everything else becomes <unk>): printable ASCII, newline, tab and the
# metaspace marker that stands for a blank.
_ALPHABET = [chr(c) for c in range(0x21, 0x7F)] + ["\n", "\t", "\u2581"]


def _train_tokenizer(corpus: Sequence[str], vocab_size: int):
    """A BPE over a fixed alphabet, blanks encoded SentencePiece-style so decoding restores spaces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=UNK_TOKEN, fuse_unk=True))
    bpe.normalizer = normalizers.NFKC()
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=_ALPHABET,
        show_progress=False,
    )
    bpe.train_from_iterator(list(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    if ids != [UNK_TOKEN_ID, PAD_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID]:
        raise RuntimeError(f"unexpected special token ids {ids}")
    return tokenizer


def _tiny_llama(
    vocab_size: int,
    *,
    seed: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    kv_heads: int,
    rope_theta: float | None = None,
):
    """A randomly initialised Llama-style causal LM (4 attention heads) with a sampling generation config."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    # Untied embeddings, since tied ones at this scale make greedy decoding repeat the last input token
    # forever. Rotary positions have no table, so a large context length costs nothing.
    extra = {} if rope_theta is None else {"rope_theta": rope_theta}
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        **extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # Sampling by default, as released chat models ship it: the server only ever switches sampling *off*
    # (for temperature 0), so with do_sample=False here a request's temperature would have no effect.
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    )
    return model


def make_tiny_chat_model(path: Path, *, seed: int = 0, vocab_size: int = 600) -> Path:
    """Write a tiny Llama-style causal LM with random weights and a chat-capable tokenizer to `path`.

    Deterministic: the same `seed` gives byte-identical files. Weights are safetensors, about 0.2 MB. Greedy
    output is readable but meaningless word pieces; `<|im_end|>` (id `EOS_TOKEN_ID`) is the end-of-turn token
    that stops generation. The caller's torch RNG state is left untouched.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(list(_TOKENIZER_CORPUS) * 3, vocab_size)
    tokenizer.save_pretrained(path)

    model = _tiny_llama(len(tokenizer), seed=seed, hidden_size=64, intermediate_size=128, num_layers=2, kv_heads=2)
    model.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------------------------------------------
# HTTP (standard library only)
# ---------------------------------------------------------------------------------------------------------------


def http_json(method: str, url: str, body: Any = None, *, timeout: float = 120.0) -> tuple[int, Any]:
    """Send one request; return (status, parsed JSON or raw text). HTTP error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


# ---------------------------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------------------------

_LIVE: set[OpenAIServer] = set()
_LIVE_LOCK = threading.Lock()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _parent_death_hook():
    """A pre-exec hook asking Linux to SIGTERM the child when the thread that started it dies, or None.

    libc is resolved here, in the parent: the hook runs between fork and exec, where importing is unsafe.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return hook


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message carries the tail of its log."""


class OpenAIServer:
    """`transformers serve` on 127.0.0.1 with a free port, as a context manager.

    On enter: starts the server in its own process group (logging to ``work_dir/<log_name>``) and waits until
    ``/health`` answers 200, which happens only after the model is loaded. On exit, or if startup fails, the
    whole process group gets SIGTERM and, after `stop_timeout` seconds, SIGKILL. A process left running when
    the interpreter exits is killed by an atexit hook. On Linux, with `die_with_parent` (the default), the
    server also gets SIGTERM if the test process is killed outright; the kernel ties this to the *thread* that
    started the server, so pass ``die_with_parent=False`` when starting it from a short-lived thread.

    Attributes once started: ``base_url`` ("http://127.0.0.1:PORT/v1"), ``url`` (without /v1), ``port``,
    ``model`` (the value for the request's "model" field), ``log_path``, ``startup_seconds``, ``command``.
    """

    def __init__(
        self,
        model_dir: Path | str,
        work_dir: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 300.0,
        stop_timeout: float = 10.0,
        torch_threads: int = 1,
        extra_args: tuple[str, ...] | list[str] = (),
        env: dict[str, str] | None = None,
        log_name: str = "openai-server.log",
        die_with_parent: bool = True,
    ):
        self.model_dir = Path(model_dir).resolve()
        # The server splits model ids on "@" (revision) and on ":<file>.gguf"; keep the path free of both.
        if "@" in str(self.model_dir) or ".gguf" in str(self.model_dir):
            raise ValueError(f"model path must not contain '@' or '.gguf': {self.model_dir}")
        self.model = str(self.model_dir)
        self.work_dir = Path(work_dir)
        self.host = host
        self._fixed_port = port
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.torch_threads = torch_threads
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.log_path = self.work_dir / log_name
        self.die_with_parent = die_with_parent
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self.command: list[str] = []
        self.startup_seconds: float | None = None

    # -- addresses -------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> OpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> OpenAIServer:
        if self.process is not None:
            raise RuntimeError("server already started")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        # A port picked by _free_port can be taken before the server binds it; retry with a fresh one.
        attempts = 1 if self._fixed_port is not None else 3
        for attempt in range(attempts):
            self._spawn(self._fixed_port or _free_port(self.host))
            try:
                self._wait_healthy(started)
            except ServerStartError as err:
                self.stop()
                if attempt + 1 < attempts and "address already in use" in str(err).lower():
                    continue
                raise
            except BaseException:  # KeyboardInterrupt, pytest timeouts: __exit__ will not run, so clean up here
                self.stop()
                raise
            break
        self.startup_seconds = time.monotonic() - started
        return self

    def _environment(self) -> dict[str, str]:
        hf_home = self.work_dir / "hf-home"
        # `GET /v1/models` scans the hub cache and fails with HTTP 500 when the directory does not exist.
        (hf_home / "hub").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "HF_HOME": str(hf_home),  # never read or write the user's cache
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # the CLI otherwise asks PyPI for a newer release
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": str(self.torch_threads),
                "MKL_NUM_THREADS": str(self.torch_threads),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def _spawn(self, port: int) -> None:
        self.port = port
        self.command = [
            sys.executable,
            "-m",
            "transformers.cli.transformers",
            "serve",
            self.model,  # preloaded before the HTTP socket opens, and the only model requests may name
            "--host",
            self.host,
            "--port",
            str(port),
            "--device",
            "cpu",
            "--log-level",
            "info",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment(),
                cwd=self.work_dir,
                start_new_session=True,
                preexec_fn=_parent_death_hook() if self.die_with_parent else None,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _wait_healthy(self, started: float) -> None:
        assert self.process is not None
        deadline = started + self.startup_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(
                    f"`transformers serve` exited with code {code} before becoming ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                status, _ = http_json("GET", f"{self.url}/health", timeout=2.0)
                if status == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"`transformers serve` not healthy after {self.startup_timeout:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def stop(self) -> None:
        """Terminate the server's process group: SIGTERM, then SIGKILL after `stop_timeout`. Idempotent."""
        process = self.process
        if process is None:
            return
        try:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
            # Also kill anything the server left in its group, even if the server itself has exited.
            _signal_group(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=self.stop_timeout)
        finally:
            self.process = None
            with _LIVE_LOCK:
                _LIVE.discard(self)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    # -- requests --------------------------------------------------------------------------------------------

    def chat_raw(self, messages: list[dict], *, timeout: float = 120.0, **params: Any) -> tuple[int, Any]:
        """POST /v1/chat/completions (non-streaming); return (status, body) without raising on HTTP errors."""
        body = {"model": self.model, "messages": messages, "stream": False, **params}
        return http_json("POST", f"{self.base_url}/chat/completions", body, timeout=timeout)

    def chat(self, messages: list[dict], *, timeout: float = 120.0, **params: Any) -> dict:
        """POST /v1/chat/completions (non-streaming); return the JSON body, raising with the log tail on errors."""
        status, body = self.chat_raw(messages, timeout=timeout, **params)
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"chat completion failed: HTTP {status}: {body}\nserver log:\n{self.log_tail()}")
        return body


def _signal_group(pgid: int, sig: int) -> None:
    # start_new_session=True made the server its group leader, so its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


# ---------------------------------------------------------------------------------------------------------------
# Scripted chat model: briefly trained so that a marker string in the prompt selects a fixed answer
# ---------------------------------------------------------------------------------------------------------------

# Words for the filler sentences that surround a marker in the training prompts (scientific-prose register).
_FILLER_WORDS = tuple(
    """
    we our the a an this that these those it its results result model models method methods data dataset
    datasets training test evaluation baseline baselines accuracy precision recall score scores table figure
    section appendix experiment experiments shows show report reports improve improves improved compare
    compared against over under with without for from into on in of to and or but not also only each every
    both more less than most best large small new strong simple standard previous prior work approach tasks
    task language text texts document documents sentence sentences word words token tokens passage passages
    query queries question questions answer answers retrieval search index evidence span spans paper papers
    annotated annotation labels label human automatic error errors analysis ablation setting settings
    parameters layer layers encoder decoder attention embedding embeddings learning learned trained train
    use used using based via per across between within when where which while because however therefore
    first second third finally further higher lower average mean total number size rate time type types
    reader benchmark corpus split splits gain gains loss objective fine-tuned pretrained transformer graph
    """.split()
)

# Characters outside the tokenizer's alphabet (they become <unk>), as real papers contain them.
_UNKNOWN_CHARS = "éüñ–—’“”ρλ×≤∑"

# The one piece of text the filler may never contain: it would teach the model to answer without the marker.
_GLUE_BEFORE = ("", " ", "\n", "\n\n", ": ", "(", '"')
_GLUE_AFTER = ("", " ", "\n", "\n\n", ".", "?", ",", ":", '"', ")")


class _PromptMaker:
    """Random chat prompts of a given size, each with at most one marker somewhere in its messages."""

    def __init__(self, rng, markers: Sequence[str], filler: Sequence[str], vocab_size: int, tokenizer):
        self.rng = rng
        self.markers = list(markers)
        self.filler = [text for text in filler if text.strip()]
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        # Pieces of the markers (runs of their words) appear as filler, so the model has to match the whole
        # marker rather than one of its words.
        self.fragments = []
        for marker in self.markers:
            words = marker.split()
            self.fragments += [
                " ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1) if j - i < len(words)
            ]

    def word(self) -> str:
        return self.rng.choice(_FILLER_WORDS)

    def sentence(self) -> str:
        rng = self.rng
        words = [self.word() for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words) + 1), str(rng.choice([rng.randint(1, 99), round(rng.random() * 100, 1)])))
        if rng.random() < 0.15 and self.fragments:
            words.insert(rng.randrange(len(words) + 1), rng.choice(self.fragments))
        if rng.random() < 0.1:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_UNKNOWN_CHARS) + self.word())
        if rng.random() < 0.2:
            words[rng.randrange(len(words))] += ","
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice("....?:")

    def piece(self) -> str:
        rng = self.rng
        kind = rng.random()
        if kind < 0.35 or (kind < 0.6 and not self.filler):
            return " ".join(self.sentence() for _ in range(rng.randint(1, 4)))
        if kind < 0.6:
            text = rng.choice(self.filler)
            start = rng.randrange(len(text))
            return text[start : start + rng.randint(20, 600)]
        if kind < 0.7:
            ids = [rng.randrange(len(SPECIAL_TOKENS), self.vocab_size) for _ in range(rng.randint(3, 40))]
            return self.tokenizer.decode(ids)
        if kind < 0.8:
            first = rng.randint(1, 15)
            return "\n".join(
                f"{first + i}. {self.word().capitalize()}: {self.sentence()}" for i in range(rng.randint(1, 5))
            )
        if kind < 0.9:
            keys = [f"{self.word()}_{rng.randint(0, 9)}" if rng.random() < 0.5 else self.word() for _ in range(3)]
            body = ", ".join(f'"{k}": [{", ".join(repr(self.word()) for _ in range(rng.randint(0, 2)))}]' for k in keys)
            return "{" + body.replace("'", '"') + "}"
        tag = self.word()
        return f"<{tag}>\n{self.sentence()}\n</{tag}>"

    def text(self, n_chars: int) -> str:
        parts: list[str] = []
        size = 0
        while size < n_chars:
            part = self.piece()
            parts.append(part)
            size += len(part) + 1
        out = parts[0]
        for part in parts[1:]:
            out += self.rng.choice((" ", "\n", "\n\n")) + part
        return out[: max(n_chars, 1)].strip() or self.word()

    def messages(self, marker: str | None, n_chars: int) -> list[dict[str, str]]:
        """Messages of about `n_chars` characters in all; `marker` (if any) is put in one of them."""
        rng = self.rng
        while True:
            has_system = rng.random() < 0.6
            share = rng.uniform(0.1, 0.7) if has_system else 0.0
            contents = [self.text(int(n_chars * share)) if has_system else None, self.text(int(n_chars * (1 - share)))]
            if marker is not None:
                slot = 0 if has_system and rng.random() < 0.4 else 1
                text = contents[slot]
                where = rng.random()
                if where < 0.25:
                    cut = 0
                elif where < 0.5:
                    cut = len(text)
                else:
                    cut = rng.randrange(len(text) + 1)
                    while 0 < cut < len(text) and not text[cut - 1].isspace():  # start at a word
                        cut -= 1
                before, after = text[:cut], text[cut:]
                glue_before = rng.choice(_GLUE_BEFORE) if before else ""
                glue_after = rng.choice(_GLUE_AFTER) if after else ""
                if before and not glue_before and not before[-1].isspace():
                    glue_before = " "
                if after and not glue_after:
                    glue_after = " "
                contents[slot] = before + glue_before + marker + glue_after + after
            messages = [
                {"role": role, "content": content}
                for role, content in zip(("system", "user"), contents, strict=True)
                if content is not None
            ]
            # Filler must never hold a marker by chance (nor a second one).
            found = sum(m in msg["content"] for m in self.markers for msg in messages)
            if found == (marker is not None):
                return messages


def make_scripted_chat_model(
    path: Path,
    script: Sequence[tuple[str, str]],
    *,
    seed: int = 0,
    steps: int = 600,
    default: str | None = None,
    filler: Sequence[str] = (),
    vocab_size: int = 1024,
    max_prompt_chars: int = 4000,
    threads: int = 1,
    verify: bool = True,
    cache_dir: Path | None = None,
    log=None,
) -> Path:
    """PLACEHOLDER"""
    import random

    import torch

    script = [(str(marker), str(response)) for marker, response in script]
    if not script:
        raise ValueError("script needs at least one (marker, response) pair")
    markers = [marker for marker, _ in script]
    if len(set(markers)) != len(markers) or not all(markers):
        raise ValueError("markers must be distinct, non-empty strings")
    for a in markers:
        for b in markers:
            if a != b and a in b:
                raise ValueError(f"marker {a!r} is part of marker {b!r}")
    path = Path(path)
    log = log or (lambda message: None)

    # Tokenizer: the stock corpus plus the script (many times, so markers and answers become few, whole-word
    # tokens), the filler words and some of the caller's filler text.
    rng = random.Random(f"scripted-{seed}")
    answers = [response for _, response in script] + ([default] if default is not None else [])
    corpus = list(_TOKENIZER_CORPUS) * 3
    corpus += [f"{marker} {response}" for marker, response in script] * 40
    corpus += [default] * 40 if default is not None else []
    corpus += [" ".join(_FILLER_WORDS)] * 5
    corpus += list(filler)
    tokenizer = _train_tokenizer(corpus, vocab_size)

    targets = []
    for answer in answers:
        ids = tokenizer.encode(answer, add_special_tokens=False)
        if tokenizer.decode(ids, skip_special_tokens=True) != answer or UNK_TOKEN_ID in ids:
            raise ValueError(f"response {answer!r} does not survive tokenization (non-ASCII text is <unk>)")
        targets.append(ids + [EOS_TOKEN_ID])
    cases = list(zip(markers + ([None] if default is not None else []), targets, strict=True))

    def encode(messages):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _tiny_llama(
                len(tokenizer), seed=seed, hidden_size=128, intermediate_size=256, num_layers=2, kv_heads=4,
                rope_theta=1e6,
            )
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
            maker = _PromptMaker(rng, markers, filler, len(tokenizer), tokenizer)
            held_out = _PromptMaker(random.Random(f"scripted-check-{seed}"), markers, filler, len(tokenizer), tokenizer)
            checks = [
                (encode(held_out.messages(marker, n_chars)), target)
                for marker, target in cases
                for n_chars in (40, 200, 800, max_prompt_chars // 2, max_prompt_chars)
            ]
            token_budget = 3000
            started = time.monotonic()
            for step in range(1, steps + 1):
                n_chars = int(math.exp(rng.uniform(math.log(20), math.log(max_prompt_chars))))
                batch = []
                tokens = 0
                while not batch or tokens < token_budget:
                    marker, target = rng.choice(cases)
                    prompt = encode(maker.messages(marker, int(n_chars * rng.uniform(0.7, 1.3))))
                    batch.append((prompt, target))
                    tokens += len(prompt) + len(target)
                width = max(len(p) + len(t) for p, t in batch)
                input_ids = torch.full((len(batch), width), PAD_TOKEN_ID)
                rows, cols, labels = [], [], []
                for row, (prompt, target) in enumerate(batch):
                    seq = prompt + target
                    input_ids[row, : len(seq)] = torch.tensor(seq)
                    for k, token in enumerate(target):
                        rows.append(row)
                        cols.append(len(prompt) + k - 1)
                        labels.append(token)
                lr = 3e-3 * min(1.0, step / 30)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                hidden = model.model(input_ids=input_ids).last_hidden_state
                logits = model.lm_head(hidden[rows, cols])
                loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if step % 10 == 0:
                    log(f"step {step} loss {loss.item():.4f} n_chars {n_chars} batch {len(batch)}x{width} {time.monotonic()-started:.1f}s")
                if step % 50 == 0:
                    worst = _worst_margin(model, checks)
                    log(f"step {step}: worst margin {worst:.2f}")
            model.eval()
    finally:
        torch.set_num_threads(saved_threads)
    return model, tokenizer, checks


def _worst_margin(model, checks) -> float:
    import torch

    was_training = model.training
    model.eval()
    worst = math.inf
    with torch.no_grad():
        for prompt, target in checks:
            ids = torch.tensor([prompt + target[:-1]])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 :]
            right = logits.gather(1, torch.tensor(target)[:, None])[:, 0]
            masked = logits.clone()
            masked[torch.arange(len(target)), torch.tensor(target)] = -math.inf
            worst = min(worst, (right - masked.max(dim=1).values).min().item())
    model.train(was_training)
    return worst
