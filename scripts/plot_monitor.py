#!/usr/bin/env python3
"""Plots the JSONL of fp4lab.torch.monitor: operand SQNR, GEMM-output SQNR, flushed-to-zero and saturated
fractions over the sampled steps, one line per (layer, pass, operand), one panel per statistic.

    python3 scripts/plot_monitor.py numerics.jsonl -o numerics.png [--layer REGEX]
"""
import argparse
import json
import re
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STATS = (("sqnr_db", "operand SQNR (dB)"), ("gemm_sqnr_db", "GEMM output SQNR (dB)"),
         ("frac_zero", "fraction flushed to zero"), ("frac_sat", "fraction at the grid's largest magnitude"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl")
    ap.add_argument("-o", "--out", default="monitor.png")
    ap.add_argument("--layer", default=None, help="regex: only layers whose name it matches")
    args = ap.parse_args()
    series = defaultdict(lambda: defaultdict(list))  # stat -> (layer, pass, operand) -> [(step, value)]
    with open(args.jsonl, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if args.layer and not re.search(args.layer, r["layer"]):
                continue
            for k, _ in STATS:
                if k == "gemm_sqnr_db" and r["operand"] != "a":
                    continue  # one value per GEMM, repeated on both operands' lines
                v = r[k]
                series[k][(r["layer"], r["pass"], r["operand"])].append((r["step"], float(v)))
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for ax, (k, title) in zip(axes.flat, STATS):
        for (layer, p, o), pts in sorted(series[k].items()):
            pts.sort()
            label = f"{layer} {p}" if k == "gemm_sqnr_db" else f"{layer} {p}.{o}"
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if series[k]:
            ax.legend(fontsize=6, ncol=2)  # per panel: the GEMM panel has one line per pass, not per operand
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)


if __name__ == "__main__":
    main()
