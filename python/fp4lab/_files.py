"""One set of rules for every front-end of the package, shared with the `fp4lab` command line.

- Errors: a library function raises `DataError` (a bad input, a failed write) or `UsageError` (a bad argument or
  option); both are `ValueError`s with a one-line message naming the file or option and its fault. No library
  function ends the process.
- Exit codes: the command line's (fp4lab/io/exit_codes.hpp, read through the C++ core, docs/spec.md §11.1).
- Outputs: held before any work to the command line's rules (fp4lab/io/outputs.hpp, through the C++ core): a file name
  (absent, or an existing regular file) in an existing writable folder, never an input and never another output;
  written to a temporary name in its folder and renamed when complete, so that a failed or interrupted write
  leaves neither a truncated file under the final name nor a temporary.
- Console scripts: `console_main` turns those errors into one line `PROG: error: MESSAGE` and the exit code, a
  closed pipe or SIGINT into the signal's own ending (status 128 + its number), as the command line does.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import stat
import sys
import tempfile
from typing import Callable, Iterable, Optional, Sequence

from . import _core

_CODES = {meaning.split(":")[0]: code for code, meaning in _core.exit_codes()}
EXIT_OK: int = _CODES["success"]
EXIT_DATA: int = _CODES["bad data"]
EXIT_USAGE: int = _CODES["bad usage"]


class Fault(ValueError):
    """A fault a front-end reports as one line and an exit code."""
    exit_code = EXIT_DATA

    def __init__(self, message: str):
        # One line, whatever the message holds (a file name with a newline, an exception's text).
        super().__init__(" ".join(str(message).splitlines()) or "error")


class DataError(Fault):
    """A bad input file or tensor, or a failed write (exit code 1, as the command line)."""
    exit_code = EXIT_DATA


class UsageError(Fault):
    """A bad argument, option or option value (exit code 2, as the command line)."""
    exit_code = EXIT_USAGE


def _paths(paths) -> list:
    out = []
    for p in paths:
        if isinstance(p, bytes):
            raise UsageError(f"{p!r}: a path is a str or os.PathLike, not bytes")
        try:
            out.append(os.fspath(p))
        except TypeError:
            raise UsageError(f"{p!r}: a path is a str or os.PathLike, not {type(p).__name__}") from None
    return out


def check_outputs(outputs: Iterable, inputs: Iterable = ()) -> None:
    """Raises the first fault of `outputs` against the command line's output rules (UsageError for a conflict
    between the paths given, DataError for a path the file system refuses)."""
    fault = _core.output_fault(_paths(outputs), _paths(inputs))
    if fault is not None:
        usage, message = fault
        message = message.replace("; use --json - for stdout", "")  # the CLI's hint names an option Python lacks
        raise (UsageError if usage else DataError)(message)


def _tmp_prefix(path: str) -> str:
    name = os.path.basename(path)
    prefix = f".{name}.tmp-"
    try:
        limit = os.pathconf(os.path.dirname(path) or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    return prefix if len(os.fsencode(prefix)) + 8 <= limit else ".fp4lab.tmp-"


def write_atomic(path, data: bytes, inputs: Iterable = (), make_dirs: bool = False) -> None:
    """Writes `data` to `path` under the output rules: checked first (against `inputs` too), written to a temporary
    name in the same folder, renamed into place when complete. A failed write raises DataError naming the path
    and leaves nothing behind. `make_dirs` creates a missing folder first (for outputs inside an output folder)."""
    path = _paths([path])[0]
    if make_dirs and os.path.dirname(path):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as e:
            raise DataError(f"{os.path.dirname(path)}: cannot create the folder ({e.strerror or e})") from None
    check_outputs([path], inputs)
    d = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=_tmp_prefix(path))
    except OSError as e:
        raise DataError(f"{path}: cannot create a temporary file ({e.strerror or e})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # what a plain open() would give, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        raise DataError(f"{path}: write failed ({e.strerror or e})") from None
    except BaseException:
        _unlink(tmp)
        raise


def write_text(path, text: str, inputs: Iterable = (), make_dirs: bool = False) -> None:
    write_atomic(path, text.encode("utf-8"), inputs, make_dirs)


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def read_bytes(path) -> bytes:
    """An input's bytes, or DataError naming it and its fault."""
    path = _paths([path])[0]
    if os.path.isdir(path):
        raise DataError(f"{path}: a folder, not a file")
    try:
        # A FIFO would block until a writer comes and a device (/dev/zero) would never end: inputs are regular
        # files, as the command line reads them.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise DataError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise DataError(f"{path}: {e.strerror or e}") from None


def read_text(path) -> str:
    """The UTF-8 text of an input, or DataError naming it and its fault."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{os.fspath(path)}: not UTF-8 text") from None


def read_json(path, key=None):
    """An input's JSON (its member `key` when given), or DataError naming it and its fault."""
    try:
        j = json.loads(read_text(path))
    except RecursionError:
        raise DataError(f"{os.fspath(path)}: not JSON (nested too deeply)") from None
    except ValueError as e:
        if isinstance(e, Fault):
            raise
        raise DataError(f"{os.fspath(path)}: not JSON ({str(e).splitlines()[0][:80]})") from None
    if key is not None and not (isinstance(j, dict) and key in j):
        raise DataError(f"{os.fspath(path)}: no '{key}' member (not the JSON this reads)")
    return j if key is None else j[key]


class ArgumentParser(argparse.ArgumentParser):
    """argparse as the command line parses: no prefix guessing (a mistyped option is an error, never another
    option), and a bad option is a UsageError (one line, exit code 2) instead of argparse's usage dump."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(message)

    def _print_message(self, message, file=None):
        # argparse swallows a failed write of --help; a full device or closed pipe must end as the CLI ends.
        if message:
            (file or sys.stderr).write(message)


def _end_by_signal(sig: int) -> None:
    """Ends the process by `sig` with its default action (status 128 + its number), as the command line does."""
    sys.stdout.flush = lambda: None  # type: ignore[method-assign]  # nothing more to say to a closed pipe
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # not reached where the signal ends the process


def console_main(prog: str, body: Callable[[], Optional[int]]) -> int:
    """Runs a console script's body the way the `fp4lab` command line ends: a Fault is one line on stderr,
    `PROG: error: MESSAGE`, and its exit code; an unreadable or unwritable file (OSError) is a data error; a
    closed stdout pipe ends the process by SIGPIPE and an interrupt by SIGINT, silently."""
    try:
        try:
            rc = body()
            sys.stdout.flush()
            return EXIT_OK if rc is None else int(rc)
        except BrokenPipeError:
            try:  # no second BrokenPipeError from the interpreter's own flush at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            _end_by_signal(signal.SIGPIPE)
        except KeyboardInterrupt:
            _end_by_signal(signal.SIGINT)
    except Fault as e:
        _say(f"{prog}: error: {e}")
        return e.exit_code
    except OSError as e:
        what = e.filename if e.filename is not None else ("stdout" if e.errno is not None else "")
        _say(f"{prog}: error: {what}: {e.strerror or e}" if what else f"{prog}: error: {e}")
        try:  # stdout on a full device: what is left in its buffer cannot be written at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_DATA
    return EXIT_OK


def _say(line: str) -> None:
    try:
        print(" ".join(line.splitlines()), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def output_inputs(paths: Sequence) -> list:
    """Every file under each of `paths` (a file, or a folder's files, recursively): the inputs an output may not
    overwrite."""
    out = []
    for p in _paths(paths):
        if os.path.isdir(p):
            for root, _dirs, files in os.walk(p):
                out += [os.path.join(root, f) for f in files]
        else:
            out.append(p)
    return out


def check_output_folder(path) -> None:
    """Raises the fault of a folder outputs are to be written into (a trace's step folders, say), before any work:
    DataError unless it is an existing writable folder, or an absent name whose nearest existing parent is a
    writable folder (the folder is made when the first output is written)."""
    p = _paths([path])[0]
    if not p:
        raise UsageError("an output folder name is empty")
    if os.path.lexists(p) and not os.path.isdir(p):
        raise DataError(f"{p}: exists and is not a folder")
    probe = os.path.abspath(p)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise DataError(f"{p}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise DataError(f"{p}: folder {probe} is not writable")


def compile_regex(pattern, what: str, error=None):
    """`pattern` compiled, or `error` (UsageError by default) naming `what` and the fault, on one line."""
    error = error or UsageError
    if not isinstance(pattern, str):
        raise error(f"{what} {pattern!r}: a regular expression is text, not {type(pattern).__name__}")
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise error(f"{what} {pattern!r}: not a regular expression ({e})") from None
