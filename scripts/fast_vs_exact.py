#!/usr/bin/env python3
"""How far fp4lab.torch's fast GEMM mode is from exact, on the real GEMMs of a trace.

For every record of the trace, every recipe and every training pass, both operands are quantised once; the
exact product (the datapath contract) and the fast one (the same dequantised operands through torch's matmul:
cuBLAS in BF16 on CUDA) are compared, beside the quantisation error itself (exact against the float64 product of
the unquantised operands):
    fast_rel   = |C_fast - C_exact| / |C_exact|        (Frobenius norms)
    quant_rel  = |C_exact - C_ref| / |C_ref|
    python3 scripts/fast_vs_exact.py [--trace DIR] [--device cuda|cpu] [--json out.json]
"""
import argparse
import json
import os

import numpy as np
import torch

import fp4lab
import fp4lab.torch as ft
from fp4lab import trace

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ROLES = {"fwd_y": ("fwd_x", "fwd_w"), "bwd_dx": ("bwd_dy", "fwd_w"), "bwd_dw": ("bwd_dy", "fwd_x")}


def operand(t, p, role):
    """The trace tensor as the pass's K-major operand (docs/spec.md §2)."""
    if p == "bwd_dw" or (p == "bwd_dx" and role == "fwd_w"):
        return t.T
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=os.path.join(ROOT, "workloads", "tiny-lm", "step_005000"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for gemm, *tensors in trace.records(args.trace):
        t = {r: torch.from_numpy(v) for r, v in zip(trace.ROLES, tensors)}
        for recipe in fp4lab.recipes():
            for p, (ra, rb) in ROLES.items():
                a = operand(t[ra], p, ra).contiguous().to(args.device)
                b = operand(t[rb], p, rb).contiguous().to(args.device)
                qa = ft.quantize(a, fp4lab.config(recipe, pass_=p, operand="a"))
                qb = ft.quantize(b, fp4lab.config(recipe, pass_=p, operand="b"))
                exact = ft.product(qa, qb, "exact").double()
                fast = ft.product(qa, qb, "fast").double()
                ref = a.double() @ b.double().t()
                rows.append({"gemm": gemm, "recipe": recipe, "pass": p, "shape": [a.shape[0], b.shape[0], a.shape[1]],
                             "fast_rel": ((fast - exact).norm() / exact.norm()).item(),
                             "quant_rel": ((exact - ref).norm() / ref.norm()).item()})
    print(f"{'recipe':9s} {'pass':7s} {'fast vs exact (rel, max over GEMMs)':>36s} {'quantisation error (rel, mean)':>32s}")
    for recipe in fp4lab.recipes():
        for p in ROLES:
            r = [x for x in rows if x["recipe"] == recipe and x["pass"] == p]
            print(f"{recipe:9s} {p:7s} {max(x['fast_rel'] for x in r):36.3e} "
                  f"{np.mean([x['quant_rel'] for x in r]):32.3e}")
    worst = max(rows, key=lambda x: x["fast_rel"] / x["quant_rel"])
    print(f"\nlargest ratio fast/quantisation error: {worst['fast_rel'] / worst['quant_rel']:.4f} "
          f"({worst['recipe']} {worst['pass']} {worst['gemm']})")
    if args.json:
        info = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "trace": args.trace,
                "rows": rows}
        with open(args.json + ".tmp", "w") as f:
            json.dump(info, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
