"""`python -m specsample`: the same command line as the `specsample` script."""

import sys

from specsample.cli import main

sys.exit(main())
