#!/usr/bin/env python3
"""A record's figures never depend on what else is analysed with it (docs/spec.md §4, "SR in the analysis of a
trace"): one record of the bundled trace under the SR recipes, analysed alone, in its folder beside the other
records, in either order beside another record, and through another path to a copy of its file, gives the same
JSON numbers, bit for bit. The key itself is pinned to the spec by an independent implementation of it (FNV-1a and
Philox4x32-10 in plain Python, checked against Random123's known answers): `fp4lab gemm` under that seed, stream 0,
gives the record's bwd_dx and bwd_dw figures, with and without the `step` metadata that is part of the identity.

Plain Python (numpy only): test_record_sr_key.py --fp4lab BIN
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "workloads", "tiny-lm", "step_005000")
GEMM = "layers.7.attn.proj"  # its file's metadata has "step": "5000"
OTHER = "layers.0.attn.proj"
RECIPES = "e2m1-ref,ufp4,nvfp4"  # SR on dY in bwd_dx and bwd_dw
FAST = ["--formats", "e2m1", "--rht", "none", "--recipe", RECIPES]  # one plain setting: the recipes are the point


# ---- the key of docs/spec.md §4, written from the spec alone ----------------------------------------------------
def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def philox4x32_10(ctr, key):
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k[1], p0 & 0xFFFFFFFF]
    return c


def record_sr_seed(seed: int, gemm: str, step) -> int:
    ident = gemm.encode() + (b"\xff" + step.encode() if step is not None else b"")
    h = fnv1a64(ident)
    out = philox4x32_10([h & 0xFFFFFFFF, h >> 32, 0x52454344, 0], [seed & 0xFFFFFFFF, seed >> 32])
    return out[0] | (out[1] << 32)


# ---- safetensors, as much as this test needs ---------------------------------------------------------------------
def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def tensor(header, data, name):
    t = header[name]
    dt = {"BF16": np.uint16, "F32": np.float32}[t["dtype"]]  # BF16 kept as its bits
    a, b = t["data_offsets"]
    return np.frombuffer(data[a:b], dtype=dt).reshape(t["shape"]), t["dtype"]


# ---- runs --------------------------------------------------------------------------------------------------------
def run(fp4lab, *args):
    r = subprocess.run([fp4lab, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{args}: exit {r.returncode}: {r.stderr}"
    return json.loads(r.stdout)


def figures(doc, gemm, trace=None):
    """Every entry of `gemm` (of `trace` where given, its name aside), numbers as their exact bits (float.hex)."""
    def exact(v):
        if isinstance(v, float):
            return v.hex()
        if isinstance(v, list):
            return [exact(x) for x in v]
        return v
    out = []
    for kind in ("tensors", "gemms"):
        for e in doc[kind]:
            if e["gemm"] == gemm and (trace is None or e["trace"] == trace):
                out.append((kind, tuple(sorted((k, repr(exact(v))) for k, v in e.items() if k != "trace"))))
    return out


def recipe_sqnr(doc, gemm, recipe, pas):
    (g,) = [g for g in doc["gemms"] if g["gemm"] == gemm and g.get("recipe") == recipe and g["pass"] == pas]
    return g["sqnr_db"]


def test_record_figures_do_not_depend_on_neighbours(fp4lab, tmp):
    own = os.path.join(TRACE, GEMM + ".safetensors")
    other = os.path.join(TRACE, OTHER + ".safetensors")
    # The same file through another folder and path: a copy in a folder of another name, reached through "..".
    elsewhere = os.path.join(tmp, "elsewhere", "sub")
    os.makedirs(elsewhere)
    shutil.copy(own, os.path.join(elsewhere, GEMM + ".safetensors"))
    shutil.copy(other, os.path.join(elsewhere, "a-first.safetensors"))
    via = os.path.join(tmp, "elsewhere", "..", "elsewhere", "sub") + os.sep

    alone = figures(run(fp4lab, "analyze", "--trace", own, *FAST, "--json", "-"), GEMM)
    assert len([1 for kind, _ in alone if kind == "gemms"]) == 3 + 3 * 3  # the setting's and every recipe's
    ways = {
        "in its folder, the 8th of 8 records": ["--trace", TRACE],
        "after another record": ["--trace", other, own],
        "before another record": ["--trace", own, other],
        "through another folder path, after another record": ["--trace", via],
    }
    for what, trace in ways.items():
        got = figures(run(fp4lab, "analyze", *trace, *FAST, "--json", "-"), GEMM)
        assert got == alone, f"{GEMM} {what}: its figures differ from the record analysed alone"
    # Its copy beside the original, both after another record: each one's figures are the record's.
    both = run(fp4lab, "analyze", "--trace", via, TRACE, *FAST, "--json", "-")
    for t in (via, TRACE):
        assert figures(both, GEMM, t) == alone, f"{GEMM} of {t} beside a copy: its figures differ"


def test_record_key_is_the_specs(fp4lab, tmp):
    # The record's W^T as the K-major B of bwd_dx (bits as they are), and its file without the step metadata.
    own = os.path.join(TRACE, GEMM + ".safetensors")
    header, data = read_st(own)
    w, dtype = tensor(header, data, GEMM + ".fwd_w")
    wt = np.ascontiguousarray(w.T)
    ops = os.path.join(tmp, "ops.safetensors")
    write_st(ops, {"__metadata__": {}, "wt": {"dtype": dtype, "shape": list(wt.shape),
                                                "data_offsets": [0, wt.nbytes]}}, wt.tobytes())
    step = header["__metadata__"]["step"]
    nostep_dir = os.path.join(tmp, "nostep")
    os.makedirs(nostep_dir)
    nostep = os.path.join(nostep_dir, GEMM + ".safetensors")
    h2 = dict(header)
    h2["__metadata__"] = {k: v for k, v in header["__metadata__"].items() if k != "step"}
    write_st(nostep, h2, data)

    for path, st in ((own, step), (nostep, None)):
        doc = run(fp4lab, "analyze", "--trace", path, *FAST, "--seed", "11", "--json", "-")
        seed = record_sr_seed(11, GEMM, st)
        for recipe in RECIPES.split(","):
            # bwd_dx = dY . W: A = dY [tokens, out], B = W^T [in, out]. bwd_dw = dY^T . X: A = dY^T, B = X^T; its
            # operands are the trace's tensors transposed, so it is checked through bwd_dx only.
            g = run(fp4lab, "gemm", "--a", f"{path}:{GEMM}.bwd_dy", "--b", f"{ops}:wt", "--recipe", recipe,
                    "--pass", "bwd_dx", "--seed", str(seed), "--stream", "0", "--out",
                    os.path.join(tmp, "c.safetensors"), "--json", "-")
            want = g["sqnr_db"]
            got = recipe_sqnr(doc, GEMM, recipe, "bwd_dx")
            assert got == want, f"{recipe} bwd_dx (step {st}): analyze {got!r}, gemm under the spec's key {want!r}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp4lab", required=True)
    fp4lab = ap.parse_args().fp4lab
    # The Python Philox against Random123's known answers (tests/models/philox_test.cpp has the same three).
    kat = [([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
           ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
           ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1])]
    for ctr, key, out in kat:
        assert philox4x32_10(ctr, key) == out
    # FNV-1a 64 test vectors (the FNV reference's: "", "a", "foobar").
    assert [fnv1a64(s) for s in (b"", b"a", b"foobar")] == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C,
                                                           0x85944171F73967E8]
    failed = 0
    for test in (test_record_figures_do_not_depend_on_neighbours, test_record_key_is_the_specs):
        with tempfile.TemporaryDirectory(prefix="fp4lab_srkey_") as tmp:
            try:
                test(fp4lab, tmp)
                print(f"PASS {test.__name__}")
            except AssertionError as e:
                failed += 1
                print(f"FAIL {test.__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
