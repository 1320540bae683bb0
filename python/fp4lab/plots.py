"""``fp4lab plot``: the figures of fp4lab's JSON and CSV outputs, labelled from the data they draw.

- ``fp4lab plot analysis ANALYSIS.json --out DIR``: from ``fp4lab analyze --json``: per-level rounding bias (the
  analytic bias of ``fp4lab bias`` beside the bias measured on the trace), tensor SQNR with and without RHT, the
  SQNR change RHT makes per layer, and, where the analysis has recipes, GEMM-output SQNR per recipe and pass.
- ``fp4lab plot sweep SWEEP.csv --out DIR``: from ``fp4lab sim --sweep``: unit area against step time for every
  run with an area, coloured by energy per token (or per step), the Pareto front drawn.

Every figure is named after the trace or sweep it comes from (``--label`` overrides). Needs matplotlib.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from ._files import ArgumentParser, DataError, UsageError, check_outputs, console_main, read_json, read_text, \
    write_atomic

ANALYSIS_FILES = ("fig_bias_levels.png", "fig_sqnr_rht.png", "fig_delta_sqnr.png", "fig_recipes.png")
SWEEP_FILES = ("fig_sweep_pareto.png",)


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DataError("fp4lab plot needs matplotlib (pip install matplotlib)") from None
    return plt


def _save(fig, path: str) -> None:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    fig.clf()
    write_atomic(path, buf.getvalue())


def _trace_label(doc: dict, path: str) -> str:
    tr = (doc.get("config") or {}).get("trace")
    if isinstance(tr, list):
        tr = ", ".join(map(str, tr))
    return str(tr) if tr else os.path.basename(path)


def _bias(fmt: str) -> dict:
    from . import cli_path
    p = subprocess.run([cli_path(), "bias", "--format", fmt, "--json", "-"], capture_output=True, text=True)
    if p.returncode != 0:
        raise DataError(f"fp4lab bias --format {fmt}: {(p.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(p.stdout)


def analysis(path: str, out: str, label: Optional[str] = None) -> List[str]:
    """The analysis figures of ``fp4lab analyze --json`` output ``path`` into folder ``out``; returns the files
    written. A figure whose rows the analysis lacks (no RHT setting, no recipe) is not drawn."""
    import numpy as np
    doc = read_json(path)
    try:
        tensors = [t for t in doc["tensors"]]
        gemms = [g for g in doc["gemms"]]
    except (KeyError, TypeError):
        raise DataError(f"{path}: not the JSON of fp4lab analyze (no tensors and gemms)") from None
    label = label or _trace_label(doc, path)
    os.makedirs(out, exist_ok=True)
    check_outputs([os.path.join(out, f) for f in ANALYSIS_FILES], [path])
    plt = _plt()
    written = []
    formats = sorted({t["format"] for t in tensors}, key=lambda f: ("e2m1", "e1m2").index(f)
                     if f in ("e2m1", "e1m2") else 9)
    if formats:
        fig, axes = plt.subplots(1, len(formats), figsize=(5 * len(formats), 3.6), squeeze=False)
        for ax, f in zip(axes[0], formats):
            data = _bias(f)
            levels = [lv["level"] for lv in data["levels"]]
            x = np.arange(len(levels))
            ax.bar(x - 0.2, [lv["bias"] for lv in data["levels"]], 0.4, label="analytic (uniform density)",
                   color="#4c72b0")
            emp = [t for t in tensors if t["format"] == f and t["rht"] == 0 and "level_counts" in t]
            if emp:
                counts = np.sum([t["level_counts"] for t in emp], axis=0)
                sums = np.sum([np.array(t["bias_per_level"]) * np.array(t["level_counts"]) for t in emp], axis=0)
                ax.bar(x + 0.2, np.where(counts > 0, sums / np.maximum(counts, 1), 0), 0.4,
                       label=f"measured, {label}", color="#dd8452")
            ax.axhline(0, color="k", lw=0.6)
            ax.set_xticks(x, [f"{v:g}" for v in levels])
            ax.set(xlabel=f"{f} level", ylabel="E[q - x | bin] (grid units)",
                   title=f"{f}: conditional rounding bias per level")
            ax.legend(fontsize=7)
        _save(fig, os.path.join(out, "fig_bias_levels.png"))
        written.append("fig_bias_levels.png")
    plain = [t for t in tensors if "recipe" not in t]
    names = sorted({(r["gemm"], r["role"]) for r in plain})
    settings = sorted({(r["format"], r["rht"]) for r in plain})
    if names and settings:
        fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(names)), 4.2))
        w = 0.8 / len(settings)
        for i, (f, d) in enumerate(settings):
            val = {(r["gemm"], r["role"]): r["sqnr_db"] for r in plain if r["format"] == f and r["rht"] == d}
            ax.bar(np.arange(len(names)) + (i - len(settings) / 2 + 0.5) * w,
                   [val.get(n, math.nan) for n in names], w, label=f"{f} {'RHT-%d' % d if d else 'no RHT'}")
        ax.set_xticks(np.arange(len(names)), [f"{g}/{r}" for g, r in names], rotation=75, fontsize=7)
        ax.set_ylabel("tensor SQNR (dB)")
        ax.set_ylim(max(0, min(r["sqnr_db"] for r in plain) - 3), None)
        ax.set_title(f"Tensor SQNR with and without RHT: {label}")
        ax.legend(fontsize=7, ncol=4)
        _save(fig, os.path.join(out, "fig_sqnr_rht.png"))
        written.append("fig_sqnr_rht.png")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    drawn = False
    for ax, rows, what in ((axes[0], plain, "role"), (axes[1], [g for g in gemms if "recipe" not in g], "pass")):
        rhts = sorted({r["rht"] for r in rows if r["rht"]})
        if not rhts:
            continue
        d = rhts[0]
        nm = sorted({(r["gemm"], r[what]) for r in rows})
        fm = sorted({r["format"] for r in rows})
        w = 0.8 / len(fm)
        for i, f in enumerate(fm):
            s = {(r["gemm"], r[what], r["rht"]): r["sqnr_db"] for r in rows if r["format"] == f}
            ax.bar(np.arange(len(nm)) + (i - len(fm) / 2 + 0.5) * w,
                   [s.get((*n, d), math.nan) - s.get((*n, 0), math.nan) for n in nm], w, label=f)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(np.arange(len(nm)), [f"{g}/{r}" for g, r in nm], rotation=75, fontsize=7)
        ax.set(ylabel=f"SQNR(RHT-{d}) - SQNR(none) (dB)",
               title=f"delta-SQNR per layer and {'tensor' if what == 'role' else 'GEMM pass'}: {label}")
        ax.legend(fontsize=8)
        drawn = True
    if drawn:
        _save(fig, os.path.join(out, "fig_delta_sqnr.png"))
        written.append("fig_delta_sqnr.png")
    else:
        plt.close(fig)
    rec = [g for g in gemms if "recipe" in g and g.get("sqnr_db") is not None]
    if rec:
        recipes = list(dict.fromkeys(g["recipe"] for g in rec))
        from ._core import PASSES as passes
        fig, ax = plt.subplots(figsize=(7, 3.8))
        w = 0.8 / len(recipes)
        for i, r in enumerate(recipes):
            vals = []
            for p in passes:
                xs = [g["sqnr_db"] for g in rec if g["recipe"] == r and g["pass"] == p]
                vals.append(sum(xs) / len(xs) if xs else math.nan)
            ax.bar(np.arange(len(passes)) + (i - len(recipes) / 2 + 0.5) * w, vals, w, label=r)
        ax.set_xticks(np.arange(len(passes)), passes)
        ax.set(ylabel="mean GEMM-output SQNR (dB)", title=f"Recipes per training GEMM: {label}")
        ax.legend(fontsize=8)
        _save(fig, os.path.join(out, "fig_recipes.png"))
        written.append("fig_recipes.png")
    plt.close("all")
    return written


def _number(v: str) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def sweep(path: str, out: str, label: Optional[str] = None) -> List[str]:
    """The Pareto figure of a ``fp4lab sim --sweep`` CSV ``path`` into folder ``out``."""
    text = read_text(path)
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or "time_us" not in rows[0]:
        raise DataError(f"{path}: not the CSV of fp4lab sim --sweep (no time_us column)")
    if "area_unit_mm2" not in rows[0]:
        raise DataError(f"{path}: no area_unit_mm2 column: the sweep's configurations have no [area] keys")
    pts = [(r["name"], _number(r["area_unit_mm2"]), _number(r["time_us"]),
            _number(r.get("energy_per_token_pj", "")) or _number(r.get("energy_total_pj", ""))) for r in rows]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    if not pts:
        raise DataError(f"{path}: no run with an area and a time")
    per_token = any(_number(r.get("energy_per_token_pj", "")) is not None for r in rows)
    os.makedirs(out, exist_ok=True)
    check_outputs([os.path.join(out, f) for f in SWEEP_FILES], [path])
    plt = _plt()
    label = label or os.path.basename(path)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    c = [p[3] * (1e-9 if per_token else 1e-12) if p[3] is not None else math.nan for p in pts]
    sc = ax.scatter([p[1] for p in pts], [p[2] * 1e-3 for p in pts], c=c, cmap="viridis", s=36, edgecolors="k",
                    linewidths=0.4)
    front = sorted((p for p in pts if not any(o[1] <= p[1] and o[2] <= p[2] and (o[1], o[2]) != (p[1], p[2])
                                              for o in pts)), key=lambda p: p[1])
    ax.plot([p[1] for p in front], [p[2] * 1e-3 for p in front], "k--", lw=0.8, label="Pareto front")
    for p in front[:12]:
        ax.annotate(p[0], (p[1], p[2] * 1e-3), fontsize=6, xytext=(3, 3), textcoords="offset points")
    fig.colorbar(sc, ax=ax, label="energy per token, mJ" if per_token else "energy per run, J")
    ax.set(xlabel="unit area, mm²", ylabel="time, ms", title=f"{label}: {len(pts)} design points")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, os.path.join(out, "fig_sweep_pareto.png"))
    plt.close("all")
    return list(SWEEP_FILES)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = ArgumentParser(prog="fp4lab plot", description="Figures of fp4lab's analysis JSON and sweep CSV.")
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("analysis", help="figures of `fp4lab analyze --json` output")
    a.add_argument("file")
    s = sub.add_parser("sweep", help="the Pareto figure of a `fp4lab sim --sweep` CSV")
    s.add_argument("file")
    for p in (a, s):
        p.add_argument("--out", required=True, help="folder for the PNGs")
        p.add_argument("--label", help="what the data is, for the titles (default: from the data)")
    args = ap.parse_args(argv)
    files = (analysis if args.what == "analysis" else sweep)(args.file, args.out, args.label)
    print(f"wrote {', '.join(os.path.join(args.out, f) for f in files)}")
    return 0


def console(argv: Optional[Sequence[str]] = None) -> int:
    return console_main("fp4lab plot", lambda: main(argv))


if __name__ == "__main__":
    sys.exit(console(sys.argv[1:]))
