"""The `fp4lab` console script: runs the command line installed with the package."""
import os
import sys


def main() -> None:
    from . import cli_path

    path = cli_path()
    os.execv(path, [path] + sys.argv[1:])
