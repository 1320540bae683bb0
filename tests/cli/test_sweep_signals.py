#!/usr/bin/env python3
"""Hostile sweeps and signals against the fp4lab command line (ctest label unit; tests/cli/CMakeLists.txt).

  test_sweep_signals.py --fp4lab BIN

Sweep files: a name template whose values hold the placeholder again, a grid past the run limit, an output prefix
naming a run's own input, a FIFO or a folder as the sweep file, keys that are not run options, one key spelt twice
-- each refused at once with one line naming the file and the fault, exit 2 (usage) or 1 (data), nothing written.
A float64 GEMM reference past FLT_MAX is a data fault, not an Inf written with exit 0. analyze refuses a grid, RHT
size or record given twice, and names rows of a folder given as DIR/ by the folder.
Signals: SIGINT, SIGTERM, SIGHUP and SIGPIPE arriving while an output's temporary exists end the run by that signal
and leave no temporary behind; an output name at the file system's limit is written.
A sweep reports progress on stderr only when stderr is a terminal.
Plain Python: exit 0 on success, 1 with a message on failure.
"""
import argparse
import os
import pty
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FC1 = os.path.join(ROOT, "workloads", "doc-lm", "step_001999", "blocks.0.fc1.safetensors")
CFG = os.path.join(ROOT, "sim", "configs", "h100-class.cfg")
checked = 0


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def refused(fp4lab, tmp, argv, code, *words, timeout=20):
    """The run must end within `timeout` with exit `code` and one error line holding every word, writing nothing."""
    global checked
    before = set(os.listdir(tmp))
    try:
        p = subprocess.run([fp4lab, *argv], capture_output=True, text=True, timeout=timeout, cwd=tmp)
    except subprocess.TimeoutExpired:
        fail(f"{argv} did not end within {timeout} s")
    lines = [l for l in p.stderr.splitlines() if "error" in l]
    if p.returncode != code or len(lines) != 1 or not all(w in lines[0] for w in words):
        fail(f"{argv}: exit {p.returncode} (want {code}), stderr {p.stderr!r} (want one line with {words})")
    if len(lines[0]) > 400:
        fail(f"{argv}: the error line is {len(lines[0])} bytes long")
    left = set(os.listdir(tmp)) - before
    if left:
        fail(f"{argv} left {sorted(left)} behind")
    checked += 1


def documented_limit():
    """The run limit docs/mpi.md and docs/spec.md state (the error message must give the same number)."""
    import re
    found = set()
    for doc in ("docs/mpi.md", "docs/spec.md"):
        with open(os.path.join(ROOT, doc)) as f:
            m = re.search(r"at most ([0-9,]+) runs", " ".join(f.read().split()))
        if not m:
            fail(f"{doc} states no sweep run limit")
        found.add(int(m.group(1).replace(",", "")))
    if len(found) != 1:
        fail(f"the documents state different run limits: {found}")
    return found.pop()


def sweeps(fp4lab, tmp):
    global checked

    def toml(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    shapes = os.path.join(tmp, "s.csv")
    with open(shapes, "w") as f:
        f.write("gemm,tokens,in,out,count\nqkv,64,256,256,1\n")
    head = f'[defaults]\nconfig = "{CFG}"\nshapes = "{shapes}"\n\n[[grid]]\n'
    # A value holding the placeholder: the name is built once, so it neither loops nor grows.
    s = toml("self.toml", head + 'name = "{recipe}"\nrecipe = ["{recipe}x", "ufp4"]\n')
    refused(fp4lab, tmp, ["sim", "--sweep", s, "--out", "o"], 2, "{recipe}x")  # then the run itself is refused
    # 9 keys x 10 values: 10^9 runs, refused before any is built.
    big = head + "".join(f'k{i} = [{", ".join(str(v) for v in range(10))}]\n' for i in range(9))
    limit = documented_limit()
    refused(fp4lab, tmp, ["sim", "--sweep", toml("big.toml", big)], 2, "big.toml", f"more than {limit} runs",
            timeout=5)
    # --out PREFIX naming a run's own input file (the shape list s.csv): refused, the file untouched.
    s = toml("ok.toml", head + 'recipe = "ufp4"\n')
    with open(shapes, "rb") as f:
        want = f.read()
    refused(fp4lab, tmp, ["sim", "--sweep", s, "--out", os.path.join(tmp, "s")], 2, "s.csv", "also an input")
    with open(shapes, "rb") as f:
        if f.read() != want:
            fail("a refused sweep changed its shape list")
    # A FIFO and a folder as the sweep file.
    fifo = os.path.join(tmp, "f.toml")
    os.mkfifo(fifo)
    refused(fp4lab, tmp, ["sim", "--sweep", fifo], 1, "f.toml", "not a regular file")
    os.unlink(fifo)
    refused(fp4lab, tmp, ["sim", "--sweep", tmp], 1, "not a regular file")
    # Keys that are the sweep's or the program's options, not a run's.
    for key in ("help", "version", "json", "sweep", "out"):
        s = toml("key.toml", head + f'recipe = "ufp4"\n{key} = "x"\n')
        refused(fp4lab, tmp, ["sim", "--sweep", s, "--out", "o"], 2, "key.toml", f"'{key}'", "not an option of one run")
    # One key spelt twice in one table.
    s = toml("twice.toml", head + 'recipe = "ufp4"\nprep.mode = "fused"\n"prep.mode" = "frontend"\n')
    refused(fp4lab, tmp, ["sim", "--sweep", s, "--out", "o"], 2, "twice.toml", "'prep.mode' is given twice")
    # An unset placeholder and an overlong name.
    s = toml("unset.toml", head + 'name = "{nope}"\nrecipe = "ufp4"\n')
    refused(fp4lab, tmp, ["sim", "--sweep", s, "--out", "o"], 2, "unset.toml", "{nope}")
    s = toml("long.toml", head + f'name = "{"x" * 2000}"\nrecipe = "ufp4"\n')
    refused(fp4lab, tmp, ["sim", "--sweep", s, "--out", "o"], 2, "long.toml", "at most 1024")
    for f in os.listdir(tmp):
        if f.endswith(".toml"):
            os.unlink(os.path.join(tmp, f))
    # The good sweep still runs and writes both outputs; with stderr not a terminal it reports no progress (a
    # captured stderr holds nothing but a failure's line), with a terminal it reports each run.
    s = toml("ok.toml", head + 'recipe = ["ufp4", "nvfp4"]\n')
    p = subprocess.run([fp4lab, "sim", "--sweep", s, "--out", "good"], capture_output=True, text=True, cwd=tmp)
    if p.returncode != 0 or not os.path.exists(os.path.join(tmp, "good.json")):
        fail(f"a good sweep failed: {p.stderr}")
    if p.stderr:
        fail(f"a sweep with stderr not a terminal wrote progress: {p.stderr!r}")
    master, slave = pty.openpty()
    p = subprocess.run([fp4lab, "sim", "--sweep", s, "--out", "good"], stdout=subprocess.DEVNULL, stderr=slave,
                       cwd=tmp)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    if p.returncode != 0 or b"sim sweep: [2/2]" not in seen:
        fail(f"a sweep on a terminal: exit {p.returncode}, progress {seen!r}")
    checked += 2


def temporaries(folder):
    return [f for f in os.listdir(folder) if ".tmp-" in f]


def signals(fp4lab, tmp):
    """quantize writes --out through a temporary renamed into place after its JSON reaches stdout; a stdout that
    blocks (a full pipe) holds the run there, with the temporary present, until the signal comes."""
    global checked
    out = os.path.join(tmp, "q.safetensors")
    argv = [fp4lab, "quantize", "--in", FC1, "--tensor", "blocks.0.fc1.fwd_x", "--recipe", "ufp4", "--out", out,
            "--json", "-"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * 65536)  # fill the pipe: the child's first write to stdout blocks
        except BlockingIOError:
            pass
        os.set_blocking(w, True)
        p = subprocess.Popen(argv, stdout=w, stderr=subprocess.DEVNULL)
        os.close(w)
        deadline = time.time() + 30
        while not temporaries(tmp) and time.time() < deadline and p.poll() is None:
            time.sleep(0.01)
        if not temporaries(tmp):
            fail(f"{signal.Signals(sig).name}: no temporary appeared while stdout was blocked")
        time.sleep(0.1)
        p.send_signal(sig)
        rc = p.wait(timeout=30)
        os.close(r)
        if rc != -sig:
            fail(f"{signal.Signals(sig).name}: exit status {rc}, want death by the signal ({-sig})")
        if temporaries(tmp) or os.path.exists(out):
            fail(f"{signal.Signals(sig).name} left {os.listdir(tmp)} behind")
        checked += 1
    # SIGPIPE: stdout's reader is gone before the JSON is written.
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run(argv, stdout=w, stderr=subprocess.DEVNULL, restore_signals=True)
    os.close(w)
    if p.returncode != -signal.SIGPIPE or temporaries(tmp) or os.path.exists(out):
        fail(f"SIGPIPE: exit {p.returncode}, left {os.listdir(tmp)}")
    checked += 1
    # An output name at the file system's limit: the temporary's longer name must not make the run fail.
    longest = os.path.join(tmp, "q" * (os.pathconf(tmp, "PC_NAME_MAX") - len(".safetensors")) + ".safetensors")
    p = subprocess.run(argv[:-4] + ["--out", longest], capture_output=True, text=True)
    if p.returncode != 0 or not os.path.exists(longest) or temporaries(tmp):
        fail(f"an output name of NAME_MAX bytes: exit {p.returncode}: {p.stderr}")
    os.unlink(longest)
    checked += 1


def gemm_reference_overflow(fp4lab, tmp):
    """A float64 reference past FLT_MAX cannot be written as FP32: a data fault (exit 1), even where the quantised
    product stays finite. A = [7t, 0.49t x 15]: int4 rounds the small values to 0, so C = 7t.v while
    C.ref = 14.35tv; with 7tv = 2e38, C is finite and C.ref is not."""
    import numpy as np
    from safetensors.numpy import save_file
    f = os.path.join(tmp, "big.safetensors")
    t, v = np.float32(1e19), np.float32(2e38 / 7e19)
    a = np.full((1, 16), 0.49 * t, np.float32)
    a[0, 0] = 7 * t
    save_file({"a": a, "b": np.full((1, 16), v, np.float32)}, f)
    refused(fp4lab, tmp, ["gemm", "--a", f + ":a", "--b", f + ":b", "--format", "int4", "--out", "c.safetensors"], 1,
            "big.safetensors", "C.ref[0, 0]", "overflows FP32")
    os.unlink(f)


def analyze_lists(fp4lab, tmp):
    """A grid, an RHT size or a record given twice is refused, not analysed twice; a folder given with a trailing
    '/' names its rows by the folder's name."""
    import shutil
    trace = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
    refused(fp4lab, tmp, ["analyze", "--trace", trace, "--formats", "e2m1,e2m1"], 2, "e2m1 is given twice")
    refused(fp4lab, tmp, ["analyze", "--trace", trace, "--rht", "16,none,16"], 2, "16 is given twice")
    one = os.path.join(trace, "layers.0.mlp.fc2.safetensors")
    refused(fp4lab, tmp, ["analyze", "--trace", trace, one], 2, "layers.0.mlp.fc2", "given twice")
    second = os.path.join(tmp, "second")
    os.makedirs(second)
    shutil.copy(one, second)
    p = subprocess.run([fp4lab, "analyze", "--trace", second + "/", trace + "/"], capture_output=True, text=True)
    shutil.rmtree(second)
    if p.returncode != 0:
        fail(f"analyze of two folders with trailing slashes: {p.stderr}")
    rows = [l.split()[0] for l in p.stdout.splitlines() if len(l.split()) > 2 and l.split()[1] == "fwd_y"]
    names = {r.split(":")[0] for r in rows}
    if not rows or names != {"second", "step_005000"}:
        fail(f"table rows named by {names}, want the folders' names")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp4lab", required=True)
    ap.add_argument("--no-sim", action="store_true", help="fp4lab was built without sim: signals only")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fp4lab-hostile-") as tmp:
        if not a.no_sim:
            sweeps(a.fp4lab, tmp)
        signals(a.fp4lab, tmp)
        gemm_reference_overflow(a.fp4lab, tmp)
        analyze_lists(a.fp4lab, tmp)
    print(f"ok: {checked} hostile cases handled")


if __name__ == "__main__":
    main()
