"""Ray job (driver only): score a span table against a gold pairs file.

    ray job submit --working-dir . -- \
        python jobs/evaluate.py --gold gold.jsonl --predictions /mnt/shared/runs/spans --json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
