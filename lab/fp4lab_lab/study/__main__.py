"""`python3 -m fp4lab_lab.study`: fp4lab-train with the corpus extraction and this repository's default paths."""
import sys

from . import main

sys.exit(main())
