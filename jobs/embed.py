"""Ray job: embed the chunks of a chunk run (one model per GPU).

    ray job submit --working-dir . -- \
        python jobs/embed.py \
        --chunks /mnt/shared/runs/chunks \
        --output /mnt/shared/runs/embeddings \
        --model ibm-granite/granite-embedding-english-r2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["embed", *sys.argv[1:]]))
