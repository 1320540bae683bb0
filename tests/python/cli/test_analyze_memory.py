#!/usr/bin/env python3
"""Peak memory of `fp4lab analyze` follows the record, not the trace: plain Python (no pytest, no fp4lab package).

Every run is under a small wrapper process that reports its one child's peak RSS (getrusage; a child's peak
includes its parent's pages at the fork, so the parent must stay small: this script is not):
  1. one small record: the binary's own footprint, subtracted from the others;
  2. 3,000 records of [16, 16, 16], one file each: above the footprint, under 24 kB per record (the report's text is
     about 12.6 kB per record; holding it as a JSON document took about 100 kB per record);
  3. each large record of LARGE, alone, by one check: above the footprint, under its limit in records.
     - [4096, 1024, 64] (9 MB of BF16): under 7 times with two OpenMP threads. Measured 4.7: the FP32 copies of
       its operands and each running task's quantised operands, as tasks happen to share a thread's heap. Holding
       the transposes of tensors up to 16 MB of floats took 7.0-7.4 (5.7 with one thread, 10.2 with four);
       holding its float64 bwd_dx reference, outputs and rotated copies whole took 14.4.
     - FP32 records of 32 and 48 MiB under the default settings: under 2 times. Measured 1.85 and 1.64: the
       record, and per running task one job's quantised B (and its packed copy) and a panel, every pass in
       panels. Holding every job's quantised B and the references of passes under 32 MB took 3.42 and 2.45 (in this test).
     The binary's own footprint (about 13 MiB) is not the record's: with it, 32 MiB peaks at 2.27 times the
     record, 48 MiB at 1.92, 64 MiB at 1.76 and 80 MiB at 1.71.
Each report must be complete: every record's tensors and GEMMs.

    python3 tests/python/cli/test_analyze_memory.py --fp4lab build/bin/fp4lab
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np


def write_record(path, gemm, shape, rng, dtype="BF16"):
    """One trace v1 file holding one record, BF16 (the top 16 bits of FP32 normals: finite, heavy enough) or F32."""
    tokens, d_in, d_out = shape
    shapes = {"fwd_x": (tokens, d_in), "fwd_w": (d_out, d_in), "bwd_dy": (tokens, d_out)}
    header, blobs, off = {"__metadata__": {"fp4lab.trace.version": "1"}}, [], 0
    for role, s in shapes.items():
        v = rng.standard_normal(s, dtype=np.float32)
        data = v.astype("<f4").tobytes() if dtype == "F32" else (v.view(np.uint32) >> 16).astype("<u2").tobytes()
        header[f"{gemm}.{role}"] = {"dtype": dtype, "shape": list(s), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return off


# The large records of run 3 (see above): (name, [tokens, in, out], dtype, limit in records),
# each under the default settings.
LARGE = [
    ("BF16 record", (4096, 1024, 64), "BF16", 7.0),
    ("FP32 record", (1024, 2048, 2048), "F32", 2.0),
    ("FP32 record", (2048, 2048, 2048), "F32", 2.0),
]

WRAPPER = r"""
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stderr.strip())
"""


def analyze(fp4lab, folder, out):
    """(peak RSS in bytes, the report) of one analyze run."""
    # Two threads, as on the CI runner: each running task holds its own quantised operands.
    r = subprocess.run([sys.executable, "-S", "-c", WRAPPER, fp4lab, "analyze", "--trace", folder, "--json", out],
                       capture_output=True, text=True, check=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    code, kib, err = (r.stdout.split(" ", 2) + [""])[:3]
    if code != "0":
        sys.exit(f"test_analyze_memory: analyze {folder} failed ({code}): {err.strip()}")
    with open(out) as f:
        report = json.load(f)
    return int(kib) * 1024, report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4lab", required=True)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    failures = []
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "a.json")
        one, many, large = (os.path.join(d, n) for n in ("one", "many", "large"))
        for f in (one, many, large):
            os.mkdir(f)

        write_record(os.path.join(one, "r.safetensors"), "r.linear", (16, 16, 16), rng)
        base, _ = analyze(a.fp4lab, one, out)

        n = 3000
        for i in range(n):
            write_record(os.path.join(many, f"r{i:05d}.safetensors"), f"r{i:05d}.linear", (16, 16, 16), rng)
        rss, report = analyze(a.fp4lab, many, out)
        if len(report["tensors"]) != 12 * n or len(report["gemms"]) != 12 * n:
            failures.append(f"{n} records: {len(report['tensors'])} tensors and {len(report['gemms'])} GEMMs reported")
        per_record = (rss - base) / n
        print(f"{n} records of [16, 16, 16]: peak RSS {rss / 2**20:.1f} MiB, {per_record / 1e3:.1f} kB per record "
              f"above one record's {base / 2**20:.1f} MiB")
        if per_record > 24e3:
            failures.append(f"{n} records: {per_record / 1e3:.1f} kB per record above the footprint (limit 24 kB)")

        # One check for every large record, each alone in its folder, its file removed after.
        for name, shape, dtype, limit in LARGE:
            path = os.path.join(large, "r.safetensors")
            record = write_record(path, "big", shape, rng, dtype)
            rss, report = analyze(a.fp4lab, large, out)
            os.remove(path)
            jobs = len(report["config"]["settings"])
            if len(report["tensors"]) != 3 * jobs or len(report["gemms"]) != 3 * jobs:
                failures.append(f"{name}: incomplete report")
            ratio = (rss - base) / record
            print(f"{name} {list(shape)} ({record / 2**20:.1f} MiB): peak RSS "
                  f"{rss / 2**20:.1f} MiB, {ratio:.2f} times the record above the footprint (limit {limit})")
            if ratio > limit:
                failures.append(f"{name} {list(shape)}: {ratio:.2f} times the record above the footprint (limit {limit})")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
