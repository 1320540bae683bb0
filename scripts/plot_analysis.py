#!/usr/bin/env python3
"""Pictures of the paper from fp4lab's JSON: per-level bias bars (Figure 1a), tensor SQNR with and without
RHT per tensor and format, and delta-SQNR per layer and path.

    build/bin/fp4lab analyze --json docs/results/analysis.json
    python3 scripts/plot_analysis.py docs/results/analysis.json --fp4lab build/bin/fp4lab --out docs
"""
import argparse
import json
import os
import subprocess

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_bias(fp4lab, formats, trace_json, out):
    """Analytic per-level bias from `fp4lab bias`, beside the empirical bias on the trace."""
    fig, axes = plt.subplots(1, len(formats), figsize=(5 * len(formats), 3.6), squeeze=False)
    for ax, f in zip(axes[0], formats):
        data = json.loads(subprocess.check_output([fp4lab, "bias", "--format", f, "--json", "-"]))
        levels = [l["level"] for l in data["levels"]]
        bias = [l["bias"] for l in data["levels"]]
        x = np.arange(len(levels))
        ax.bar(x - 0.2, bias, 0.4, label="analytic (uniform density)", color="#4c72b0")
        emp = [t for t in trace_json["tensors"] if t["format"] == f and t["rht"] == 0]
        if emp:
            counts = np.sum([t["level_counts"] for t in emp], axis=0)
            sums = np.sum([np.array(t["bias_per_level"]) * np.array(t["level_counts"]) for t in emp], axis=0)
            ax.bar(x + 0.2, np.where(counts > 0, sums / np.maximum(counts, 1), 0), 0.4,
                   label="empirical, bundled trace", color="#dd8452")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x, [f"{v:g}" for v in levels])
        ax.set_xlabel(f"{f} level")
        ax.set_ylabel("E[q - x | bin] (grid units)")
        ax.set_title(f"{f}: conditional rounding bias per level")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fig_bias_levels.png"), dpi=120)


def plot_sqnr(j, out):
    t = j["tensors"]
    names = sorted({(r["gemm"], r["role"]) for r in t})
    settings = sorted({(r["format"], r["rht"]) for r in t})
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(names)), 4.2))
    w = 0.8 / len(settings)
    for i, (f, d) in enumerate(settings):
        vals = [next(r["sqnr_db"] for r in t if (r["gemm"], r["role"]) == n and r["format"] == f and r["rht"] == d)
                for n in names]
        ax.bar(np.arange(len(names)) + (i - len(settings) / 2 + 0.5) * w, vals, w,
               label=f"{f} {'RHT-%d' % d if d else 'no RHT'}")
    ax.set_xticks(np.arange(len(names)), [f"{g}/{r}" for g, r in names], rotation=75, fontsize=7)
    ax.set_ylabel("tensor SQNR (dB)")
    lo = min(r["sqnr_db"] for r in t)
    ax.set_ylim(max(0, lo - 3), None)
    ax.set_title("Tensor SQNR with and without RHT (1x16 blocks, FP32 scales)")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fig_sqnr_rht.png"), dpi=120)


def plot_delta(j, out):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for ax, key, what in ((axes[0], "tensors", "role"), (axes[1], "gemms", "pass")):
        recs = [r for r in j[key] if "recipe" not in r]
        names = sorted({(r["gemm"], r[what]) for r in recs})
        formats = sorted({r["format"] for r in recs})
        rhts = sorted({r["rht"] for r in recs if r["rht"]})
        if not rhts:
            continue
        d = rhts[0]
        w = 0.8 / len(formats)
        for i, f in enumerate(formats):
            def s(n, dd):
                return next(r["sqnr_db"] for r in recs if (r["gemm"], r[what]) == n and r["format"] == f and r["rht"] == dd)
            ax.bar(np.arange(len(names)) + (i - len(formats) / 2 + 0.5) * w, [s(n, d) - s(n, 0) for n in names], w,
                   label=f)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(np.arange(len(names)), [f"{g}/{r}" for g, r in names], rotation=75, fontsize=7)
        ax.set_ylabel(f"SQNR(RHT-{d}) - SQNR(none) (dB)")
        ax.set_title(f"delta-SQNR per layer and {'tensor' if key == 'tensors' else 'GEMM pass'}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fig_delta_sqnr.png"), dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("analysis", help="JSON written by `fp4lab analyze --json`")
    ap.add_argument("--fp4lab", default="build/bin/fp4lab", help="the fp4lab binary (for `fp4lab bias`)")
    ap.add_argument("--out", default="docs", help="folder for the PNGs")
    a = ap.parse_args()
    with open(a.analysis) as f:
        j = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    formats = sorted({r["format"] for r in j["tensors"]}, key=lambda f: ["e2m1", "e1m2"].index(f) if f in ("e2m1", "e1m2") else 9)
    plot_bias(a.fp4lab, formats, j, a.out)
    plot_sqnr(j, a.out)
    plot_delta(j, a.out)
    print(f"wrote {a.out}/fig_bias_levels.png, fig_sqnr_rht.png, fig_delta_sqnr.png")


if __name__ == "__main__":
    main()
