"""Hostile conditions around the C++ module, one test per class: a trace file truncated while
fp4lab.analyze reads it, thread counts OpenMP cannot honour, Ctrl-C during a long analysis, and arguments of the wrong
type to the bindings. Each case runs the package in a process of its own, so a crash is a failed test and not a lost
test session.

The package comes from PYTHONPATH (ctest points it at the build's in-tree package)."""
import os
import shutil
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fp4lab
from fp4lab import trace as ftrace

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK_SOURCE = os.path.join(HERE, "..", "..", "cli", "truncate_hook.cpp")


def write_record(path, gemm, shape, seed=0):
    """One trace v1 file holding one BF16 record (written by fp4lab.trace); returns where its tensor data begins
    (the header's end)."""
    tokens, d_in, d_out = shape
    rng = np.random.default_rng(seed)
    shapes = {"fwd_x": (tokens, d_in), "fwd_w": (d_out, d_in), "bwd_dy": (tokens, d_out)}
    tensors = {f"{gemm}.{role}": (rng.standard_normal(s, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
               .view(ml_dtypes.bfloat16) for role, s in shapes.items()}
    ftrace.write_file(path, tensors, {"fp4lab.trace.version": "1"})
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def python(code, env=None, timeout=120):
    """Runs `code` in a fresh interpreter with the package under test (PYTHONPATH); returns the process."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ---- SIGBUS: a trace file truncated after its header was read, before its tensors are ----------------------------

@pytest.fixture(scope="module")
def truncate_hook(tmp_path_factory):
    """The LD_PRELOAD library that truncates FP4LAB_TEST_TRUNCATE=PATH:LENGTH at the first close() of PATH (fp4lab
    closes a trace file once its header is read, and reads the tensors later): the build's, else compiled here."""
    built = os.path.join(os.path.dirname(os.path.dirname(os.environ.get("FP4LAB_BIN", "/nonexistent"))),
                         "tests", "cli", "libfp4lab_truncate_hook.so")
    if os.path.isfile(built):
        return built
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler for the truncation hook")
    out = str(tmp_path_factory.mktemp("hook") / "truncate_hook.so")
    subprocess.run([cxx, "-shared", "-fPIC", "-O1", HOOK_SOURCE, "-o", out, "-ldl"], check=True)
    return out


TRUNCATED_CALLS = {
    "analyze": "fp4lab.analyze(F)",
    "analyze-json": "fp4lab.analyze(F, json=os.path.join(os.path.dirname(F), 'out.json'))",
    "trace.read_file": "fp4lab.trace.read_file(F)",
    "trace.check": "fp4lab.trace.check(F)",
}


@pytest.mark.parametrize("call", sorted(TRUNCATED_CALLS))
def test_sigbus_trace_truncated_while_read_is_one_data_error(tmp_path, truncate_hook, call):
    f = str(tmp_path / "t.safetensors")
    cut = write_record(f, "g", (64, 64, 64))
    code = ("import os, fp4lab, fp4lab.trace\n"
            f"F = {os.path.realpath(f)!r}\n"
            "try:\n"
            f"    {TRUNCATED_CALLS[call]}\n"
            "    print('no error')\n"
            "except ValueError as e:\n"
            "    print(type(e).__name__, isinstance(e, fp4lab._files.DataError), e)\n")
    r = python(code, {"LD_PRELOAD": truncate_hook, "FP4LAB_TEST_TRUNCATE": f"{os.path.realpath(f)}:{cut}"})
    assert r.returncode == 0, f"ended by signal {-r.returncode}" if r.returncode < 0 else r.stderr
    assert os.path.getsize(f) == cut  # the hook cut it, during the call
    kind, is_data, message = r.stdout.strip().split(" ", 2)
    assert is_data == "True", r.stdout
    assert message.startswith(f"{os.path.realpath(f)}: truncated to {cut} bytes while in use: tensor 'g.fwd_x'"), \
        r.stdout
    assert "\n" not in r.stdout.strip()
    assert sorted(os.listdir(tmp_path)) == ["t.safetensors"]  # no output, no temporary


# ---- OMP_NUM_THREADS: a count OpenMP cannot honour --------------------------------------------------------------

@pytest.mark.parametrize("value", ["100000", "40000", "1025", "abc", "0", "-3", "4,100000", ""])
def test_thread_counts_openmp_cannot_honour_are_one_usage_error(tmp_path, value):
    f = str(tmp_path / "t.safetensors")
    write_record(f, "g", (32, 32, 32))
    code = ("import numpy as np, fp4lab\n"
            "for call in (lambda: fp4lab.analyze(%r), lambda: fp4lab.quantize(np.ones((4, 32), np.float32))):\n"
            "    try:\n"
            "        call()\n"
            "        print('ran')\n"
            "    except fp4lab._files.UsageError as e:\n"
            "        print(e)\n" % f)
    r = python(code, {"OMP_NUM_THREADS": value})
    assert r.returncode == 0, f"ended by signal {-r.returncode}" if r.returncode < 0 else r.stderr
    lines = r.stdout.splitlines()
    shown = value if value else "''"
    assert len(lines) == 2 and all(ln.startswith(f"OMP_NUM_THREADS={shown}: not a thread count from 1 to 1024")
                                   for ln in lines), r.stdout


def test_thread_counts_within_the_rule_give_the_same_figures(tmp_path):
    f = str(tmp_path / "t.safetensors")
    write_record(f, "g", (32, 32, 32))
    code = f"import json, fp4lab\nprint(json.dumps(fp4lab.analyze({f!r})['gemms']))"
    runs = [python(code, {"OMP_NUM_THREADS": v}) for v in ("1", " 3 ", "2,2")]
    assert all(r.returncode == 0 and r.stderr == "" for r in runs), [r.stderr for r in runs]
    assert runs[1].stdout == runs[0].stdout and runs[2].stdout == runs[0].stdout


# ---- SIGINT: Ctrl-C during a long fp4lab.analyze ------------------------------------------------------------------

def test_sigint_stops_analyze_within_about_a_record(tmp_path):
    # 16 records of 640^3 under every recipe and five RHT settings: about 0.4 s each on one thread, 6 s in all.
    folder = tmp_path / "trace"
    folder.mkdir()
    for k in range(16):
        write_record(str(folder / f"r{k:02d}.safetensors"), f"g{k}", (640, 640, 640), seed=k)
    out = tmp_path / "out"
    out.mkdir()
    code = ("import os, signal, sys, threading, time, fp4lab\n"
            "for json_path in (%r, None):\n"
            "    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
            "    t0 = time.monotonic()\n"
            "    try:\n"
            "        fp4lab.analyze(%r, recipe='all', rht=[None, 16, 32, 64, 128], json=json_path)\n"
            "        print('finished', time.monotonic() - t0)\n"
            "    except KeyboardInterrupt:\n"
            "        print('interrupted', time.monotonic() - t0)\n" % (str(out / "a.json"), str(folder)))
    r = python(code, {"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    for line in r.stdout.splitlines():
        what, seconds = line.split()
        assert what == "interrupted", r.stdout
        assert float(seconds) < 5.0, r.stdout  # the signal at 0.5 s, then a record or two (slower on a loaded machine)
    assert len(r.stdout.splitlines()) == 2
    assert os.listdir(out) == []  # no JSON, no temporary


# ---- arguments of the wrong type: one line naming the function, the argument and the types it takes ---------------

@pytest.mark.parametrize("call, want", [
    (lambda f: fp4lab.analyze(123), "analyze(): trace must be a str or os.PathLike of str, or a list of them, not int"),
    (lambda f: fp4lab.analyze(b"path"), "analyze(): trace must be a str or os.PathLike of str, or a list of them, "
                                        "not bytes"),
    (lambda f: fp4lab.analyze([f, b"path"]), "analyze(): a trace path must be a str or os.PathLike of str, not bytes"),
    (lambda f: fp4lab.analyze(f, json=b"out.json"), "analyze(): json must be a str or os.PathLike of str, not bytes"),
    (lambda f: ftrace.write_file(b"o.safetensors", {}, {}),
     "write_file(): path must be a str or os.PathLike of str, not bytes"),
    (lambda f: ftrace.write_file(f + ".o", {1: np.zeros((16, 16), np.float32)}, {}),
     "write_file(): the names in tensors must be str, not int"),
    (lambda f: ftrace.write_file(f + ".o", {}, {"step": 1, 2: "x"}),
     "write_file(): the names in metadata must be str, not int"),
    (lambda f: ftrace.write_file(f + ".o", [np.zeros(4, np.float32)], {}),
     "write_file(): tensors must be a mapping of str names, not list"),
    (lambda f: ftrace.read_file(f.encode()), "read_file(): path must be a str or os.PathLike of str, not bytes"),
    (lambda f: ftrace.records(f.encode()), "records(): path must be a str or os.PathLike of str, not bytes"),
    (lambda f: ftrace.check(f, block="16"), "check(): block must be an int, not str"),
])
def test_binding_argument_types_are_one_line_type_errors(tmp_path, call, want):
    f = str(tmp_path / "t.safetensors")
    write_record(f, "g", (16, 16, 16))
    with pytest.raises(TypeError) as e:
        call(f)
    assert str(e.value) == want
    assert not os.path.exists(f + ".o")


def test_analyze_faults_carry_their_exit_codes(tmp_path):
    with pytest.raises(fp4lab._files.DataError, match="no such file or folder"):
        fp4lab.analyze(str(tmp_path / "missing"))
    f = str(tmp_path / "t.safetensors")
    write_record(f, "g", (16, 16, 16))
    with pytest.raises(fp4lab._files.UsageError, match="--block: '4294967296' is not an integer"):
        fp4lab.analyze(f, block=2**32)
    with pytest.raises(TypeError, match="analyze\\(\\): block must be an int, not str"):
        fp4lab.analyze(f, block="16")  # numbers are read from text by the command line only
