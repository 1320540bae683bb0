"""`fp4lab analyze` against an independent numpy implementation of docs/spec.md §6 (tests/python/cli/oracle.py),
its JSON schema, the bundled-trace default, and its rejection of bad traces.

FP4LAB_BIN names the built binary (ctest sets it)."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import oracle as analysis_numpy  # noqa: E402  (tests/python/cli/oracle.py)

BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
TRACE = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
LAYER = os.path.join(TRACE, "layers.7.mlp.fc2.safetensors")  # fc2: the paper's outlier-heavy input


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    out = tmp_path_factory.mktemp("an") / "a.json"
    r = run("analyze", "--trace", LAYER, "--json", str(out))
    assert r.returncode == 0, r.stderr
    return json.load(open(out)), analysis_numpy.analyze(LAYER)


def test_tensor_metrics_match_numpy(both):
    c, n = both
    nt = {(t["gemm"], t["role"], t["format"], t["rht"]): t for t in n["tensors"]}
    assert len(c["tensors"]) == len(nt) == 12  # 3 tensors x {e2m1, e1m2} x {none, 16}
    for t in c["tensors"]:
        o = nt[(t["gemm"], t["role"], t["format"], t["rht"])]
        # Without RHT both quantisers do the same FP32 operations; with RHT numpy rotates by a matrix product
        # (other rounding), so the rotated tensor differs in the last bits.
        tol = 1e-6 if t["rht"] == 0 else 1e-3
        assert abs(t["sqnr_db"] - o["sqnr_db"]) < tol, (t, o)
        assert abs(t["beff"] - o["beff"]) < (1e-12 if t["rht"] == 0 else 1e-3), (t, o)
        assert abs(t["alpha"] - o["alpha"]) < 1e-6, (t, o)
        np.testing.assert_allclose(t["bias_per_level"], o["bias_per_level"], atol=1e-6 if t["rht"] == 0 else 1e-3)


def test_gemm_metrics_match_numpy(both):
    c, n = both
    ng = {(g["gemm"], g["pass"], g["format"], g["rht"]): g for g in n["gemms"]}
    assert len(c["gemms"]) == len(ng) == 12
    for g in c["gemms"]:
        o = ng[(g["gemm"], g["pass"], g["format"], g["rht"])]
        # numpy multiplies the dequantised operands in plain FP32, fp4lab under the block contract: the
        # outputs differ by FP32 rounding only, far below the 4-bit quantisation error the SQNR measures.
        assert abs(g["sqnr_db"] - o["sqnr_db"]) < 1e-3, (g, o)
        assert abs(g["eta"] - o["eta"]) < 1e-6, (g, o)


def test_paper_inversion_on_fc2_input(both):
    """The paper's Q1 observation on the bundled fc2 input: E2M1 ahead without RHT, E1M2 ahead with it."""
    c, _ = both
    s = {(t["format"], t["rht"]): t for t in c["tensors"] if t["role"] == "fwd_x"}
    assert s["e2m1", 0]["sqnr_db"] > s["e1m2", 0]["sqnr_db"]
    assert s["e1m2", 16]["sqnr_db"] > s["e2m1", 16]["sqnr_db"]
    assert s["e2m1", 16]["sqnr_db"] < s["e2m1", 0]["sqnr_db"]  # RHT hurts E2M1 here
    assert s["e1m2", 16]["beff"] > s["e1m2", 0]["beff"] + 0.2  # and fills E1M2's bins
    assert abs(s["e1m2", 16]["delta_sqnr_db"] - (s["e1m2", 16]["sqnr_db"] - s["e1m2", 0]["sqnr_db"])) < 1e-12


def test_json_schema(both):
    c, _ = both
    assert c["fp4lab.analysis.version"] == 1
    for t in c["tensors"]:
        for k in ("gemm", "role", "format", "rht", "sqnr_db", "beff", "alpha", "bias_per_level"):
            assert k in t
        assert t["rht"] in (0, 16)
    for g in c["gemms"]:
        for k in ("gemm", "pass", "format", "rht", "sqnr_db", "eta"):
            assert k in g


def test_default_runs_bundled_trace():
    r = run("--json", "-")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert {t["gemm"] for t in j["tensors"]} >= {"layers.7.mlp.fc2", "layers.0.attn.qkv"}
    assert len({g["gemm"] for g in j["gemms"]}) == 8


def test_recipes_and_other_rht_size():
    r = run("analyze", "--trace", LAYER, "--formats", "int4", "--rht", "none,32", "--rht-seed", "7",
            "--recipe", "ufp4,mxfp4", "--json", "-")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert {t["rht"] for t in j["tensors"]} == {0, 32}
    assert {g.get("recipe") for g in j["gemms"]} == {None, "ufp4", "mxfp4"}
    # int4 is the e1m2 grid up to a power of two: identical SQNR for the same blocks.
    e = run("analyze", "--trace", LAYER, "--formats", "e1m2", "--rht", "none", "--json", "-")
    i = {t["role"]: t["sqnr_db"] for t in j["tensors"] if t["rht"] == 0}
    for t in json.loads(e.stdout)["tensors"]:
        assert t["sqnr_db"] == i[t["role"]]


@pytest.mark.parametrize("args,code,needle", [
    (["analyze", "--trace", "/nonexistent/trace"], 1, "/nonexistent/trace"),
    (["analyze", "--bogus"], 2, "bogus"),
    (["analyze", "--trace", LAYER, "--formats", "e3m0"], 2, "e3m0"),
    (["analyze", "--trace", LAYER, "--rht", "24"], 2, "24"),
    (["analyze", "--trace", LAYER, "--recipe", "fp8"], 2, "fp8"),
])
def test_bad_usage(args, code, needle):
    r = run(*args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr


def test_truncated_trace_rejected(tmp_path):
    bad = tmp_path / "t"
    bad.mkdir()
    raw = open(LAYER, "rb").read()
    (bad / "cut.safetensors").write_bytes(raw[: len(raw) // 2])
    r = run("analyze", "--trace", str(bad))
    assert r.returncode == 1
    assert "cut.safetensors" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_nan_in_trace_rejected(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(LAYER, d / "l.safetensors")
    raw = bytearray(open(d / "l.safetensors", "rb").read())
    raw[-2:] = b"\xc0\x7f"  # the last BF16 element becomes a NaN
    (d / "l.safetensors").write_bytes(bytes(raw))
    r = run("analyze", "--trace", str(d))
    assert r.returncode == 1
    assert "l.safetensors" in r.stderr and "NaN" in r.stderr, r.stderr


def test_fault_in_first_record_with_many_threads(tmp_path):
    # A fault in the first record while later records load and compute beside it (more threads than one record's
    # tasks, every recipe): one line and exit 1 every time, never a later record's half-made results (which
    # crashed the report once).
    d = tmp_path / "t"
    d.mkdir()
    files = sorted(f for f in os.listdir(TRACE) if f.endswith(".safetensors"))[:4]
    for i, f in enumerate(files):
        raw = bytearray(open(os.path.join(TRACE, f), "rb").read())
        if i == 0:
            raw[-2:] = b"\xc0\x7f"  # the last BF16 element becomes a NaN
        (d / f"{i}-{f}").write_bytes(bytes(raw))
    env = dict(os.environ, OMP_NUM_THREADS="64")
    for _ in range(8):
        r = subprocess.run([BIN, "analyze", "--trace", str(d), "--recipe", "all"], capture_output=True, text=True,
                           env=env)
        assert r.returncode == 1 and "NaN" in r.stderr and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
