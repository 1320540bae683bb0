#!/usr/bin/env python3
"""Benchmark: `fp4lab analyze` against a straightforward numpy implementation of the same definitions
(fp4lab.oracle), on the same traces, in the same run. Prints wall time, throughput in trace
elements per second for both, the ratio, and how closely the two agree.

    python3 scripts/bench_analyze.py --fp4lab build/bin/fp4lab [--trace DIR] [--larger 4] [--repeat 5] [--python]

--python also times fp4lab.analyze, the same library called in this process.

Runs of the two alternate (fp4lab, numpy, fp4lab, ...), so that load from other work on the machine falls on
both alike; the medians are compared. --larger F also times a trace F times the bundled one's tokens, made
from it (every record's X and dY rows repeated F times, each copy scaled by its own power of two so that no
two are equal; BF16 like the original), written to a temporary folder.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

from fp4lab import analyze as analyze_in_process
from fp4lab import oracle as analysis_numpy
from fp4lab import trace


def larger_trace(src, folder, factor):
    """The records of `src` with tokens x factor: X and dY rows repeated, copy c scaled by 2^-c (exact in BF16)."""
    for fn in trace.files(src):
        meta, tensors = trace.read_raw(fn)
        for name, a in tensors.items():
            assert trace.dtype_name(a) == "BF16", f"{fn}: {name} is {trace.dtype_name(a)}, expected BF16"
            if not name.endswith(".fwd_w"):  # X [tokens, in], dY [tokens, out]
                tensors[name] = np.concatenate([a * a.dtype.type(2.0**-c) for c in range(factor)])
        trace.write_file(os.path.join(folder, os.path.basename(fn)), tensors, meta)


def bench(fp4lab, trace, repeat, python=False):
    def run_fp4lab():
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            t0 = time.perf_counter()
            subprocess.run([fp4lab, "analyze", "--trace", trace, "--json", f.name], check=True,
                           stdout=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            return dt, json.load(open(f.name))

    def run_numpy():
        t0 = time.perf_counter()
        j = analysis_numpy.analyze(trace)
        return time.perf_counter() - t0, j

    def run_python():
        t0 = time.perf_counter()
        j = analyze_in_process(trace)
        return time.perf_counter() - t0, j

    runs_c, runs_n, runs_p = [], [], []
    for _ in range(repeat):  # alternating, so that the machine's load falls on all alike
        runs_c.append(run_fp4lab())
        runs_n.append(run_numpy())
        if python:
            runs_p.append(run_python())
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

    print(f"trace {trace}: {elements} elements, {len(jc['tensors'])} tensor and {len(jc['gemms'])} GEMM records")
    print(f"{'implementation':<22}{'wall (s, median of %d)' % repeat:>26}{'elements/s':>16}   all runs (s)")
    print(f"{'fp4lab analyze':<22}{tc:>26.3f}{elements / tc:>16.3e}   " + " ".join(f"{r[0]:.3f}" for r in runs_c))
    print(f"{'numpy (same defs)':<22}{tn:>26.3f}{elements / tn:>16.3e}   " + " ".join(f"{r[0]:.3f}" for r in runs_n))
    if python:
        tp = sorted(r[0] for r in runs_p)[len(runs_p) // 2]
        print(f"{'fp4lab.analyze':<22}{tp:>26.3f}{elements / tp:>16.3e}   " + " ".join(f"{r[0]:.3f}" for r in runs_p))
        mask = lambda j: {k: v for k, v in j.items() if k not in ("config", "git_commit")}  # noqa: E731
        assert mask(runs_p[0][1]) == mask(jc), "fp4lab.analyze and fp4lab analyze disagree"
        print(f"speed-up fp4lab.analyze / numpy: {tn / tp:.1f}x")
    print(f"speed-up fp4lab / numpy: {tn / tc:.1f}x")
    print(f"agreement: max |dSQNR| tensors {dt:.2e} dB (no RHT {dt0:.2e}), max |dB_eff| {db:.2e}, "
          f"max |dSQNR| GEMMs {dg:.2e} dB (numpy multiplies in plain FP32, not the block contract)")
    return tn / tc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4lab", default="build/bin/fp4lab")
    ap.add_argument("--trace", default=os.path.join(os.path.dirname(__file__), "..", "workloads", "tiny-lm", "step_005000"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the median is reported")
    ap.add_argument("--python", action="store_true", help="also time fp4lab.analyze (in process)")
    ap.add_argument("--larger", type=int, default=0, metavar="F",
                    help="also a trace with F times the tokens, made from --trace (BF16 traces)")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    ratios = [bench(a.fp4lab, a.trace, a.repeat, a.python)]
    if a.larger > 1:
        with tempfile.TemporaryDirectory() as d:
            larger_trace(a.trace, d, a.larger)
            print()
            ratios.append(bench(a.fp4lab, d, a.repeat, a.python))
    print(f"load average after: {os.getloadavg()[0]:.2f}; speed-ups: " + ", ".join(f"{r:.1f}x" for r in ratios))


if __name__ == "__main__":
    main()
