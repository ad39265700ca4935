"""Ray job: the whole chain (chunk -> embed -> index -> retrieve -> extract) on your corpus and queries, with one
Ray connection for every stage; each stage is its own run folder under --output.

    ray job submit --working-dir . -- \
        python jobs/run.py --config configs/cluster-gpu.yaml \
        --input s3://bucket/acl-anthology/md --queries /mnt/shared/queries.jsonl --output s3://bucket/runs/chain-1

Rerun with the same --run-id after a crash: committed stages are skipped, the interrupted one resumes.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
