#!/usr/bin/env python3
"""The sweep engine of `fp4lab sim --sweep` (ctest label unit; tests/cli/CMakeLists.txt).

  test_sweep_engine.py --fp4lab BIN

- Run names carry numbers in their shortest round-trip form: a sweep over 2.8 names its run rht2.8 (not
  rht2.7999999999999998), and the run's options say 2.8 too.
- The CSV carries every per-run figure of the report: energy by unit, each stall category's share, the bytes at
  every memory level, and every area figure the report has, each equal to the JSON's.
- Worker processes and the job memo change nothing: OMP_NUM_THREADS=2 with the memo gives the JSON and CSV of one
  process that simulates every job (--no-job-cache), byte for byte, on a sweep whose runs share jobs.
Plain Python: exit 0 on success, 1 with a message on failure.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CFG = os.path.join(ROOT, "sim", "configs", "h100-class.cfg")
PRICED = os.path.join(ROOT, "sim", "configs", "h200-class-dual.cfg")  # prices area and static energy
SHAPES = "gemm,tokens,in,out,count\nqkv,256,512,1536,4\nfc2,256,1024,512,4\n"


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def sweep(fp4lab, tmp, toml, prefix, *extra, threads="1"):
    path = os.path.join(tmp, prefix + ".toml")
    with open(path, "w") as f:
        f.write(toml)
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    p = subprocess.run([fp4lab, "sim", "--sweep", path, "--out", os.path.join(tmp, prefix), *extra],
                       capture_output=True, text=True, env=env, timeout=60)
    if p.returncode != 0:
        fail(f"sweep {prefix} {extra}: exit {p.returncode}: {p.stderr.strip()}")
    with open(os.path.join(tmp, prefix + ".json"), "rb") as f:
        js = f.read()
    with open(os.path.join(tmp, prefix + ".csv"), "rb") as f:
        cs = f.read()
    return js, cs


def header(shapes, body, cfg=CFG):
    return f'[defaults]\nconfig = "{cfg}"\nshapes = "{shapes}"\n\n[[grid]]\n{body}'


def test_names_without_float_noise(fp4lab, tmp, shapes):
    toml = header(shapes, 'name = "rht{rht.lanes}_{recipe}"\nrecipe = "ufp4"\n"rht.lanes" = [2.8, 0.1, 64.0]\n')
    js, cs = sweep(fp4lab, tmp, toml, "names")
    runs = json.loads(js)["runs"]
    names = [r["name"] for r in runs]
    if names != ["rht2.8_ufp4", "rht0.1_ufp4", "rht64_ufp4"]:
        fail(f"run names {names}")
    if runs[0]["args"][runs[0]["args"].index("--rht.lanes") + 1] != "2.8":
        fail(f"run options {runs[0]['args']}")
    rows = list(csv.DictReader(cs.decode().splitlines()))
    if [r["rht.lanes"] for r in rows] != ["2.8", "0.1", "64"]:
        fail(f"CSV rht.lanes column {[r['rht.lanes'] for r in rows]}")


def test_csv_has_every_figure(fp4lab, tmp, shapes):
    toml = header(shapes, 'name = "{recipe}"\nrecipe = ["ufp4", "nvfp4"]\n') + \
        f'\n[[grid]]\nname = "priced_{{recipe}}"\nconfig = "{PRICED}"\nrecipe = ["ufp4", "nvfp4"]\n'
    js, cs = sweep(fp4lab, tmp, toml, "columns")
    runs = json.loads(js)["runs"]
    rows = list(csv.DictReader(cs.decode().splitlines()))
    for run, row in zip(runs, rows):
        rep, total = run["report"], run["report"]["total"]
        want = {"cycles": total["cycles"], "energy_total_pj": total["energy_total_pj"]}
        for k, v in total["energy_pj"].items():
            want[f"energy_{k}_pj"] = v
        for k, v in total["stall_cycles"].items():
            want[f"stall_{k}_share"] = v / total["cycles"]
        for k, v in total["bytes"].items():
            want[f"{k}_bytes"] = v
        for k, v in (rep.get("area") or {}).items():
            want[f"area_{k}"] = v
        if run["name"].startswith("priced") and not any(k.startswith("area_") for k in want):
            fail(f"{PRICED} gives no area in the report")
        for col in ("energy_mac_pj", "energy_dram_pj", "stall_compute_share", "stall_prep_share", "l2_read_bytes",
                    "buffer_write_bytes", "dram_read_bytes"):
            if col not in want:
                fail(f"the report has no figure for {col}: {sorted(want)}")
        for col, v in want.items():
            if col not in row:
                fail(f"CSV has no column {col}: {sorted(row)}")
            if float(row[col]) != float(v):
                fail(f"{run['name']}: CSV {col} = {row[col]}, report {v!r}")


def test_workers_and_memo_identical(fp4lab, tmp, shapes):
    # mac.kind e1m2 and dual time ufp4's E1M2 jobs alike, and the DRAM energy never enters the timing: the memo
    # answers most jobs, priced with each run's own energy table.
    # On a configuration that prices area, mac.kind changes the area and so the static energy of the same timing.
    toml = header(shapes, 'name = "{mac.kind}_{recipe}_dram{energy.dram_byte_pj}"\nrecipe = ["ufp4", "e2m1-ref"]\n'
                  '"mac.kind" = ["e2m1", "e1m2", "dual"]\n"energy.dram_byte_pj" = [28.0, 14.5]\n', cfg=PRICED)
    ref = sweep(fp4lab, tmp, toml, "same", "--no-job-cache", threads="1")
    for threads in ("1", "2"):
        got = sweep(fp4lab, tmp, toml, "same", threads=threads)
        if got != ref:
            fail(f"OMP_NUM_THREADS={threads} with the memo differs from one process without it")
    rows = list(csv.DictReader(ref[1].decode().splitlines()))
    if len({r["energy_total_pj"] for r in rows}) != len(rows):
        fail("runs with different energy tables share an energy total")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp4lab", required=True)
    args = ap.parse_args()
    fp4lab = os.path.abspath(args.fp4lab)
    with tempfile.TemporaryDirectory() as tmp:
        shapes = os.path.join(tmp, "shapes.csv")
        with open(shapes, "w") as f:
            f.write(SHAPES)
        test_names_without_float_noise(fp4lab, tmp, shapes)
        test_csv_has_every_figure(fp4lab, tmp, shapes)
        test_workers_and_memo_identical(fp4lab, tmp, shapes)
    print("ok")


if __name__ == "__main__":
    main()
