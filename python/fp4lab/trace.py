"""Trace v1 folders (docs/spec.md §7): reading, writing and checking them, through the C++ reader and writer that
`fp4lab analyze` and the other commands use (bound in fp4lab._core).

A trace is a folder of .safetensors files. Each record holds, for a linear layer `<gemm>`, the operands of its
three training GEMMs at one step: `<gemm>.fwd_x` [tokens, in], `<gemm>.fwd_w` [out, in] and `<gemm>.bwd_dy`
[tokens, out], BF16 or F32, with "fp4lab.trace.version": "1" in __metadata__. Faults are TraceError (a
ValueError) with the reader's one-line message naming the file and the fault.

    from fp4lab import trace
    meta, arrays, dtypes = trace.read_file("t/step_000100/layers.0.mlp.fc2.safetensors")   # float32 arrays
    for gemm, x, w, dy in trace.records("t/step_000100"): ...
    rows = trace.check("t/step_000100")       # the C++ reader's validation; outlier statistics per tensor

`python3 -m fp4lab.trace FOLDER|FILE [--block 16] [--json stats.json]` (also `fp4lab-capture check`) prints the
check's table.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _core
from ._base import one_line_errors as _one_line_errors, path_arg as _path_arg
from ._files import (ArgumentParser, DataError, UsageError, check_outputs, console_main, output_inputs,
                     write_text)

TRACE_VERSION = "1"
ROLES = ("fwd_x", "fwd_w", "bwd_dy")
SUFFIX = ".safetensors"


class TraceError(DataError):
    """A one-line fault naming the file or module concerned (a ValueError; a data error, exit code 1, in the console
    scripts)."""


def _check_outputs(outputs, inputs=()) -> None:
    """The shared output rule (fp4lab._files.check_outputs) before any work: a path the file system refuses as a
    TraceError, a conflict between the paths given (an output that is an input) as the UsageError it is."""
    try:
        check_outputs(outputs, inputs)
    except DataError as e:
        raise TraceError(str(e)) from None


def _mapping_arg(func: str, name: str, value) -> None:
    """A mapping of str names, as the C++ writer takes it, else a one-line TypeError naming the function and the
    argument (nanobind's own refusal is a multi-line dump of the C++ signature)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{func}(): {name} must be a mapping of str names, not {type(value).__name__}")
    for k in value:
        if not isinstance(k, str):
            raise TypeError(f"{func}(): the names in {name} must be str, not {type(k).__name__}")


def _int_arg(func: str, name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{func}(): {name} must be an int, not {type(value).__name__}")
    return int(value)


def _io(func, *args):
    """A call into the C++ reader or writer, its ValueError as a TraceError."""
    try:
        return func(*args)
    except ValueError as e:
        raise TraceError(str(e)) from None


@functools.lru_cache(maxsize=None)
def _dtypes() -> Dict[str, np.dtype]:
    """The numpy dtype of each safetensors dtype the reader knows (little-endian, as the format stores them)."""
    import ml_dtypes  # noqa: PLC0415 — BF16 and FP8, which numpy lacks
    return {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
            "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
            "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "BOOL": np.dtype(np.bool_), "U8": np.dtype("u1"),
            "I8": np.dtype("i1"), "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "U32": np.dtype("<u4"),
            "I32": np.dtype("<i4"), "U64": np.dtype("<u8"), "I64": np.dtype("<i8")}


def _bf16() -> np.dtype:
    return _dtypes()["BF16"]


def _as_numpy(name: str, t, path: str) -> np.ndarray:
    """A numpy array of a torch tensor (BF16 or F32, copied to the host) or of an array."""
    if type(t).__module__.startswith("torch"):
        import torch  # noqa: PLC0415 — only when given torch tensors
        if t.dtype not in (torch.bfloat16, torch.float32):
            raise TraceError(f"{path}: tensor {name}: dtype {t.dtype} is not BF16 or F32")
        bf16 = t.dtype == torch.bfloat16
        a = t.detach().cpu().contiguous().view(torch.int16 if bf16 else torch.int32).numpy()
        return a.view(_bf16() if bf16 else np.float32)
    a = np.ascontiguousarray(t)
    if a.dtype not in (np.dtype(np.float32), np.dtype(_bf16())):
        raise TraceError(f"{path}: tensor {name}: dtype {a.dtype} is not BF16 or F32")
    return a


@_one_line_errors
def write_file(path: str, tensors: Mapping[str, object], metadata: Mapping[str, object], inputs=()) -> None:
    """Writes BF16 or F32 tensors (numpy arrays, ml_dtypes.bfloat16 for BF16, or torch tensors) in the given order
    and `metadata` (values as text) as one safetensors file; under a temporary name, then renamed, so that a killed
    writer leaves no truncated record. `path` is held to the command line's output rules first (a file name in an
    existing writable folder, never a folder or a device, never one of the files `inputs`). An argument of the wrong
    type is a one-line TypeError naming it."""
    path = _path_arg("write_file", "path", path)
    _mapping_arg("write_file", "tensors", tensors)
    _mapping_arg("write_file", "metadata", metadata)
    _check_outputs([path], inputs)
    out = []
    for name, t in tensors.items():
        a = _as_numpy(name, t, path)
        out.append((name, dtype_name(a), list(a.shape), a.reshape(-1).view(np.uint8)))
    _io(_core.write_safetensors, os.fspath(path), out, {k: str(v) for k, v in metadata.items()})


def _read(path: str, func: str):
    """(metadata, [(name, dtype name, array as stored)]) in the file's order."""
    meta, tensors = _io(_core.read_safetensors, _path_arg(func, "path", path))
    dt = _dtypes()
    return meta, [(name, dtype, raw.view(dt[dtype]).reshape(shape)) for name, dtype, shape, raw in tensors]


def read_raw(path: str) -> Tuple[Dict[str, str], Dict[str, np.ndarray]]:
    """(metadata, {name: array as stored}): BF16 as ml_dtypes.bfloat16, F32 and F16 as themselves."""
    meta, tensors = _read(path, "read_raw")
    return meta, {name: a for name, _, a in tensors}


def dtype_name(a: np.ndarray) -> str:
    """The safetensors name of an array's dtype (BF16, F32, F16, ...)."""
    for name, d in _dtypes().items():
        if a.dtype == d:
            return name
    raise TraceError(f"dtype {a.dtype} has no safetensors name")


def read_file(path: str):
    """(metadata, {name: float32 array}, {name: stored dtype name}) of one file; only F32, BF16 and F16 tensors
    are accepted."""
    meta, tensors = _read(path, "read_file")
    arrays, dtypes = {}, {}
    for name, dt, a in tensors:
        if dt not in ("F32", "BF16", "F16"):
            raise TraceError(f"{path}: tensor {name!r}: dtype {dt} is not F32, BF16 or F16")
        arrays[name], dtypes[name] = a.astype(np.float32), dt
    return meta, arrays, dtypes


def files(path: str) -> List[str]:
    """The record files of a trace folder, sorted by name, or [path] for one file."""
    if not os.path.isdir(path):
        return [path]
    out = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(SUFFIX))
    if not out:
        raise TraceError(f"{path}: no {SUFFIX} files in the folder")
    return out


def records(path: str):
    """[(gemm, X, W, dY)] of a valid trace as float32 arrays, in the reader's order (files by name, then each gemm's
    first tensor in its file)."""
    t = _io(_core.Trace, _path_arg("records", "path", path), 1)
    return [(r["gemm"], *_io(t.load, i)) for i, r in enumerate(t.records)]


# ---------------------------------------------------------------------------------------------------------
# check: validation and outlier statistics
# ---------------------------------------------------------------------------------------------------------

def tensor_stats(a) -> Dict[str, float]:
    """Outlier statistics of a [rows, cols] tensor. Kurtosis is the plain 4th standardised moment of all
    elements (3 for a Gaussian); channel = column (the `in` features of X, the `out` features of dY)."""
    a = np.asarray(a, dtype=np.float64)
    mu, sd = a.mean(), a.std()
    rms = math.sqrt(float((a * a).mean()))
    col_rms = np.sqrt((a * a).mean(axis=0))
    med = float(np.median(col_rms))
    return {
        "kurtosis": float(((a - mu) ** 4).mean() / sd ** 4) if sd > 0 else float("nan"),
        "amax_over_rms": float(np.abs(a).max() / rms) if rms > 0 else float("nan"),
        "max_over_median_channel_rms": float(col_rms.max() / med) if med > 0 else float("inf"),
        "rms": rms,
    }


def check(path: str, block: int = 16) -> List[dict]:
    """Validates a trace folder (or one file) with the C++ reader (docs/spec.md §7: headers, version, the three
    tensors of every gemm, BF16/F32, shapes, multiples of `block`, finite values); returns one dict per gemm, in the
    reader's order (files by name, then each gemm's first tensor in its file)."""
    t = _io(_core.Trace, _path_arg("check", "path", path), _int_arg("check", "block", block))
    out = []
    for i, r in enumerate(t.records):
        meta = t.metadata(r["file"])
        x, w, dy = _io(t.load, i)
        out.append({"file": r["file"], "gemm": r["gemm"], "tokens": r["tokens"], "in": r["in"], "out": r["out"],
                    "dtype": r["dtype"], "step": meta.get("step", ""), "model": meta.get("model", ""),
                    "command": meta.get("command", ""),
                    "x": tensor_stats(x), "w": tensor_stats(w), "dy": tensor_stats(dy)})
    return out


def print_check(rows: List[dict], file=None) -> None:
    file = file or sys.stdout
    print(f"{'gemm':<22} {'tokens':>6} {'in':>5} {'out':>5} {'dtype':>5}  "
          f"{'x kurt':>8} {'x amax/rms':>10} {'x chmax/med':>11}  {'dy kurt':>8} {'dy amax/rms':>11}", file=file)
    for r in rows:
        x, dy = r["x"], r["dy"]
        print(f"{r['gemm']:<22} {r['tokens']:>6} {r['in']:>5} {r['out']:>5} {r['dtype']:>5}  "
              f"{x['kurtosis']:>8.2f} {x['amax_over_rms']:>10.2f} {x['max_over_median_channel_rms']:>11.2f}  "
              f"{dy['kurtosis']:>8.2f} {dy['amax_over_rms']:>11.2f}", file=file)


def _json_value(v):
    """`v` with every non-finite float as None: JSON has no NaN or infinity (the command line writes null too)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    return v


def check_main(args) -> int:
    """The `check` command (`fp4lab-capture check`, `python3 -m fp4lab.trace`): the table and an optional JSON
    (`--json -`: the JSON on stdout instead of the table). Faults are raised for console_main to print as one line:
    a bad option or an output that would overwrite the trace before any work (exit 2), an invalid trace (exit 1)."""
    if not 0 < args.block < 2 ** 31:
        raise UsageError(f"--block {args.block}: not a positive integer below 2^31")
    if args.json is not None and args.json != "-":
        # The JSON may not overwrite a record of the trace it describes; checked before the trace is read.
        check_outputs([args.json], output_inputs([args.path]))
    rows = check(args.path, args.block)
    if args.json == "-":
        print(json.dumps(_json_value(rows), indent=1, allow_nan=False))
        return 0
    print_check(rows)
    if args.json is not None:
        write_text(args.json, json.dumps(_json_value(rows), indent=1, allow_nan=False) + "\n",
                   inputs=output_inputs([args.path]))
    print(f"{args.path}: {len(rows)} gemms valid (trace v1, block {args.block})")
    return 0


def add_check_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("path", help="a trace folder or one record file")
    ap.add_argument("--block", type=int, default=16, help="tokens/in/out must be multiples of this")
    ap.add_argument("--json", default=None, metavar="FILE|-",
                    help="also write the statistics as JSON to FILE (-: to stdout, instead of the table)")


def main(argv: Optional[List[str]] = None) -> int:
    def body() -> int:
        ap = ArgumentParser(prog="python3 -m fp4lab.trace",
                            description="validate a trace folder/file and print outlier statistics")
        add_check_arguments(ap)
        return check_main(ap.parse_args(argv))

    return console_main("fp4lab.trace", body)


if __name__ == "__main__":
    sys.exit(main())
