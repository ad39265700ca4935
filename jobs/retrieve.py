"""Ray job: top-k chunks per query with dense, BM25 and hybrid search.

    ray job submit --working-dir . -- \
        python jobs/retrieve.py \
        --index /mnt/shared/runs/index \
        --queries queries.jsonl \
        --output /mnt/shared/runs/retrieval
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["retrieve", *sys.argv[1:]]))
