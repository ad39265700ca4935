"""Ray job (optional stage): rerank each query's top retrieved chunks with a cross-encoder.

    ray job submit --working-dir . -- \
        python jobs/rerank.py \
        --retrieval /mnt/shared/runs/retrieval \
        --model cross-encoder/ms-marco-MiniLM-L-6-v2 \
        --output /mnt/shared/runs/reranked
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["rerank", *sys.argv[1:]]))
