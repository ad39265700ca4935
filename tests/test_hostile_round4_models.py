"""Hostile input, round 4 (issue 34, item 3): model folders are input.

Tiny random-weight models are built from configs (``helpers``), then damaged or forged: a safetensors header
claiming 2^40 bytes, tensors past the end of a cut file, an absurd ``config.json`` (10 MB, 100,000 layers, a size
that is a string, sizes its weights do not hold), a truncated or inconsistent tokenizer, more parameters than the
memory at hand. ``models.check_model_dir`` refuses each with one line; every model-loading command (embed,
extract with the highlighter and the semantic extractor, rerank, train, silver --tokenizer) stops with exit 2 and
one line in seconds. The commands run in a subprocess under a memory cap (the bomb cases would otherwise take
the machine if a check regressed). No Ray: each command stops while it plans.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_token_classifier, tiny_model_dir

from verbatim_batch.core import models


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("round4-models")
    return {"classifier": make_token_classifier(root / "classifier"), "embedder": tiny_model_dir(root / "bert", "bert")}


def _config_patch(**patch):
    def change(folder: Path) -> None:
        conf = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(conf | patch))
    return change


def _weights(folder: Path) -> Path:
    return sorted(folder.glob("*.safetensors"))[0]


def _header_claims(n: int):
    def change(folder: Path) -> None:
        data = bytearray(_weights(folder).read_bytes())
        data[:8] = struct.pack("<Q", n)
        _weights(folder).write_bytes(bytes(data))
    return change


def _cut_weights(folder: Path) -> None:
    data = _weights(folder).read_bytes()
    _weights(folder).write_bytes(data[: len(data) // 2])


def _huge_config(folder: Path) -> None:
    (folder / "config.json").write_text("{" + " " * (10 << 20) + "}")


def _truncated_tokenizer(folder: Path) -> None:
    data = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(data[: len(data) // 2])


def _bad_tokenizer_entry(folder: Path) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["model"]["type"] = "NoSuchModel"
    (folder / "tokenizer.json").write_text(json.dumps(tok))


CASES = {
    "header claims 2^40 bytes": (_header_claims(1 << 40), "header"),
    "header claims 2^64-1 bytes": (_header_claims((1 << 64) - 1), "header"),
    "weights cut in half": (_cut_weights, "do not fit the file"),
    "config.json of 10 MB": (_huge_config, "config.json is"),
    "100,000 layers": (_config_patch(num_hidden_layers=100_000), "num_hidden_layers = 100000"),
    "a size that is a string": (_config_patch(hidden_size="64"), "hidden_size"),
    "a negative vocabulary": (_config_patch(vocab_size=-1), "vocab_size"),
    "sizes the weights do not hold": (_config_patch(hidden_size=65_536, num_hidden_layers=1_000), "does not describe"),
    "truncated tokenizer.json": (_truncated_tokenizer, "tokenizer.json is not valid JSON"),
    "tokenizer.json of an unknown kind": (_bad_tokenizer_entry, "tokenizer cannot be loaded"),
    "tokenizer past the vocabulary": (_config_patch(vocab_size=1_000), "past the embedding table"),
}


def damaged(good_dir: Path, dest: Path, change) -> Path:
    shutil.copytree(good_dir, dest)
    change(dest)
    return dest


def test_a_good_model_folder_passes(good):
    for folder in good.values():
        models.check_model_dir(folder, "model")


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_damaged_or_forged_folder_is_one_line(good, tmp_path, case):
    change, says = CASES[case]
    folder = damaged(good["classifier"], tmp_path / "m", change)
    t0 = time.monotonic()
    with pytest.raises(ValueError) as exc:
        models.check_model_dir(folder, "highlighter model")
    assert time.monotonic() - t0 < 20
    message = str(exc.value)
    assert says in message and "\n" not in message and len(message) < 600, message


def test_more_parameters_than_memory_is_refused(good, tmp_path, monkeypatch):
    folder = damaged(good["embedder"], tmp_path / "m", lambda f: None)
    monkeypatch.setattr(models, "memory_budget", lambda: 1 << 20)  # 1 MiB free
    with pytest.raises(ValueError, match="GiB of memory are available"):
        models.check_model_dir(folder, "embedding model")


# --- every model-loading command, in a subprocess under a memory cap -----------------------------------------


RUNNER = textwrap.dedent("""
    import contextlib, io, json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    from verbatim_batch.cli import main
    out = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
            except BaseException as exc:
                rc = f"raised {type(exc).__name__}: {exc}"[:500]
        out.append({"rc": rc, "err": err.getvalue()[-2000:], "s": time.monotonic() - t0})
    print(json.dumps(out))
""")


def _fake_run(folder: Path, command: str, config: dict, table: str | None = None) -> str:
    folder.mkdir(parents=True)
    if table:
        (folder / table).mkdir()
        pq.write_table(pa.table({"chunk_id": ["c1"], "text": ["Some text."]}), folder / table / "part-0.parquet")
    (folder / "manifest.json").write_text(json.dumps({"run_id": folder.name, "command": command,
                                                      "config": json.dumps(config)}))
    return str(folder)


def test_every_model_loading_command_stops_with_one_line(good, tmp_path):
    chunks = _fake_run(tmp_path / "chunks", "chunk", {}, "chunks")
    index = _fake_run(tmp_path / "index", "index", {"chunks": chunks})
    pq.write_table(pa.table({"chunk_id": ["c1"]}), Path(index) / "ids.parquet")  # an index run holds its ids
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"query": "what"}) + "\n")
    retrieval = _fake_run(tmp_path / "retrieval", "retrieve", {"queries": str(queries), "index": index}, "retrieval")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "q", "chunk": "Some text here."}) + "\n")
    bomb = damaged(good["classifier"], tmp_path / "bomb", _config_patch(num_hidden_layers=100_000))
    header = damaged(good["embedder"], tmp_path / "header", _header_claims(1 << 40))
    tokenizer = damaged(good["classifier"], tmp_path / "tok", _truncated_tokenizer)
    out = str(tmp_path / "out")
    commands = {
        "embed": ["embed", "--chunks", chunks, "--model", str(header), "--output", out],
        "extract highlighter": ["extract", "--pairs", str(pairs), "--extractor", "highlighter", "--model", str(bomb),
                                "--output", out],
        "extract semantic": ["extract", "--pairs", str(pairs), "--extractor", "semantic", "--model", str(header),
                             "--output", out],
        "rerank": ["rerank", "--retrieval", retrieval, "--model", str(tokenizer), "--output", out],
        "train": ["train", "--model", str(bomb), "--train", str(pairs), "--eval", str(pairs), "--output", out],
        "silver": ["silver", "--chunks", chunks, "--index", index, "--model", "m", "--base-url",
                   "http://127.0.0.1:9/v1", "--tokenizer", str(tokenizer), "--output", out],
    }
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(list(commands.values()))], capture_output=True,
                          text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = dict(zip(commands, json.loads(done.stdout.strip().splitlines()[-1]), strict=True))
    for name, r in results.items():
        lines = [line for line in r["err"].strip().splitlines() if line.strip()]
        assert r["rc"] == 2 and len(lines) == 1 and "Traceback" not in r["err"], (name, r)
        assert any(w in lines[0] for w in ("header", "num_hidden_layers", "tokenizer")), (name, lines[0])
        assert r["s"] < 60, (name, r["s"])
    assert not Path(out).exists()


@pytest.mark.parametrize("modules, says", [
    ([{"type": "sentence_transformers.models.Transformer", "path": "../outside"}], "not a folder inside"),
    ([{"type": "sentence_transformers.models.Pooling", "path": "/etc"}], "not a folder inside"),
    ("[" * 100_000, "not a JSON file"),
])
def test_sentence_transformers_files_never_lead_outside_the_folder(good, tmp_path, modules, says):
    from verbatim_batch.retrieval.embedder import EmbedderConfig, embedder_fingerprint

    def forge(folder: Path) -> None:
        (folder / "modules.json").write_text(modules if isinstance(modules, str) else json.dumps(modules))

    folder = damaged(good["embedder"], tmp_path / "m", forge)
    with pytest.raises(ValueError, match=says):
        embedder_fingerprint(EmbedderConfig(model=str(folder)))
