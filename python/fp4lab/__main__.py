"""``python3 -m fp4lab ...``: the ``fp4lab`` console script (its ``decide`` subcommand in Python, the rest the
command line installed with the package)."""
import sys

from ._cli import main

sys.exit(main())
