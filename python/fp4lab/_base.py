"""The top-level functions of fp4lab that its other modules use (fp4lab.decision): the preset table, the command
line's path and the trace analysis, with the argument checks they share with fp4lab/__init__.py. They live below the
package's __init__ (which re-exports them) so that imports go one way: __init__ -> decision -> here, never back."""
from __future__ import annotations

import functools
import os
from typing import Any, Iterable, Optional

import numpy as np

from . import _core
from ._files import UsageError


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
            seed: Optional[int] = None, sr_draw: Any = None, json: Any = None) -> Optional[dict]:
    """The analyses of docs/spec.md §6 on a trace folder or file (or a list of them, as ``--trace DIR DIR``): the
    same dict ``fp4lab analyze --json`` writes, from the same C++ library, with ``config.command`` the command line
    that writes it (each option in the command line's spelling). ``formats`` and ``recipe`` take lists or
    comma-separated names; ``formats`` entries are fp4lab.Format members or their names, ``scale`` an fp4lab.Scale
    or its name, ``sr_draw`` an fp4lab.SrDraw or its name (how the recipe runs' stochastic rounding draws
    its words, docs/spec.md §4), ``rht`` a size or a list of them (ints; None, 0 or "none" mean no rotation), ``rht_signs`` "te" or
    +1/-1 entries, the others ints; the options reach the library typed (a number given as text is a TypeError).
    A bad option raises UsageError, a bad trace DataError (both ValueErrors, with the command line's one-line
    message and exit code); a path of another type than str or os.PathLike of str is a TypeError.

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
    # The keywords typed here (names looked up in their tables; numbers are not read from text, the command line's
    # job); an integer out of range is the command line's message for that option.
    opts: dict = {}
    if formats is not None:
        opts["formats"] = [f if isinstance(f, _core.Format) else _core.format_named(_name("formats", f))
                           for f in _entries(formats)]
    if rht is not None:
        opts["rht"] = [rht_size("analyze(): an rht entry", d) for d in _entries(rht)]
    if recipe is not None:
        if isinstance(recipe, str) and recipe == "all":
            opts["all_recipes"] = True
        else:
            opts["recipes"] = [_name("recipe", r) for r in _entries(recipe)]
    if rht_signs is not None:
        if isinstance(rht_signs, str):
            if rht_signs != "te":
                raise TypeError("analyze(): rht_signs is a sequence of +1/-1 entries or 'te', not other text")
            opts["rht_signs_te"] = True
        else:
            signs = check_signs(rht_signs)  # the entries' types, as config() checks them
            for i, x in enumerate(signs):
                if x not in (1.0, -1.0):
                    raise UsageError(f"--rht-signs: sign {i + 1} is '{x:g}', not +1 or -1")
            opts["rht_signs"] = signs
    for opt, v in (("rht_seed", rht_seed), ("block", block), ("seed", seed)):
        if v is not None:
            opts[opt] = int_setting(f"analyze(): {opt}", opt, v, UsageError)
    if scale is not None:
        opts["scale"] = scale if isinstance(scale, _core.Scale) else _core.scale_named(_name("scale", scale))
    if sr_draw is not None:
        opts["sr_draw"] = (sr_draw if isinstance(sr_draw, _core.SrDraw)
                           else _core.sr_draw_named(_name("sr_draw", sr_draw)))
    if json is None:
        return _core.analyze(traces, **opts)
    return _core.analyze(traces, **opts, json_path=path_arg("analyze", "json", json))


def _entries(v: Any) -> list:
    """A list keyword's entries: a comma-separated string's (empty entries left out, as the command line reads
    it), or the sequence's."""
    if isinstance(v, str):
        return _core.split_list(v)
    if isinstance(v, Iterable):
        return list(v)
    return [v]


# The integer settings' ranges (the command line's: --block an int, the seeds and the stream unsigned).
INT_RANGES = {"block": (-2**31, 2**31 - 1), "rht_seed": (0, 2**64 - 1), "seed": (0, 2**64 - 1),
              "stream": (0, 2**32 - 1)}


def int_setting(what: str, name: str, v: Any, fault: type = ValueError) -> int:
    """An integer setting of config()/analyze(): an int (numpy's too, not a bool; text is a TypeError, reading it
    is the command line's job) within INT_RANGES[name], else ``fault`` with the command line's one-line message."""
    if not is_int(v):
        raise TypeError(f"{what} must be an int, not {type(v).__name__}")
    lo, hi = INT_RANGES[name]
    if not lo <= int(v) <= hi:
        raise fault(f"--{name.replace('_', '-')}: '{int(v)}' is not an integer"
                    + (f" from 0 to {hi}" if lo == 0 else ""))
    return int(v)


def rht_size(what: str, d: Any) -> int:
    """An RHT setting: an int (0: none), None or 'none'; past 32 bits -1, which the size rule refuses with the
    command line's message."""
    if d is None or (isinstance(d, str) and d == "none"):
        return 0
    if not is_int(d):
        raise TypeError(f"{what} must be an RHT size (an int; 0, None or 'none': off), not {type(d).__name__}")
    return int(d) if -2**31 <= d < 2**31 else -1


def _name(opt: str, v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"analyze(): {opt} entries are names (str), not {type(v).__name__}")
    return v


def is_int(v: Any) -> bool:
    """An integer value (numpy's too), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
