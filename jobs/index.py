"""Ray job: build FAISS + BM25 indexes from an embeddings run (on a GPU node when there is one).

    ray job submit --working-dir . -- \
        python jobs/index.py \
        --embeddings /mnt/shared/runs/embeddings \
        --chunks /mnt/shared/runs/chunks \
        --output /mnt/shared/runs/index
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["index", *sys.argv[1:]]))
