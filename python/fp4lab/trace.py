"""Trace v1 folders (docs/spec.md §7): reading, writing and checking them, through the `safetensors` package.

A trace is a folder of .safetensors files. Each record holds, for a linear layer `<gemm>`, the operands of its
three training GEMMs at one step: `<gemm>.fwd_x` [tokens, in], `<gemm>.fwd_w` [out, in] and `<gemm>.bwd_dy`
[tokens, out], BF16 or F32, with "fp4lab.trace.version": "1" in __metadata__. This module is the package's one
safetensors reader and writer; the C++ reader of `fp4lab analyze` reads the same files.

    from fp4lab import trace
    meta, arrays, dtypes = trace.read_file("t/step_000100/layers.0.mlp.fc2.safetensors")   # float32 arrays
    for gemm, x, w, dy in trace.records("t/step_000100"): ...
    rows = trace.check("t/step_000100")       # validates as the C++ reader does; outlier statistics per tensor

`python3 -m fp4lab.trace FOLDER|FILE [--block 16] [--json stats.json]` (also `fp4lab-capture check`) prints the
check's table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

TRACE_VERSION = "1"
ROLES = ("fwd_x", "fwd_w", "bwd_dy")
SUFFIX = ".safetensors"


class TraceError(Exception):
    """A one-line fault naming the file or module concerned."""


def _bf16():
    import ml_dtypes  # noqa: PLC0415 — numpy's BF16 dtype, which safetensors' numpy API maps to "BF16"
    return ml_dtypes.bfloat16


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


def write_file(path: str, tensors: Mapping[str, object], metadata: Mapping[str, object]) -> None:
    """Writes BF16 or F32 tensors (numpy arrays, ml_dtypes.bfloat16 for BF16, or torch tensors) and `metadata`
    (values as text) as one safetensors file; under a temporary name, then renamed, so that a killed writer
    leaves no truncated record."""
    from safetensors.numpy import save  # noqa: PLC0415
    arrays = {name: _as_numpy(name, t, path) for name, t in tensors.items()}
    blob = save(arrays, metadata={k: str(v) for k, v in metadata.items()})
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_raw(path: str) -> Tuple[Dict[str, str], Dict[str, np.ndarray]]:
    """(metadata, {name: array as stored}): BF16 as ml_dtypes.bfloat16, F32 and F16 as themselves."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415
    _bf16()
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such file")
    try:
        with safe_open(path, "numpy") as f:
            meta = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise TraceError(f"{path}: not a valid safetensors file ({str(e).splitlines()[0] if str(e) else e})") \
            from None
    return meta, arrays


_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def dtype_name(a: np.ndarray) -> str:
    """The safetensors name of an array's dtype (BF16, F32, F16, ...)."""
    return "BF16" if a.dtype == np.dtype(_bf16()) else _DTYPES.get(a.dtype, a.dtype.name.upper())


def read_file(path: str):
    """(metadata, {name: float32 array}, {name: stored dtype name}) of one file; only F32, BF16 and F16 tensors
    are accepted."""
    meta, raw = read_raw(path)
    arrays, dtypes = {}, {}
    for name, a in raw.items():
        dt = dtype_name(a)
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


def gemm_names(names) -> List[str]:
    """The GEMMs named by `<gemm>.<role>` tensor names, sorted."""
    return sorted({n.rsplit(".", 1)[0] for n in names if n.rsplit(".", 1)[-1] in ROLES})


def records(path: str):
    """[(gemm, X, W, dY)] as float32 arrays, in file order and, within a file, by name."""
    out = []
    for fn in files(path):
        _, arrays, _ = read_file(fn)
        out += [(g, *(arrays[f"{g}.{r}"] for r in ROLES)) for g in gemm_names(arrays)]
    return out


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
    """Validates a trace folder (or one file) as docs/spec.md §7 says; returns one dict per gemm."""
    out = []
    for f in files(path):
        meta, arrays, dtypes = read_file(f)
        if meta.get("fp4lab.trace.version") != TRACE_VERSION:
            raise TraceError(f"{f}: __metadata__ lacks \"fp4lab.trace.version\": \"1\"")
        gemms = gemm_names(arrays)
        if not gemms:
            raise TraceError(f"{f}: no <gemm>.fwd_x/.fwd_w/.bwd_dy tensors")
        for g in gemms:
            names = [f"{g}.{s}" for s in ROLES]
            for n in names:
                if n not in arrays:
                    raise TraceError(f"{f}: gemm {g!r} lacks tensor {n!r}")
                if dtypes[n] not in ("BF16", "F32"):
                    raise TraceError(f"{f}: tensor {n!r} is {dtypes[n]}, trace v1 allows BF16 or F32")
                if arrays[n].ndim != 2:
                    raise TraceError(f"{f}: tensor {n!r} has shape {list(arrays[n].shape)}, expected 2-D")
                bad = np.flatnonzero(~np.isfinite(arrays[n]))
                if bad.size:
                    raise TraceError(f"{f}: tensor {n!r}: non-finite value at flat index {bad[0]}")
            x, w, dy = (arrays[n] for n in names)
            t, i = x.shape
            o = w.shape[0]
            if w.shape[1] != i or dy.shape != (t, o):
                raise TraceError(f"{f}: gemm {g!r}: shapes fwd_x {list(x.shape)}, fwd_w {list(w.shape)}, "
                                 f"bwd_dy {list(dy.shape)} disagree")
            for what, n in (("tokens", t), ("in", i), ("out", o)):
                if n % block:
                    raise TraceError(f"{f}: gemm {g!r}: {what} = {n} is not a multiple of {block}")
            out.append({"file": f, "gemm": g, "tokens": t, "in": i, "out": o, "dtype": dtypes[names[0]],
                        "step": meta.get("step", ""), "model": meta.get("model", ""),
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


def check_main(args, prog: str) -> int:
    """The `check` command: the table, an optional JSON, a one-line fault and exit 1 on an invalid trace."""
    try:
        rows = check(args.path, args.block)
    except TraceError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    print_check(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{args.path}: {len(rows)} gemms valid (trace v1, block {args.block})")
    return 0


def add_check_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("path", help="a trace folder or one record file")
    ap.add_argument("--block", type=int, default=16, help="tokens/in/out must be multiples of this")
    ap.add_argument("--json", default=None, help="also write the statistics as JSON to this file")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m fp4lab.trace",
                                 description="validate a trace folder/file and print outlier statistics")
    add_check_arguments(ap)
    return check_main(ap.parse_args(argv), "fp4lab.trace")


if __name__ == "__main__":
    sys.exit(main())
