"""The runner's loop, with a stage of its own and no Ray: commit, no-op rerun, resume, a refused change of
settings, carry from a previous run, the row check, and a composite run.

The fake stage runs in the driver (``needs_ray = False``, its dataset an iterable of Arrow tables): a real
stage differs only in handing the runner a ``ray.data.Dataset``; every file, record and manifest is real.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.core.runs import SettingsChangedError, read_manifest
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import (
    CompositeStage,
    Outcome,
    Plan,
    RunOptions,
    StageContext,
    StageResult,
    TableStage,
    Work,
)

ROWS = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.int64()),
                  pa.field("factor", pa.int64())])


class Killed(Exception):
    """Stands in for a driver killed part-way (the staging folder stays, as after SIGKILL)."""


@dataclass(kw_only=True)
class FakeJob(RunOptions):
    input: str  # JSON {key: value}
    factor: int = 2
    fail_after: int | None = None  # batches written before the stage dies
    lose: str | None = None  # a key the stage silently drops (a bug the row check must catch)
    folder: str | None = None  # an input folder besides the input file


class FakeStage(TableStage):
    command = "fake"
    tables = {"rows": ROWS}
    key_column = "key"
    needs_ray = False
    calls: ClassVar[dict[str, int]] = {}

    def plan(self) -> Plan:
        FakeStage.calls["plan"] = FakeStage.calls.get("plan", 0) + 1
        return Plan(config={"input": self.job.input, "factor": self.job.factor},
                    inputs=(self.job.input, *([self.job.folder] if self.job.folder else [])))

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        with open(self.job.input, encoding="utf-8") as fh:
            values = json.load(fh)
        return Work(keys=pa.array(sorted(values), pa.string()), n_in=len(values), data=values)

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> list[str]:
        old = pq.read_table(os.path.join(previous, "rows")).to_pylist()
        return [r["key"] for r in old if work.data.get(r["key"]) == r["value"] and r["factor"] == self.job.factor]

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext):
        skip_set = set(skip.to_pylist())
        keys = [k for k in work.keys.to_pylist() if k not in skip_set and k != self.job.lose]
        for n, i in enumerate(range(0, len(keys), 2)):
            if self.job.fail_after is not None and n == self.job.fail_after:
                raise Killed(f"killed after {n} batches")
            FakeStage.calls["batch"] = FakeStage.calls.get("batch", 0) + 1
            part = keys[i:i + 2]
            yield pa.table({"key": part, "value": [work.data[k] for k in part],
                            "factor": [self.job.factor] * len(part)}, schema=ROWS)

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> dict[str, int]:
        return {"sum": sum(v * self.job.factor for v in work.data.values())}


@pytest.fixture(autouse=True)
def _reset_calls():
    FakeStage.calls.clear()


def write_input(path, values: dict[str, int]) -> str:
    path.write_text(json.dumps(values), encoding="utf-8")
    return str(path)


def rows(run: str) -> list[dict[str, Any]]:
    return sorted(pq.read_table(os.path.join(run, "rows")).to_pylist(), key=lambda r: r["key"])


VALUES = {f"k{i}": i for i in range(7)}


def test_commit_counts_and_no_op_rerun(tmp_path):
    src = write_input(tmp_path / "in.json", VALUES)
    out = str(tmp_path / "out")
    path, manifest = run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1")))
    assert path == out and read_manifest(out)["run_id"] == "r1"
    assert [r["value"] for r in rows(out)] == list(range(7))
    c = manifest["counts"]
    assert (c["rows_in"], c["rows_new"], c["rows_carried"], c["rows_resumed"], c["sum"]) == (7, 7, 0, 0, 42)
    assert manifest["tables"] == {"rows": {"rows": 7, "files": 4}}
    assert not [d for d in os.listdir(tmp_path) if ".staging-" in d], "staging folder left behind"
    assert not os.path.exists(os.path.join(out, "_writes")) and not os.path.exists(os.path.join(out, "_run.json"))
    # a rerun of the committed id does nothing: no plan, no batch; the same manifest
    calls = dict(FakeStage.calls)
    again_path, again = run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1")))
    assert again == read_manifest(out) and FakeStage.calls == calls


def test_killed_run_resumes_with_the_same_settings(tmp_path):
    src = write_input(tmp_path / "in.json", VALUES)
    out = str(tmp_path / "out")
    with pytest.raises(Killed):
        run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1", fail_after=2)))
    assert not os.path.exists(out)
    _, manifest = run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1")))
    c = manifest["counts"]
    assert (c["rows_in"], c["rows_resumed"], c["rows_new"]) == (7, 4, 3)
    fresh, _ = run_stage(FakeStage(FakeJob(input=src, output=str(tmp_path / "fresh"))))
    assert rows(out) == rows(fresh)


def test_resume_with_other_settings_is_refused_never_mixed(tmp_path):
    src = write_input(tmp_path / "in.json", VALUES)
    out = str(tmp_path / "out")
    with pytest.raises(Killed):
        run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1", fail_after=1)))
    with pytest.raises(SettingsChangedError, match="other settings") as err:
        run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1", factor=3)))
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)  # the CLI's one line, exit 2
    assert not os.path.exists(out)
    # the first settings still resume; a new run id starts afresh with the new ones
    _, m = run_stage(FakeStage(FakeJob(input=src, output=out, run_id="r1")))
    assert m["counts"]["rows_resumed"] == 2 and {r["factor"] for r in rows(out)} == {2}
    _, m = run_stage(FakeStage(FakeJob(input=src, output=str(tmp_path / "o3"), run_id="r2", factor=3)))
    assert {r["factor"] for r in rows(str(tmp_path / "o3"))} == {3} and m["counts"]["rows_resumed"] == 0


def test_carry_from_previous_equals_a_fresh_run(tmp_path):
    out1 = str(tmp_path / "night1")
    run_stage(FakeStage(FakeJob(input=write_input(tmp_path / "a.json", VALUES), output=out1)))
    changed = VALUES | {"k1": 100, "k8": 8}
    del changed["k0"]
    src = write_input(tmp_path / "b.json", changed)
    out2 = str(tmp_path / "night2")
    FakeStage.calls.clear()
    _, manifest = run_stage(FakeStage(FakeJob(input=src, output=out2, previous=out1)))
    c = manifest["counts"]
    assert (c["rows_in"], c["rows_carried"], c["rows_new"]) == (7, 5, 2)  # k2..k6 carried; k1, k8 new
    assert FakeStage.calls["batch"] == 1
    fresh, _ = run_stage(FakeStage(FakeJob(input=src, output=str(tmp_path / "fresh"))))
    assert rows(out2) == rows(fresh)
    assert json.loads(manifest["config"])["previous"] == out1 and out1 in manifest["inputs"]
    # another setting carries nothing (the stage's own rule), and the result is still that of a fresh run
    _, m3 = run_stage(FakeStage(FakeJob(input=src, output=str(tmp_path / "n3"), previous=out1, factor=5)))
    assert m3["counts"]["rows_carried"] == 0 and {r["factor"] for r in rows(str(tmp_path / "n3"))} == {5}


def test_lost_rows_fail_the_run_and_commit_nothing(tmp_path):
    src = write_input(tmp_path / "in.json", VALUES)
    out = str(tmp_path / "out")
    with pytest.raises(RuntimeError, match=r"7 rows in but 6 written.*k3.*rows were lost"):
        run_stage(FakeStage(FakeJob(input=src, output=out, lose="k3")))
    assert not os.path.exists(out)


def test_output_inside_an_input_folder_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "data").mkdir()
    src = write_input(tmp_path / "data" / "in.json", VALUES)
    with pytest.raises(ValueError, match="inside the input folder"):
        run_stage(FakeStage(FakeJob(input=src, folder=str(tmp_path / "data"), output=str(tmp_path / "data" / "out"))))
    assert os.listdir(tmp_path / "data") == ["in.json"] and "plan" in FakeStage.calls


@dataclass(kw_only=True)
class PairJob(RunOptions):
    input: str
    second_input: str  # the second sub-run's input: it carries what is unchanged from the first
    factor: int = 2
    fail_in_second: bool = False


class PairStage(CompositeStage):
    """Two fake sub-runs under one folder, the second one fed by the first."""

    command = "pair"

    def plan(self) -> Plan:
        job = self.job
        return Plan(config={"input": job.input, "second_input": job.second_input, "factor": job.factor},
                    inputs=(job.input, job.second_input))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        job = self.job
        common = {"run_id": ctx.run_id, "factor": job.factor}
        a, ma = run_stage(FakeStage(FakeJob(input=job.input, output=os.path.join(ctx.staging, "a"), **common)))
        b, mb = run_stage(FakeStage(FakeJob(input=job.second_input, output=os.path.join(ctx.staging, "b"), previous=a,
                                            fail_after=0 if job.fail_in_second else None, **common)))
        return StageResult(tables={"a/rows": ma["tables"]["rows"], "b/rows": mb["tables"]["rows"]},
                           counts={f"b.{k}": mb["counts"][k] for k in ("rows_carried", "rows_new")})


def test_composite_run_commits_last_resumes_and_refuses_other_settings(tmp_path):
    src = write_input(tmp_path / "in.json", VALUES)
    src2 = write_input(tmp_path / "in2.json", VALUES | {"k1": 100})
    out = str(tmp_path / "pair")
    with pytest.raises(Killed):
        run_stage(PairStage(PairJob(input=src, second_input=src2, output=out, run_id="p1", fail_in_second=True)))
    assert os.path.isfile(os.path.join(out, "a", "manifest.json")) and not os.path.exists(
        os.path.join(out, "manifest.json")), "sub-run a committed, the composite not"
    with pytest.raises(SettingsChangedError):
        run_stage(PairStage(PairJob(input=src, second_input=src2, output=out, run_id="p1", factor=9)))
    FakeStage.calls.clear()
    path, manifest = run_stage(PairStage(PairJob(input=src, second_input=src2, output=out, run_id="p1")))
    assert manifest["counts"] == {"b.rows_carried": 6, "b.rows_new": 1} and read_manifest(out)["command"] == "pair"
    assert FakeStage.calls.get("batch", 0) == 1, "sub-run a was redone"
    assert os.path.isfile(os.path.join(out, "report.json"))
    # a user's non-empty folder is never taken over
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not a run folder"):
        run_stage(PairStage(PairJob(input=src, second_input=src2, output=str(tmp_path / "mine"))))
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_unchanged_files_are_carried_by_reference_and_never_dangle(tmp_path):
    """A previous file whose rows are all unchanged becomes a hard link (same inode, nothing rewritten); one
    with a changed row is rewritten; deleting the previous run afterwards leaves the new run whole."""
    out1 = str(tmp_path / "night1")
    run_stage(FakeStage(FakeJob(input=write_input(tmp_path / "a.json", VALUES), output=out1)))
    src = write_input(tmp_path / "b.json", VALUES | {"k6": 60})  # k6 shares its file with k7? no: with k4, k5
    out2 = str(tmp_path / "night2")
    _, m = run_stage(FakeStage(FakeJob(input=src, output=out2, previous=out1)))
    c = m["counts"]
    assert c["carried_files.link"] == 3 and c.get("carried_files.rewritten", 0) == 0 and c["rows_new"] == 1, c
    inodes1 = {os.stat(os.path.join(out1, "rows", f)).st_ino for f in os.listdir(os.path.join(out1, "rows"))}
    inodes2 = {os.stat(os.path.join(out2, "rows", f)).st_ino for f in os.listdir(os.path.join(out2, "rows"))}
    assert len(inodes1 & inodes2) == 3
    index = json.loads((tmp_path / "night2" / "files.json").read_text())
    assert sum(f["rows"] for f in index["rows"].values()) == 7
    import shutil

    shutil.rmtree(out1)
    assert [r["value"] for r in rows(out2)] == [0, 1, 2, 3, 4, 5, 60]


def test_a_previous_file_that_changed_after_its_commit_is_not_carried(tmp_path):
    out1 = str(tmp_path / "night1")
    run_stage(FakeStage(FakeJob(input=write_input(tmp_path / "a.json", VALUES), output=out1)))
    victim = sorted(os.listdir(os.path.join(out1, "rows")))[0]
    table = pq.read_table(os.path.join(out1, "rows", victim))
    forged = table.set_column(1, "value", pa.array([999] * table.num_rows, pa.int64()))
    pq.write_table(forged, os.path.join(out1, "rows", victim))  # edited in place: its digest no longer matches
    _, m = run_stage(FakeStage(FakeJob(input=write_input(tmp_path / "b.json", VALUES), output=str(tmp_path / "n2"),
                                       previous=out1)))
    assert m["counts"]["rows_new"] == table.num_rows and m["counts"]["rows_carried"] == 7 - table.num_rows
    assert [r["value"] for r in rows(str(tmp_path / "n2"))] == list(range(7)), "forged rows carried"


def test_compaction_bounds_files_across_nights_and_survives_a_kill(tmp_path, monkeypatch):
    """Each night adds a few small files; compaction merges small files once there are more than
    ``max_small_files``, so the count stays bounded; killed right after a merge is recorded, a rerun with
    the same id ends with the same rows and no file counted twice."""
    from verbatim_batch.core.faults import InjectedFault

    values = {f"k{i:03d}": i for i in range(40)}
    tiny = {"target_file_mb": 0.02, "max_small_files": 4}  # files here are about 1 KB: all "small"
    prev = None
    counts = []
    for night in range(4):
        values = values | {f"k{night * 7:03d}": 1000 + night}
        out = str(tmp_path / f"night{night}")
        job = FakeJob(input=write_input(tmp_path / f"in{night}.json", values), output=out, previous=prev, **tiny)
        _, m = run_stage(FakeStage(job))
        assert [r["value"] for r in rows(out)] == [values[k] for k in sorted(values)]
        counts.append(m["tables"]["rows"]["files"])
        assert len([f for f in os.listdir(os.path.join(out, "rows"))]) == counts[-1]
        prev = out
    assert counts[0] < 20 and max(counts) <= 4 + 1 + 3, counts  # 20 writes, merged; small files stay bounded
    out = str(tmp_path / "killed")
    job = FakeJob(input=write_input(tmp_path / "in.json", values), output=out, run_id="r1", **tiny)
    monkeypatch.setenv("VERBATIM_BATCH_FAULT", f"compact.recorded@{tmp_path / 'fired'};action=raise")
    with pytest.raises(InjectedFault):
        run_stage(FakeStage(job))
    monkeypatch.delenv("VERBATIM_BATCH_FAULT")
    _, m = run_stage(FakeStage(job))
    assert m["tables"]["rows"]["rows"] == 40 and m["counts"]["rows_resumed"] == 40
    assert [r["value"] for r in rows(out)] == [values[k] for k in sorted(values)]
