"""Ray job: verbatim evidence spans for (query, chunk) pairs.

    ray job submit --working-dir . -- \
        python jobs/extract.py \
        --retrieval /mnt/shared/runs/retrieval \
        --extractor highlighter --model KRLabsOrg/acl-verbatim-modernbert \
        --output /mnt/shared/runs/spans
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["extract", *sys.argv[1:]]))
