"""Ray job: publish a nightly root's current night (or a nightly or chain run folder) as Apache Iceberg tables;
the data files are written by the cluster's Ray tasks, one snapshot per table is committed by the driver.

    ray job submit --working-dir . -- \
        python jobs/publish.py s3://bucket/verbatim/nightly --warehouse s3://bucket/lake \
        --catalog-uri postgresql+psycopg2://USER@catalog-db/iceberg

Publishing a night again adds nothing; a killed publish leaves every table at its last snapshot: rerun it.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from verbatim_batch.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["publish", *sys.argv[1:]]))
