"""Limits of the machine (issue 44): an output whose folder name or path the file system cannot hold once a run's
staging folder and files are added is refused with one line and exit 2 before anything is written (the file
system's own ``Errno 36`` came mid-run, as a traceback, and left a staging folder behind)."""

from __future__ import annotations

import os

import pytest

from verbatim_batch.core.runs import check_output_names


def test_names_and_paths_that_cannot_hold_a_run_are_refused(tmp_path):
    check_output_names(str(tmp_path / "run"))
    check_output_names(str(tmp_path / ("n" * 200)))  # 200 + a 12-character token + 10 fit in 255
    with pytest.raises(ValueError, match=r"--output: the folder name is 250 bytes; at most 233 fit"):
        check_output_names(str(tmp_path / ("n" * 250)))
    with pytest.raises(ValueError, match=r"at most 117 fit .* with this run id"):
        check_output_names(str(tmp_path / ("n" * 200)), run_id="r" * 128)
    deep = os.path.join(str(tmp_path), *["d" * 200] * 19)  # about 3,900 bytes
    with pytest.raises(ValueError, match=r"--output: the path is \d+ bytes; at most \d+ fit"):
        check_output_names(deep)
    check_output_names("s3://bucket/" + "k" * 300)  # an object store's keys are its own business


def test_the_cli_refuses_them_in_one_line_and_writes_nothing(tmp_path, capsys):
    from verbatim_batch.cli import main

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.md").write_text("# A\n\ntext\n")
    out = tmp_path / ("o" * 250)
    rc = main(["chunk", "--input", str(tmp_path / "c"), "--output", str(out), "--num-cpus", "1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "folder name is 250 bytes" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no lock, no staging folder
