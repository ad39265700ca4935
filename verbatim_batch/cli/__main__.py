import sys

from verbatim_batch.cli import main

sys.exit(main())
