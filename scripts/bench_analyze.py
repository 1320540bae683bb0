#!/usr/bin/env python3
"""Benchmark: `fp4lab analyze` against a straightforward numpy implementation of the same definitions
(scripts/analysis_numpy.py), on the same trace, in the same run. Prints wall time, throughput in trace
elements per second for both, the ratio, and how closely the two agree.

    python3 scripts/bench_analyze.py --fp4lab build/bin/fp4lab [--trace workloads/tiny-lm/step_005000]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analysis_numpy  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4lab", default="build/bin/fp4lab")
    ap.add_argument("--trace", default=os.path.join(os.path.dirname(__file__), "..", "workloads", "tiny-lm", "step_005000"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the median is reported")
    a = ap.parse_args()

    def run_fp4lab():
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            t0 = time.perf_counter()
            subprocess.run([a.fp4lab, "analyze", "--trace", a.trace, "--json", f.name], check=True,
                           stdout=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            return dt, json.load(open(f.name))

    def run_numpy():
        t0 = time.perf_counter()
        j = analysis_numpy.analyze(a.trace)
        return time.perf_counter() - t0, j

    runs_c = [run_fp4lab() for _ in range(a.repeat)]
    runs_n = [run_numpy() for _ in range(a.repeat)]
    tc = sorted(r[0] for r in runs_c)[len(runs_c) // 2]
    tn = sorted(r[0] for r in runs_n)[len(runs_n) // 2]
    jc, jn = runs_c[0][1], runs_n[0][1]
    elements = jc["config"]["elements"]

    key_t = lambda r: (r["gemm"], r["role"], r["format"], r["rht"])  # noqa: E731
    key_g = lambda r: (r["gemm"], r["pass"], r["format"], r["rht"])  # noqa: E731
    nt = {key_t(r): r for r in jn["tensors"]}
    ng = {key_g(r): r for r in jn["gemms"]}
    dt = max(abs(r["sqnr_db"] - nt[key_t(r)]["sqnr_db"]) for r in jc["tensors"])
    dt0 = max(abs(r["sqnr_db"] - nt[key_t(r)]["sqnr_db"]) for r in jc["tensors"] if r["rht"] == 0)
    db = max(abs(r["beff"] - nt[key_t(r)]["beff"]) for r in jc["tensors"])
    dg = max(abs(r["sqnr_db"] - ng[key_g(r)]["sqnr_db"]) for r in jc["gemms"] if key_g(r) in ng)

    print(f"trace {a.trace}: {elements} elements, {len(jc['tensors'])} tensor and {len(jc['gemms'])} GEMM records")
    print(f"{'implementation':<22}{'wall (s, median of %d)' % a.repeat:>26}{'elements/s':>16}")
    print(f"{'fp4lab analyze':<22}{tc:>26.3f}{elements / tc:>16.3e}")
    print(f"{'numpy (same defs)':<22}{tn:>26.3f}{elements / tn:>16.3e}")
    print(f"speed-up fp4lab / numpy: {tn / tc:.1f}x")
    print(f"agreement: max |dSQNR| tensors {dt:.2e} dB (no RHT {dt0:.2e}), max |dB_eff| {db:.2e}, "
          f"max |dSQNR| GEMMs {dg:.2e} dB (numpy multiplies in plain FP32, not the block contract)")


if __name__ == "__main__":
    main()
