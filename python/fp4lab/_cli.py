"""The `fp4lab` console script: `fp4lab decide` (python/fp4lab/decision.py), else runs the command line installed with the package (which then ends by its own rules,
docs/spec.md §11.1); a command line that is missing or cannot be run is one line and exit code 1, as for the other
console scripts."""
import os
import signal
import sys

from ._files import DataError, console_main


def _run() -> None:
    from . import cli_path

    try:
        path = cli_path()
    except RuntimeError as e:
        raise DataError(str(e)) from None
    # Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal stays ignored across exec: the command
    # line gets the defaults back (as subprocess's restore_signals does), so `fp4lab ... | head -1` ends by SIGPIPE.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        raise DataError(f"{path}: cannot run ({e.strerror or e})") from None


def main() -> int:
    # `fp4lab decide` is the package's own (it joins the simulator, the analyses and the training evidence, and
    # draws the figures); every other subcommand is the command line's.
    if len(sys.argv) > 1 and sys.argv[1] == "decide":
        from .decision import console
        return console(sys.argv[2:])
    return console_main("fp4lab", _run)
