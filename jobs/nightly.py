"""Ray job: the nightly incremental run (only changed papers are chunked, embedded and extracted).

    ray job submit --working-dir . -- \
        python jobs/nightly.py --config configs/cluster-gpu.yaml \
        --input s3://bucket/acl-anthology/md --queries s3://bucket/queries.jsonl --root s3://bucket/nightly \
        --run-id nightly-$(date -u +%Y%m%d)

A dated --run-id: a rerun the same night after a crash resumes it (docs/cluster.md: Scheduled nights; exit codes 0
committed, 2 refused, 130 interrupted, else failed). Readers load the current span table with
verbatim_batch.core.runs.current_table("s3://bucket/nightly", "spans"), or, with --warehouse, from Iceberg tables
(docs/publish.md).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["nightly", *sys.argv[1:]]))
