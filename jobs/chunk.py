"""Ray job: chunk a corpus.

    ray job submit --working-dir . -- python jobs/chunk.py --input s3://bucket/acl-md --output /mnt/shared/runs/chunks
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["chunk", *sys.argv[1:]]))
