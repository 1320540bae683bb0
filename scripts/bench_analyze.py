#!/usr/bin/env python3
"""Benchmark: `fp4lab analyze` against a straightforward numpy implementation of the same definitions
(tests/python/cli/oracle.py), on the same traces, in the same run. Prints wall time, throughput in trace
elements per second for both, the ratio, and how closely the two agree.

    python3 scripts/bench_analyze.py --fp4lab build/bin/fp4lab [--trace DIR] [--larger 4] [--repeat 5] [--python]
                                     [--memory [--small-records 40000]]

--python also times fp4lab.analyze, the same library called in this process.

--memory also measures peak RSS (getrusage of each run in a process of its own) of fp4lab analyze and of the numpy
analysis, side by side, on three synthetic BF16 traces written to a temporary folder: one small record alone (the
binary's own overhead), one large record [16384, 2048, 64] of 69.5 MB (the largest record of
scripts/bench_mpi.py's trace), and --small-records records of [32, 32, 16] (4.1 kB each), one file each. It prints
each run's wall time and fp4lab's JSON size. With --python it also measures fp4lab.analyze in a process of its own,
returning the report as a dict and writing it with json=PATH.

Runs of the two alternate (fp4lab, numpy, fp4lab, ...), so that load from other work on the machine falls on
both alike; the medians are compared. --larger F also times a trace F times the bundled one's tokens, made
from it (every record's X and dY rows repeated F times, each copy scaled by its own power of two so that no
two are equal; BF16 like the original), written to a temporary folder.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from fp4lab import analyze as analyze_in_process
from fp4lab import trace

# The numpy oracle is the tests' (tests/python/cli/oracle.py), not the package's.
ORACLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python", "cli")
sys.path.insert(0, ORACLE_DIR)
import oracle as analysis_numpy  # noqa: E402


def larger_trace(src, folder, factor):
    """The records of `src` with tokens x factor: X and dY rows repeated, copy c scaled by 2^-c (exact in BF16)."""
    for fn in trace.files(src):
        meta, tensors = trace.read_raw(fn)
        for name, a in tensors.items():
            assert trace.dtype_name(a) == "BF16", f"{fn}: {name} is {trace.dtype_name(a)}, expected BF16"
            if not name.endswith(".fwd_w"):  # X [tokens, in], dY [tokens, out]
                tensors[name] = np.concatenate([a * a.dtype.type(2.0**-c) for c in range(factor)])
        trace.write_file(os.path.join(folder, os.path.basename(fn)), tensors, meta)


def bench(fp4lab, trace, repeat, python=False, label=None):
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

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shown = label or (os.path.relpath(trace, root) if os.path.abspath(trace).startswith(root + os.sep) else trace)
    print(f"trace {shown}: {elements} elements, {len(jc['tensors'])} tensor and {len(jc['gemms'])} GEMM records")
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


# Runs argv[1:] and prints the peak RSS of that one child in KiB (ru_maxrss of RUSAGE_CHILDREN), so that each
# measured run has a process of its own and the figure is not the maximum over everything run before it.
RSS_WRAPPER = r"""
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
# The numpy analysis of one trace, as its own process.
NUMPY_RUN = f"import sys; sys.path.insert(0, {ORACLE_DIR!r}); import oracle; oracle.analyze(sys.argv[1])"


def synthetic_trace(folder, shape, records, seed):
    """`records` files of one record each, [tokens, in, out] = shape, BF16: heavy-tailed activations with outlier
    channels, Gaussian weights, Student-t gradients. Returns the bytes of one record."""
    import ml_dtypes
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    t, d_in, d_out = shape
    for i in range(records):
        x = rng.standard_normal((t, d_in), dtype=np.float32) * rng.lognormal(0, 1, d_in).astype(np.float32)
        w = rng.standard_normal((d_out, d_in), dtype=np.float32) / np.float32(np.sqrt(d_in))
        dy = rng.standard_t(4, (t, d_out)).astype(np.float32) * np.float32(1e-3)
        tensors = {f"r{i:06d}.linear.{r}": a.astype(ml_dtypes.bfloat16) for r, a in zip(trace.ROLES, (x, w, dy))}
        trace.write_file(os.path.join(folder, f"r{i:06d}.safetensors"), tensors,
                         {"fp4lab.trace.version": "1", "source": "scripts/bench_analyze.py (synthetic)"})
    return 2 * (t * d_in + d_out * d_in + t * d_out)


def peak_rss(argv):
    """(peak RSS in bytes, wall seconds) of argv run in a process of its own."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", RSS_WRAPPER] + argv, check=True, capture_output=True, text=True)
    return int(p.stdout.split()[-1]) * 1024, time.perf_counter() - t0


PY_ANALYZE = "import sys, fp4lab; r = fp4lab.analyze(sys.argv[1], json=sys.argv[2] if len(sys.argv) > 2 else None)"


def memory(fp4lab, small_records, python=False):
    """Peak RSS of fp4lab analyze and of the numpy analysis on the synthetic traces, side by side (and of
    fp4lab.analyze, returning a dict or writing json=, with python)."""
    mib = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    size_text = lambda b: f"{b / 1e6:.1f} MB" if b >= 1e6 else f"{b / 1e3:.1f} kB"  # noqa: E731
    # Peak RSS over the record's size, where the record is large enough for the ratio to mean something.
    ratio = lambda rss, record: f"{rss / record:.2f}x" if record >= 1e6 else "-"  # noqa: E731
    print(f"\nmemory: peak RSS of each run in a process of its own; BF16 records, one file each "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(f"{'trace':<30}{'largest record':>15} | {'fp4lab RSS':>10}{'/ record':>9}{'wall s':>8}{'JSON':>10}"
          f"{'JSON/rec':>10} | {'numpy RSS':>10}{'/ record':>9}{'wall s':>8}")
    with tempfile.TemporaryDirectory() as d:
        cases = [("one record [32, 32, 16]", (32, 32, 16), 1),
                 ("one record [16384, 2048, 64]", (16384, 2048, 64), 1),
                 (f"{small_records} records [32, 32, 16]", (32, 32, 16), small_records)]
        for i, (name, shape, n) in enumerate(cases):
            folder = os.path.join(d, f"t{i}")
            record = synthetic_trace(folder, shape, n, seed=i)
            out = os.path.join(d, "analysis.json")
            rss_c, tc = peak_rss([fp4lab, "analyze", "--trace", folder, "--json", out])
            size = os.path.getsize(out)
            rss_n, tn = peak_rss([sys.executable, "-c", NUMPY_RUN, folder])
            print(f"{name:<30}{size_text(record):>15} | {mib(rss_c):>10}{ratio(rss_c, record):>9}{tc:>8.1f}"
                  f"{size_text(size):>10}{size_text(size / n):>10} | {mib(rss_n):>10}{ratio(rss_n, record):>9}{tn:>8.1f}",
                  flush=True)
            if python:
                rss_d, td = peak_rss([sys.executable, "-c", PY_ANALYZE, folder])
                rss_j, tj = peak_rss([sys.executable, "-c", PY_ANALYZE, folder, out])
                print(f"{'  fp4lab.analyze: dict':<30}{'':>15} | {mib(rss_d):>10}{ratio(rss_d, record):>9}{td:>8.1f}"
                      f"{'':>20} |\n{'  fp4lab.analyze: json=':<30}{'':>15} | {mib(rss_j):>10}"
                      f"{ratio(rss_j, record):>9}{tj:>8.1f}{size_text(os.path.getsize(out)):>10}", flush=True)
            shutil.rmtree(folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4lab", default="build/bin/fp4lab")
    ap.add_argument("--trace", default=os.path.join(os.path.dirname(__file__), "..", "workloads", "tiny-lm", "step_005000"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the median is reported")
    ap.add_argument("--python", action="store_true", help="also time fp4lab.analyze (in process)")
    ap.add_argument("--larger", type=int, default=0, metavar="F",
                    help="also a trace with F times the tokens, made from --trace (BF16 traces)")
    ap.add_argument("--memory", action="store_true",
                    help="also peak RSS of both on a large record and on many small ones (synthetic, see above)")
    ap.add_argument("--small-records", type=int, default=40000, metavar="N",
                    help="records of the many-small-records trace of --memory")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    ratios = [bench(a.fp4lab, a.trace, a.repeat, a.python)]
    if a.larger > 1:
        with tempfile.TemporaryDirectory() as d:
            larger_trace(a.trace, d, a.larger)
            print()
            ratios.append(bench(a.fp4lab, d, a.repeat, a.python, f"--trace with {a.larger}x its tokens (temporary)"))
    print(f"load average after: {os.getloadavg()[0]:.2f}; speed-ups: " + ", ".join(f"{r:.1f}x" for r in ratios))
    if a.memory:
        memory(a.fp4lab, a.small_records, a.python)


if __name__ == "__main__":
    main()
