#!/usr/bin/env python3
"""The same bits on every machine (docs/spec.md §6.1): fp4lab's outputs must not depend on the instruction set
the build targets, the thread count or the MPI rank count.

  check.py [--main build/bin/fp4lab] [--work build-arch]

Builds the fp4lab command line for baseline x86-64 and for x86-64-v3 (AVX2 and FMA) where this CPU runs it, beside
the main build (-march=native), then runs the same commands with each build under
1, 2 and 3 OpenMP threads, and the analyses under `mpirun -np 1/2/3` with the main and the baseline build, and
requires every output byte-identical to the main build's single-thread run: analyze JSON on both bundled traces
(every recipe, and a second set of knobs), sim JSON (a trace with --check, a shape list, a sweep's JSON and CSV),
bias JSON for every grid, and quantize/gemm outputs (codes, scales, C and its float64 reference). The wall-clock
`seconds` of an analysis and the JSON's `git_commit` stamp (taken when each build was configured) are masked;
nothing else is: each build runs as `./fp4lab` from a folder that links to it, so the command lines the outputs
record agree.
The SIMD paths the code selects at compile time (the contract GEMM's scalar / AVX2 / AVX-512 VNNI kernels, the
float64 reference tile's and RHT-16's AVX-512F forms) are each built by one of these builds where the CPU has
them: scalar by baseline, AVX2 by x86-64-v3, AVX-512 by the native build. x86-64-v4 is built on its own only when
the main build is not a -march=native one (its CMakeCache.txt says so): otherwise the native build already targets
AVX-512 (and VNNI where present), and without VNNI v4's GEMM path is x86-64-v3's; leaving it out saves a build.
Exits 1 naming the first output that differs.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
DOC = os.path.join(ROOT, "workloads", "doc-lm", "step_001999")
FC1 = os.path.join(DOC, "blocks.0.fc1.safetensors")

# The x86-64 levels (GCC's -march names) and the CPU flags each needs (the psABI's definition of the levels).
LEVELS = {
    "x86-64": set(),
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"},
    "x86-64-v4": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave",
                  "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
}

SWEEP = """
[defaults]
config = "{root}/sim/configs/h100-class.cfg"

[[grid]]
name = "{{recipe}}_{{mac.kind}}"
shapes = "{shapes}"
recipe = ["ufp4", "nvfp4"]
mac.kind = ["e2m1", "dual"]

[[grid]]
name = "trace_{{prep.mode}}"
trace = "{root}/workloads/tiny-lm/step_005000"
recipe = "mxfp4"
"prep.mode" = ["fused", "frontend"]
"""


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def is_native(main):
    """Whether the fp4lab at `main` comes from a -march=native build (FP4LAB_NATIVE on, no FP4LAB_MARCH), read from
    the CMakeCache.txt of its build folder (main is BUILD/bin/fp4lab); unknown counts as not native."""
    cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(main))), "CMakeCache.txt")
    try:
        with open(cache) as f:
            entries = dict(line.rstrip("\n").split("=", 1) for line in f
                           if "=" in line and not line.startswith(("#", "//")))
    except OSError:
        return False
    native = entries.get("FP4LAB_NATIVE:BOOL", "").upper() in ("ON", "1", "TRUE")
    return native and not entries.get("FP4LAB_MARCH:STRING")


def build(level, work, jobs):
    d = os.path.join(work, level)
    # A unity build (fewer, larger translation units: the shared headers parsed once) of the command line, sim and
    # analysis; the golden model's files stay separate (models/CMakeLists.txt). The -march level and the
    # floating-point flags are the project's, as in any build.
    cfg = ["cmake", "-S", ROOT, "-B", d, "-DCMAKE_BUILD_TYPE=Release", f"-DFP4LAB_MARCH={level}",
           "-DFP4LAB_TESTS=OFF", "-DFP4LAB_BENCH=OFF", "-DFP4LAB_RTL=OFF", "-DFP4LAB_PYTHON=OFF", "-DFP4LAB_CUDA=OFF",
           "-DCMAKE_UNITY_BUILD=ON"]
    subprocess.run(cfg, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", d, "-j", str(jobs), "--target", "fp4lab"], check=True,
                   stdout=subprocess.DEVNULL)
    return os.path.join(d, "bin", "fp4lab")


def mask(text):
    """What may differ between two runs: an analysis's wall-clock seconds, and the build's source stamp
    (`git describe` taken when each build was configured: "-dirty" when the tree had local changes then)."""
    text = re.sub(rb'"seconds": [-0-9.e+]+', b'"seconds": 0', text)
    return re.sub(rb'"git_commit": "[^"]*"', b'"git_commit": ""', text)


def cases(tmp):
    """(name, argv after the executable, files it writes) for every output compared."""
    shapes = os.path.join(tmp, "small.csv")
    with open(shapes, "w") as f:
        f.write("gemm,tokens,in,out,count\nqkv,512,1024,1536,4\nfc2,512,2048,1024,4\n")
    sweep = os.path.join(tmp, "s.toml")
    with open(sweep, "w") as f:
        f.write(SWEEP.format(root=ROOT, shapes=shapes))
    out = lambda name: os.path.join(tmp, "out", name)  # noqa: E731
    yield "analyze tiny-lm, every recipe", ["analyze", "--trace", TINY, "--recipe", "all", "--json", "-"], []
    yield "analyze doc-lm, every recipe", ["analyze", "--trace", DOC, "--recipe", "all", "--json", "-"], []
    yield ("analyze doc-lm, block 32, ue8m0, RHT 16/32/128, three grids",
           ["analyze", "--trace", DOC, "--formats", "e2m1,e1m2,int4", "--rht", "none,16,32,128", "--block", "32",
            "--scale", "ue8m0", "--recipe", "nvfp4,mxfp4", "--seed", "7", "--json", "-"], [])
    yield ("sim tiny-lm trace --check",
           ["sim", "--trace", TINY, "--config", os.path.join(ROOT, "sim", "configs", "h200.cfg"), "--recipe", "nvfp4",
            "--check", "--json", "-"], [])
    yield ("sim llama2-7b shapes",
           ["sim", "--shapes", os.path.join(ROOT, "workloads", "shapes", "llama2-7b.csv"), "--config",
            os.path.join(ROOT, "sim", "configs", "h100-class.cfg"), "--recipe", "ufp4", "--json", "-"], [])
    yield "sim --sweep", ["sim", "--sweep", sweep, "--out", out("sweep")], [out("sweep.json"), out("sweep.csv")]
    for fmt in ("e2m1", "e1m2", "int4", "e2m1_max2"):
        yield f"bias {fmt}", ["bias", "--format", fmt, "--json", "-"], []
    yield ("quantize nvfp4 bwd_dy with SR",
           ["quantize", "--in", FC1, "--tensor", "blocks.0.fc1.bwd_dy", "--recipe", "nvfp4", "--pass", "bwd_dw",
            "--role", "bwd_dy", "--out", out("q.safetensors"), "--json", "-"], [out("q.safetensors")])
    yield ("gemm ufp4 fwd_y (C and its float64 reference)",
           ["gemm", "--a", FC1 + ":blocks.0.fc1.fwd_x", "--b", FC1 + ":blocks.0.fc1.fwd_w", "--recipe", "ufp4",
            "--out", out("c.safetensors"), "--json", "-"], [out("c.safetensors")])


def run(argv, files, env, cwd):
    """Runs `./fp4lab ARGS` (every argument an absolute path) in `cwd`, which holds a link to one build's fp4lab,
    so that the command line the outputs record is the same for every build."""
    for f in files:
        if os.path.exists(f):
            os.unlink(f)
    p = subprocess.run(argv, capture_output=True, env=env, cwd=cwd)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(argv)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}")
    blobs = [mask(p.stdout)]
    for f in files:
        with open(f, "rb") as fh:
            blobs.append(fh.read())
    return blobs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--main", default=os.path.join(ROOT, "build", "bin", "fp4lab"), help="the native build's fp4lab")
    ap.add_argument("--work", default=os.path.join(ROOT, "build-arch"), help="folder for the other builds")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    ap.add_argument("--mpirun", default=shutil.which("mpirun"))
    a = ap.parse_args()
    flags = cpu_flags()
    levels = [lv for lv, need in LEVELS.items() if need <= flags]
    native = is_native(a.main)
    built = [lv for lv in levels if lv != "x86-64-v4" or not native]  # a native main covers AVX-512 (docstring)
    print(f"cross-build: CPU levels {', '.join(levels)}; built beside the main build ("
          f"{'-march=native' if native else 'not native'}): {', '.join(built)}; GEMM paths: scalar"
          + (", avx2" if "avx2" in flags else "") + (", avx512-vnni" if {"avx512f", "avx512bw", "avx512_vnni"} <= flags
                                                     else ""), flush=True)
    builds = {"native": os.path.abspath(a.main)}
    for lv in built:
        builds[lv] = build(lv, os.path.abspath(a.work), a.jobs)
    base_env = dict(os.environ, OMP_WAIT_POLICY="passive", OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    compared = 0
    with tempfile.TemporaryDirectory(prefix="fp4lab-cross-") as tmp:
        os.makedirs(os.path.join(tmp, "out"))
        links = {}
        for b, path in builds.items():
            links[b] = os.path.join(tmp, "bin", b)
            os.makedirs(links[b])
            os.symlink(path, os.path.join(links[b], "fp4lab"))
        all_cases = list(cases(tmp))
        want = {name: run(["./fp4lab", *argv], files, dict(base_env, OMP_NUM_THREADS="1"), links["native"])
                for name, argv, files in all_cases}
        for name, blobs in want.items():
            if sum(len(b) for b in blobs) < 100:
                sys.exit(f"FAIL: {name}: the reference run wrote nothing to compare")
        runs = [(b, f"{b}, {t} thread{'s' * (t > 1)}", [], t) for b in builds for t in (1, 2, 3)]
        if a.mpirun:
            mpi = [a.mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np"]
            runs += [(b, f"{b}, mpirun -np {n}", mpi + [str(n)], 1) for b in ("native", "x86-64") for n in (1, 2, 3)]
        else:
            sys.exit("FAIL: no mpirun: the rank-count comparison cannot run (install openmpi-bin)")
        for build_name, label, prefix, threads in runs:
            env = dict(base_env, OMP_NUM_THREADS=str(threads))
            for name, argv, files in all_cases:
                if prefix and not argv[0] == "analyze" and "--sweep" not in argv:
                    continue  # ranks share analyze's records and a sweep's runs; the rest is one process
                got = run(prefix + ["./fp4lab", *argv], files, env, links[build_name])
                for i, (x, y) in enumerate(zip(want[name], got)):
                    if x != y:
                        where = next(j for j in range(min(len(x), len(y))) if x[j] != y[j]) if len(x) == len(y) \
                            else min(len(x), len(y))
                        what = "stdout" if i == 0 else os.path.basename(files[i - 1])
                        sys.exit(f"FAIL: {name}: {what} of {label} differs from native, 1 thread, at byte {where}: "
                                 f"{x[max(0, where - 60):where + 60]!r} vs {y[max(0, where - 60):where + 60]!r}")
                    compared += 1
            print(f"cross-build: {label}: identical", flush=True)
    print(f"cross-build: {compared} outputs compared over {len(builds)} builds, 1-3 threads and 1-3 MPI ranks: "
          f"{compared} identical, 0 differ")


if __name__ == "__main__":
    main()
