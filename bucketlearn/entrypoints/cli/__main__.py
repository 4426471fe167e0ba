"""``python -m bucketlearn.entrypoints.cli``: the ``bucketlearn`` command line."""

import sys

from bucketlearn.entrypoints.cli import main

sys.exit(main())
