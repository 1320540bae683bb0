"""A straightforward numpy implementation of fp4lab's pinned analyses (docs/spec.md §6): the test oracle (kept under tests/, not in the
package).

Written independently of the C++ code from the definitions alone (it calls nothing of fp4lab, and reads traces
with its own few lines of numpy), for three uses:
  * the baseline that `scripts/bench_analyze.py` times `fp4lab analyze` against,
  * a cross-check: tests/python compares its numbers with fp4lab's JSON, and
  * the reference that tests/python holds fp4lab.trace's reads against, byte for byte.

Blocks of 16 along the last dimension, one FP32 scale amax/gmax per block, RTNE (ties to the even level),
RHT-16 as H . diag(s) / 4 along the reduction dimension.
"""
import json
import math
import os
import sys

import numpy as np

# ---- reading: safetensors is [8 bytes: little-endian header length n][n bytes: JSON header][data] ----------------
# Only what trace v1 stores (F32 and BF16 along with F16), as 1-D views shaped by the header; no validation
# beyond what decoding needs: the reader under test does that.
_WIDE = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_safetensors(path):
    """(metadata, {name: (dtype name, array of the stored values)}), header order; BF16 as its uint16 bit patterns."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(data[b:end], dtype=_WIDE[e["dtype"]]).reshape(e["shape"]))
    return meta, out


def as_f32(dtype, a):
    """The values of a stored F32, F16 or BF16 array as float32 (BF16 is the top half of an FP32 bit pattern)."""
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def load_trace(path):
    """[(gemm, X, W, dY)] as float32 arrays: files by name, gemms by name within a file."""
    names = sorted(f for f in os.listdir(path) if f.endswith(".safetensors")) if os.path.isdir(path) else [path]
    out = []
    for fn in names:
        _, tensors = read_safetensors(os.path.join(path, fn) if os.path.isdir(path) else fn)
        for g in sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".fwd_x")}):
            out.append((g, *(as_f32(*tensors[f"{g}.{r}"]) for r in ("fwd_x", "fwd_w", "bwd_dy"))))
    return out

GRIDS = {
    "e2m1": np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32),
    "e1m2": np.arange(8, dtype=np.float32) * np.float32(0.25),
    "int4": np.arange(8, dtype=np.float32),
    "e2m1_max2": np.array([0, 0.5, 1, 1.5, 2], dtype=np.float32),
}
TE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], dtype=np.float32)


def hadamard(d):
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def rht(x, signs, d=16):
    """RHT along the last dimension in blocks of d: y = H diag(s) x / sqrt(d)."""
    m = (hadamard(d) * signs[None, :]).astype(np.float32) / np.float32(math.sqrt(d))
    return (x.reshape(-1, d) @ m.T).reshape(x.shape).astype(np.float32)


def quantize(x, grid, block=16):
    """Returns (dequantised, level index, scaled |value|) for 1 x block blocks along the last dim."""
    gmax = grid[-1]
    xb = x.reshape(-1, block).astype(np.float32)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    scale = (amax / gmax).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    v = np.minimum(np.abs(xb) / safe, gmax)
    mids = (grid[:-1] + grid[1:]) / np.float32(2)
    idx = np.searchsorted(mids, v, side="left")
    tie = (idx < len(mids)) & (mids[np.minimum(idx, len(mids) - 1)] == v)
    idx = np.where(tie & (idx % 2 == 1), idx + 1, idx)
    idx = np.where(scale == 0, 0, idx)
    deq = np.sign(xb) * grid[idx] * scale
    return deq.reshape(x.shape), idx.reshape(x.shape), (v * (scale != 0)).reshape(x.shape), (scale != 0)


def sqnr_db(ref, q):
    ref = ref.astype(np.float64)
    err = q.astype(np.float64) - ref
    return 10 * math.log10((ref * ref).sum() / (err * err).sum())


def beff(idx, k):
    p = np.bincount(idx.ravel(), minlength=k)[:k] / idx.size
    p = p[p > 0]
    return math.exp(-(p * np.log(p)).sum()) / k


def alpha(ref, q):
    ref = ref.astype(np.float64)
    return float((q.astype(np.float64) * ref).sum() / (ref * ref).sum())


def tensor_stats(x, grid_name, use_rht, signs=TE_SIGNS):
    grid = GRIDS[grid_name]
    seen = rht(x, signs) if use_rht else x
    deq, idx, v, valid = quantize(seen, grid)
    bias = []
    vb = v.reshape(-1, 16)[valid[:, 0]]
    ib = idx.reshape(-1, 16)[valid[:, 0]]
    for i, g in enumerate(grid):
        sel = ib == i
        bias.append(float((g - vb[sel]).mean()) if sel.any() else 0.0)
    return {"sqnr_db": sqnr_db(seen, deq), "beff": beff(idx, len(grid)), "alpha": alpha(seen, deq),
            "bias_per_level": bias}


def pass_operands(x, w, dy):
    return {"fwd_y": (x, w), "bwd_dx": (dy, np.ascontiguousarray(w.T)),
            "bwd_dw": (np.ascontiguousarray(dy.T), np.ascontiguousarray(x.T))}


def gemm_stats(a, b, grid_name, use_rht, signs=TE_SIGNS):
    grid = GRIDS[grid_name]
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    sa = rht(a, signs) if use_rht else a
    sb = rht(b, signs) if use_rht else b
    qa, _, _, _ = quantize(sa, grid)
    qb, _, _, _ = quantize(sb, grid)
    c = qa.astype(np.float32) @ qb.astype(np.float32).T
    return {"sqnr_db": sqnr_db(ref, c), "eta": alpha(sa, qa) * alpha(sb, qb)}


def analyze(trace, formats=("e2m1", "e1m2"), rhts=(0, 16)):
    tensors, gemms = [], []
    for g, x, w, dy in load_trace(trace):
        for fmt in formats:
            for d in rhts:
                for role, t in (("fwd_x", x), ("fwd_w", w), ("bwd_dy", dy)):
                    tensors.append({"gemm": g, "role": role, "format": fmt, "rht": d, **tensor_stats(t, fmt, d != 0)})
                for p, (a, b) in pass_operands(x, w, dy).items():
                    gemms.append({"gemm": g, "pass": p, "format": fmt, "rht": d, **gemm_stats(a, b, fmt, d != 0)})
    return {"fp4lab.analysis.version": 1, "config": {"implementation": "numpy"}, "tensors": tensors, "gemms": gemms}


if __name__ == "__main__":  # python3 tests/python/cli/oracle.py TRACE: the JSON on stdout
    json.dump(analyze(sys.argv[1]), sys.stdout, indent=1)
