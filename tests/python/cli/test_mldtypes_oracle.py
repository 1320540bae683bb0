"""Independent oracle for the E2M1 codec: ml_dtypes' float4_e2m1fn RTNE cast against `fp4lab cast --format e2m1`.

Over > 10^6 FP32 values -- every level, every midpoint between neighbouring levels and up to 1000 ulps either
side of each, both signs, +-0, subnormals, uniform values over [-8, 8] and [-1e4, 1e4], and random finite bit
patterns over the whole FP32 range -- the 4-bit code fp4lab writes must equal ml_dtypes' bit pattern exactly,
and the dequantised FP32 value ml_dtypes' float32 value bit for bit (signed zeros included).

ml_dtypes (0.6.0 checked) saturates finite |x| > 6 to +-6, as fp4lab's cast does, so those values are
compared too; if an ml_dtypes version stops saturating, the comparison is restricted to |x| <= 6 and says so.
NaN and Inf are not compared: fp4lab rejects them with an error (checked below), while ml_dtypes maps
Inf to +-6 and NaN to a code of its choosing -- the 4-bit grid has no such values.

Run: python3 test_mldtypes_oracle.py --fp4lab build/bin/fp4lab   (or FP4LAB_BIN=... python3 -m pytest -q this file)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

E2M1_LEVELS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def ulp_neighbours(x, k):
    """Positive float32 values x moved by -k..+k ulps (bit-pattern steps; x > 0 and finite)."""
    bits = np.asarray(x, dtype=np.float32).view(np.int32)
    steps = np.arange(-k, k + 1, dtype=np.int32)
    out = (bits[:, None] + steps[None, :]).ravel()
    out = out[out >= 0]  # stepping below +0 would wrap into the negative bit patterns
    return out.view(np.float32)


def oracle_values(rng):
    mids = (E2M1_LEVELS[:-1] + E2M1_LEVELS[1:]) / 2  # 0.25 0.75 1.25 1.75 2.5 3.5 5: exact in FP32
    parts = [
        E2M1_LEVELS,
        mids,
        np.nextafter(mids, np.float32(0)),  # one ulp either side: a wrong tie rule shows here
        np.nextafter(mids, np.float32(np.inf)),
        ulp_neighbours(mids, 1000),
        ulp_neighbours(E2M1_LEVELS[1:], 200),
        np.array([0.0, np.finfo(np.float32).tiny, np.finfo(np.float32).max, 6.0, 7.0, 8.0, 1e30], np.float32),
        rng.uniform(-8.0, 8.0, 700_000).astype(np.float32),
        rng.uniform(-1e4, 1e4, 50_000).astype(np.float32),
        rng.uniform(6.0, 7.0, 20_000).astype(np.float32),
    ]
    # Random bit patterns with a finite exponent cover the whole FP32 range, subnormals included.
    bits = rng.integers(0, 2**32, 250_000, dtype=np.uint64).astype(np.uint32)
    bits = bits[(bits & 0x7F800000) != 0x7F800000]
    parts.append(bits.view(np.float32))
    sub = rng.integers(0, 0x00800000, 10_000, dtype=np.uint32)  # exponent field 0: subnormals
    parts.append(sub.view(np.float32))
    pos = np.concatenate([np.abs(p.astype(np.float32)) for p in parts])
    v = np.concatenate([pos, -pos])  # both signs, so -0 and every negative midpoint too
    assert np.all(np.isfinite(v))
    return v


def run_cast(fp4lab, folder, values):
    src, dst, js = (os.path.join(folder, n) for n in ("in.safetensors", "out.safetensors", "out.json"))
    save_file({"v": values}, src)
    cmd = [fp4lab, "cast", "--in", src, "--tensor", "v", "--format", "e2m1", "--rounding", "rtne", "--out", dst,
           "--json", js]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    out = load_file(dst)
    with open(js) as f:
        summary = json.load(f)
    return out["v.codes"], out["v.dequant"], summary


def check_oracle(fp4lab):
    rng = np.random.default_rng(20261129)
    values = oracle_values(rng)

    # How this ml_dtypes treats finite values above gmax = 6 decides what can be compared.
    probe = np.array([6.5, 7.0, 1e30, -1e30], np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    saturates = bool(np.array_equal(probe, np.array([6, 6, 6, -6], np.float32)))
    if not saturates:
        print(f"ml_dtypes {ml_dtypes.__version__} does not saturate above 6 ({probe}); comparing |x| <= 6 only")

    with tempfile.TemporaryDirectory(prefix="fp4lab_oracle_") as folder:
        codes, dequant, summary = run_cast(fp4lab, folder, values)
    assert codes.dtype == np.uint8 and codes.shape == values.shape, (codes.dtype, codes.shape)
    assert summary["count"] == values.size

    ml = values.astype(ml_dtypes.float4_e2m1fn)
    ml_codes = ml.view(np.uint8)
    assert np.all(ml_codes < 16), "ml_dtypes stores float4 in the low nibble of a byte"
    ml_values = ml.astype(np.float32)

    mask = np.ones(values.size, bool) if saturates else (np.abs(values) <= 6.0)
    n = int(mask.sum())
    bad = np.nonzero(mask & ((codes != ml_codes) | (dequant.view(np.uint32) != ml_values.view(np.uint32))))[0]
    mids = (E2M1_LEVELS[:-1] + E2M1_LEVELS[1:]) / 2
    n_mid = int(np.isin(np.abs(values[mask]), mids).sum())
    n_sat = int((np.abs(values[mask]) > 6).sum())
    print(f"compared {n} FP32 values ({n_mid} exact midpoints, {n_sat} above gmax 6, "
          f"{int((values[mask] == 0).sum())} zeros): {len(bad)} mismatches "
          f"(ml_dtypes {ml_dtypes.__version__}, saturating: {saturates})")
    for i in bad[:10]:
        print(f"  x = {values[i]!r} ({values[i:i+1].view(np.uint32)[0]:#010x}): fp4lab code {codes[i]:#06b}, "
              f"ml_dtypes code {ml_codes[i]:#06b}")
    assert n >= 1_000_000, f"only {n} values compared"
    assert n_mid >= 14, "every midpoint of both signs must be among the values"
    assert len(bad) == 0

    # NaN / Inf: no 4-bit code; fp4lab refuses them with one line naming the file, exit 1.
    with tempfile.TemporaryDirectory(prefix="fp4lab_oracle_") as folder:
        for bad_value in (np.nan, np.inf, -np.inf):
            src = os.path.join(folder, "nan.safetensors")
            save_file({"v": np.array([1.0, bad_value], np.float32)}, src)
            r = subprocess.run([fp4lab, "cast", "--in", src, "--tensor", "v", "--format", "e2m1", "--out",
                                os.path.join(folder, "o.safetensors")], capture_output=True, text=True)
            assert r.returncode == 1, (bad_value, r.returncode, r.stderr)
            assert r.stderr.count("\n") == 1 and src in r.stderr, r.stderr
    return n


def find_fp4lab(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp4lab", default=os.environ.get("FP4LAB_BIN"), help="path of the fp4lab executable")
    args, _ = p.parse_known_args(argv)
    if not args.fp4lab or not os.access(args.fp4lab, os.X_OK):
        raise SystemExit(f"fp4lab executable not found ({args.fp4lab!r}); pass --fp4lab PATH or set FP4LAB_BIN")
    return args.fp4lab


def test_e2m1_rtne_matches_ml_dtypes():
    """pytest entry: FP4LAB_BIN names the executable."""
    assert check_oracle(find_fp4lab([])) >= 1_000_000


if __name__ == "__main__":
    check_oracle(find_fp4lab(sys.argv[1:]))
    print("PASS")
