"""The scripted chat model: trained in the test session, served by `transformers serve`, asked over HTTP.

The script is the one the pipeline tests need: one marker per LLM step (question types, question, search
query, extraction) and a fixed answer for each. Prompts here are new text around the markers, plus the
repository's own prompt builders over synthetic papers.
"""

from __future__ import annotations

import hashlib
import json
import random
import time

import pytest
from llmserver import OpenAIServer, make_scripted_chat_model, require_server

pytestmark = pytest.mark.slow

# "we use" occurs in nearly every synthetic paper (see `test_extraction_answer_quotes_common_paper_text`), so
# an extraction answer quoting it aligns to real text in many chunks and is rejected in the others.
SCRIPT = [
    ("Which 3 of the question types", '["Definition", "Quantification", "Comparison"]'),
    ("Write one question of type", "What is the method used for training?"),
    ("Write the short search query", "training method dataset"),
    ("<doc_0>", '{"doc_0": ["we use"], "doc_1": [], "doc_2": [], "doc_3": [], "doc_4": []}'),
]
DEFAULT = "I cannot help with that."
BUILD_SECONDS_LIMIT = 150  # about 25-50 s on a busy 2-CPU machine; generous for slower CI runners

PARAGRAPH = (
    "Our encoder reads each abstract once and keeps a running summary of the entities it has seen. On the "
    "development split, precision rises from 71.2 to 78.9 while recall stays flat; the gain comes mostly from "
    "long documents, where the baseline loses track of earlier mentions (Table 3)."
)


@pytest.fixture(scope="session")
def scripted(tmp_path_factory):
    """(model_dir, build seconds): built once per session, with no cache, so its build time is measured."""
    require_server()
    work = tmp_path_factory.mktemp("scripted")
    lines: list[str] = []
    started = time.monotonic()
    model_dir = make_scripted_chat_model(work / "model", SCRIPT, default=DEFAULT, log=lines.append)
    seconds = time.monotonic() - started
    print(f"\nscripted model built in {seconds:.1f}s:\n" + "\n".join(lines))
    return model_dir, seconds


@pytest.fixture(scope="module")
def server(scripted, tmp_path_factory):
    model_dir, _ = scripted
    with OpenAIServer(model_dir, tmp_path_factory.mktemp("scripted-server")) as srv:
        yield srv


def _answer(server: OpenAIServer, messages: list[dict]) -> tuple[str, dict]:
    body = server.chat(messages, temperature=0, max_tokens=64)
    return body["choices"][0]["message"]["content"], body


def _wrappings(marker: str) -> list[list[dict]]:
    """The marker in new text: alone, in a system message, mid-sentence, at the end, inside a long user turn."""
    return [
        [{"role": "user", "content": marker}],
        [
            {"role": "system", "content": f"You are a careful research assistant. {marker}, please."},
            {"role": "user", "content": PARAGRAPH},
        ],
        [{"role": "user", "content": f"Context:\n{PARAGRAPH}\n\nNow: {marker} (answer briefly) for the text."}],
        [
            {"role": "system", "content": "Reply tersely."},
            {"role": "user", "content": "\n\n".join([PARAGRAPH] * 8) + f"\n\n{marker}"},
        ],
    ]


def test_build_time_and_record(scripted):
    model_dir, seconds = scripted
    record = json.loads((model_dir / "scripted.json").read_text())
    print(f"\nbuild+train {seconds:.1f}s, {record['steps']} steps, worst held-out margin {record['worst_margin']}")
    assert seconds < BUILD_SECONDS_LIMIT
    assert record["worst_margin"] >= 3.0
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in model_dir.iterdir()
    }


@pytest.mark.parametrize("marker, response", SCRIPT, ids=["types", "question", "query", "extract"])
def test_each_marker_gets_its_response(server, marker, response):
    for messages in _wrappings(marker):
        content, body = _answer(server, messages)
        assert content == response, messages
        assert body["choices"][0]["finish_reason"] == "stop"
    if response.startswith(("[", "{")):
        json.loads(response)  # the pipeline parses these


def test_prompt_without_marker_gets_default(server):
    for messages in (
        [{"role": "user", "content": "Hello there."}],
        [{"role": "system", "content": "Question types and search queries."}, {"role": "user", "content": PARAGRAPH}],
    ):
        assert _answer(server, messages)[0] == DEFAULT


def test_real_prompt_builders(server):
    """The repository's own prompts over synthetic papers, as the pipeline sends them (up to ~10k tokens)."""
    from verbatim_batch.extract import prompts
    from verbatim_batch.silver import querygen
    from verbatim_synth.corpus import generate_paper

    rng = random.Random(3)
    papers = [generate_paper(21, i).markdown for i in range(4)]

    def chunk(size: int) -> str:
        paper = rng.choice(papers)
        start = rng.randrange(max(1, len(paper) - size))
        return paper[start : start + size]

    answers = dict(SCRIPT)
    cases = [
        (querygen.types_messages(chunk(2500)), answers["Which 3 of the question types"]),
        (querygen.question_messages(chunk(2500), "Comparison"), answers["Write one question of type"]),
        (querygen.rewrite_messages(answers["Write one question of type"]), answers["Write the short search query"]),
        (prompts.build_messages("training method dataset", [chunk(1500)]), answers["<doc_0>"]),
        (prompts.build_messages("training method dataset", [chunk(4000) for _ in range(5)]), answers["<doc_0>"]),
    ]
    for messages, expected in cases:
        content, body = _answer(server, messages)
        assert content == expected, (body["usage"], messages[-1]["content"][-200:])


def test_extraction_answer_quotes_common_paper_text():
    from verbatim_synth.corpus import generate_paper

    quote = json.loads(dict(SCRIPT)["<doc_0>"])["doc_0"][0]
    papers = [generate_paper(0, i).markdown for i in range(20)]
    assert sum(quote in paper for paper in papers) >= 15


def test_build_is_deterministic_and_cached(tmp_path):
    require_server()
    quick = {"steps": 3, "verify": False}

    def digest(path):
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}

    first = digest(make_scripted_chat_model(tmp_path / "a", SCRIPT, **quick))
    assert first == digest(make_scripted_chat_model(tmp_path / "b", SCRIPT, **quick))
    assert (
        first["model.safetensors"]
        != digest(make_scripted_chat_model(tmp_path / "c", SCRIPT, seed=1, **quick))["model.safetensors"]
    )

    lines: list[str] = []
    cache = tmp_path / "cache"
    assert digest(make_scripted_chat_model(tmp_path / "d", SCRIPT, cache_dir=cache, **quick)) == first
    assert digest(make_scripted_chat_model(tmp_path / "e", SCRIPT, cache_dir=cache, log=lines.append, **quick)) == first
    assert any("reusing cached" in line for line in lines)
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1


@pytest.mark.parametrize(
    "script, default, message",
    [
        ([], None, "at least one"),
        ([("a b", "x"), ("a b", "y")], None, "distinct"),
        ([("question types", "x"), ("Which 3 of the question types", "y")], None, "part of marker"),
        ([("marker", "")], None, "non-empty"),
        ([("marker", "<|im_end|>")], None, "decode back"),
        ([("marker", "x")], "", "non-empty"),
    ],
)
def test_bad_scripts_are_rejected(tmp_path, script, default, message):
    require_server()
    with pytest.raises(ValueError, match=message):
        make_scripted_chat_model(tmp_path / "m", script, default=default, steps=1, verify=False)
