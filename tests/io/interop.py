#!/usr/bin/env python3
"""Cross-checks fp4lab's safetensors I/O against the reference Python implementation (safetensors.numpy)
and ml_dtypes' BF16 rounding. Called by interop_test.cpp:
  interop.py write <file>   write a file with known tensors for the C++ reader
  interop.py check <file>   verify a file the C++ writer produced; exit status 0 when it agrees
"""
import sys

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def write(path):
    save_file(
        {
            "f32": (np.arange(12, dtype=np.float32) * 0.25 - 1).reshape(3, 4),
            "f16": np.array([2.0**-24, 65504, -0.0, 1 / 3], dtype=np.float16),
            "bf16": np.array([1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, -2.5], dtype=np.float32).astype(ml_dtypes.bfloat16),
            "i64": np.array([-1, 2**40], dtype=np.int64),
        },
        path,
        metadata={"fp4lab.trace.version": "1", "model": "py"},
    )


def check(path):
    t = load_file(path)
    with safe_open(path, framework="numpy") as f:
        md = f.metadata()
    assert md == {"fp4lab.trace.version": "1", "writer": "c++"}, md
    src = t["src"]
    assert src.dtype == np.float32 and src.shape == (64, 64), (src.dtype, src.shape)
    got = t["bf16"]
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (64, 64), (got.dtype, got.shape)
    want = src.astype(ml_dtypes.bfloat16)  # ml_dtypes rounds to nearest even
    diff = np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))
    assert diff.size == 0, f"{diff.size} BF16 codes differ, first at {diff[0]}"
    assert (t["u8"] == np.arange(10, dtype=np.uint8)).all()
    print(f"interop: {src.size} BF16 values and metadata agree")


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
