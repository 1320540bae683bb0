#!/usr/bin/env python3
"""Scale benchmark of MPI-sharded `fp4lab analyze` (docs/mpi.md).

Writes a synthetic trace v1 of >= --gb GB (BF16 operands; one safetensors file per GEMM, records of unequal
size) into a temporary folder (never into the repository), then runs
    mpirun -np R fp4lab analyze --trace DIR --formats F --rht D --json OUT
for each R of --ranks and reports: throughput in MB of operands per second, the speed-up and parallel
efficiency (speed-up / ranks) against one rank, each rank's peak RSS (getrusage of a small wrapper around each
rank) against the largest record, and whether the JSON lists equal the one-rank run's. The machine's load
(/proc/loadavg) before and after each run goes into the results, since other work perturbs the timings.

Usage: scripts/bench_mpi.py [--fp4lab build/bin/fp4lab] [--gb 2.1] [--ranks 1,2] [--json docs/results/bench-mpi.json]
                            [--txt docs/results/bench-mpi.txt] [--workdir DIR] [--keep]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

from fp4lab import trace

# Each rank runs under this wrapper, which reports the rank's peak RSS (ru_maxrss of its one child, in KiB).
RSS_WRAPPER = r"""
import os, resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
with open(os.path.join(sys.argv[1], "rss." + rank), "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
"""


def write_record(path, gemm, tokens, d_in, d_out, rng):
    """One trace v1 file: <gemm>.fwd_x [tokens, in], .fwd_w [out, in], .bwd_dy [tokens, out], BF16."""
    # Activations with per-channel scales (outlier channels), weights ~ N(0, 1/in), heavy-tailed gradients.
    x = rng.standard_normal((tokens, d_in), dtype=np.float32) * rng.lognormal(0, 1, d_in).astype(np.float32)
    w = rng.standard_normal((d_out, d_in), dtype=np.float32) / np.float32(np.sqrt(d_in))
    dy = rng.standard_t(4, (tokens, d_out)).astype(np.float32) * np.float32(1e-3)
    tensors = {f"{gemm}.{r}": a.astype(ml_dtypes.bfloat16) for r, a in zip(trace.ROLES, (x, w, dy))}  # RTNE
    trace.write_file(path, tensors, {"fp4lab.trace.version": "1", "source": "scripts/bench_mpi.py (synthetic)"})
    return sum(a.nbytes for a in tensors.values())


def make_trace(folder, gb, seed):
    """Records of unequal size (the sharding's balancing has work to do) until >= gb GB of operands.
    Narrow outputs keep the GEMMs cheap per element, so the run measures reading and quantising, not FLOPs."""
    rng = np.random.default_rng(seed)
    shapes = [(16384, 2048, 64), (8192, 2048, 32), (4096, 1024, 16), (16384, 1024, 32), (8192, 4096, 64)]
    total, largest, i = 0, 0, 0
    while total < gb * 1e9:
        t, d_in, d_out = shapes[i % len(shapes)]
        b = write_record(os.path.join(folder, f"synthetic.{i:03d}.safetensors"), f"layer{i}.linear", t, d_in, d_out, rng)
        total, largest, i = total + b, max(largest, b), i + 1
    return total, largest, i


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def run(a, ranks, trace, work):
    out = os.path.join(work, f"np{ranks}.json")
    rss_dir = os.path.join(work, f"rss{ranks}")
    os.makedirs(rss_dir, exist_ok=True)
    cmd = [a.mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), sys.executable, "-c", RSS_WRAPPER,
           rss_dir, a.fp4lab, "analyze", "--trace", trace, "--formats", a.formats, "--rht", a.rht, "--json", out]
    # One OpenMP thread per rank by default, so that R ranks use R cores and the speed-up is the sharding's.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(a.omp_threads))
    before = loadavg()
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"bench_mpi: -np {ranks} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss = [int(open(os.path.join(rss_dir, f"rss.{r}")).read()) * 1024 for r in range(ranks)]
    with open(out) as f:
        rep = json.load(f)
    return {"ranks": ranks, "wall_s": wall, "analyze_s": rep["config"]["seconds"], "peak_rss_bytes": rss,
            "loadavg_before": before, "loadavg_after": loadavg(),
            "lists": json.dumps([rep["tensors"], rep["gemms"]])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp4lab", default="build/bin/fp4lab")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--gb", type=float, default=2.1, help="operand bytes of the synthetic trace, GB (>= 2)")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--formats", default="e1m2", help="analyze --formats")
    ap.add_argument("--rht", default="none", help="analyze --rht")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS of each rank")
    ap.add_argument("--workdir", help="parent of the temporary trace folder (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic trace")
    ap.add_argument("--json", default="docs/results/bench-mpi.json")
    ap.add_argument("--txt", default="docs/results/bench-mpi.txt")
    a = ap.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]

    work = tempfile.mkdtemp(prefix="fp4lab-bench-mpi-", dir=a.workdir)
    try:
        trace = os.path.join(work, "trace")
        os.makedirs(trace)
        t0 = time.monotonic()
        total, largest, n = make_trace(trace, a.gb, a.seed)
        gen_s = time.monotonic() - t0
        print(f"bench_mpi: {n} records, {total / 1e9:.2f} GB of BF16 operands, largest record {largest / 1e6:.1f} MB "
              f"(written in {gen_s:.0f} s to {trace})", flush=True)
        runs = []
        for r in ranks:
            res = run(a, r, trace, work)
            runs.append(res)
            print(f"bench_mpi: -np {r}: {res['wall_s']:.1f} s, {total / 1e6 / res['wall_s']:.1f} MB/s, peak RSS "
                  + ", ".join(f"{x / 2**20:.0f} MiB" for x in res["peak_rss_bytes"]), flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    base = runs[0]
    rows = []
    for res in runs:
        speedup = base["wall_s"] / res["wall_s"] * base["ranks"]
        rows.append({
            "ranks": res["ranks"], "wall_s": round(res["wall_s"], 2), "analyze_s": round(res["analyze_s"], 2),
            "mb_per_s": round(total / 1e6 / res["wall_s"], 2),
            "speedup": round(speedup, 3), "efficiency": round(speedup / res["ranks"], 3),
            "peak_rss_mib": [round(x / 2**20, 1) for x in res["peak_rss_bytes"]],
            "rss_over_largest_record": [round(x / largest, 2) for x in res["peak_rss_bytes"]],
            "lists_identical_to_first": res["lists"] == base["lists"],
            "loadavg_before": res["loadavg_before"], "loadavg_after": res["loadavg_after"]})
    doc = {"fp4lab.bench_mpi.version": 1,
           "command": " ".join(sys.argv),
           "analyze": {"formats": a.formats, "rht": a.rht, "omp_threads_per_rank": a.omp_threads},
           "trace": {"records": n, "operand_bytes": total, "largest_record_bytes": largest, "dtype": "BF16",
                     "generated_s": round(gen_s, 1)},
           "machine": {"cpus": os.cpu_count(), "mpirun": subprocess.run([a.mpirun, "--version"], capture_output=True,
                                                                        text=True).stdout.splitlines()[0]},
           "runs": rows}
    lines = [f"fp4lab analyze over MPI ranks: synthetic trace of {n} records, {total / 1e9:.2f} GB BF16 operands, "
             f"largest record {largest / 1e6:.1f} MB; --formats {a.formats} --rht {a.rht}; {a.omp_threads} OpenMP "
             f"thread(s) per rank; {os.cpu_count()} CPUs shared with other users (see loadavg)",
             "ranks  wall s  MB/s   speed-up  efficiency  peak RSS per rank (MiB)  RSS / largest record  identical  loadavg before/after"]
    for r in rows:
        lines.append(f"{r['ranks']:5d}  {r['wall_s']:6.1f}  {r['mb_per_s']:5.1f}  {r['speedup']:8.2f}  {r['efficiency']:10.2f}  "
                     f"{', '.join(f'{x:.0f}' for x in r['peak_rss_mib']):23s}  "
                     f"{', '.join(f'{x:.2f}' for x in r['rss_over_largest_record']):20s}  "
                     f"{'yes' if r['lists_identical_to_first'] else 'NO':9s}  {' '.join(r['loadavg_before'])} / {' '.join(r['loadavg_after'])}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    for path, body in ((a.json, json.dumps(doc, indent=1) + "\n"), (a.txt, text)):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(body)
        os.replace(path + ".tmp", path)
    if not all(r["lists_identical_to_first"] for r in rows):
        sys.exit("bench_mpi: the JSON lists differ between rank counts")


if __name__ == "__main__":
    main()
