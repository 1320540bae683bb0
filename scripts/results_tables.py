#!/usr/bin/env python3
"""Markdown tables for docs/results.md from `fp4lab analyze --json` output.

    build/bin/fp4lab analyze --recipe ufp4,e2m1-ref,nvfp4,mxfp4 --json docs/results/analysis.json
    python3 scripts/results_tables.py docs/results/analysis.json
"""
import json
import sys


def main(path):
    j = json.load(open(path))
    t = {(r["gemm"], r["role"], r["format"], r["rht"]): r for r in j["tensors"]}
    g = {(r["gemm"], r["pass"], r["format"], r["rht"]): r for r in j["gemms"] if "recipe" not in r}
    d = max(r["rht"] for r in j["tensors"])

    def mark(a0, ad, b0, bd):
        return "**yes**" if a0 > b0 and bd > ad else ""

    print(f"### Tensors (SQNR in dB; RHT-{d} against the rotated tensor; B_eff none → RHT)\n")
    print("| gemm | tensor | E2M1 | E2M1+RHT | Δ | E1M2 | E1M2+RHT | Δ | B_eff E2M1 | B_eff E1M2 | inversion |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (gemm, role) in sorted({(k[0], k[1]) for k in t}):
        a0, ad = t[gemm, role, "e2m1", 0], t[gemm, role, "e2m1", d]
        b0, bd = t[gemm, role, "e1m2", 0], t[gemm, role, "e1m2", d]
        print(f"| {gemm} | {role} | {a0['sqnr_db']:.2f} | {ad['sqnr_db']:.2f} | {ad['sqnr_db'] - a0['sqnr_db']:+.2f} "
              f"| {b0['sqnr_db']:.2f} | {bd['sqnr_db']:.2f} | {bd['sqnr_db'] - b0['sqnr_db']:+.2f} "
              f"| {a0['beff']:.3f} → {ad['beff']:.3f} | {b0['beff']:.3f} → {bd['beff']:.3f} "
              f"| {mark(a0['sqnr_db'], ad['sqnr_db'], b0['sqnr_db'], bd['sqnr_db'])} |")
    print(f"\n### GEMM outputs (SQNR in dB against the float64 product of the unquantised operands; η = α_A·α_B)\n")
    print("| gemm | pass | E2M1 | E2M1+RHT | Δ | E1M2 | E1M2+RHT | Δ | η E2M1 | η E1M2+RHT | inversion |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (gemm, p) in sorted({(k[0], k[1]) for k in g}):
        a0, ad = g[gemm, p, "e2m1", 0], g[gemm, p, "e2m1", d]
        b0, bd = g[gemm, p, "e1m2", 0], g[gemm, p, "e1m2", d]
        print(f"| {gemm} | {p} | {a0['sqnr_db']:.2f} | {ad['sqnr_db']:.2f} | {ad['sqnr_db'] - a0['sqnr_db']:+.2f} "
              f"| {b0['sqnr_db']:.2f} | {bd['sqnr_db']:.2f} | {bd['sqnr_db'] - b0['sqnr_db']:+.2f} "
              f"| {a0['eta']:.4f} | {bd['eta']:.4f} | {mark(a0['sqnr_db'], ad['sqnr_db'], b0['sqnr_db'], bd['sqnr_db'])} |")
    rec = [r for r in j["gemms"] if "recipe" in r]
    if rec:
        names = list(dict.fromkeys(r["recipe"] for r in rec))
        print("\n### Training recipes: mean over the trace's GEMMs per pass (SQNR dB / η)\n")
        print("| pass | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for p in ("fwd_y", "bwd_dx", "bwd_dw"):
            cells = []
            for n in names:
                rs = [r for r in rec if r["recipe"] == n and r["pass"] == p]
                cells.append(f"{sum(r['sqnr_db'] for r in rs) / len(rs):.2f} / {sum(r['eta'] for r in rs) / len(rs):.4f}")
            print(f"| {p} | " + " | ".join(cells) + " |")
    inv = j.get("inversion", {})
    if inv:
        print(f"\nInversion: {len(inv['tensors'])} of {inv['tensors_total']} tensors, "
              f"{len(inv['gemms'])} of {inv['gemms_total']} GEMMs.")
    print("\nForward-chain shrinkage Π η over the fwd_y GEMMs: " +
          ", ".join(f"{k} {v['product_eta_fwd_y']:.4f}" for k, v in j.get("decay", {}).items()))


if __name__ == "__main__":
    main(sys.argv[1])
