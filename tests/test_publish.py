"""``verbatim-batch publish`` and ``nightly --warehouse``: nights as current-state Apache Iceberg tables in a real
pyiceberg SQL catalog on SQLite, read back by pyiceberg.

Unit (no Ray; runs made here, each a committed run folder with its files.json): the published schemas are
tables.py's with ``night`` and ``row_hash`` (one declaration, keys as identifier fields); a night commits one
snapshot that deletes the rows that left or changed and adds the new ones, unchanged rows stay in their files;
each night is a tag; a night that changed nothing writes no data file; a republish is a no-op; --keep-nights
expires and deletes only what no kept tag reads; a tampered run, a damaged, read-only or locked catalog are
refused in one line (exit 2); publishes at once each land once; tables of the previous release are refused, then
converted by --convert. E2E (the session's nightly baseline): the CLI publishes a night, which pyiceberg,
``ray.data.read_iceberg``, pandas and duckdb read as the run's own tables; a night killed while publishing leaves
every table as it was, and rerunning completes it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import nightly

from verbatim_batch.cli import config, main
from verbatim_batch.core import storage, tables
from verbatim_batch.engine.lake import (
    NIGHT,
    PUBLISHED,
    IcebergTarget,
    arrow_schema,
    conform,
    ensure_table,
    night_snapshot,
    open_catalog,
    published_nights,
)
from verbatim_batch.engine.lake_state import ROW_HASH

pytest.importorskip("pyiceberg")

CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_plain(t.value_type))
    return t


# --- unit: schemas, nights as commits, refusals ----------------------------------------------------------------


def test_published_schemas_are_tables_py_schemas_with_night_and_row_hash_keyed_by_the_declared_keys(tmp_path):
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    catalog = open_catalog(IcebergTarget(warehouse=str(tmp_path / "lake")))
    assert (tmp_path / "lake" / "catalog.db").is_file()  # the default: pyiceberg's SQL catalog on SQLite
    source = {"chunks": tables.CHUNKS, "retrieval": tables.RETRIEVAL, "pairs": tables.PAIRS, "spans": tables.SPANS}
    assert set(PUBLISHED) == set(source) == set(tables.PUBLISHED_KEYS)
    for name, schema in source.items():
        table = ensure_table(catalog, "verbatim", name)
        got = schema_to_pyarrow(table.schema(), include_field_ids=False)
        assert got.names == [NIGHT, *schema.names, ROW_HASH], name
        assert not got.field(NIGHT).nullable and not got.field(ROW_HASH).nullable
        for field in schema:  # same type (Iceberg has one string type) and the same required columns
            assert _plain(got.field(field.name).type) == _plain(field.type), (name, field.name)
            assert got.field(field.name).nullable == field.nullable, (name, field.name)
        keys = [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids]
        assert set(keys) == set(tables.PUBLISHED_KEYS[name]) and not table.spec().fields, name  # keyed, unpartitioned
        assert ensure_table(catalog, "verbatim", name).metadata_location == table.metadata_location  # reused


def test_a_table_of_that_name_with_other_columns_is_refused(tmp_path):
    catalog = open_catalog(IcebergTarget(warehouse=str(tmp_path / "lake")))
    catalog.create_namespace("verbatim")
    catalog.create_table(("verbatim", "spans"), schema=pa.schema([("x", pa.int64())]))
    with pytest.raises(ValueError, match="not a table of ours .*another --namespace"):
        ensure_table(catalog, "verbatim", "spans")


def _chunk(i: int, text: str | None = None) -> dict:
    body = text or f"chunk {i} of the paper, its text"
    return {"chunk_id": f"c{i}", "paper_id": f"p{i % 2}", "chunk_index": i, "start": 0, "end": len(body),
            "byte_start": 0, "byte_end": len(body), "text": body, "context": "", "heading_path": ["Intro"],
            "n_chars": len(body), "flags": [], "paper_sha256": "s", "normalization": "", "chunker_config_hash": "h"}


def _run(folder: Path, run_id: str, rows: list[dict], compression: str = "zstd") -> Path:
    """A committed chunk run as ``publish`` reads one: manifest.json, chunks/*.parquet and files.json."""
    run = folder / run_id
    (run / "chunks").mkdir(parents=True)
    part = run / "chunks" / "part-0.parquet"
    pq.write_table(tables.to_table(rows, tables.CHUNKS), part, compression=compression)
    (run / "files.json").write_text(json.dumps({"chunks": {"part-0.parquet": {
        "rows": len(rows), "bytes": part.stat().st_size, "digest": storage.file_digest(str(part)), "counts": {}}}}))
    (run / "manifest.json").write_text(json.dumps({
        "command": "chunk", "run_id": run_id, "created_at": "2026-12-01T00:00:00+00:00", "config": "{}",
        "tables": {"chunks": {"files": 1, "rows": len(rows)}}}))
    return run


def _publish(run: Path, lake: Path, **target) -> dict:
    from verbatim_batch.stages.publish import PublishJob, run_publish

    return run_publish(PublishJob(source=str(run), target=IcebergTarget(warehouse=str(lake), **target)))


def _chunks(lake: Path):
    return open_catalog(IcebergTarget(warehouse=str(lake))).load_table(("verbatim", "chunks"))


def _state(table, snapshot_id: int | None = None) -> dict[str, tuple[str, str]]:
    rows = table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return {r["chunk_id"]: (r["night"], r["text"]) for r in rows}


def _data_files(lake: Path) -> set[str]:
    return {p.name for p in lake.rglob("data/*.parquet")}


def test_a_night_commits_what_changed_as_one_tagged_snapshot_and_an_unchanged_night_writes_no_data_file(tmp_path):
    lake, runs = tmp_path / "lake", tmp_path / "runs"
    first = [_chunk(i) for i in range(5)]
    done = _publish(_run(runs, "r1", first), lake)["tables"][0]
    assert done["published"] and done["rows"] == 5 and done["deleted"] == 0
    table = _chunks(lake)
    assert _state(table) == {f"c{i}": ("r1", first[i]["text"]) for i in range(5)}

    # r2: c0 edited, c4 gone, c5 new: one snapshot deleting two rows and adding two, the others untouched
    second = [_chunk(0, "chunk 0, edited"), *first[1:4], _chunk(5)]
    done = _publish(_run(runs, "r2", second), lake)["tables"][0]
    assert (done["rows"], done["deleted"], done["files"]) == (2, 2, 1)
    table = _chunks(lake)
    assert len(table.snapshots()) == 2
    summary = table.current_snapshot().summary.additional_properties
    assert summary["added-records"] == "2" and summary["added-position-deletes"] == "2"
    assert summary["verbatim.night"] == "r2" and summary["verbatim.fingerprint"]
    assert _state(table) == {"c0": ("r2", "chunk 0, edited"), **{f"c{i}": ("r1", first[i]["text"])
                                                                   for i in (1, 2, 3)}, "c5": ("r2", second[4]["text"])}
    assert _state(table, night_snapshot(table, "r1")) == {f"c{i}": ("r1", first[i]["text"]) for i in range(5)}
    assert set(table.metadata.refs) == {"main", "night-r1", "night-r2"}

    # r3: the same rows in the same bytes, r4: the same rows in other bytes: tags only, no data file
    files = _data_files(lake)
    shutil.copytree(runs / "r2", runs / "r3")
    manifest = json.loads((runs / "r3" / "manifest.json").read_text())
    (runs / "r3" / "manifest.json").write_text(json.dumps(manifest | {"run_id": "r3"}))
    _publish(runs / "r3", lake)
    _publish(_run(runs, "r4", second, compression="snappy"), lake)
    table = _chunks(lake)
    assert len(table.snapshots()) == 2 and _data_files(lake) == files
    assert night_snapshot(table, "r3") == night_snapshot(table, "r4") == night_snapshot(table, "r2")
    assert [n for n, _, _ in published_nights(table)] == ["r1", "r2", "r3", "r4"]

    # publishing a night again changes nothing, not even the table's metadata
    location = table.metadata_location
    assert not _publish(runs / "r2", lake)["tables"][0]["published"]
    assert _chunks(lake).metadata_location == location

    # a night without rows empties the table (whole files dropped, no delete file)
    _publish(_run(runs, "r5", []), lake)
    table = _chunks(lake)
    assert table.scan().to_arrow().num_rows == 0 and len(table.snapshots()) == 3
    assert len(_state(table, night_snapshot(table, "r2"))) == 5


def _carried_night(runs: Path, previous: Path, run_id: str, keep: list[str], fresh: list[dict]) -> Path:
    """A chunk night as a run with ``--previous`` commits it: the previous night's rows of ``keep`` carried by the
    sink (its one file rewritten, with the rows it came from in files.json), ``fresh`` rows in a file of their
    own."""
    from verbatim_batch.engine.sink import (
        carry_rows,
        no_counts,
        record_write,
        sum_live_files,
        write_files_index,
        write_table_file,
    )

    run = runs / run_id
    _, counts = carry_rows(str(previous), {"chunks": tables.CHUNKS}, "chunk_id", keep, str(run))
    assert counts["files_rewritten"] == 1, counts
    path, stats = write_table_file(str(run), "chunks", "part-fresh", tables.to_table(fresh, tables.CHUNKS),
                                   tables.CHUNKS, no_counts)
    record_write(str(run), "fresh", {"rows": {"chunks": len(fresh)}, "files": {"chunks": path}, "counts": {},
                                     "stats": {path: stats}})
    write_files_index(str(run), sum_live_files(str(run), {"chunks": tables.CHUNKS}), ["chunks"])
    (run / "manifest.json").write_text(json.dumps({
        "command": "chunk", "run_id": run_id, "created_at": "2026-12-01T00:00:00+00:00", "config": "{}",
        "tables": {"chunks": {"files": 2, "rows": len(keep) + len(fresh)}}}))
    return run


def test_a_carried_file_takes_the_recorded_hashes_of_the_rows_it_came_from_and_publishes_them_exactly(
        tmp_path, monkeypatch):
    """A night whose run rewrote the previous night's unchanged rows into a new file (``--previous``: the sink
    keeps the rows of unchanged papers and records which rows of which file they are) is compared without reading
    that file's rows: its row hashes are those recorded for the rows it came from, once its own key column matches
    theirs. A provenance that does not match (other rows, a count that differs) is not used: the file is read and
    hashed. Either way the published rows are the run's rows, each with the hash of its own columns."""
    import verbatim_batch.stages.publish as publish
    from verbatim_batch.engine.lake_state import row_hashes

    lake, runs = tmp_path / "lake", tmp_path / "runs"
    first = [_chunk(i) for i in range(8)]
    r1 = _run(runs, "r1", first)
    _publish(r1, lake)
    keep = [f"c{i}" for i in (0, 1, 3, 4, 6, 7)]  # c2 edited, c5 gone, c8 new
    fresh = [_chunk(2, "chunk 2, edited"), _chunk(8)]
    r2 = _carried_night(runs, r1, "r2", keep, fresh)
    index = json.loads((r2 / "files.json").read_text())["chunks"]
    carried = next(name for name in index if name.startswith("part-carried-"))
    assert index[carried]["carried_from"] == {"digest": storage.file_digest(str(r1 / "chunks" / "part-0.parquet")),
                                              "rows": [[0, 2], [3, 5], [6, 8]]}

    read: list[str] = []
    real_read = storage.read_parquet

    def spy(loc, columns=None, filter=None):
        read.append(f"{Path(loc).name}:{'rows' if columns is None else ','.join(columns)}")
        return real_read(loc, columns=columns, filter=filter)

    monkeypatch.setattr(publish.storage, "read_parquet", spy)
    done = _publish(r2, lake)["tables"][0]
    assert (done["rows"], done["deleted"]) == (2, 2)  # c2's new row and c8 added; c2's old row and c5 deleted
    assert f"{carried}:chunk_id" in read and f"{carried}:rows" not in read, read  # its key column only
    assert "part-fresh.parquet:rows" in read

    def published_rows(table) -> list[dict]:
        got = table.scan().to_arrow()
        assert got[ROW_HASH].to_pylist() == row_hashes(got).tolist()  # each row's hash is that of its columns
        return sorted(got.drop_columns([NIGHT, ROW_HASH]).to_pylist(), key=lambda r: r["chunk_id"])

    run_rows = sorted(pq.read_table(r2 / "chunks").to_pylist(), key=lambda r: r["chunk_id"])
    assert published_rows(_chunks(lake)) == run_rows
    assert _state(_chunks(lake))["c3"][0] == "r1" and _state(_chunks(lake))["c2"][0] == "r2"

    # a provenance naming other rows of that file (as many): refused by the key column, the file read and hashed
    keep3 = [f"c{i}" for i in (0, 1, 3, 4, 6)]  # c7 and c8 gone, c2 the same row in a new file, c9 new
    r3 = _carried_night(runs, r2, "r3", keep3, [_chunk(2, "chunk 2, edited"), _chunk(9)])
    index = json.loads((r3 / "files.json").read_text())
    carried3 = next(name for name in index["chunks"] if name.startswith("part-carried-"))
    honest = index["chunks"][carried3]["carried_from"]
    assert honest["rows"] == [[0, 5]]
    index["chunks"][carried3]["carried_from"] = {"digest": honest["digest"], "rows": [[1, 6]]}  # shifted by one
    (r3 / "files.json").write_text(json.dumps(index))
    read.clear()
    done = _publish(r3, lake)["tables"][0]
    assert f"{carried3}:rows" in read, read
    assert (done["rows"], done["deleted"]) == (1, 2)  # c9 added, c7 and c8 deleted: nothing else moved
    run_rows = sorted(pq.read_table(r3 / "chunks").to_pylist(), key=lambda r: r["chunk_id"])
    assert published_rows(_chunks(lake)) == run_rows


def test_keep_nights_expires_what_no_kept_tag_reads_and_deletes_only_those_files(tmp_path):
    lake, runs = tmp_path / "lake", tmp_path / "runs"
    states = [[_chunk(i, f"night {n} chunk {i}" if i == n else None) for i in range(4)] for n in range(4)]
    for n, rows in enumerate(states):
        _publish(_run(runs, f"r{n}", rows), lake, keep_nights=2)
    table = _chunks(lake)
    assert set(table.metadata.refs) == {"main", "night-r2", "night-r3"}
    assert len(table.snapshots()) == 2
    for n in (2, 3):  # every kept night still reads whole
        assert sorted(t for _, t in _state(table, night_snapshot(table, f"r{n}")).values()) == \
            sorted(r["text"] for r in states[n])
    referenced = {e.data_file.file_path.rsplit("/", 1)[-1] for s in table.snapshots()
                  for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io)}
    assert _data_files(lake) == referenced  # the files only r0's and r1's snapshots read are gone
def _refused(capsys, argv: list[str], message: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    return err


def test_a_run_changed_after_its_commit_is_refused_naming_verify_before_anything_is_written(tmp_path, capsys):
    run = _run(tmp_path / "runs", "r1", [_chunk(i) for i in range(3)])
    part = run / "chunks" / "part-0.parquet"
    pq.write_table(tables.to_table([_chunk(0, "tampered")], tables.CHUNKS), part)  # replaced after the commit
    lake = tmp_path / "lake"
    _refused(capsys, ["publish", str(run), "--warehouse", str(lake)], "verbatim-batch verify")
    table = _chunks(lake)
    assert table.current_snapshot() is None and not _data_files(lake)  # nothing reached the lake


def test_a_damaged_read_only_or_locked_catalog_and_bad_names_are_refused_in_one_line(tmp_path, capsys):
    run = _run(tmp_path / "runs", "r1", [_chunk(i) for i in range(3)])
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "catalog.db").write_bytes(b"this is not a database" * 100)
    err = _refused(capsys, ["publish", str(run), "--warehouse", str(damaged)], "damaged")
    assert str(damaged / "catalog.db") in err and "new --warehouse" in err

    lake = tmp_path / "lake"
    _publish(run, lake)  # a catalog with tables
    ro = f"sqlite:///file:{lake}/catalog.db?mode=ro&uri=true"
    run2 = _run(tmp_path / "runs", "r2", [_chunk(i) for i in range(4)])
    _refused(capsys, ["publish", str(run2), "--warehouse", str(lake), "--catalog-uri", ro], "read-only")

    holder = sqlite3.connect(lake / "catalog.db", timeout=0)
    holder.execute("BEGIN EXCLUSIVE")  # another process's write lock on the catalog, held past the wait
    try:
        err = _refused(capsys, ["publish", str(run2), "--warehouse", str(lake)], "locked by another process")
        assert str(lake / "catalog.db") in err
    finally:
        holder.rollback()
        holder.close()
    assert len(_chunks(lake).snapshots()) == 1  # nothing published halfway
    _refused(capsys, ["publish", str(run2), "--warehouse", str(lake), "--namespace", "n" * 300], "at most 100")


def test_a_warehouse_this_user_cannot_write_is_refused_in_one_line(tmp_path, capsys):
    run = _run(tmp_path / "runs", "r1", [_chunk(i) for i in range(3)])
    lake = tmp_path / "lake"
    lake.mkdir()
    os.chmod(lake, 0o555)
    try:
        if os.access(lake, os.W_OK):  # root writes anywhere: a folder sysfs refuses to make instead
            lake = Path("/sys/verbatim-batch-test-lake")
        err = _refused(capsys, ["publish", str(run), "--warehouse", str(lake)], "writable")
        assert str(lake) in err
    finally:
        os.chmod(tmp_path / "lake", 0o755)


def test_publishes_at_once_publish_every_night_exactly_once_without_a_traceback(tmp_path):
    runs, lake = tmp_path / "runs", tmp_path / "lake"
    _publish(_run(runs, "r0", [_chunk(i) for i in range(4)]), lake)
    nights = {f"r{n}": _run(runs, f"r{n}", [_chunk(i, f"night {n} chunk {i}" if i == n else None)
                                             for i in range(4)]) for n in (1, 2)}
    procs = [subprocess.Popen([*CLI, "publish", str(nights[n]), "--warehouse", str(lake)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in ("r1", "r2", "r1")]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "Traceback" not in err, err[-3000:]
    table = _chunks(lake)
    assert sorted(n for n, _, _ in published_nights(table)) == ["r0", "r1", "r2"]
    assert len(table.snapshots()) == 3  # r1 once, r2 once
    last = published_nights(table)[-1][0]
    assert {c: t for c, (_, t) in _state(table).items()} == {r["chunk_id"]: r["text"] for r in pq.read_table(
        nights[last] / "chunks").to_pylist()}  # the state is the night committed last, whole


def _old_release_table(catalog, nights: dict[str, list[dict]]) -> None:
    """chunks as the previous release wrote it: night + the run's columns, a partition per night, one snapshot
    per night with the night in its summary."""
    catalog.create_namespace_if_not_exists("verbatim")
    schema = pa.schema([pa.field(NIGHT, pa.string(), nullable=False), *tables.CHUNKS])
    with catalog.create_table_transaction(("verbatim", "chunks"), schema=schema) as txn:
        with txn.update_spec() as spec:
            spec.add_identity(NIGHT)
    table = catalog.load_table(("verbatim", "chunks"))
    for night, rows in nights.items():
        run = tables.to_table(rows, tables.CHUNKS)
        batch = pa.Table.from_arrays([pa.array([night] * run.num_rows), *run.columns], schema=schema)
        table.append(batch, snapshot_properties={"verbatim.night": night, "verbatim.fingerprint": "fp-" + night})
        with table.transaction() as txn:
            txn.set_properties({"verbatim.night": night})
        table = catalog.load_table(("verbatim", "chunks"))


def test_tables_of_the_previous_release_are_refused_then_converted_by_one_command(tmp_path, capsys):
    lake = tmp_path / "lake"
    old = {"o1": [_chunk(i) for i in range(3)], "o2": [_chunk(0, "edited"), _chunk(1), _chunk(3)]}
    _old_release_table(open_catalog(IcebergTarget(warehouse=str(lake))), old)
    run = _run(tmp_path / "runs", "r3", old["o2"])
    _refused(capsys, ["publish", str(run), "--warehouse", str(lake)], "publish SOURCE --convert")
    assert main(["publish", str(run), "--warehouse", str(lake), "--convert"]) == 0
    assert "verbatim.chunks converted to a current-state table: 2 nights as tags" in capsys.readouterr().out
    table = _chunks(lake)
    assert [n for n, _, _ in published_nights(table)] == ["o1", "o2", "r3"]
    for night, rows in old.items():  # every earlier night, by its tag
        assert {c: t for c, (_, t) in _state(table, night_snapshot(table, night)).items()} == \
            {r["chunk_id"]: r["text"] for r in rows}
    assert _state(table)["c1"] == ("o1", _chunk(1)["text"])  # an unchanged row keeps the night that wrote it
    assert night_snapshot(table, "r3") == night_snapshot(table, "o2")  # r3 has o2's rows: a tag, no data file


def test_without_the_iceberg_extra_publish_and_a_publishing_night_name_it_exit_2(tmp_path):
    block = "import sys; sys.modules['pyiceberg'] = None; from verbatim_batch.cli import main; sys.exit(main())"
    examples = Path(__file__).resolve().parents[1] / "verbatim_batch" / "examples"
    for argv in (["publish", str(tmp_path), "--warehouse", str(tmp_path / "lake")],
                 ["nightly", "--input", str(examples / "corpus"), "--queries", str(examples / "queries.jsonl"),
                  "--root", str(tmp_path / "root"), "--warehouse", str(tmp_path / "lake")]):
        done = subprocess.run([sys.executable, "-c", block, *argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip().splitlines() == [
            f"verbatim-batch {argv[0]}: error: publishing needs the iceberg extra: pip install "
            "'verbatim-batch[iceberg]'"], done.stderr[-2000:]
    assert not (tmp_path / "root").exists()  # the night was refused before it ran


def _rows(n: int) -> pa.Table:
    base = {"run_id": "r", "query_id": "q", "query": "what", "start": 0, "end": 1, "text": "t",
            "extractor": "semantic", "config_hash": "h"}
    return tables.to_table([base | {"pair_id": f"p{i}"} for i in range(n)], tables.SPANS)


def test_conform_puts_night_first_and_fills_columns_older_runs_lack():
    rows = _rows(2).drop_columns(["align"])  # a run written before the column existed
    out = conform(rows, "spans", "n1")
    assert out.schema.equals(arrow_schema("spans")) and out[ROW_HASH].null_count == 0
    assert out[NIGHT].to_pylist() == ["n1", "n1"] and out["align"].null_count == 2
    with pytest.raises(ValueError, match="no column text"):
        conform(rows.drop_columns(["text"]), "spans", "n1")


def test_bad_sources_and_targets_are_refused_in_one_line(tmp_path, capsys):
    lake = str(tmp_path / "lake")
    _refused(capsys, ["publish", str(tmp_path / "nope"), "--warehouse", lake], "not found")
    (tmp_path / "folder").mkdir()
    _refused(capsys, ["publish", str(tmp_path / "folder"), "--warehouse", lake], "neither a nightly root")
    (tmp_path / "root" / "runs").mkdir(parents=True)
    _refused(capsys, ["publish", str(tmp_path / "root"), "--warehouse", lake], "no committed night yet")
    _refused(capsys, ["publish", str(tmp_path / "root"), "--warehouse", "s3://bucket/lake"], "--catalog-uri")
    _refused(capsys, ["publish", str(tmp_path / "root"), "--warehouse", lake, "--namespace", "a.b"], "--namespace")
    assert not (tmp_path / "lake").exists()  # nothing is created for a refused publish


def test_a_publish_section_configures_nightly_below_its_own_section(tmp_path):
    conf = tmp_path / "conf.yaml"
    conf.write_text("namespace: top\nkeep_nights: 9\npublish:\n  warehouse: /data/lake\n  namespace: pub\n"
                    "nightly:\n  root: /data/nightly\n  keep_nights: 3\n")
    ignored: list[str] = []
    night = config.load_config(str(conf), "nightly", ignored)
    assert (night["warehouse"], night["namespace"], night["keep_nights"]) == ("/data/lake", "pub", 3)
    assert not ignored
    publish = config.load_config(str(conf), "publish")
    assert (publish["warehouse"], publish["namespace"], publish["keep_nights"]) == ("/data/lake", "pub", 9)
    run = config.load_config(str(conf), "run", ignored)  # run takes no publish options: the section is not used
    assert "warehouse" not in run and "section 'publish'" in ignored


# --- e2e: a real night, published, read, killed and resumed ----------------------------------------------------


def _copy_root(baseline: dict, dest: Path) -> Path:
    root = dest / "root"
    shutil.copytree(baseline["root"], root, symlinks=True)
    return root


def _cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=600, env=base | (env or {}))


def _catalog(lake: Path):
    return open_catalog(IcebergTarget(warehouse=str(lake)))


def _snapshots(lake: Path) -> dict[str, list[int]]:
    catalog = _catalog(lake)
    return {name: [s.snapshot_id for s in catalog.load_table(("verbatim", name)).snapshots()] for name in PUBLISHED}


@pytest.fixture(scope="module")
def published(nightly_baseline, tmp_path_factory):
    """The baseline night r1 published by the CLI (small and local: written in its own process), once per module."""
    tmp = tmp_path_factory.mktemp("published")
    root, lake = _copy_root(nightly_baseline, tmp), tmp / "lake"
    done = _cli("publish", str(root), "--warehouse", str(lake), "--num-cpus", "2")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "night r1 published" in done.stdout and done.stdout.count("written by driver") == 4, done.stdout
    assert "Started a local Ray" not in done.stderr
    return {"root": root, "lake": lake, "run": root / "runs" / "r1",
            "spans": pq.read_table(root / "runs" / "r1" / "spans" / "spans")}


def test_read_with_pyiceberg_every_table_is_the_nights_run_table(published):
    for name, spec in PUBLISHED.items():
        want = pq.read_table(published["run"] / spec.stage / name)
        table = _catalog(published["lake"]).load_table(("verbatim", name))
        got = table.scan().to_arrow()  # the current state: a plain scan, no filter by night
        assert got.num_rows == want.num_rows > 0, name
        assert got.column_names == [NIGHT, *want.column_names, ROW_HASH], name
        assert set(got[NIGHT].to_pylist()) == {table.properties["verbatim.night"]} == {"r1"}
        rows = sorted(got.drop_columns([NIGHT, ROW_HASH]).to_pylist(), key=str)  # every row, as the run wrote it
        assert rows == sorted(want.to_pylist(), key=str), name


def test_read_with_pandas(published):
    frame = _catalog(published["lake"]).load_table(("verbatim", "spans")).scan().to_pandas()
    assert sorted(frame["text"]) == sorted(published["spans"]["text"].to_pylist())
    assert set(frame["night"]) == {"r1"}


def test_read_with_duckdb_through_arrow(published):
    import duckdb

    con = duckdb.connect()
    con.register("spans", _catalog(published["lake"]).load_table(("verbatim", "spans")).scan().to_arrow())
    assert con.sql("SELECT count(*) FROM spans WHERE night = 'r1'").fetchall() == [(published["spans"].num_rows,)]


def test_read_with_ray(published, ray_local):
    import ray
    from ray.data.expressions import col

    kwargs = {"name": "verbatim", "type": "sql", "uri": f"sqlite:///{published['lake']}/catalog.db"}
    ds = ray.data.read_iceberg(table_identifier="verbatim.spans", catalog_kwargs=kwargs)
    pair_ids = sorted(r["pair_id"] for r in ds.filter(expr=col("night") == "r1").take_all())
    assert pair_ids == sorted(published["spans"]["pair_id"].to_pylist())
    tagged = night_snapshot(_catalog(published["lake"]).load_table(("verbatim", "spans")), "r1")
    by_tag = ray.data.read_iceberg(table_identifier="verbatim.spans", catalog_kwargs=kwargs, snapshot_id=tagged)
    assert sorted(r["pair_id"] for r in by_tag.take_all()) == pair_ids  # the night read back by its tag


def test_publishing_the_same_night_again_adds_nothing(published):
    before = _snapshots(published["lake"])
    again = _cli("publish", str(published["root"]), "--warehouse", str(published["lake"]))
    assert again.returncode == 0 and again.stdout.count("nothing to do") == 4, again.stdout + again.stderr[-2000:]
    assert _snapshots(published["lake"]) == before and all(len(s) == 1 for s in before.values())
    assert "Started a local Ray" not in again.stderr


def test_a_killed_publish_leaves_the_last_snapshot_and_a_rerun_completes(nightly_baseline, ray_local, tmp_path):
    from verbatim_batch.stages.publish import PublishJob, run_publish

    root, lake = _copy_root(nightly_baseline, tmp_path), tmp_path / "lake"
    result = run_publish(PublishJob(source=str(root), target=IcebergTarget(warehouse=str(lake)), address="local"))
    assert {t["written_by"] for t in result["tables"]} == {"ray"}  # r1, with an address: Ray's tasks write
    first = _snapshots(lake)
    r1_spans = _catalog(lake).load_table(("verbatim", "spans")).scan().to_arrow()

    # night r2 publishes as it commits; SIGKILLed (its driver) while the Ray tasks write the first table's files
    marker = tmp_path / "fired"
    killed = nightly(root, nightly_baseline["corpus"], "r2", "--warehouse", str(lake), check=False,
                     env={"VERBATIM_BATCH_FAULT": f"publish.write@{marker};target=driver"})
    assert killed.returncode == -9 and marker.exists(), killed.stderr[-3000:]
    assert (root / "CURRENT").read_text().strip() == "r2"  # the night itself committed
    assert _snapshots(lake) == first  # every table still at r1's snapshot, and reads
    table = _catalog(lake).load_table(("verbatim", "spans"))
    assert table.properties["verbatim.night"] == "r1" and table.scan().to_arrow().equals(r1_spans)

    # `publish` killed after its data files are written, before the first commit: still nothing committed
    marker2 = tmp_path / "fired2"
    done = _cli("publish", str(root), "--warehouse", str(lake), "--num-cpus", "2",
                env={"VERBATIM_BATCH_FAULT": f"publish.commit@{marker2}"})
    assert done.returncode == -9 and marker2.exists(), done.stderr[-3000:]
    assert _snapshots(lake) == first

    # the night rerun (same run id): committed already, so it only publishes, and completes
    rerun = nightly(root, nightly_baseline["corpus"], "r2", "--warehouse", str(lake))
    assert "night r2 published" in rerun.stdout, rerun.stdout
    now = _snapshots(lake)
    catalog = _catalog(lake)
    for name, spec in PUBLISHED.items():
        assert now[name][:1] == first[name] and len(now[name]) <= 2, name  # at most one more snapshot per table
        table = catalog.load_table(("verbatim", name))
        assert [n for n, _, _ in published_nights(table)] == ["r1", "r2"]
        for night in ("r1", "r2"):  # the current state is r2's tables, and r1 reads back by its tag
            want = pq.read_table(root / "runs" / night / spec.stage / name).to_pylist()
            got = table.scan(snapshot_id=night_snapshot(table, night)).to_arrow()
            assert sorted(got.drop_columns([NIGHT, ROW_HASH]).to_pylist(), key=str) == sorted(want, key=str), name
        assert table.scan().to_arrow().num_rows == len(want), name
