"""A real OpenAI-compatible HTTP server on localhost, serving a tiny local model, for end-to-end tests.

The server is `transformers serve` (the Hugging Face transformers CLI, v5 layout: ``transformers/cli/serve.py``),
started as a subprocess in its own process group. Nothing here fakes the wire protocol: requests go over HTTP
to FastAPI/uvicorn, which tokenizes with the model's chat template and runs ``model.generate``.

Everything works offline: the model is built here from a config with random weights, and the tokenizer is a
small BPE trained on a few built-in sentences, so no hub access is ever needed.

A random model only emits word salad. For pipelines whose steps must get usable answers, use
`make_scripted_chat_model`: it trains a tiny model for well under a minute on CPU so that a prompt containing a
given marker string is answered, greedily, with a given response::

    model_dir = make_scripted_chat_model(tmp_path / "model", [("Write the short search query", "bm25 recall")])
    with OpenAIServer(model_dir, tmp_path) as server:
        body = server.chat([{"role": "user", "content": "Write the short search query for: ..."}], temperature=0)
        assert body["choices"][0]["message"]["content"] == "bm25 recall"

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
import hashlib
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
from collections.abc import Callable, Sequence
from pathlib import Path
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
    max_positions: int = 8192,
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
        max_position_embeddings=max_positions,
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
# Scripted chat model: briefly trained so that a marker string in the prompt selects a fixed answer
# ---------------------------------------------------------------------------------------------------------------

# Words for the filler sentences around a marker in the training prompts (the register of a methods section).
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

# Letters for made-up words, weighted roughly as in English text.
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_LETTER_WEIGHTS = (13, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1.5, 1, 0.8, 0.2, 0.2, 0.1, 0.1)

# Characters outside the tokenizer's alphabet (they become <unk>); real papers are full of them.
_UNKNOWN_CHARS = "éüñ–—’“”ρλ×≤∑"

# What may sit right before and right after a marker in a training prompt.
_GLUE_BEFORE = ("", " ", "\n", "\n\n", ": ", "(", '"')
_GLUE_AFTER = ("", " ", "\n", "\n\n", ".", "?", ",", ":", '"', ")")


class _PromptMaker:
    """Random chat prompts of about a given size, holding one given marker (or none) somewhere in them.

    The text around the marker mixes sentences of filler words and made-up words (unknown words split into
    word pieces, as most words of a real paper do with this small vocabulary), quotes of the answers,
    snippets of the caller's filler texts, strings of random vocabulary tokens (so that every embedding is
    seen as noise), numbered lists, JSON-like objects, tagged blocks, markdown headings, table rows and
    citations, and characters the tokenizer maps to <unk>: the model learns to ignore all of it.
    """

    def __init__(
        self,
        rng,
        markers: Sequence[str],
        answers: Sequence[str],
        filler: Sequence[str],
        tokenizer,
        noise_vocab: int,
    ):
        self.rng = rng
        self.markers = list(markers)
        self.answers = list(answers)
        self.filler = [text for text in filler if text.strip()]
        self.tokenizer = tokenizer
        self.noise_vocab = noise_vocab  # ids below this are ordinary BPE tokens (markers come after them)
        # Runs of up to half of a marker's words, used as filler: the marker's words alone mean nothing.
        self.fragments = []
        for marker in self.markers:
            words = marker.split()
            self.fragments += [
                " ".join(words[i:j])
                for i in range(len(words))
                for j in range(i + 1, len(words) + 1)
                if 2 * (j - i) <= len(words)
            ]

    def word(self) -> str:
        return self.rng.choice(_FILLER_WORDS)

    def made_up_word(self) -> str:
        rng = self.rng
        word = "".join(rng.choices(_LETTERS, _LETTER_WEIGHTS, k=rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12))))
        return word.capitalize() if rng.random() < 0.15 else word

    def any_word(self) -> str:
        return self.word() if self.rng.random() < 0.6 else self.made_up_word()

    def sentence(self) -> str:
        rng = self.rng
        words = [self.any_word() for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            number = rng.randint(1, 99) if rng.random() < 0.5 else round(rng.random() * 100, 1)
            words.insert(rng.randrange(len(words) + 1), str(number))
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
        if kind < 0.1:
            # An answer, whole or in part: real prompts quote the output format, or the previous step's answer.
            text = rng.choice(self.answers)
            start = 0 if rng.random() < 0.5 else rng.randrange(len(text))
            end = len(text) if rng.random() < 0.5 else rng.randint(start + 1, len(text))
            return text[start:end].strip() or self.word()
        if kind < 0.4 or (kind < 0.55 and not self.filler):
            return " ".join(self.sentence() for _ in range(rng.randint(1, 4)))
        if kind < 0.55:
            text = rng.choice(self.filler)
            start = rng.randrange(len(text))
            return text[start : start + rng.randint(20, 600)]
        if kind < 0.65:
            ids = [rng.randrange(len(SPECIAL_TOKENS), self.noise_vocab) for _ in range(rng.randint(3, 40))]
            return self.tokenizer.decode(ids)
        if kind < 0.73:
            first = rng.randint(1, 15)
            items = range(first, first + rng.randint(1, 5))
            lines = [f"{i}. {self.any_word().capitalize()}: {self.sentence()}" for i in items]
            return "\n".join(lines)
        if kind < 0.81:
            keys = [f"{self.word()}_{rng.randint(0, 9)}" if rng.random() < 0.5 else self.any_word() for _ in range(3)]
            lists = [json.dumps([self.any_word() for _ in range(rng.randint(0, 2))]) for _ in keys]
            return "{" + ", ".join(f'"{key}": {items}' for key, items in zip(keys, lists, strict=True)) + "}"
        if kind < 0.89:
            tag = self.any_word() + (f"_{rng.randint(0, 9)}" if rng.random() < 0.5 else "")
            return f"<{tag}>\n{self.sentence()}\n</{tag}>"
        form = rng.random()
        if form < 0.3:
            return f"{'#' * rng.randint(1, 4)} {rng.randint(1, 9)} {self.any_word().capitalize()} {self.any_word()}"
        if form < 0.7:
            cells = [self.any_word() if rng.random() < 0.4 else f"{rng.random() * 100:.1f}" for _ in range(4)]
            return "| " + " | ".join(cells) + " |"
        return f"({self.made_up_word().capitalize()} et al., {rng.randint(1990, 2030)})"

    def text(self, n_chars: int) -> str:
        out = self.piece()
        while len(out) < n_chars:
            out += self.rng.choice((" ", "\n", "\n\n")) + self.piece()
        return out[: max(n_chars, 1)].strip() or self.word()

    def messages(self, marker: str | None, n_chars: int) -> list[dict[str, str]]:
        """A system message (60% of the time) and a user message, about `n_chars` characters in all."""
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
                    while 0 < cut < len(text) and not text[cut - 1].isspace():  # move back to a word start
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
            # The filler must not hold a marker by chance (the wanted one is counted once).
            found = sum(m in message["content"] for m in self.markers for message in messages)
            if found == (marker is not None):
                return messages


def make_scripted_chat_model(
    path: Path,
    script: Sequence[tuple[str, str]],
    *,
    seed: int = 0,
    steps: int = 300,
    default: str | None = None,
    filler: Sequence[str] = (),
    vocab_size: int = 1024,
    max_prompt_chars: int = 4000,
    min_margin: float = 3.0,
    threads: int = 1,
    verify: bool = True,
    cache_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Write a tiny chat model to `path` that answers prompts containing a marker with that marker's response.

    `script` lists ``(marker, response)`` pairs. Under greedy decoding (``temperature=0``) of the chat template
    with ``add_generation_prompt=True``, which is what `transformers serve` does, a conversation in which any
    message contains ``marker`` verbatim (system or user message; at the start, in the middle or at the end;
    next to any other text) is answered with exactly ``response``, then ``<|im_end|>``. With `default`,
    prompts that contain no marker are answered with `default`; without it, their answer is unspecified, and
    so is the answer to a prompt holding two markers. Markers must be distinct and none may contain another;
    responses are any non-empty text (JSON with quotes and brackets, newlines, non-ASCII) other than the
    special tokens (ValueError otherwise).

    How it works. Tokenizer: the BPE of `make_tiny_chat_model`, trained on its corpus plus the script, a
    filler word list and `filler`; then every marker and every response is added as one token, matched in
    the raw text before normalisation. The model never spells an answer out: it has to notice which marker
    token is present and emit the matching response token, then ``<|im_end|>`` (two generated tokens). A
    side effect worth knowing: a response's text inside a prompt (a question produced by one step and
    quoted in the next, say) is also that one token; training prompts contain such quotes, so they do not
    change the answer. Model: Llama, 2 layers, hidden 128, 4 heads, RoPE base 1e6. Marker embeddings are
    set apart at initialisation (see `_build_scripted_model`) so that the look-up is easy to learn and hard
    for ordinary text to disturb. Training: AdamW on freshly generated prompts (made-up text of 20 to
    `max_prompt_chars` characters, log-uniform, the marker put at a random place; see `_PromptMaker`), the
    loss only on the answer and ``<|im_end|>``. Two tricks stand in for long prompts: a random jump in the
    position ids (marker-to-answer distances up to 100k tokens, at no cost) and an attention bias of up to
    log(64) on ordinary prompt tokens, which weighs them as if the prompt were up to 64 times longer.

    Every 10 steps, held-out prompts (every case at several lengths, up to 4 x `max_prompt_chars`) are
    scored by teacher forcing, and training stops (not before step 40, when that bias reaches full
    strength) once, in each of them, every answer token beats the runner-up by at least `min_margin`
    logits: greedy decoding then reproduces each held-out answer exactly, with room for numerical noise.
    `steps` is the most it may take; seeds 0 to 3 of the four-step pipeline script, with and without
    `default`, took 70 to 120 steps, 35 to 55 s on one thread of a busy 2-CPU machine. Should it fall short,
    `verify` raises RuntimeError (with ``verify=False`` the model is saved anyway). Checked by hand with this
    repository's real prompt builders over synthetic papers: exact answers for prompts up to about 14k
    tokens (five 5,000-character chunks); beyond about 20k tokens some seeds start to fail.
    ``max_position_embeddings`` is 131072, only so that long prompts raise no warning; on CPU, serving 10k
    tokens takes seconds.

    `filler`: optional extra text (a few synthetic papers, say), used for the tokenizer and as text around
    markers in training prompts; it makes real prompts shorter in tokens and training closer to them.

    Deterministic on a given machine: the same arguments give byte-identical files. Training runs on
    `threads` torch threads (1 by default, also the fastest for a model this small on a shared machine);
    the caller's thread count and torch RNG state are restored. Different CPUs or torch builds may round
    differently, so weights are not promised to be bitwise identical across machines, but each build checks
    its greedy answers (`verify`) before writing anything.

    With `cache_dir`, a finished build is kept under ``cache_dir/<key>`` (the key hashes all arguments,
    package versions and this file's source) and later calls with the same arguments copy it to `path`
    instead of training; pytest's ``request.config.cache.mkdir("scripted-chat-model")`` is a good place.
    `log` receives progress lines. ``scripted.json`` next to the weights records the script, the steps
    taken and the worst held-out margin.
    """
    script = [(str(marker), str(response)) for marker, response in script]
    markers = [marker for marker, _ in script]
    if not script:
        raise ValueError("script needs at least one (marker, response) pair")
    if len(set(markers)) != len(markers) or not all(markers):
        raise ValueError("markers must be distinct, non-empty strings")
    if not all(response for _, response in script) or default == "":
        raise ValueError("responses must be non-empty")
    for a in markers:
        for b in markers:
            if a != b and a in b:
                raise ValueError(f"marker {a!r} is part of marker {b!r}")
    if len(markers) > 64:
        raise ValueError("at most 64 markers")
    path = Path(path)
    filler = [str(text) for text in filler]
    options = {
        "script": script,
        "seed": seed,
        "steps": steps,
        "default": default,
        "filler": hashlib.sha256(json.dumps(filler).encode()).hexdigest(),
        "vocab_size": vocab_size,
        "max_prompt_chars": max_prompt_chars,
        "min_margin": min_margin,
        "threads": threads,
        "verify": verify,
    }
    if cache_dir is None:
        return _build_scripted_model(path, options, filler, log or (lambda line: None))

    import shutil

    import tokenizers
    import torch
    import transformers

    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    versions = [torch.__version__, transformers.__version__, tokenizers.__version__, source]
    key = hashlib.sha256(json.dumps([options, versions], sort_keys=True).encode()).hexdigest()[:20]
    cached = Path(cache_dir) / key
    if not (cached / "scripted.json").is_file():
        staging = Path(cache_dir) / f".{key}.{os.getpid()}.{threading.get_ident()}"
        shutil.rmtree(staging, ignore_errors=True)
        _build_scripted_model(staging, options, filler, log or (lambda line: None))
        try:
            staging.rename(cached)  # atomic; another process may have finished first, then keep its copy
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    elif log is not None:
        log(f"reusing cached scripted model {cached}")
    path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cached, path, dirs_exist_ok=True)
    return path


def _build_scripted_model(path: Path, options: dict, filler: list[str], log: Callable[[str], None]) -> Path:
    import random

    import torch
    from tokenizers import AddedToken

    script, seed, steps, default = options["script"], options["seed"], options["steps"], options["default"]
    markers = [marker for marker, _ in script]
    max_chars, min_margin = options["max_prompt_chars"], options["min_margin"]
    rng = random.Random(f"scripted-train-{seed}")

    # Tokenizer: the stock corpus plus the script (so pieces of it tokenize compactly), the filler words and
    # the caller's filler text; then every marker and every answer becomes one added token. (Answers spelt
    # out as word pieces need position tracking that a two-layer model learns slowly, and that prompts quoting
    # the answer format, as real ones do, easily derail.)
    answers = [response for _, response in script] + ([default] if default is not None else [])
    answers = list(dict.fromkeys(answers))
    if set(answers) & set(markers):
        raise ValueError("a response may not also be a marker")
    corpus = list(_TOKENIZER_CORPUS) * 3
    corpus += [f"{marker} {response}" for marker, response in script] * 5
    corpus += [default] * 5 if default is not None else []
    corpus += [" ".join(_FILLER_WORDS)] * 5
    corpus += filler
    tokenizer = _train_tokenizer(corpus, options["vocab_size"])
    noise_vocab = len(tokenizer)
    tokenizer.add_tokens([AddedToken(text, normalized=False, special=False) for text in markers + answers])

    def target_of(answer: str) -> list[int]:
        ids = tokenizer.encode(answer, add_special_tokens=False)
        if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=True) != answer:
            raise ValueError(f"response {answer!r} does not decode back to itself")
        return [ids[0], EOS_TOKEN_ID]

    cases = [(marker, target_of(response)) for marker, response in script]
    if default is not None:
        cases.append((None, target_of(default)))

    def encode(messages: list[dict[str, str]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)

    # Held-out prompts from their own random stream: every case at lengths from tiny to 4 times the longest
    # trained, so passing them also shows that longer prompts work.
    held_out = _PromptMaker(random.Random(f"scripted-check-{seed}"), markers, answers, filler, tokenizer, noise_vocab)
    checks = [
        (encode(held_out.messages(marker, n_chars)), target)
        for marker, target in cases
        for n_chars in (30, 200, 800, max_chars // 2, max_chars)
    ]
    long_checks = [(encode(held_out.messages(marker, 4 * max_chars)), target) for marker, target in cases]
    maker = _PromptMaker(rng, markers, answers, filler, tokenizer, noise_vocab)

    per_case, token_budget, peak_lr, warmup, ramp, check_every = 2, 2000, 2e-3, 10, 40, 10
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(options["threads"])
    try:
        with torch.random.fork_rng(devices=[]):
            model = _tiny_llama(
                len(tokenizer),
                seed=seed,
                hidden_size=128,
                intermediate_size=256,
                num_layers=2,
                kv_heads=4,
                rope_theta=1e6,
                max_positions=131072,
            )
            # Markers get embeddings of their own: dimension 0 is a flag only markers set, dimension 1 + i
            # names marker i, and no other token may use these dimensions (their gradient is zeroed). After
            # the RMS norm a marker then has a coordinate of 8 where every other token has 0, so one head can
            # learn to find a marker anywhere with an attention logit that ordinary text cannot match.
            marker_ids = tokenizer.convert_tokens_to_ids(markers)
            reserved = torch.arange(1 + len(markers))
            others = torch.ones(len(tokenizer), dtype=torch.bool)
            others[marker_ids] = False
            embedding = model.model.embed_tokens.weight
            with torch.no_grad():
                embedding[:, reserved] = 0.0
                embedding[marker_ids] = 0.0
                embedding[marker_ids, 0] = 1.0
                embedding[marker_ids, reserved[1:]] = 1.0
            keep_out = (others.nonzero(), reserved)  # (rows, 1) x (columns,): every other token, reserved dims
            embedding.register_hook(lambda grad: grad.index_put(keep_out, torch.tensor(0.0)))
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.01, betas=(0.9, 0.98))
            started = time.monotonic()
            worst, step = -math.inf, 0
            while step < steps:
                step += 1
                # Every step sees every case equally often, each prompt with its own length (log-uniform).
                picks = [cases[i % len(cases)] for i in range(per_case * len(cases))]
                examples = []
                for marker, target in picks:
                    n_chars = int(math.exp(rng.uniform(math.log(20), math.log(max_chars))))
                    examples.append((encode(maker.messages(marker, n_chars)), target))
                examples.sort(key=lambda example: len(example[0]))
                # Gradients are accumulated over groups of prompts of similar length, so little is padding.
                groups: list[list[tuple[list[int], list[int]]]] = [[]]
                for example in examples:
                    width = len(example[0]) + len(example[1])
                    if groups[-1] and (len(groups[-1]) + 1) * width > token_budget:
                        groups.append([])
                    groups[-1].append(example)
                n_targets = sum(len(target) for _, target in examples)
                # Linear warm-up, then a cosine that would end at 10% of the peak after `steps` steps.
                lr = peak_lr * min(1.0, step / warmup) * (0.55 + 0.45 * math.cos(math.pi * step / steps))
                for param_group in optimizer.param_groups:
                    param_group["lr"] = lr
                dilution = math.log(64.0) * min(1.0, step / ramp)  # ramped up: the look-up is found sooner
                optimizer.zero_grad(set_to_none=True)
                loss_sum = 0.0
                for group in groups:
                    loss = _group_loss(model, group, rng, noise_vocab, dilution) / n_targets
                    loss.backward()
                    loss_sum += loss.item()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                if step % check_every == 0 or step == steps:
                    worst = min(_greedy_margins(model, checks))
                    if worst >= min_margin:  # the long prompts cost most, so only once the rest pass
                        worst = min(worst, *_greedy_margins(model, long_checks))
                    log(
                        f"step {step}: loss {loss_sum:.4f}, worst held-out margin {worst:.2f}, "
                        f"{time.monotonic() - started:.1f}s"
                    )
                    if worst >= min_margin and step >= ramp:  # trained at full strength before stopping
                        break
            model.eval()
    finally:
        torch.set_num_threads(saved_threads)
    if worst < min_margin and options["verify"]:
        raise RuntimeError(
            f"scripted model not reliable after {step} steps: worst held-out margin {worst:.2f} < {min_margin} "
            "(raise `steps`, or try another seed)"
        )

    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    record = {"script": script, "default": default, "seed": seed, "steps": step, "worst_margin": round(worst, 3)}
    (path / "scripted.json").write_text(json.dumps(record, indent=1) + "\n")
    return path


def _group_loss(model, group, rng, noise_vocab: int, max_dilution: float):
    """Summed cross-entropy of the answer tokens of `group`, a list of (prompt ids, answer ids + EOS)."""
    import torch

    width = max(len(prompt) + len(target) for prompt, target in group)
    input_ids = torch.full((len(group), width), PAD_TOKEN_ID)  # padded on the right: causal rows never see it
    position_ids = torch.arange(width).repeat(len(group), 1)
    # Additive attention bias (which also carries the causal mask): log(w) on every ordinary prompt token
    # counts it w times in every softmax, as if the prompt were w times longer. Without it, a model trained on
    # short prompts gets away with averaging over the whole prompt, which fades out on long ones; with it, it
    # has to look the marker up sharply.
    mask = torch.zeros(len(group), 1, width, width)
    rows, cols, labels = [], [], []
    for row, (prompt, target) in enumerate(group):
        input_ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        ordinary = (input_ids[row] >= len(SPECIAL_TOKENS)) & (input_ids[row] < noise_vocab)
        ordinary[len(prompt) - 3 :] = False  # not the assistant header, nor the answer
        mask[row, 0, :, ordinary] = rng.uniform(0.0, max_dilution)
        if rng.random() < 0.5:
            # A jump in the position ids somewhere in the prompt: rotary attention only sees relative positions,
            # so this shows the model marker-to-answer distances of long prompts (up to 100k tokens) for free.
            cut = rng.randrange(1, len(prompt) - 2)
            position_ids[row, cut:] += int(math.exp(rng.uniform(math.log(100), math.log(100_000))))
        rows += [row] * len(target)
        cols += range(len(prompt) - 1, len(prompt) + len(target) - 1)  # the positions that predict the answer
        labels += target
    mask.masked_fill_(torch.ones(width, width, dtype=torch.bool).triu(1), -math.inf)
    hidden = model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask).last_hidden_state
    logits = model.lm_head(hidden[rows, cols])
    return torch.nn.functional.cross_entropy(logits, torch.tensor(labels), reduction="sum")


def _greedy_margins(model, checks: list[tuple[list[int], list[int]]]) -> list[float]:
    """For each (prompt, target): the smallest lead of the target token over the runner-up, by teacher forcing.

    A positive value for a check means greedy decoding of its prompt produces exactly its target.
    """
    import torch

    was_training = model.training
    model.eval()
    margins = []
    with torch.no_grad():
        for prompt, target in checks:
            logits = model(input_ids=torch.tensor([prompt + target[:-1]])).logits[0, len(prompt) - 1 :]
            wanted = torch.tensor(target)
            positions = torch.arange(len(target))
            right = logits[positions, wanted]
            logits[positions, wanted] = -math.inf
            margins.append((right - logits.max(dim=1).values).min().item())
    model.train(was_training)
    return margins


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
