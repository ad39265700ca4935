"""Ray job: fine-tune the highlighter on a silver run (or any pairs file) with Ray Train.

    ray job submit --working-dir . -- \
        python jobs/train.py --train /mnt/shared/runs/silver --model answerdotai/ModernBERT-base \
        --num-workers 8 --use-gpu --output /mnt/shared/runs/student --run-id student-1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
