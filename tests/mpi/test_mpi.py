#!/usr/bin/env python3
"""MPI runs of fp4lab against the single-process run (ctest label mpi; tests/mpi/CMakeLists.txt).

  test_mpi.py analyze --np N [--two]    tensors/gemms lists (and decay, inversion, elements) of
                                        `mpirun -np N fp4lab analyze` equal the plain run's, bit for bit
  test_mpi.py fault --np N              a NaN in one file among good ones: non-zero exit, the file and
                                        fault named once, no report left behind (not even a temporary)
  test_mpi.py sweep --np N              `fp4lab sim --sweep` JSON and CSV byte-identical to the plain run
  test_mpi.py sweep-fault --np N        a sweep with one bad run: non-zero exit, that run named once, no outputs
Plain Python: no pytest needed. Exit 0 on success, 1 with a message on failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRACE = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           OMP_WAIT_POLICY="passive", OMPI_MCA_rmaps_base_oversubscribe="1")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if check and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return p


def mpi(a, np_):
    return [a.mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", str(np_)]


def small_second_folder(tmp):
    """A second 'step': two of the bundled files, so the two folders differ in records and sizes."""
    d = os.path.join(tmp, "step_b")
    os.makedirs(d)
    for f in ("layers.0.attn.proj.safetensors", "layers.7.mlp.fc2.safetensors"):
        shutil.copy(os.path.join(TRACE, f), d)
    return d


def analyze(a, tmp):
    traces = [TRACE] + ([small_second_folder(tmp)] if a.two else [])
    # A recipe run too: its stochastic rounding is keyed by each record's identity (docs/spec.md §4), whichever rank
    # runs it.
    base = ["analyze", "--trace", *traces, "--formats", "e2m1,e1m2", "--rht", "none,16", "--recipe", "nvfp4"]
    plain, dist = os.path.join(tmp, "plain.json"), os.path.join(tmp, "mpi.json")
    run([a.fp4lab, *base, "--json", plain])
    p = run(mpi(a, a.np) + [a.fp4lab, *base, "--json", dist])
    with open(plain) as f:
        ref = f.read()
    with open(dist) as f:
        got = f.read()
    # Compare the lists as text as well as parsed: the text is the bit-level claim (17 significant digits).
    r, g = json.loads(ref), json.loads(got)
    for key in ("tensors", "gemms", "inversion", "decay"):
        if json.dumps(r[key]) != json.dumps(g[key]):
            fail(f"'{key}' differs between the plain run and -np {a.np}")
    if r["config"]["elements"] != g["config"]["elements"]:
        fail("config.elements differs")
    if not r["tensors"] or not any("recipe" in x for x in r["gemms"]):
        fail("the plain run produced no tensors or no recipe GEMMs: the comparison would prove nothing")
    if a.two and not all("trace" in x for x in r["tensors"]):
        fail("with two folders every entry should name its folder")
    # Rank 0 alone prints the table.
    if p.stdout.count("Tensor SQNR") != 1:
        fail(f"the table was printed {p.stdout.count('Tensor SQNR')} times, not once")
    print(f"ok: {len(r['tensors'])} tensors, {len(r['gemms'])} gemms identical with -np {a.np}"
          + (" over two folders" if a.two else ""))


def poison(path, tensor):
    """Writes a NaN over the first element of `tensor` (BF16 or F32) in a safetensors file."""
    import ml_dtypes  # noqa: F401  (BF16 arrays for safetensors' numpy API)
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    with safe_open(path, "numpy") as f:
        meta = f.metadata()
    tensors = load_file(path)
    tensors[tensor] = tensors[tensor].copy()
    tensors[tensor].reshape(-1)[0] = np.nan
    save_file(tensors, path, metadata=meta)


def fault(a, tmp):
    d = os.path.join(tmp, "trace")
    shutil.copytree(TRACE, d)
    bad = os.path.join(d, "layers.0.mlp.fc2.safetensors")
    poison(bad, "layers.0.mlp.fc2.bwd_dy")
    out = os.path.join(tmp, "out", "report.json")
    os.makedirs(os.path.dirname(out))
    single = run([a.fp4lab, "analyze", "--trace", d, "--json", out], check=False)
    p = run(mpi(a, a.np) + [a.fp4lab, "analyze", "--trace", d, "--json", out], check=False)
    if single.returncode == 0 or p.returncode == 0:
        fail(f"exit codes {single.returncode} (plain) and {p.returncode} (-np {a.np}): a NaN must fail the run")
    lines = [l for l in p.stderr.splitlines() if "error:" in l]
    if len(lines) != 1:
        fail(f"expected the fault named once, got {len(lines)} error lines:\n{p.stderr}")
    if bad not in lines[0] or "NaN" not in lines[0]:
        fail(f"the error line does not name the file and the fault: {lines[0]}")
    want = [l for l in single.stderr.splitlines() if "error:" in l]
    if want != lines:
        fail(f"-np {a.np} names a different fault than the plain run:\n{want}\n{lines}")
    left = os.listdir(os.path.dirname(out))
    if left:
        fail(f"a failed run left {left} behind")
    print(f"ok: -np {a.np} exit {p.returncode}, one line: {lines[0]}")


SWEEP = """
[meta]
note = "tests/mpi sweep"

[defaults]
config = "{root}/sim/configs/h100-class.cfg"

[[grid]]
name = "{{recipe}}_{{mac.kind}}"
shapes = "{shapes}"
recipe = ["ufp4", "e2m1-ref"]
mac.kind = ["e2m1", "dual"]

[[grid]]
name = "b{{block}}_lanes{{acc.lanes}}"
shapes = "{shapes}"
recipe = "ufp4"
block = [16, 32]
"acc.lanes" = [256, 128]

[[grid]]
name = "trace_{{prep.mode}}"
trace = "{root}/workloads/tiny-lm/step_005000"
recipe = "ufp4"
"prep.mode" = ["fused", "frontend"]
"""


def sweep(a, tmp):
    # Small shapes keep each run well under a second on the 2-core CI machine.
    shapes = os.path.join(tmp, "small.csv")
    with open(shapes, "w") as fh:
        fh.write("gemm,tokens,in,out,count\nqkv,512,1024,1536,4\nfc2,512,2048,1024,4\n")
    f = os.path.join(tmp, "s.toml")
    with open(f, "w") as fh:
        fh.write(SWEEP.format(root=ROOT, shapes=shapes))
    plain, dist = os.path.join(tmp, "plain"), os.path.join(tmp, "mpi")
    run([a.fp4lab, "sim", "--sweep", f, "--out", plain])
    p = run(mpi(a, a.np) + [a.fp4lab, "sim", "--sweep", f, "--out", dist])
    for ext in (".json", ".csv"):
        with open(plain + ext, "rb") as x, open(dist + ext, "rb") as y:
            if x.read() != y.read():
                fail(f"sweep {ext} differs between the plain run and -np {a.np}")
    runs = json.load(open(plain + ".json"))["runs"]
    if len(runs) != 10:
        fail(f"expected 10 runs, got {len(runs)}")
    if "sim sweep:" in p.stderr:  # progress goes to a terminal only (docs/spec.md §11.1)
        fail(f"a sweep wrote progress to a captured stderr: {p.stderr!r}")
    print(f"ok: {len(runs)} sweep runs, JSON and CSV identical with -np {a.np}")


def sweep_fault(a, tmp):
    shapes = os.path.join(tmp, "small.csv")
    with open(shapes, "w") as fh:
        fh.write("gemm,tokens,in,out,count\nqkv,512,1024,1536,4\n")
    f = os.path.join(tmp, "bad.toml")
    with open(f, "w") as fh:
        fh.write(f'[defaults]\nconfig = "{ROOT}/sim/configs/h100-class.cfg"\nshapes = "{shapes}"\n'
                 '[[grid]]\nname = "r_{recipe}"\nrecipe = ["ufp4", "e2m1-ref", "nosuch", "nvfp4"]\n')
    out = os.path.join(tmp, "out", "res")
    os.makedirs(os.path.dirname(out))
    p = run(mpi(a, a.np) + [a.fp4lab, "sim", "--sweep", f, "--out", out], check=False)
    lines = [l for l in p.stderr.splitlines() if "error:" in l]
    if p.returncode == 0 or len(lines) != 1 or "r_nosuch" not in lines[0] or "nosuch" not in lines[0]:
        fail(f"exit {p.returncode}, expected one error line naming run r_nosuch:\n{p.stderr}")
    if os.listdir(os.path.dirname(out)):
        fail(f"a failed sweep left {os.listdir(os.path.dirname(out))} behind")
    print(f"ok: -np {a.np} exit {p.returncode}, one line: {lines[0]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=["analyze", "fault", "sweep", "sweep-fault"])
    ap.add_argument("--fp4lab", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--two", action="store_true", help="analyze: two trace folders")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fp4lab-mpi-") as tmp:
        {"analyze": analyze, "fault": fault, "sweep": sweep, "sweep-fault": sweep_fault}[a.case](a, tmp)


if __name__ == "__main__":
    main()
