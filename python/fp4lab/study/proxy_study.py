"""The proxy study: which trace metrics predict the paired loss effects of a training results file (`report`'s JSON)?

For every paired effect with an interval (report.proxy_pairs: two presets, or an ablation and the recipe it
changes, final validation loss, two seeds or more) and every trace metric of METRICS, the metric's difference
between the two recipes on a trace (`fp4lab analyze --recipe` output) is held against the effect's mean paired
loss difference, by rank correlation across the effects:

- orientation: x = g(A) − g(B) with g the metric, negated where a lower value is better, and y = −(mean paired
  Δ val loss of A − B, points); so x > 0 where the metric favours A, y > 0 where A ended lower, and ρ > 0 means
  the recipe the metric favours tends to end at the lower loss (+1: the metric orders the effects perfectly;
  < 0: it points the wrong way);
- each effect enters twice, as (x, y) and as its mirror (−x, −y), B − A: an effect's sign is a naming
  convention (ufp4 first, an ablation before its base), and with the mirrors no figure depends on it;
- Spearman's ρ (ranks with ties averaged) and Kendall's τ_b (ties taken out of the denominator) of the mirrored
  points, and the count of effects whose x and y agree in sign (the metric favours the recipe that ended lower)
  and disagree (x = 0: the metric does not tell the recipes apart, neither);
- 95% percentile bootstrap intervals of ρ, RESAMPLES resamples drawn by SplitMix64 from SEED, each draw bringing
  an effect with its mirror: over the effects (as many draws as effects, with replacement), and over the recipe
  pairs (as many draws as pairs, each bringing every effect of the pair: the effects of one pair share their
  metric difference, so they are not independent draws). The interval is the ⌈0.025 m⌉-th and ⌈0.975 m⌉-th
  smallest of the m resamples with a defined ρ (a resample whose x or y are all equal has none; their count is
  in the JSON). One set of draws serves every metric, so their intervals compare.

ρ is one square root and one division of exact integer moments (spearman), so every figure is the same bits on
every machine (docs/spec.md §6.1), in the plain Python of the point estimates and in numpy's bootstrap alike.
"""
import json
import math

from .._files import DataError, UsageError, check_outputs, read_text, write_atomic
from . import report as rp
from ..accuracy import FIELDS, METRICS, PASSES  # one definition of each metric, shared with fp4lab decide

RESAMPLES = 10000
SEED = 20250
LEFT_OUT = "mxfp4"  # the grid far from the others in error: the study is repeated without its effects
MARKER = "proxy study: fp4lab-train proxy-study"
# The method in one paragraph, for the JSON that carries its own reading.
DEFINITION = ("per paired effect A - B (final validation loss, two seeds or more) and trace metric g: x = g(A) - g(B), "
              "negated where a lower g is better; y = -(mean paired delta val loss, points); each effect enters with "
              "its mirror (-x, -y); Spearman's rho (ranks with ties averaged) and Kendall's tau_b of the mirrored "
              "points; rho > 0: the recipe the metric favours tends to end at the lower loss. 95% percentile "
              "bootstrap intervals of rho (the ceil(0.025 m)-th and ceil(0.975 m)-th smallest of the m resamples "
              "with a defined rho), SplitMix64 draws from `seed`, one set of draws for every metric, each draw an "
              "effect with its mirror: over the effects, and over the recipe pairs (a drawn pair brings all its "
              "effects)")




def trace_metrics(analysis_path):
    """{recipe: {metric key: value}} of one trace's `fp4lab analyze --recipe` output (one JSON, or several joined
    by '+', as report.recipe_rows reads them). A DataError names the file whose rows lack a number (an exact
    GEMM output's SQNR is null: it has no dB to average) or a pass of the three."""
    out = {}
    for rec, (path, rows) in rp.recipe_rows(analysis_path).items():
        for f in FIELDS:
            xs = [r.get(f) for r in rows]
            if not (rp._numbers(xs) and all(math.isfinite(x) for x in xs)):
                raise DataError(f"{path}: recipe {rec}: a GEMM row without a finite number in {f!r} (the study "
                                "needs finite figures of every row)")
        passes = {str(r.get("pass")) for r in rows}
        if passes != set(PASSES) or not all(isinstance(r.get("pass"), str) for r in rows):
            raise DataError(f"{path}: recipe {rec}: GEMM rows of passes {', '.join(sorted(passes))[:200]}, not "
                            f"{', '.join(PASSES)}")
        out[rec] = {key: fn(rows) for key, _, _, fn in METRICS}
    return out


def _codes(v):
    """Dense rank codes of v (equal values one code, in ascending order) and their count."""
    order = {u: k for k, u in enumerate(sorted(set(v)))}
    return [order[u] for u in v], len(order)


def _rho(num, dx, dy):
    """ρ from the exact integer moments: num / √(dx · dy), one rounding each (the same bits in Python and numpy);
    NaN where either variable has no spread."""
    return float("nan") if dx == 0 or dy == 0 else float(num) / math.sqrt(float(dx * dy))


def spearman(x, y, weights=None):
    """Spearman's ρ: Pearson's r of the ranks, ties given their mean rank; NaN without spread. weights (whole
    numbers) repeat each point that many times, as a bootstrap resample does. The ranks are doubled to whole
    numbers so the moments n·Σab − Σa·Σb, n·Σa² − (Σa)², n·Σb² − (Σb)² are exact integers and ρ is one square
    root and one division of them: the same value as fp4lab.paired's pearson(ranks(x), ranks(y)) but for its
    last bits, and the very bits the bootstrap's vectorised form gives."""
    if len(x) != len(y):
        raise ValueError("spearman: x and y differ in length")
    w = [1] * len(x) if weights is None else [int(v) for v in weights]
    cx, kx = _codes(x)
    cy, ky = _codes(y)
    ra, rb = _doubled_ranks(cx, kx, w), _doubled_ranks(cy, ky, w)
    n = sum(w)
    sa = sum(wi * a for wi, a in zip(w, ra))
    sb = sum(wi * b for wi, b in zip(w, rb))
    return _rho(n * sum(wi * a * b for wi, a, b in zip(w, ra, rb)) - sa * sb,
                n * sum(wi * a * a for wi, a in zip(w, ra)) - sa * sa,
                n * sum(wi * b * b for wi, b in zip(w, rb)) - sb * sb)


def _doubled_ranks(codes, k, w):
    """Twice the 0-based mean rank of each point's value in the sample that repeats point i w[i] times:
    2 · (points below) + (points equal) − 1."""
    count = [0] * k
    for c, wi in zip(codes, w):
        count[c] += wi
    below, s = [0] * k, 0
    for j in range(k):
        below[j], s = s, s + count[j]
    return [2 * below[c] + count[c] - 1 for c in codes]


def kendall_tau_b(x, y):
    """Kendall's τ_b = (concordant − discordant) / √((n0 − n1)(n0 − n2)), n0 = n(n − 1)/2 pairs, n1 and n2 the
    pairs tied in x and in y; NaN where either variable has no two different values."""
    n = len(x)
    if n != len(y):
        raise ValueError("kendall_tau_b: x and y differ in length")
    s = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx = (x[i] > x[j]) - (x[i] < x[j])
            dy = (y[i] > y[j]) - (y[i] < y[j])
            s += dx * dy
            tx += dx == 0
            ty += dy == 0
    n0 = n * (n - 1) // 2
    return _rho(s, n0 - tx, n0 - ty)


_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1


def splitmix64(seed: int, count: int):
    """The first `count` outputs of Steele, Lea and Flood's SplitMix64 from `seed` (Vigna's reference constants),
    as numpy uint64: output i mixes the state seed + (i + 1)·γ mod 2^64, so the stream is one vector operation
    and the same on every machine and numpy version."""
    import numpy as np
    z = np.uint64(seed & _MASK) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GAMMA)  # wraps mod 2^64
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def percentile_interval(values):
    """The ⌈0.025 m⌉-th and ⌈0.975 m⌉-th smallest of m values (the inverse of the empirical distribution
    function, numpy's method 'inverted_cdf'), in integer arithmetic; (None, None) for no values."""
    v = sorted(values)
    m = len(v)
    if not m:
        return None, None
    return v[(25 * m + 999) // 1000 - 1], v[(975 * m + 999) // 1000 - 1]


def resample_weights(groups, n, resamples=RESAMPLES, seed=SEED):
    """The bootstrap's resamples as whole-number weights, shape (resamples, n): resample r draws len(groups)
    groups with replacement (`groups`: lists of point indices; one point each for a bootstrap over points),
    draw j being SplitMix64 output r·len(groups) + j modulo len(groups), and weighs each point by how often its
    group was drawn."""
    import numpy as np
    g = len(groups)
    draws = (splitmix64(seed, resamples * g) % np.uint64(g)).astype(np.int64).reshape(resamples, g)
    per_group = np.zeros((resamples, g), dtype=np.int64)
    np.add.at(per_group, (np.repeat(np.arange(resamples), g), draws.ravel()), 1)
    member = np.zeros((g, n), dtype=np.int64)
    for j, idx in enumerate(groups):
        member[j, idx] = 1
    return per_group @ member  # integer matmul: exact


def bootstrap_rhos(x, y, weights):
    """Spearman's ρ(x, y) of every resample (a row of whole-number weights), vectorised: spearman(x, y, row)
    bit for bit, NaN where a resample has no spread."""
    import numpy as np
    w = np.asarray(weights, dtype=np.int64)

    def ranks(v):
        codes, k = _codes(v)
        onehot = np.zeros((len(v), k), dtype=np.int64)
        onehot[np.arange(len(v)), codes] = 1
        count = w @ onehot  # (resamples, k): points per value
        below = np.cumsum(count, axis=1) - count
        return (2 * below + count - 1)[:, codes]  # (resamples, n), doubled mean ranks

    a, b = ranks(x), ranks(y)
    n = w.sum(axis=1)
    sa, sb = (w * a).sum(axis=1), (w * b).sum(axis=1)
    num = n * (w * a * b).sum(axis=1) - sa * sb
    dd = (n * (w * a * a).sum(axis=1) - sa * sa) * (n * (w * b * b).sum(axis=1) - sb * sb)
    out = np.full(len(w), np.nan)
    ok = dd > 0
    out[ok] = num[ok].astype(np.float64) / np.sqrt(dd[ok].astype(np.float64))
    return out


def bootstrap(xs, y, groups, resamples=RESAMPLES, seed=SEED):
    """Percentile intervals of Spearman's ρ(x, y) for every x of `xs` ({key: list}), one set of resamples for
    all (resample_weights). Returns {key: (low, high, resamples with a defined ρ)}."""
    import numpy as np
    if not groups:  # nothing to draw from
        return {k: (None, None, 0) for k in xs}
    w = resample_weights(groups, len(y), resamples, seed)
    out = {}
    for k, x in xs.items():
        r = bootstrap_rhos(x, y, w)
        r = r[~np.isnan(r)]
        out[k] = (*(None if v is None else float(v) for v in percentile_interval(r.tolist())), len(r))
    return out


def _finite(v):
    return None if v is None or math.isnan(v) else v


def _effect(pairs, i):
    return pairs[i][2]


def correlate(x, y, groups, decided=(), resamples=RESAMPLES, seed=SEED):
    """The figures of one metric against the effects: x the metric's differences and y the loss outcomes as the
    effects name them (A − B), `groups` the effects' indices by recipe pair. Each effect enters with its mirror
    (−x, −y), so no figure depends on which recipe an effect names first; a bootstrap draw brings an effect (or
    every effect of a recipe pair) with its mirror. decided: the indices of the effects whose interval excludes
    zero, whose signs are counted apart."""
    n = len(x)
    mx, my = x + [-v for v in x], y + [-v for v in y]
    over_effects = bootstrap({0: mx}, my, [[j, j + n] for j in range(n)], resamples, seed)[0]
    over_pairs = bootstrap({0: mx}, my, [g + [j + n for j in g] for g in groups], resamples, seed)[0]
    return {"n_effects": n, "n_pairs": len(groups), "delta": x,
            "spearman": _finite(spearman(mx, my)), "kendall_tau_b": _finite(kendall_tau_b(mx, my)),
            "interval_effects": dict(zip(("low", "high", "defined"), over_effects)),
            "interval_pairs": dict(zip(("low", "high", "defined"), over_pairs)),
            "favours_lower": sum(1 for u, v in zip(x, y) if u * v > 0),
            "favours_higher": sum(1 for u, v in zip(x, y) if u * v < 0),
            "decided_lower": sum(1 for j in decided if x[j] * y[j] > 0),
            "decided_higher": sum(1 for j in decided if x[j] * y[j] < 0), "decided": len(decided),
            "spearman_as_named": _finite(spearman(x, y))}


def study(runs, traces, resamples=RESAMPLES, seed=SEED):
    """The study as docs/results/proxy-study.json holds it. traces: [(label, analysis path)] (the path as
    trace_metrics reads it). Every trace is held against the effects it has both recipes of; then again without
    the effects of LEFT_OUT."""
    if resamples < 1:
        raise UsageError(f"--resamples {resamples}: not a positive count")
    stats = [(label, path, trace_metrics(path)) for label, path in traces]
    pairs = rp.proxy_pairs(runs, [(label, st) for label, _, st in stats])
    if not pairs:
        raise DataError("no paired effect with an interval (two seeds or more) that a trace has both recipes of")
    effects = [{"study": s, "gemm_mode": mode, "a": p.a, "b": p.b, "seeds": list(p.seeds),
                "diffs": list(p.diffs), "mean": p.stats.mean, "low": p.stats.low, "high": p.stats.high,
                "kind": p.stats.kind} for s, mode, p in pairs]
    out = {"definition": DEFINITION,
           "resamples": resamples, "seed": seed, "generator": "SplitMix64", "left_out_grid": LEFT_OUT,
           "metrics": [{"key": k, "name": name, "better": "higher" if b > 0 else "lower"}
                       for k, name, b, _ in METRICS],
           "effects": effects, "traces": []}
    subsets = (("all", lambda p: True), ("without_" + LEFT_OUT, lambda p: LEFT_OUT not in (p.a, p.b)))
    for label, path, st in stats:
        use = [i for i in range(len(pairs)) if _effect(pairs, i).a in st and _effect(pairs, i).b in st]
        tr = {"label": label, "analysis": path.split("+"), "effects": use,
              "recipes": {r: st[r] for r in sorted(st)}, "metrics": {k: {} for k, _, _, _ in METRICS}}
        for subset, take in subsets:
            keep = [i for i in use if take(_effect(pairs, i))]
            y = [-_effect(pairs, i).stats.mean for i in keep]  # a lower loss of A is a positive outcome
            decided = [j for j, i in enumerate(keep) if _effect(pairs, i).stats.kind in ("worse", "better")]
            by_pair = {}
            for j, i in enumerate(keep):
                by_pair.setdefault((_effect(pairs, i).a, _effect(pairs, i).b), []).append(j)
            for k, _, better, _ in METRICS:
                # + 0.0: an unchanged metric is +0, not −0, in the JSON
                x = [better * (st[_effect(pairs, i).a][k] - st[_effect(pairs, i).b][k]) + 0.0 for i in keep]
                tr["metrics"][k][subset] = correlate(x, y, list(by_pair.values()), decided, resamples,
                                                   seed)
        out["traces"].append(tr)
    return out


def _r(v):
    return "–" if v is None else f"{v:+.2f}"


def _cell(m):
    e, q = m["interval_effects"], m["interval_pairs"]
    return f"{_r(m['spearman'])} ({_r(e['low'])} to {_r(e['high'])}; {_r(q['low'])} to {_r(q['high'])})"


def best(result):
    """The best-supported metric: the highest lower end of the 95% interval over the effects, the lowest over the
    traces taken (ties: the earlier metric). Returns its key."""
    def low(m):
        lows = [t["metrics"][m["key"]]["all"]["interval_effects"]["low"] for t in result["traces"]]
        return -math.inf if None in lows else min(lows)
    return max(result["metrics"], key=low)["key"]


def table(result) -> str:
    """The study's table: one row per metric; per trace Spearman's ρ with its 95% intervals (over the effects;
    over the recipe pairs), the same without the left-out grid's effects, Kendall's τ_b, and for how many effects
    the metric favours the recipe that ended lower; then the counts and the best-supported metric in words."""
    trs = result["traces"]
    left = result["left_out_grid"]
    sub = "without_" + left
    head = ["metric", "better"]
    for t in trs:
        head += [f"ρ, {t['label']} (95%: effects; pairs)", f"ρ without {left}, {t['label']}", f"τ_b, {t['label']}",
                 f"favours lower / higher loss, {t['label']}"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for m in result["metrics"]:
        cells = [m["name"].replace("|", "\\|"), m["better"]]
        for t in trs:
            a, w = t["metrics"][m["key"]]["all"], t["metrics"][m["key"]][sub]
            cells += [_cell(a), _cell(w), _r(a["kendall_tau_b"]), f"{a['favours_lower']} / {a['favours_higher']}"]
        lines.append("| " + " | ".join(cells) + " |")
    def counts(t):
        m0 = t["metrics"][result["metrics"][0]["key"]]
        a, w = m0["all"], m0[sub]
        return (f"{a['n_effects']} effects of {a['n_pairs']} recipe pairs ({w['n_effects']} of {w['n_pairs']} "
                f"without {left})")
    n = {counts(t) for t in trs}
    said = n.pop() if len(n) == 1 else "; ".join(f"{counts(t)} on {t['label']}" for t in trs)
    key = best(result)
    name = next(m["name"] for m in result["metrics"] if m["key"] == key).replace("|", "\\|")
    rhos = "; ".join(f"{_cell(t['metrics'][key]['all'])} on {t['label']}" for t in trs)
    ivs = [t["metrics"][key]["all"]["interval_effects"] for t in trs]
    if all(iv["low"] is not None and iv["low"] > 0 for iv in ivs):
        verdict = "; its interval lies above zero on every trace."
    elif any(iv["low"] is not None and iv["low"] > 0 for iv in ivs):
        verdict = "; its interval lies above zero on some traces, not on every one."
    else:
        verdict = ("; its interval reaches zero or below on every trace: no metric is supported as a predictor of "
                   "the order of the paired effects.")
    decided = sorted({(m["decided"], m["decided_lower"], m["decided_higher"]) for t in trs
                      for m in (t["metrics"][k]["all"] for k in t["metrics"])})
    lines += ["", f"{said}; {result['resamples']:,} bootstrap resamples from seed {result['seed']}. " +
              " ".join(f"Of the {d} effects whose interval excludes zero, the metrics favour the recipe that ended "
                       f"lower in {lo} and the other in {hi}." for d, lo, hi in decided) +
              f" Best supported (the highest lower end of the interval over effects, on the worse trace): {name}, "
              f"ρ = {rhos}" + verdict]
    return "\n".join(lines)


def cmd_proxy_study(args):
    """Reads the runs and the analyses, checks the outputs, then computes the study and writes the JSON and the
    table of docs/results/training.md between its markers."""
    specs = rp.analysis_specs(args.analysis)
    if args.resamples < 1:
        raise UsageError(f"--resamples {args.resamples}: not a positive count")
    inputs = [args.training] + [p for _, path in specs for p in path.split("+")]
    outputs = [p for p in (args.json, args.doc) if p]
    check_outputs(outputs, inputs)  # the document is rewritten in place; no output is an input
    runs = rp._runs_of(args.training)
    doc = read_text(args.doc) if args.doc else None
    if doc is not None:
        rp.replace_block(doc, MARKER, "", args.doc)  # its markers are there, before the work
    result = study(runs, specs, args.resamples, args.bootstrap_seed)
    text = table(result)
    if args.doc:
        doc = rp.replace_block(doc, MARKER, text, args.doc)
    if args.json:
        text_json = json.dumps(result, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
        write_atomic(args.json, text_json.encode(), inputs)
    if args.doc:
        write_atomic(args.doc, doc.encode(), inputs)
    else:
        print(text)
    print(f"proxy-study: {len(result['traces'])} traces x {len(result['effects'])} effects x {len(METRICS)} "
          "metrics" + (" -> " + ", ".join(outputs) if outputs else ""))
    return result
