#!/usr/bin/env python3
"""Summarises the sim/experiments/run.sh sweep into markdown tables (docs/sim.md).

Usage: summarize.py SWEEP.json | OUT_DIR
SWEEP.json is the output of `fp4lab sim --sweep` (run <experiment>_<variant> holds that run's report; meta
holds the notes); OUT_DIR, the older layout, holds OUT_DIR/<experiment>_<variant>.json, one `fp4lab sim --json`
report each. Totals are the reports' count-weighted totals, i.e. one training step of the listed layers.
"""
import json
import os
import sys


def loader(path):
    """name -> report, from a sweep results file or a folder of single-run reports."""
    if os.path.isdir(path):
        def from_dir(name):
            with open(os.path.join(path, name + ".json")) as f:
                return json.load(f)
        return from_dir
    with open(path) as f:
        doc = json.load(f)
    runs = {r["name"]: r["report"] for r in doc["runs"]}
    return lambda name: doc["meta"] if name == "1_meta" else runs[name]


def load(out, name):
    return out(name)


def tot(rep):
    return rep["total"]


def prep_us(rep):
    ghz = rep["config"]["clock.ghz"]
    return sum(g["count"] * g["prep_cycles"] for g in rep["gemms"]) / ghz / 1e3


def fmt(x, d=1):
    return f"{x:,.{d}f}"


def exp1(out):
    print("### 1. E2M1-only vs E1M2-only vs dual-format units\n")
    meta = load(out, "1_meta")
    print(f"Workload `{meta['shapes']}`, config h100-class; same area: {meta['area_note']}\n")
    print("| TCU | budget | units/SM | acc lanes/SM | ufp4 step (ms) | ufp4 energy (mJ) | e2m1-ref step (ms) | e2m1-ref energy (mJ) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    names = {"mac": "same MAC count", "dot": "same dot-product area", "unit": "same block-MAC area"}
    for budget in ("mac", "dot", "unit"):
        for kind in ("e2m1", "e1m2", "dual"):
            row = []
            for recipe in ("ufp4", "e2m1-ref"):
                r = load(out, f"1_{budget}_{kind}_{recipe}")
                units, lanes = r["config"]["mac.units"], r["config"]["acc.lanes"]
                t = tot(r)
                native = all(g["native"] for g in r["gemms"])
                mark = "" if native else " (fallback)"
                row += [fmt(t["time_us"] / 1e3, 3) + mark, fmt(t["energy_total_pj"] / 1e9, 1)]
            label = {"e2m1": "E2M1-only", "e1m2": "E1M2-only", "dual": "dual-format"}[kind]
            print(f"| {label} | {names[budget]} | {units} | {lanes} | " + " | ".join(row) + " |")
    print()


def exp2(out):
    print("### 2. RHT + quantise: fused pass, unfused passes, or in the TCU front-end\n")
    for src in ("trace", "shapes"):
        meta = load(out, f"2_{src}_plain")
        print(f"Source `{meta['source']}`, recipe ufp4 (RHT-16 on all three GEMMs), config h100-class:\n")
        print("| RHT + quantise | prep time (us) | × plain quantise | × fused | step time (us) | energy (mJ) |")
        print("|---|---:|---:|---:|---:|---:|")
        plain = prep_us(load(out, f"2_{src}_plain"))
        fused = prep_us(load(out, f"2_{src}_fused"))
        rows = [("plain quantise, no RHT (one pass)", "plain"), ("fused RHT + quantise (one pass)", "fused"),
                ("unfused: RHT pass, then quantise pass", "unfused"), ("in the TCU front-end (no pass)", "frontend")]
        for label, v in rows:
            r = load(out, f"2_{src}_{v}")
            p = prep_us(r)
            rp = fmt(p / plain, 2) + "×" if p > 0 else "–"
            rf = fmt(p / fused, 2) + "×" if p > 0 else "–"
            print(f"| {label} | {fmt(p)} | {rp} | {rf} | {fmt(tot(r)['time_us'])} | {fmt(tot(r)['energy_total_pj'] / 1e9, 2)} |")
        print()


def exp3(out):
    print("### 3. Block 16 vs block 32 (E1M2 grid, FP32 block scales, RHT-16)\n")
    meta = load(out, "3_acc256_b16")
    print(f"Workload `{meta['source']}`, config h100-class:\n")
    print("| accumulator lanes/SM | block | step (ms) | MAC util | DRAM (GB) | acc energy (mJ) | energy (mJ) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for lanes in (256, 128, 64):
        for b in (16, 32):
            r = load(out, f"3_acc{lanes}_b{b}")
            t = tot(r)
            dram = (t["bytes"]["dram_read"] + t["bytes"]["dram_write"]) / 1e9
            print(f"| {lanes} | {b} | {fmt(t['time_us'] / 1e3, 3)} | {fmt(100 * t['mac_util'])}% | {fmt(dram, 2)} | "
                  f"{fmt(t['energy_pj']['acc'] / 1e9, 2)} | {fmt(t['energy_total_pj'] / 1e9, 2)} |")
    print()


def exp4(out):
    print("### 4. A training step: ufp4 vs e2m1-ref\n")
    for src in ("trace", "shapes"):
        a, b = load(out, f"4_{src}_ufp4"), load(out, f"4_{src}_e2m1-ref")
        print(f"Source `{a['source']}`, config h100-class; times in us, energies in uJ:\n")
        print("| pass | ufp4 time | e2m1-ref time | ufp4 energy | e2m1-ref energy | ufp4 RHT energy | e2m1-ref RHT energy |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for p in ("fwd_y", "bwd_dx", "bwd_dw"):
            def s(r, key):
                return sum(g["count"] * (g[key] if key != "rht_e" else g["energy_pj"]["rht"]) for g in r["gemms"]
                           if g["pass"] == p)
            print(f"| {p} | {fmt(s(a, 'time_us'))} | {fmt(s(b, 'time_us'))} | {fmt(s(a, 'energy_total_pj') / 1e6)} | "
                  f"{fmt(s(b, 'energy_total_pj') / 1e6)} | {fmt(s(a, 'rht_e') / 1e6, 2)} | {fmt(s(b, 'rht_e') / 1e6, 2)} |")
        ta, tb = tot(a), tot(b)
        print(f"| **step** | **{fmt(ta['time_us'])}** | **{fmt(tb['time_us'])}** | **{fmt(ta['energy_total_pj'] / 1e6)}** | "
              f"**{fmt(tb['energy_total_pj'] / 1e6)}** | {fmt(ta['energy_pj']['rht'] / 1e6, 2)} | {fmt(tb['energy_pj']['rht'] / 1e6, 2)} |")
        print(f"\nufp4 / e2m1-ref: time {ta['time_us'] / tb['time_us']:.3f}×, energy "
              f"{ta['energy_total_pj'] / tb['energy_total_pj']:.3f}×\n")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = loader(sys.argv[1])
    for e in (exp1, exp2, exp3, exp4):
        e(out)


if __name__ == "__main__":
    main()
