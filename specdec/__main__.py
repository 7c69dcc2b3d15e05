"""`python -m specdec ...`: the command line (see specdec.cli)."""

import sys

from specdec.cli import main

sys.exit(main())
