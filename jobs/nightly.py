"""Ray job: the nightly incremental run (only changed papers are chunked, embedded and extracted).

    ray job submit --working-dir . -- \
        python jobs/nightly.py --config configs/cluster-gpu.yaml \
        --input s3://bucket/acl-anthology/md --queries /mnt/shared/queries.jsonl --root /mnt/shared/nightly

Rerun with the same --run-id after a crash to resume. Readers load the current span table with
pandas.read_parquet("/mnt/shared/nightly/current/spans/spans").
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["nightly", *sys.argv[1:]]))
