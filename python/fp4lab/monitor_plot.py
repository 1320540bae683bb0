"""Plots the JSONL of fp4lab.torch.monitor: by default one heatmap per (statistic, pass), layers down and recorded
optimizer steps across (operand SQNR, GEMM-output SQNR, flushed-to-zero and saturated fractions; the operand
statistics show each layer's operand A and B as two rows), readable for a model of hundreds of GEMMs; ``--lines``
draws one line per (layer, pass, operand) instead, for a few layers.

    fp4lab-monitor-plot numerics.jsonl -o numerics.png [--layer REGEX] [--lines]

A file that is not the monitor's JSONL is a one-line error naming the file and line (exit 1); the PNG is held to
the command line's output rules before the file is read (never the JSONL itself, a folder or a device: exit 2 or 1)
and written to a temporary name, renamed when complete.
"""
from __future__ import annotations

import io
import json
import os
import sys
from collections import defaultdict
from typing import Optional

from ._files import ArgumentParser, DataError, UsageError, check_outputs, compile_regex, console_main, write_atomic

STATS = (("sqnr_db", "operand SQNR (dB)"), ("gemm_sqnr_db", "GEMM output SQNR (dB)"),
         ("frac_zero", "fraction flushed to zero"), ("frac_sat", "fraction at the grid's largest magnitude"))


def _layer_pattern(layer: Optional[str], what: str = "layer"):
    if layer is None:
        return None
    return compile_regex(layer, what)


def read(path: str, layer: Optional[str] = None) -> dict:
    """stat -> (layer, pass, operand) -> [(step, value)], from the monitor's JSONL; a DataError (a ValueError) names
    the file and line, a UsageError a bad `layer` regex."""
    pattern = _layer_pattern(layer) if layer else None
    series = defaultdict(lambda: defaultdict(list))
    with _open(path) as f:
        for n, raw in _lines(f, path):
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
                raise DataError(f"{path}:{n}: not a record of fp4lab.torch.monitor ({type(e).__name__}: {e})") \
                    from None
    if not series:  # an empty plot would look like a run that recorded nothing
        raise DataError(f"{path}: no record of fp4lab.torch.monitor" +
                        (f" for a layer matching {layer!r}" if pattern else ""))
    return series


def _open(path: str):
    if not isinstance(path, (str, os.PathLike)):  # open() would take an int as a file descriptor
        raise UsageError(f"{path!r}: a path is a str or os.PathLike, not {type(path).__name__}")
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:  # a NUL byte
        raise DataError(f"{path!r}: {e}") from None


def _lines(f, path: str):
    try:
        yield from enumerate(f, 1)
    except OSError as e:  # a folder, or a read error part-way
        raise DataError(f"{path}: {e.strerror or e}") from None


from ._core import PASSES  # noqa: E402  (the training GEMMs, in their order)


def _heatmaps(plt, series: dict):
    """One panel per (statistic, pass): rows are the layers in the order the file first names them (the forward's
    order), operand A above B for the operand statistics; columns the recorded steps. An SQNR of +inf (no error)
    is drawn at the panel's largest finite value; a GEMM not recorded at a step is blank."""
    import numpy as np
    layers: list = []
    for k, _ in STATS:
        for lay, _, _ in series[k]:
            if lay not in layers:
                layers.append(lay)
    steps = sorted({st for k, _ in STATS for pts in series[k].values() for st, _ in pts})
    col = {st: i for i, st in enumerate(steps)}
    fig, axes = plt.subplots(len(STATS), len(PASSES), figsize=(15, len(STATS) * (2.5 + min(len(layers), 320) / 40)),
                             squeeze=False)
    for r, (k, title) in enumerate(STATS):
        ops = ("a",) if k == "gemm_sqnr_db" else ("a", "b")
        rows = [(lay, o) for lay in layers for o in ops]
        for c, p in enumerate(PASSES):
            ax = axes[r][c]
            grid = np.full((len(rows), len(steps)), np.nan)
            for i, (lay, o) in enumerate(rows):
                for st, v in series[k].get((lay, p, o), ()):
                    grid[i, col[st]] = v
            finite = grid[np.isfinite(grid)]
            if finite.size:
                grid[np.isposinf(grid)] = finite.max()
                grid[np.isneginf(grid)] = finite.min()
            im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
            fig.colorbar(im, ax=ax, fraction=0.04)
            ax.set_title(f"{p}: {title}" + ("" if len(ops) == 1 else " (rows: A, B)"), fontsize=9)
            # At most about 40 labels a panel, so that 32 decoder blocks of 7 GEMMs stay legible.
            every = max(1, -(-len(layers) // 40))
            ax.set_yticks([i * len(ops) for i in range(0, len(layers), every)])
            ax.set_yticklabels(layers[::every], fontsize=5)
            xt = list(range(0, len(steps), max(1, -(-len(steps) // 12))))
            ax.set_xticks(xt)
            ax.set_xticklabels([str(steps[i]) for i in xt], fontsize=7)
            if r == len(STATS) - 1:
                ax.set_xlabel("optimizer step")
    return fig


def _lines_plot(plt, series: dict):
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for ax, (k, title) in zip(axes.flat, STATS):
        for (lay, p, o), pts in sorted(series[k].items()):
            pts.sort()
            label = f"{lay} {p}" if k == "gemm_sqnr_db" else f"{lay} {p}.{o}"
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=label)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if series[k]:
            ax.legend(fontsize=6, ncol=2)  # per panel: the GEMM panel has one line per pass, not per operand
    return fig


def plot(path: str, out: str, layer: Optional[str] = None, lines: bool = False) -> None:
    """The plot of the monitor's JSONL `path` as a PNG `out` (heatmaps; `lines`: one line per layer, pass and
    operand); `out` is checked first (the shared output rules: never `path` itself, a folder or a device), then the
    file is read, then the PNG written through a temporary name."""
    _layer_pattern(layer)
    _open(path).close()  # a missing input is named first, as the command line does
    check_outputs([out], [path])
    series = read(path, layer)
    try:
        import matplotlib
    except ImportError:
        raise DataError("matplotlib is needed for the plot (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = _lines_plot(plt, series) if lines else _heatmaps(plt, series)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(out, buf.getvalue(), inputs=[path])


def main(argv=None) -> int:
    def body() -> None:
        ap = ArgumentParser(prog="fp4lab-monitor-plot", description=__doc__.splitlines()[0])
        ap.add_argument("jsonl")
        ap.add_argument("-o", "--out", default="monitor.png")
        ap.add_argument("--layer", default=None, help="regex: only layers whose name it matches")
        ap.add_argument("--lines", action="store_true", help="one line per layer, pass and operand, not heatmaps")
        a = ap.parse_args(argv)
        _layer_pattern(a.layer, "--layer")
        plot(a.jsonl, a.out, a.layer, a.lines)

    return console_main("fp4lab-monitor-plot", body)


if __name__ == "__main__":
    sys.exit(main())
