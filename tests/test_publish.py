"""``verbatim-batch publish`` and ``nightly --warehouse``: nights as Apache Iceberg tables in a real pyiceberg SQL
catalog on SQLite.

Unit (no Ray): the published schemas are tables.py's (one declaration), a commit is one snapshot that replaces
its night's partition, a night already published is a no-op, older nights are dropped by --keep-nights in the same
snapshot and stay readable by time travel, refusals are one line (exit 2), the iceberg extra missing is named,
and a ``publish:`` section configures nightly. E2E (the session's nightly baseline): the CLI publishes a night
(small and local: written in its own process), which pyiceberg, ``ray.data.read_iceberg``, pandas and duckdb read
as the run's own tables; a republish adds no snapshot; where Ray is up its tasks write the files; a night killed
(SIGKILL) while publishing, and a publish killed before its commit, leave every table at its last snapshot, and
rerunning completes it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import nightly

from verbatim_batch.cli import config, main
from verbatim_batch.core import tables
from verbatim_batch.engine.lake import (
    NIGHT,
    PUBLISHED,
    IcebergTarget,
    arrow_schema,
    commit_night,
    conform,
    ensure_table,
    is_published,
    night_snapshot,
    open_catalog,
    published_nights,
)

pytest.importorskip("pyiceberg")

CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_plain(t.value_type))
    return t


# --- unit: schemas, commits, refusals ---------------------------------------------------------------------------


def test_published_schemas_are_tables_py_schemas_with_night_in_front(tmp_path):
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    catalog = open_catalog(IcebergTarget(warehouse=str(tmp_path / "lake")))
    assert (tmp_path / "lake" / "catalog.db").is_file()  # the default: pyiceberg's SQL catalog on SQLite
    source = {"chunks": tables.CHUNKS, "retrieval": tables.RETRIEVAL, "pairs": tables.PAIRS, "spans": tables.SPANS}
    assert set(PUBLISHED) == set(source)
    for name, schema in source.items():
        table = ensure_table(catalog, "verbatim", name)
        got = schema_to_pyarrow(table.schema(), include_field_ids=False)
        assert got.names == [NIGHT, *schema.names], name
        assert not got.field(NIGHT).nullable
        for field in schema:  # same type (Iceberg has one string type) and the same required columns
            assert _plain(got.field(field.name).type) == _plain(field.type), (name, field.name)
            assert got.field(field.name).nullable == field.nullable, (name, field.name)
        spec = [table.schema().find_column_name(f.source_id) for f in table.spec().fields]
        assert spec == [NIGHT, *PUBLISHED[name].partition], name
        assert ensure_table(catalog, "verbatim", name).metadata_location == table.metadata_location  # reused


def test_a_table_of_that_name_with_other_columns_is_refused(tmp_path):
    catalog = open_catalog(IcebergTarget(warehouse=str(tmp_path / "lake")))
    catalog.create_namespace("verbatim")
    catalog.create_table(("verbatim", "spans"), schema=pa.schema([("x", pa.int64())]))
    with pytest.raises(ValueError, match="not a table of ours .*another --namespace"):
        ensure_table(catalog, "verbatim", "spans")


def _rows(n: int, extractor: str = "semantic", text: str = "t") -> pa.Table:
    base = {"run_id": "r", "query_id": "q", "query": "what", "start": 0, "end": 1, "text": text,
            "extractor": extractor, "config_hash": "h"}
    return tables.to_table([base | {"pair_id": f"p{i}"} for i in range(n)], tables.SPANS)


def _data_files(table, night: str, rows: pa.Table) -> list:
    """The data files Ray's Iceberg datasink writes for these rows (the same pyiceberg writer, here in-process)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    return list(_dataframe_to_data_files(table_metadata=table.metadata, df=conform(rows, "spans", night),
                                         io=table.io))


def test_a_commit_is_one_snapshot_replacing_its_night_and_older_nights_stay_readable(tmp_path):
    catalog = open_catalog(IcebergTarget(warehouse=str(tmp_path / "lake")))
    table = ensure_table(catalog, "verbatim", "spans")
    first = commit_night(table, "n1", "d1", _data_files(table, "n1", _rows(3)))
    second = commit_night(table, "n2", "d2", _data_files(table, "n2", _rows(2, "highlighter")))
    table = catalog.load_table(("verbatim", "spans"))
    assert [s.snapshot_id for s in table.snapshots()] == [first, second]  # one snapshot per night
    assert published_nights(table) == [("n1", "d1", first), ("n2", "d2", second)]
    assert table.properties["verbatim.night"] == "n2"
    assert sorted(table.scan().to_arrow()[NIGHT].to_pylist()) == ["n1"] * 3 + ["n2"] * 2
    assert is_published(table, "n2", "d2") and not is_published(table, "n2", "d2-other")
    assert not is_published(table, "n3", "d3")

    # the same night with other tables (another fingerprint): its partition is replaced, n1's is kept
    third = commit_night(table, "n2", "d2b", _data_files(table, "n2", _rows(4, text="u")))
    table = catalog.load_table(("verbatim", "spans"))
    now = table.scan().to_arrow()
    assert sorted(zip(now[NIGHT].to_pylist(), now["text"].to_pylist(), strict=True)) == \
        [("n1", "t")] * 3 + [("n2", "u")] * 4
    assert len(table.snapshots()) == 3 and night_snapshot(table, "n2") == third

    # time travel: the table as each night left it
    assert table.scan(snapshot_id=night_snapshot(table, "n1")).to_arrow().num_rows == 3
    assert table.scan(snapshot_id=second).to_arrow().num_rows == 5

    # --keep-nights 1: n1's partition goes in the same (one) snapshot that adds n3; n1 stays readable back then
    fourth = commit_night(table, "n3", "d3", _data_files(table, "n3", _rows(1)), keep_nights=1)
    table = catalog.load_table(("verbatim", "spans"))
    assert len(table.snapshots()) == 4 and table.current_snapshot().snapshot_id == fourth
    assert table.scan().to_arrow()[NIGHT].to_pylist() == ["n3"]
    assert table.scan(snapshot_id=first).to_arrow().num_rows == 3

    # a night without rows still commits its snapshot (so republishing it is a no-op) and empties its partition
    commit_night(table, "n3", "d3-empty", [])
    table = catalog.load_table(("verbatim", "spans"))
    assert table.scan().to_arrow().num_rows == 0 and is_published(table, "n3", "d3-empty")


def test_conform_puts_night_first_and_fills_columns_older_runs_lack():
    rows = _rows(2).drop_columns(["align"])  # a run written before the column existed
    out = conform(rows, "spans", "n1")
    assert out.schema.equals(arrow_schema("spans"))
    assert out[NIGHT].to_pylist() == ["n1", "n1"] and out["align"].null_count == 2
    with pytest.raises(ValueError, match="no column text"):
        conform(rows.drop_columns(["text"]), "spans", "n1")


def _refused(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


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
        got = table.scan(row_filter=f"night == '{table.properties['verbatim.night']}'").to_arrow()
        assert got.num_rows == want.num_rows > 0, name
        assert got.column_names == [NIGHT, *want.column_names], name
        rows = sorted(got.drop_columns([NIGHT]).to_pylist(), key=str)  # every row and value, as the run wrote it
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

    ds = ray.data.read_iceberg(table_identifier="verbatim.spans",
                               catalog_kwargs={"name": "verbatim", "type": "sql",
                                               "uri": f"sqlite:///{published['lake']}/catalog.db"})
    pair_ids = sorted(r["pair_id"] for r in ds.filter(expr=col("night") == "r1").take_all())
    assert pair_ids == sorted(published["spans"]["pair_id"].to_pylist())


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
    for name in PUBLISHED:
        assert now[name][:1] == first[name] and len(now[name]) == 2, name  # one more snapshot per table
        table = catalog.load_table(("verbatim", name))
        assert [n for n, _, _ in published_nights(table)] == ["r1", "r2"]
        nights = table.scan().to_arrow()[NIGHT].to_pylist()
        assert nights.count("r1") == nights.count("r2") > 0, name  # an unchanged corpus: the same rows each night
        assert table.scan(snapshot_id=night_snapshot(table, "r1")).to_arrow().num_rows == nights.count("r1")
