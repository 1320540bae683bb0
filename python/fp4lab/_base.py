"""The top-level functions of fp4lab that its other modules use (fp4lab.decision): the preset table, the command
line's path and the trace analysis, with the argument checks they share with fp4lab/__init__.py. They live below the
package's __init__ (which re-exports them) so that imports go one way: __init__ -> decision -> here, never back."""
from __future__ import annotations

import functools
import os
from typing import Any, Iterable, Optional

import numpy as np

from . import _core


def one_line_errors(func):
    """nanobind refuses arguments of the wrong type with a multi-line dump of the C++ signature; a public function
    raises the one-line TypeError instead, naming itself, the types it was given and the types the call takes."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except TypeError as e:
            text = str(e)
            if "incompatible function arguments" not in text:
                raise
            lines = [ln.strip() for ln in text.splitlines()]
            sig = next((ln[3:] for ln in lines if ln.startswith("1. ")), "")
            got = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Invoked with types")), "?")
            raise TypeError(f"{func.__name__}(): arguments of types ({got}) do not fit {sig.split(' -> ')[0]}") \
                from None
    return wrapper


def check_signs(value: Any) -> list:
    """rht_signs given as a sequence: its entries, each a number (the C++ rule checks they are +1 or -1)."""
    if isinstance(value, np.ndarray) and value.ndim != 1:
        raise ValueError(f"knob rht_signs: a 1-D sequence of +1/-1 entries or 'te', not a {value.ndim}-D array")
    if not isinstance(value, Iterable):
        raise TypeError(f"knob rht_signs: a sequence of +1/-1 entries or 'te', not {type(value).__name__}")
    out = []
    for s in value:
        if not isinstance(s, (int, float, np.integer, np.floating)) or isinstance(s, (bool, np.bool_)):
            raise TypeError(f"knob rht_signs: entries are +1 or -1, not {type(s).__name__}")
        out.append(float(s))
    return out


def recipes() -> dict:
    """Each preset's settings for operand a and b of fwd_y, bwd_dx and bwd_dw (docs/spec.md §2)."""
    return {name: _core.recipe_table(name) for name in _core.recipe_names()}


def cli_path() -> str:
    """The fp4lab command line (the ``fp4lab`` console script runs it): the one installed with this package, else
    $FP4LAB_BIN, else the one built beside an in-tree build (build/bin/fp4lab next to build/python)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "bin", "fp4lab"), os.environ.get("FP4LAB_BIN", ""),
              os.path.join(here, "..", "..", "bin", "fp4lab")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise RuntimeError("the fp4lab command line is not installed with this package (it needs Boost.Program_options "
                       "at build time); set FP4LAB_BIN to a built fp4lab")


def list_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, Iterable):
        return ",".join("none" if x in (None, 0) else str(x) for x in v)
    return "none" if v in (None, 0) else str(v)


def path_arg(func: str, name: str, value: Any) -> str:
    """A path argument as the C++ reader takes it: a str or os.PathLike of str, else a one-line TypeError naming the
    function, the argument and the types it takes (bytes paths included: the reader's messages and records are
    UTF-8 text)."""
    try:
        p = os.fspath(value)
    except TypeError:
        p = value
    if not isinstance(p, str):
        raise TypeError(f"{func}(): {name} must be a str or os.PathLike of str, not {type(p).__name__}")
    return p


@one_line_errors
def analyze(trace: Any, *, formats: Any = None, rht: Any = None, rht_signs: Any = None, rht_seed: Any = None,
            recipe: Any = None, block: Optional[int] = None, scale: Optional[str] = None,
            seed: Optional[int] = None, json: Any = None) -> Optional[dict]:
    """The analyses of docs/spec.md §6 on a trace folder or file (or a list of them, as ``--trace DIR DIR``): the
    same dict ``fp4lab analyze --json`` writes, from the same C++ library, with ``config.command`` the command line
    that writes it. ``formats``, ``rht`` and ``recipe`` take lists or comma-separated strings; ``rht`` entries None
    or 0 mean no rotation. A bad option raises UsageError, a bad trace DataError (both ValueErrors, with the command
    line's one-line message and exit code); a path of another type than str or os.PathLike of str is a TypeError.

    With ``json=PATH`` the document is written to that file instead, byte for byte as ``fp4lab analyze --json
    PATH`` writes it (through a temporary name, renamed when complete; refused before any work if PATH is an input
    or cannot be written), and None is returned: a trace of many records then costs the command line's memory, not
    that of a dict of the whole report. Ctrl-C (KeyboardInterrupt) stops the analysis at its next record, leaving no
    file and no temporary."""
    if isinstance(trace, (str, os.PathLike)):
        paths = [trace]
    elif isinstance(trace, (bytes, bytearray)) or not isinstance(trace, Iterable):
        raise TypeError(f"analyze(): trace must be a str or os.PathLike of str, or a list of them, not "
                        f"{type(trace).__name__}")
    else:
        paths = list(trace)
    traces = [path_arg("analyze", "a trace path", p) for p in paths]
    opts = {}
    for opt, v in (("formats", formats), ("rht", rht), ("recipe", recipe)):
        if v is not None:
            opts[opt] = list_text(v)
    if rht_signs is not None:
        # The analysis takes the command line's options as text (its one interface with fp4lab analyze).
        signs = rht_signs
        if not isinstance(signs, (str, np.ndarray)) and isinstance(signs, Iterable):
            signs = list(signs)  # read once
        if not isinstance(signs, str):
            check_signs(signs)  # the entries' types, as config() checks them
            signs = ",".join("+1" if x == 1 else "-1" if x == -1 else str(x) for x in signs)
        opts["rht-signs"] = signs
    for opt, v in (("rht-seed", rht_seed), ("block", block), ("scale", scale), ("seed", seed)):
        if v is not None:
            opts[opt] = str(v)
    if json is None:
        return _core.analyze(traces, opts)
    return _core.analyze(traces, opts, path_arg("analyze", "json", json))
