import sys

from .corpus import main

sys.exit(main())
