"""No INFO line from Ray between our progress lines on a normal run (issue 53, item 5b): Ray Data's console
handler prints warnings and errors only (its INFO lines, "... execution finished", "Data sink ... finished",
stay in its session log file), and a local Ray's start says nothing ("Started a local Ray instance."): the
progress line says it starts. A real chunk stage on a local Ray of its own, in a subprocess."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from helpers import EXAMPLES, PAPERS

CODE = """
import logging, sys
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
run_chunk(ChunkJob(input=sys.argv[1], output=sys.argv[2], num_cpus=1))
logging.getLogger("ray.data").warning("a warning of Ray Data's own")
"""


def test_a_stage_prints_our_progress_and_ray_datas_warnings_but_no_info_line_of_ray(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in PAPERS[:2]:
        shutil.copy(EXAMPLES / "corpus" / name, corpus / name)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT",
                                                            "VERBATIM_PROGRESS")}
    done = subprocess.run([sys.executable, "-c", CODE, str(corpus), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stderr.splitlines()
    assert any(re.match(r"\[chunk\] done: 2/2 rows", x) for x in lines), lines  # our progress
    assert [x for x in lines if re.search(r"\bINFO\b", x)] == [], lines  # none of Ray's INFO lines
    assert any("a warning of Ray Data's own" in x for x in lines), lines  # its warnings still print
