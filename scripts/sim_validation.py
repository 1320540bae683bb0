#!/usr/bin/env python3
"""The simulator's validation against measured H200 kernel timings (docs/validation.md).

  sim_validation.py plan [--part quant|gemm]
                                the fp4lab-cuda timings arguments: every quantiser operand and GEMM shape of the
                                workloads/shapes models' three training GEMMs, and the square sweep
  sim_validation.py split       which half (calibration or validation) each measured shape falls in

The split rule, fixed before any calibration: within each shape set (quantiser operands; GEMMs) the distinct
shapes are sorted by work (rows*K elements; M*N*K) and then by the shape's dimensions; the shapes at even
positions (0, 2, 4, ...) are the calibration half and those at odd positions the validation half. Every kernel
timed on a shape (the three quantiser passes; the GEMM's unpack, mma and whole call, under each recipe) falls in
that shape's half. Both halves thus span the whole size range, and no validation shape's time is ever used to
choose a configuration value.
"""
import argparse
import csv
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = [256, 512, 1024, 2048, 4096, 8192, 16384]


def read_layers(path):
    """(gemm, tokens, in, out) of one workloads/shapes CSV (format: workloads/shapes/README.md)."""
    with open(path) as f:
        lines = [l for l in f if l.strip() and not l.lstrip().startswith("#")]
    return [(r["gemm"], int(r["tokens"]), int(r["in"]), int(r["out"])) for r in csv.DictReader(lines)]


def layer_shapes(tokens, din, dout):
    """The three training GEMMs of a linear layer (fwd_y = X.W^T, bwd_dx = dY.W, bwd_dw = dY^T.X) as (M, N, K),
    and the quantised operands, A [M, K] and B [N, K] of each, as (rows, K)."""
    gemms = [(tokens, dout, din), (tokens, din, dout), (dout, din, tokens)]
    operands = set()
    for m, n, k in gemms:
        operands |= {(m, k), (n, k)}
    return gemms, operands


def shape_sets(root=ROOT):
    gemms, quants = set(), set()
    for f in sorted(glob.glob(os.path.join(root, "workloads", "shapes", "*.csv"))):
        for _, t, i, o in read_layers(f):
            g, q = layer_shapes(t, i, o)
            gemms |= set(g)
            quants |= q
    for s in SWEEP:
        gemms.add((s, s, s))
        quants.add((s, s))
    return sorted(quants), sorted(gemms)


def split_of(shapes):
    """{shape: 'calibration' | 'validation'} by the rule in this module's docstring."""
    def work(s):
        w = 1
        for d in s:
            w *= d
        return w
    order = sorted(shapes, key=lambda s: (work(s), s))
    return {s: ("calibration" if i % 2 == 0 else "validation") for i, s in enumerate(order)}


def shape_text(s):
    return "x".join(str(d) for d in s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="print the fp4lab-cuda timings shape arguments")
    pl.add_argument("--part", choices=["all", "quant", "gemm"], default="all")
    sub.add_parser("split", help="print each shape's half")
    a = ap.parse_args(argv)
    quants, gemms = shape_sets()
    if a.cmd == "plan":
        words = []
        if a.part in ("all", "quant"):
            words += ["--quant"] + [shape_text(s) for s in quants]
        if a.part in ("all", "gemm"):
            words += ["--gemm"] + [shape_text(s) for s in gemms]
        print(" ".join(words))
    elif a.cmd == "split":
        for kind, shapes in (("quant", quants), ("gemm", gemms)):
            for s, half in sorted(split_of(shapes).items()):
                print(kind, shape_text(s), half)
    return 0


if __name__ == "__main__":
    sys.exit(main())
