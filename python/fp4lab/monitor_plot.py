"""Plots the JSONL of fp4lab.torch.monitor: operand SQNR, GEMM-output SQNR, flushed-to-zero and saturated
fractions over the sampled steps, one line per (layer, pass, operand), one panel per statistic.

    fp4lab-monitor-plot numerics.jsonl -o numerics.png [--layer REGEX]

A file that is not the monitor's JSONL is a one-line error naming the file and line (exit 1); the PNG is written
to a temporary name and renamed when complete.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections import defaultdict
from typing import Optional

from ._files import write_atomic

STATS = (("sqnr_db", "operand SQNR (dB)"), ("gemm_sqnr_db", "GEMM output SQNR (dB)"),
         ("frac_zero", "fraction flushed to zero"), ("frac_sat", "fraction at the grid's largest magnitude"))


def read(path: str, layer: Optional[str] = None) -> dict:
    """stat -> (layer, pass, operand) -> [(step, value)], from the monitor's JSONL; ValueError names the line."""
    pattern = re.compile(layer) if layer else None
    series = defaultdict(lambda: defaultdict(list))
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                r = json.loads(raw.decode("utf-8"))
                key = tuple(r[k] for k in ("layer", "pass", "operand"))
                step = r["step"]
                if not all(isinstance(k, str) for k in key) or type(step) is not int:
                    raise TypeError("layer, pass and operand must be text and step an integer")
                if pattern and not pattern.search(key[0]):
                    continue
                for k, _ in STATS:
                    if k == "gemm_sqnr_db" and key[2] != "a":
                        continue  # one value per GEMM, repeated on both operands' lines
                    v = r[k]
                    if isinstance(v, bool) or not (isinstance(v, (int, float)) or v == "inf"):
                        raise TypeError(f"{k} is not a number")
                    series[k][key].append((step, float(v)))  # SQNR "inf" (no error) is float("inf")
            except (ValueError, TypeError, KeyError, OverflowError, RecursionError, AttributeError) as e:
                raise ValueError(f"{path}:{n}: not a record of fp4lab.torch.monitor ({type(e).__name__}: {e})")
    return series


def plot(path: str, out: str, layer: Optional[str] = None) -> None:
    series = read(path, layer)
    try:
        import matplotlib
    except ImportError:
        raise ValueError("matplotlib is needed for the plot (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for ax, (k, title) in zip(axes.flat, STATS):
        for (lay, p, o), pts in sorted(series[k].items()):
            pts.sort()
            label = f"{lay} {p}" if k == "gemm_sqnr_db" else f"{lay} {p}.{o}"
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if series[k]:
            ax.legend(fontsize=6, ncol=2)  # per panel: the GEMM panel has one line per pass, not per operand
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(out, buf.getvalue())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fp4lab-monitor-plot", description=__doc__.splitlines()[0])
    ap.add_argument("jsonl")
    ap.add_argument("-o", "--out", default="monitor.png")
    ap.add_argument("--layer", default=None, help="regex: only layers whose name it matches")
    a = ap.parse_args(argv)
    try:
        plot(a.jsonl, a.out, a.layer)
    except (OSError, ValueError, re.error) as e:
        print(f"fp4lab-monitor-plot: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
