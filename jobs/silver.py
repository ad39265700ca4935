"""Ray job: silver training data (queries -> retrieval -> LLM teacher spans -> filter -> train/dev).

    ray job submit --working-dir . -- \
        python jobs/silver.py --chunks /mnt/shared/runs/chunks --index /mnt/shared/runs/index \
        --model Qwen/Qwen3-32B --base-url http://vllm.internal:8000/v1 --n-papers 2000 \
        --tokenizer answerdotai/ModernBERT-base --output /mnt/shared/runs/silver
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["silver", *sys.argv[1:]]))
