"""The `fp4lab` console script: `fp4lab decide` and `fp4lab plot` (fp4lab.decision, fp4lab.plots), else runs the command line installed with the package (which then ends by its own rules,
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


# The subcommands that are the package's own (they join the simulator, the analyses and the training evidence, and
# draw with matplotlib); every other subcommand is the command line's.
_PYTHON = {"decide": "decision", "plot": "plots"}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in _PYTHON:
        import importlib
        return importlib.import_module(f".{_PYTHON[sys.argv[1]]}", __package__).console(sys.argv[2:])
    return console_main("fp4lab", _run)
