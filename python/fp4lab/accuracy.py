"""Trace metrics of a recipe's accuracy, and their uncertainty across a trace's records and steps.

One definition of each metric, shared by ``fp4lab decide`` (the decision report's accuracy side) and the proxy study
that tests which of them predict the paired training effects (docs/results/training.md). A metric is computed from the GEMM
rows ``fp4lab analyze --recipe`` writes for one recipe (docs/spec.md §6): ``sqnr_db``, ``eta`` (the predicted output
scale η = α_A·α_B) and ``eta_measured``, one row per record and pass.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Mapping, NamedTuple, Sequence

import numpy as np

from ._core import PASSES  # noqa: E402  (the training GEMMs, in their order)
FIELDS = ("sqnr_db", "eta", "eta_measured")


def _sum(xs):
    """Summed in list order from +0.0 (not builtins.sum, which compensates on Python 3.12 and later): the same bits
    on every Python."""
    total = 0.0
    for x in xs:
        total += x
    return total


def _mean(xs):
    return _sum(xs) / len(xs)


def _values(rows, field, passes):
    return [r[field] for r in rows if r["pass"] in passes]


class Metric(NamedTuple):
    key: str
    name: str
    better: int  # +1: a higher value is better; -1: a lower one
    fn: Callable[[Sequence[Mapping]], float]


# δ = 1 − η (docs/spec.md §6).
METRICS = (
    Metric("sqnr", "mean GEMM-output SQNR, dB (every GEMM and pass)", +1,
           lambda rs: _mean(_values(rs, "sqnr_db", PASSES))),
    Metric("sqnr_fwd_y", "`fwd_y` SQNR, dB (forward outputs)", +1, lambda rs: _mean(_values(rs, "sqnr_db", ("fwd_y",)))),
    Metric("sqnr_bwd_dx", "`bwd_dx` SQNR, dB (activation gradients)", +1,
           lambda rs: _mean(_values(rs, "sqnr_db", ("bwd_dx",)))),
    Metric("sqnr_bwd_dw", "`bwd_dw` SQNR, dB (weight update against its error)", +1,
           lambda rs: _mean(_values(rs, "sqnr_db", ("bwd_dw",)))),
    Metric("sqnr_grad", "gradient-side SQNR, dB (`bwd_dx` and `bwd_dw`)", +1,
           lambda rs: _mean(_values(rs, "sqnr_db", ("bwd_dx", "bwd_dw")))),
    Metric("sqnr_min", "worst GEMM-output SQNR, dB (lowest of every GEMM and pass)", +1,
           lambda rs: min(_values(rs, "sqnr_db", PASSES))),
    Metric("shrink", "mean shrinkage |δ| = |1 − η|, η = α_A·α_B (every GEMM and pass)", -1,
           lambda rs: _mean([abs(1.0 - v) for v in _values(rs, "eta", PASSES)])),
    Metric("shrink_measured", "mean output bias |1 − η_measured| (every GEMM and pass)", -1,
           lambda rs: _mean([abs(1.0 - v) for v in _values(rs, "eta_measured", PASSES)])),
    Metric("chain", "forward-chain shrinkage |Σ δ| over `fwd_y` (≈ |log Π η|)", -1,
           lambda rs: abs(_sum([1.0 - v for v in _values(rs, "eta", ("fwd_y",))]))),
    Metric("dw_bias", "weight-update bias, mean |1 − η_measured| of `bwd_dw`", -1,
           lambda rs: _mean([abs(1.0 - v) for v in _values(rs, "eta_measured", ("bwd_dw",))])),
)
BY_KEY = {m.key: m for m in METRICS}


def recipe_rows(analysis: Mapping, label: str = "") -> Dict[str, List[dict]]:
    """{recipe: its GEMM rows} of one ``fp4lab analyze --recipe`` document, each row tagged with ``record``: the
    trace label and the GEMM name, the unit the uncertainty is taken over (one record's three passes share its
    tensors, so they are not independent draws)."""
    out: Dict[str, List[dict]] = {}
    for r in analysis.get("gemms", []):
        rec = r.get("recipe")
        if rec is None:
            continue
        out.setdefault(rec, []).append(dict(r, record=(label, r["gemm"])))
    return out


def check_rows(rows: Sequence[Mapping], where: str) -> None:
    """A ValueError naming ``where`` unless every row has a finite figure in every field and the three passes are
    all there (an exact GEMM output has no SQNR in dB to average)."""
    for f in FIELDS:
        for r in rows:
            v = r.get(f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{where}: GEMM {r.get('gemm')!r} pass {r.get('pass')!r} has no finite {f!r}")
    passes = {r.get("pass") for r in rows}
    if passes != set(PASSES):
        raise ValueError(f"{where}: GEMM rows of passes {sorted(map(str, passes))}, not {', '.join(PASSES)}")


def metrics(rows: Sequence[Mapping]) -> Dict[str, float]:
    """{metric key: value} of one recipe's GEMM rows."""
    return {m.key: m.fn(rows) for m in METRICS}


def percentile_interval(values: Sequence[float], level: float = 0.95):
    """The (⌈(1−level)/2·m⌉-th, ⌈(1+level)/2·m⌉-th) smallest of m values: a percentile bootstrap interval."""
    v = sorted(values)
    m = len(v)
    lo = max(1, math.ceil((1 - level) / 2 * m))
    hi = max(1, math.ceil((1 + level) / 2 * m))
    return v[lo - 1], v[hi - 1]


def bootstrap(by_recipe: Mapping[str, Sequence[Mapping]], pairs: Sequence[tuple], resamples: int,
              seed: int) -> dict:
    """Each recipe's metrics with 95% percentile intervals, and the paired differences A − B of ``pairs`` with
    theirs, over the records: every resample draws as many records as there are, with replacement (numpy's
    PCG64 from ``seed``), and takes each recipe's rows of the drawn records, so A and B of a pair are drawn
    together. Records are the units drawn because a record's passes share its tensors; steps (several traces)
    enter as further records."""
    records = sorted({r["record"] for rows in by_recipe.values() for r in rows})
    index = {rec: i for i, rec in enumerate(records)}
    grouped = {name: [[] for _ in records] for name in by_recipe}
    for name, rows in by_recipe.items():
        for r in rows:
            grouped[name][index[r["record"]]].append(r)
    point = {name: metrics(rows) for name, rows in by_recipe.items()}
    draws = {name: {m.key: [] for m in METRICS} for name in by_recipe}
    rng = np.random.default_rng(seed)
    n = len(records)
    for _ in range(resamples):
        pick = rng.integers(0, n, size=n)
        for name in by_recipe:
            rows = [r for i in pick for r in grouped[name][i]]
            if {r["pass"] for r in rows} != set(PASSES):
                continue
            for m in METRICS:
                draws[name][m.key].append(m.fn(rows))
    out = {"records": len(records), "resamples": resamples, "seed": seed, "recipes": {}, "differences": []}
    for name in by_recipe:
        out["recipes"][name] = {
            k: {"value": point[name][k], "low": percentile_interval(draws[name][k])[0],
                "high": percentile_interval(draws[name][k])[1]} for k in point[name]}
    for a, b in pairs:
        if a not in by_recipe or b not in by_recipe:
            continue
        d = {"a": a, "b": b, "metrics": {}}
        for m in METRICS:
            xa, xb = draws[a][m.key], draws[b][m.key]
            diffs = [x - y for x, y in zip(xa, xb)] if len(xa) == len(xb) else []
            lo, hi = percentile_interval(diffs) if diffs else (math.nan, math.nan)
            # favours: which recipe the metric favours, and whether the interval of A − B excludes zero
            delta = point[a][m.key] - point[b][m.key]
            d["metrics"][m.key] = {"value": delta, "low": lo, "high": hi,
                                   "favours": a if m.better * delta > 0 else b if m.better * delta < 0 else None,
                                   "decided": bool(lo > 0 or hi < 0)}
        out["differences"].append(d)
    return out
