"""verbatim-batch train: labelled windows cut exactly as the highlighter reads, input formats, a tiny random
ModernBERT that learns a learnable task with 2 Ray Train workers (then extract + evaluate on its model),
and a training job killed with SIGKILL that resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.cli import parse_args
from verbatim_batch.cli.commands import job_of
from verbatim_batch.core.runs import build_manifest, read_manifest, staged
from verbatim_batch.retrieval.embedder import DEFAULT_MODEL
from verbatim_batch.silver import dataset as silver
from verbatim_batch.silver.train import data as tdata
from verbatim_batch.stages.train import TrainJob, run_train

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]

EVIDENCE = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
FILLER = "the model data table result shows we use paper method corpus score baseline train".split()
QUESTIONS = ["which sentences are evidence", "what supports the claim", "where is the answer"]


def tiny_model(path: Path, seed: int = 0) -> Path:
    """A small random ModernBERT token classifier (2 labels) with the bundled MiniLM tokenizer."""
    import torch
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    torch.manual_seed(seed)
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=512, pad_token_id=0, cls_token_id=101,
                           sep_token_id=102, bos_token_id=101, eos_token_id=102, global_attn_every_n_layers=2,
                           local_attention=16, num_labels=2)
    ModernBertForTokenClassification(cfg).save_pretrained(str(path))
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    return path


def synthetic_pairs(n: int, seed: int) -> list[dict]:
    """Chunks of 5-word sentences; sentences of EVIDENCE words are the spans (a quarter of pairs have none)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        parts, spans, pos = [], [], 0
        negative = rng.random() < 0.25
        for _ in range(rng.randint(3, 6)):
            ev = not negative and rng.random() < 0.4
            sentence = " ".join(rng.choice(EVIDENCE if ev else FILLER) for _ in range(5))
            if ev:
                spans.append({"start": pos, "end": pos + len(sentence)})
            parts.append(sentence + ". ")
            pos += len(sentence) + 2
        rows.append({"query_id": f"q{seed}-{i}", "question": rng.choice(QUESTIONS), "chunk": "".join(parts).strip(),
                     "spans": spans})
    return rows


def silver_run(path: Path, train: list[dict], dev: list[dict]) -> Path:
    """A committed silver `data` run, as `verbatim-batch silver` writes it."""
    def rows(pairs):
        return [{**p, "chunk_id": f"c-{p['query_id']}", "paper_id": "p", "source": "gold", "rank": 1,
                 "teacher_model": "t", "spans": [{**s, "text": p["chunk"][s["start"]:s["end"]]} for s in p["spans"]]}
                for p in pairs]
    with staged(str(path)) as run:
        silver.write_silver(run.staging, rows(train), rows(dev))
        run.commit(build_manifest(run_id="silver-test", command="silver", config={}, inputs=[], tables={},
                                  counts={"train": len(train), "dev": len(dev)}, timings_s={"total": 0.0}))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("train") / "tiny")


# --- data: fast, no Ray ----------------------------------------------------------------------------------


def test_windows_match_the_highlighter(tiny):
    """Training windows are the highlighter's windows, token for token, and labels follow the spans."""
    from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig

    pairs, _ = tdata.normalize_rows(synthetic_pairs(12, seed=3))
    hl = Highlighter(HighlighterConfig(model=str(tiny), max_length=32, stride=8))
    _, enc, errors = hl._windows(pairs["question"].to_pylist(), pairs["chunk"].to_pylist())
    assert not errors
    win = tdata.windows(pairs, hl.tokenizer, 32, 8)
    assert win["input_ids"].to_pylist() == enc["input_ids"]
    assert win.num_rows > pairs.num_rows  # some pairs need more than one window
    for w, (ids, labels) in enumerate(zip(win["input_ids"].to_pylist(), win["labels"].to_pylist(), strict=True)):
        owner = enc["overflow_to_sample_mapping"][w]
        seq = enc.sequence_ids(w)
        pair = pairs.slice(owner, 1).to_pylist()[0]
        for t, (lab, sid, (a, b)) in enumerate(zip(labels, seq, enc["offset_mapping"][w], strict=True)):
            if sid != 1:
                assert lab == -100, (w, t)
            else:
                inside = any(s["start"] < b and a < s["end"] for s in pair["spans"])
                assert lab == int(inside and b > a), (w, t, pair["chunk"][a:b])
        assert len(ids) == len(labels) <= 32


def test_inputs_parquet_jsonl_and_silver(tmp_path):
    rows = synthetic_pairs(6, seed=1)
    jsonl = tmp_path / "pairs.jsonl"
    lines = [json.dumps({"query": r["question"], "chunk": r["chunk"], "spans": [[s["start"], s["end"]]
                                                                                 for s in r["spans"]]}) for r in rows]
    lines += ["not json", json.dumps({"query": "q", "chunk": "abc", "spans": [{"start": 2, "end": 9}]}),
              json.dumps({"query": "", "chunk": "abc", "spans": []})]
    jsonl.write_text("\n".join(lines) + "\n")
    table, info = tdata.read_pairs(str(jsonl), "train")
    assert table.num_rows == 6
    assert info["skipped"] == {"invalid_record": 1, "missing_question": 1, "missing_chunk": 0, "bad_spans": 1}
    assert table["spans"].to_pylist() == [[{"start": s["start"], "end": s["end"]} for s in r["spans"]] for r in rows]
    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), folder / "a.parquet")
    ptable, pinfo = tdata.read_pairs(str(folder), "eval")
    assert ptable["query_id"].to_pylist() == [r["query_id"] for r in rows]
    assert pinfo["sha256"] == info["sha256"]  # same pairs, same data hash
    run = silver_run(tmp_path / "silver" / "data", rows[:4], rows[4:])
    for where in (run, run.parent):  # the data run, or the silver job folder holding it
        assert tdata.read_pairs(str(where), "train")[0].num_rows == 4
        assert tdata.read_pairs(str(where), "eval")[0].num_rows == 2


def test_pack_batches_and_args():
    win = pa.Table.from_pylist([{"input_ids": [1] * n, "labels": [0] * n} for n in (5, 9, 3, 7, 2)])
    fixed = tdata.pack_batches(win, batch_size=2, seed=0)
    assert sorted(len(x) for x in fixed["input_ids"].to_pylist()) == [1, 2, 2]
    budget = tdata.pack_batches(win, batch_size=None, batch_tokens=14, seed=0)
    for ids in budget["input_ids"].to_pylist():
        assert len(ids) * max(len(x) for x in ids) <= 14 or len(ids) == 1
    assert sum(budget["n_tokens"].to_pylist()) == 26
    job = job_of(parse_args(["train", "--train", "s", "--output", "o", "--batch-tokens", "4096", "--use-gpu",
                                "--run-id", "r1", "--num-workers", "4"]))
    assert (job.batch_tokens, job.use_gpu, job.run_id, job.num_workers, job.lr, job.epochs) == \
        (4096, True, "r1", 4, 5e-5, 3)
    assert "run_id" not in job.config() and job.config()["max_length"] == 8192
    with pytest.raises(ValueError):
        TrainJob(train="s", output="o", stride=5000)


# --- Ray Train ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_learns_then_extract_and_evaluate(ray_local, tiny, tmp_path):
    """silver -> train (2 workers) -> extract -> evaluate: a tiny random ModernBERT learns the task."""
    from verbatim_batch.cli import main as cli

    train_rows, dev_rows = synthetic_pairs(96, seed=11), synthetic_pairs(24, seed=12)
    silver_dir = silver_run(tmp_path / "silver" / "data", train_rows, dev_rows)
    t0 = time.perf_counter()
    out, manifest = run_train(TrainJob(train=str(silver_dir.parent), output=str(tmp_path / "student"),
                                       model=str(tiny), epochs=4, lr=3e-3, batch_size=8, max_length=32, stride=8,
                                       num_workers=2, cpus_per_worker=0.5, warmup_ratio=0.05, seed=0))
    seconds = time.perf_counter() - t0
    t = manifest["training"]
    print(f"train: {seconds:.1f}s, best {t['best']}")
    assert len(t["epochs"]) == 4 and [e["epoch"] for e in t["epochs"]] == [1.0, 2.0, 3.0, 4.0]
    assert t["best"]["eval_word_f1"] >= 0.9, t["epochs"]
    assert t["best"]["eval_word_f1"] == max(e["eval_word_f1"] for e in t["epochs"])
    assert t["epochs"][-1]["eval_loss"] < t["epochs"][0]["eval_loss"]
    assert t["data"]["train"]["silver_run"] == str(silver_dir)
    assert manifest["counts"]["steps"] == t["max_steps"] and manifest["counts"]["resumed_from_step"] == 0
    model = Path(out) / "model"
    conf = json.loads((model / "config.json").read_text())
    assert conf["id2label"] == {"0": "O", "1": "EVIDENCE"}
    assert (model / "model.safetensors").exists() and (model / "tokenizer.json").exists()
    assert not (model / "optimizer.pt").exists()
    assert "<svg" in (Path(out) / "training.html").read_text()
    assert read_manifest(out)["run_id"] == manifest["run_id"]

    # the model folder is a highlighter as it is: extract and evaluate on the dev pairs
    gold = tmp_path / "dev.jsonl"
    gold.write_text("".join(json.dumps({"query": r["question"], "chunk": r["chunk"], "query_id": r["query_id"],
                                        "gold_spans": r["spans"]}) + "\n" for r in dev_rows))
    spans_dir = tmp_path / "spans"
    assert cli(["extract", "--pairs", str(gold), "--output", str(spans_dir), "--extractor", "highlighter",
                "--model", str(model), "--max-length", "32", "--stride", "8"]) == 0
    result = tmp_path / "eval.json"
    from verbatim_batch.quality.evaluate import evaluate_files

    figures = evaluate_files(str(gold), str(spans_dir))
    result.write_text(json.dumps(figures))
    assert figures["word"]["micro_f1"] == pytest.approx(t["best"]["eval_word_f1"], abs=1e-6)


@pytest.mark.slow
def test_kill_and_resume(tiny, tmp_path):
    """A training job SIGKILLed between its first and second checkpoint, rerun with the same --run-id,
    continues from the first checkpoint (not from step 0) and commits a run with every epoch's metrics."""
    rows = synthetic_pairs(96, seed=21)
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:80]))
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows[80:]))
    out = tmp_path / "student"
    cmd = [sys.executable, str(REPO / "jobs" / "train.py"), "--train", str(train), "--eval", str(dev),
           "--model", str(tiny), "--output", str(out), "--run-id", "r1", "--epochs", "3", "--lr", "3e-3",
           "--batch-size", "8", "--max-length", "32", "--stride", "8", "--num-workers", "2",
           "--cpus-per-worker", "0.5", "--num-cpus", "2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    marker = tmp_path / "fault.fired"
    # a worker is SIGKILLed as epoch 3 ends, before its evaluation and checkpoint; then the job is killed -9
    killed_env = {**env, "VERBATIM_BATCH_FAULT": f"train.evaluate#3@{marker}"}
    proc = subprocess.Popen(cmd, env=killed_env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    snapshot = tmp_path / ".student.staging-r1" / "checkpoints" / "checkpoint_manager_snapshot.json"
    deadline = time.time() + 240
    try:
        while not marker.exists() and proc.poll() is None:
            assert time.time() < deadline, "no fault within 240 s"
            time.sleep(0.1)
        try:  # the driver (unless the dead worker's error already ended it) and the local Ray it started
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finally:
        proc.wait()
    assert marker.exists() and snapshot.exists()
    assert not out.exists()
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = read_manifest(str(out))
    t = manifest["training"]
    # from a checkpoint the killed run left (Ray registers them asynchronously: epoch 1 or 2), not from zero
    assert t["resumed_from_step"] in (t["steps_per_epoch"], 2 * t["steps_per_epoch"]), t
    assert t["global_step"] == t["max_steps"] == 3 * t["steps_per_epoch"]
    assert [e["epoch"] for e in t["epochs"]] == [1.0, 2.0, 3.0]  # the killed run's epochs are in the history
    assert (out / "model" / "model.safetensors").exists()
    # a rerun of a committed run id leaves it as it is (it returns before starting Ray)
    path, again = run_train(job_of(parse_args(["train", *cmd[2:]])))
    assert path == str(out) and again["created_at"] == manifest["created_at"] and again["run_id"] == "r1"
