"""Ray job: 3 synthetic search queries per sampled chunk, from an OpenAI-compatible LLM endpoint.

    ray job submit --working-dir . -- \
        python jobs/querygen.py --chunks /mnt/shared/runs/chunks --n-papers 2000 \
        --model Qwen/Qwen3-32B --base-url http://vllm.internal:8000/v1 --output /mnt/shared/runs/querygen
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["querygen", *sys.argv[1:]]))
