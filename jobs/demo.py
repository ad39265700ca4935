"""Ray job: the demo pipeline on the bundled example corpus.

    ray job submit --working-dir . -- python jobs/demo.py --output /tmp/verbatim-demo
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
