"""`python3 -m fp4lab.study`: the same command line as `fp4lab-train`."""
import sys

from .cli import main

sys.exit(main())
