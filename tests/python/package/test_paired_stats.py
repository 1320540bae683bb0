"""fp4lab.paired (python/fp4lab/paired.py) and its use by `fp4lab-train report` (fp4lab.study): the t quantile
table against the closed-form Student t distribution evaluated with the decimal module, the statistics against
values worked out by hand, the edge cases, the rank correlation, and the committed paired results against the
committed runs."""
import json
import math
import os
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest

from fp4lab import paired, study as st

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


# ---------------------------------------------------------------------------------------------------------
# The t table, against an independent evaluation of the distribution
# ---------------------------------------------------------------------------------------------------------

def _atan_series(x, eps):
    """arctan by its Taylor series, for |x| small."""
    total, term, x2, k = x, x, x * x, 1
    while True:
        term = -term * x2
        k += 2
        if abs(term / k) < eps:
            return total
        total += term / k


def _atan(x, pi, eps):
    if x > 1:
        return pi / 2 - _atan(1 / x, pi, eps)
    halvings = 0
    while x > Decimal("0.05"):  # arctan x = 2 arctan(x / (1 + √(1 + x²)))
        x = x / (1 + (1 + x * x).sqrt())
        halvings += 1
    return _atan_series(x, eps) * (2 ** halvings)


def two_sided_probability(t, nu):
    """P(|T| < t) for Student's t with nu degrees of freedom, by the finite series of Abramowitz & Stegun
    26.7.3 (nu odd) and 26.7.4 (nu even), in 50-digit decimal arithmetic; θ = arctan(t / √nu)."""
    with localcontext() as ctx:
        ctx.prec = 50
        eps = Decimal(10) ** -48
        pi = 16 * _atan_series(Decimal(1) / 5, eps) - 4 * _atan_series(Decimal(1) / 239, eps)  # Machin
        t, n = Decimal(t), Decimal(nu)
        r = n + t * t
        sin, cos2 = t / r.sqrt(), n / r
        if nu % 2 == 0:  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + … + cos^(nu−2)θ term)
            term = total = Decimal(1)
            for k in range(1, nu // 2):
                term = term * cos2 * (2 * k - 1) / (2 * k)
                total += term
            return +(sin * total)
        theta = _atan(t / n.sqrt(), pi, eps)
        if nu == 1:
            return +(2 * theta / pi)
        term = total = cos2.sqrt()  # (2/π)(θ + sin θ (cos θ + 2/3 cos³θ + … + cos^(nu−2)θ term))
        for k in range(1, (nu - 1) // 2):
            term = term * cos2 * (2 * k) / (2 * k + 1)
            total += term
        return +(2 / pi * (theta + sin * total))


def test_the_reference_distribution_itself():
    # Known points: for one degree of freedom (Cauchy) P(|T| < 1) = 1/2; for two, P(|T| < t) = t / √(2 + t²).
    assert abs(two_sided_probability(1.0, 1) - Decimal("0.5")) < Decimal("1e-45")
    with localcontext() as ctx:
        ctx.prec = 50
        assert abs(two_sided_probability(3.0, 2) - Decimal(3) / Decimal(11).sqrt()) < Decimal("1e-45")
    assert two_sided_probability(0.0, 7) == 0
    # Increasing in t, below 1, and the more degrees of freedom the closer to the normal's 0.9500042 at 1.96.
    for nu in (3, 8, 29):
        assert two_sided_probability(1.9, nu) < two_sided_probability(2.0, nu) < 1
    assert two_sided_probability(1.96, 5) < two_sided_probability(1.96, 30) < Decimal("0.9500042")


def test_t_table_is_the_correctly_rounded_0975_quantile():
    assert sorted(paired.T975) == list(range(1, 31))
    for df, t in paired.T975.items():
        assert paired.t975(df) == t
        # The quantile lies within half an ulp of the tabulated double: it is the correctly rounded value.
        half_ulp = Decimal(math.ulp(t)) / 2
        assert two_sided_probability(Decimal(t) - half_ulp, df) < Decimal("0.95"), df
        assert two_sided_probability(Decimal(t) + half_ulp, df) > Decimal("0.95"), df


def test_t_table_matches_the_published_three_decimal_table():
    # The familiar table of two-sided 95% critical values (any statistics textbook), df 1..30.
    published = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
                 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
                 2.045, 2.042]
    assert [round(paired.T975[df], 3) for df in range(1, 31)] == published
    for bad in (0, 31, -1):
        with pytest.raises(ValueError, match="degrees of freedom"):
            paired.t975(bad)


# ---------------------------------------------------------------------------------------------------------
# The statistics
# ---------------------------------------------------------------------------------------------------------

def test_three_seed_example_against_hand_computed_values():
    # docs/results/training.md's 6000-step ufp4 − e2m1-ref validation differences, as printed: +0.12, +0.76, +0.58.
    # By hand: mean = 1.46 / 3 = 0.486667; deviations −0.366667, +0.273333, +0.093333, squares summing to
    # 0.217867; SD = √(0.217867 / 2) = 0.330051; SE = SD / √3 = 0.190555; t(0.975, 2 df) = 4.302653;
    # t · SE = 0.819891; interval −0.333224 to +1.306558. It holds zero: no difference detectable.
    s = paired.paired_stats([0.12, 0.76, 0.58])
    assert s.n == 3 and (s.above, s.below, s.zero) == (3, 0, 0)
    assert s.mean == pytest.approx(0.4866666666666667, abs=1e-12)
    assert s.sd == pytest.approx(0.3300505011863084, abs=1e-12)
    assert s.se == pytest.approx(0.1905547457060860, abs=1e-12)
    assert s.t == paired.T975[2]
    assert s.half == pytest.approx(0.8198908967790060, abs=1e-12)
    assert s.low == pytest.approx(-0.3332242301123393, abs=1e-12)
    assert s.high == pytest.approx(1.3065575634456726, abs=1e-12)
    assert s.kind == "undetected"
    # The same figures from exact rational arithmetic (the inputs are doubles near 0.12 …, so not to the bit).
    d = [Fraction(12, 100), Fraction(76, 100), Fraction(58, 100)]
    mean = sum(d) / 3
    var = sum((x - mean) ** 2 for x in d) / 2
    assert abs(s.mean - float(mean)) < 1e-15 and abs(s.se * s.se - float(var / 3)) < 1e-15


def test_verdicts_read_from_the_interval():
    def result(diffs):
        return paired.PairResult("ufp4", "e2m1-ref", "val", tuple(range(len(diffs))), tuple(diffs),
                                 paired.paired_stats(diffs))

    # By hand: mean −1.05; deviations ±0.05, ±0.15: Σ = 0.05; SE = √(0.05 / 3 / 4) = 0.0645497;
    # t(3 df) = 3.182446: ± 0.205426, interval −1.2554 to −0.8446, below zero.
    r = result([-1.0, -1.2, -0.9, -1.1])
    assert r.stats.half == pytest.approx(0.2054264, abs=1e-6) and r.stats.kind == "better"
    assert r.verdict() == "ufp4 better than e2m1-ref by 1.05 ± 0.21 points"
    r = result([1.0, 1.2, 0.9, 1.1])
    assert r.stats.kind == "worse" and r.verdict() == "ufp4 worse than e2m1-ref by 1.05 ± 0.21 points"
    assert (r.stats.above, r.stats.below) == (4, 0)
    r = result([0.12, 0.76, 0.58])
    assert r.verdict() == "no difference detectable at ±0.82 points"
    # n = 2 uses the widest quantile of the table: t(1 df) = 12.706.
    r = result([1.0, 3.0])
    assert r.stats.half == pytest.approx(12.706204736174705, abs=1e-12)
    assert r.verdict() == "no difference detectable at ±12.71 points"


def test_edge_cases():
    s = paired.paired_stats([])
    assert (s.n, s.mean, s.half, s.kind) == (0, None, None, "none")
    none = paired.PairResult("ufp4", "e2m1-ref", "val", (), (), s)
    assert none.verdict() == "ufp4 vs e2m1-ref: no seed with a run of both"
    s = paired.paired_stats([10.94])
    assert (s.n, s.mean, s.sd, s.se, s.half, s.low, s.high, s.kind) == (1, 10.94, None, None, None, None, None,
                                                                         "one")
    one = paired.PairResult("ufp4", "e2m1-ref", "val", (0,), (10.94,), s)
    assert one.verdict() == "one seed (+10.94 points): no interval from one seed, nothing decided"
    # All differences equal: no spread, so an interval of no width, and the verdict says so.
    s = paired.paired_stats([0.5, 0.5, 0.5])
    assert s.sd == 0 and s.se == 0 and s.half == 0 and s.low == s.high == 0.5 and s.kind == "worse"
    eq = paired.PairResult("ufp4", "e2m1-ref", "val", (0, 1, 2), (0.5,) * 3, s)
    assert eq.verdict() == ("ufp4 worse than e2m1-ref by 0.50 ± 0.00 points (all 3 differences equal: the "
                            "interval has no width)")
    s = paired.paired_stats([0.0, 0.0])
    assert s.kind == "same" and s.zero == 2 and s.half == 0
    assert paired.PairResult("a", "b", "val", (0, 1), (0.0, 0.0), s).verdict() == ("no difference: identical on "
                                                                                 "all 2 seeds")
    with pytest.raises(ValueError, match="finite"):
        paired.paired_stats([1.0, float("nan")])
    with pytest.raises(ValueError, match="degrees of freedom"):
        paired.paired_stats([0.1] * 32)  # beyond the table
    assert paired.paired_stats([0.1 * k for k in range(31)]).t == paired.T975[30]


def losses_of(table):
    """{(recipe, seed): {"val": v, "train": v}} from {recipe: {seed: loss}} (the same loss for both measures)."""
    return {(r, s): {"val": v, "train": v} for r, per_seed in table.items() for s, v in per_seed.items()}


def test_compare_pairs_only_seeds_with_both_runs_and_a_reference_and_says_which_not():
    losses = losses_of({"ufp4": {0: 1.02, 1: 1.10, 2: 1.05, 4: 1.0},
                        "e2m1-ref": {0: 1.00, 2: 1.04, 3: 1.2, 4: 1.0},
                        "bf16": {0: 1.25, 1: 1.2, 2: 1.30, 3: 1.1}})
    r = paired.compare(losses, "ufp4", "e2m1-ref", "val")
    assert r.seeds == (0, 2) and r.only_a == (1,) and r.only_b == (3,) and r.no_reference == (4,)
    # d = 100 · (L_A − L_B) / L_bf16 of the same seed.
    assert r.diffs == (100 * (1.02 - 1.00) / 1.25, 100 * (1.05 - 1.04) / 1.30)
    assert r.diffs[0] == pytest.approx(1.6) and r.diffs[1] == pytest.approx(0.769230769)
    assert r.stats.n == 2
    assert r.unpaired() == ("seed 1 of ufp4 has no e2m1-ref run; seed 3 of e2m1-ref has no ufp4 run; seed 4 has "
                            "no bf16 run")
    assert r.verdict().endswith("(seed 1 of ufp4 has no e2m1-ref run; seed 3 of e2m1-ref has no ufp4 run; seed 4 "
                                "has no bf16 run: not paired)")
    assert "not paired" not in r.verdict(notes=False)
    # Against BF16 the difference is the BF16-relative loss error itself.
    b = paired.compare(losses, "ufp4", "bf16", "val")
    assert b.seeds == (0, 1, 2) and b.only_b == (3,) and b.only_a == (4,)
    assert b.diffs == tuple(100 * (losses[("ufp4", s)]["val"] - losses[("bf16", s)]["val"]) /
                            losses[("bf16", s)]["val"] for s in (0, 1, 2))
    # The same bits whatever order the runs come in: the seeds are summed in ascending order.
    items = list(losses.items())
    random.Random(1).shuffle(items)
    assert paired.compare(dict(items), "ufp4", "e2m1-ref", "val") == r
    # No common seed.
    n = paired.compare(losses_of({"ufp4": {0: 1.0}, "e2m1-ref": {1: 1.0}, "bf16": {0: 1.0, 1: 1.0}}), "ufp4",
                       "e2m1-ref", "val")
    assert n.stats.n == 0 and n.only_a == (0,) and n.only_b == (1,)
    assert n.verdict().startswith("ufp4 vs e2m1-ref: no seed with a run of both (seed 0 of ufp4 has")


def test_pairs_that_matter():
    allr = ["bf16", "nvfp4", "mxfp4", "e2m1-ref", "ufp4", "ufp4-rht-none", "ufp4-rht-wgrad", "ufp4-rht-fwd-wgrad",
            "ufp4-sr-none", "ufp4-sr-grads", "e2m1-rht-all"]
    got = paired.pairs_for(allr)
    assert got[:3] == [("ufp4", "e2m1-ref"), ("ufp4", "nvfp4"), ("ufp4", "mxfp4")]
    assert got[3:9] == [("ufp4-rht-none", "ufp4"), ("ufp4-rht-wgrad", "ufp4"), ("ufp4-rht-fwd-wgrad", "ufp4"),
                        ("ufp4-sr-none", "ufp4"), ("ufp4-sr-grads", "ufp4"), ("e2m1-rht-all", "e2m1-ref")]
    assert got[9:] == [(r, "bf16") for r in allr[1:]]
    # Only pairs whose two recipes are present; no BF16 pairs without BF16.
    assert paired.pairs_for(["ufp4", "e2m1-rht-all", "ufp4-sr-none"]) == [("ufp4-sr-none", "ufp4")]
    assert paired.pairs_for(["bf16", "ufp4"]) == [("ufp4", "bf16")]


def test_compare_all_keeps_studies_apart():
    losses = {}
    for corpus, shift in (("linux-doc", 0.0), ("other", 0.5)):
        for seed in range(3):
            losses[("bf16", seed, corpus, "small")] = {"val": 2.0 + shift, "train": 2.0 + shift}
            losses[("ufp4", seed, corpus, "small")] = {"val": 2.02 + shift + 0.001 * seed, "train": 2.0 + shift}
            losses[("e2m1-ref", seed, corpus, "small")] = {"val": 2.0 + shift, "train": 2.0 + shift}
    losses[("ufp4", 0, "linux-doc", "large")] = {"val": 1.0, "train": 1.0}
    out = paired.compare_all(losses)
    assert sorted(out) == [("linux-doc", "large"), ("linux-doc", "small"), ("other", "small")]
    assert out[("linux-doc", "large")] == []  # nothing to compare a lone run with
    small = out[("linux-doc", "small")]
    assert [(p.a, p.b, p.measure) for p in small] == [("ufp4", "e2m1-ref", "val"), ("ufp4", "e2m1-ref", "train"),
                                                      ("ufp4", "bf16", "val"), ("ufp4", "bf16", "train"),
                                                      ("e2m1-ref", "bf16", "val"), ("e2m1-ref", "bf16", "train")]
    assert small[0].stats.kind == "worse" and small[0].seeds == (0, 1, 2)
    assert small[1].stats.kind == "same"
    assert out[("other", "small")][0].diffs[0] == pytest.approx(100 * 0.02 / 2.5)


# ---------------------------------------------------------------------------------------------------------
# The report, on the committed runs and on synthetic ones
# ---------------------------------------------------------------------------------------------------------

def committed_runs():
    with open(os.path.join(ROOT, "docs", "results", "training.json")) as f:
        return json.load(f)["runs"]


def study(runs, model, length):
    ms = st.metrics(runs)
    (mode, results), = st.paired(ms, model, length)
    return ms, mode, {(p.a, p.b, p.measure): p for p in results}


def test_committed_6000_step_runs():
    ms, mode, res = study(committed_runs(), "small", 6000)
    assert mode == "exact"
    v = res[("ufp4", "e2m1-ref", "val")]
    # Seeds 0-2: the per-seed differences docs/results/training.md printed before the paired statistics existed; seeds 3 and
    # 4 came later (their runs' validation losses, rounded: 1.0757, 1.0357, BF16 1.0599: 100 * (1.0757 - 1.0357) /
    # 1.0599 = 3.77, 3.78 from the unrounded losses; 1.1362, 1.1220, BF16 1.0344: 100 * 0.0142 / 1.0344 = 1.37, 1.38
    # unrounded).
    assert v.seeds == (0, 1, 2, 3, 4) and [round(d, 2) for d in v.diffs] == [0.12, 0.76, 0.58, 3.78, 1.38]
    # Each is the difference of the two recipes' BF16-relative errors of that seed.
    rel = {(m["recipe"], m["seed"]): m["val_rel"] for m in ms if m["length"] == 6000 and "val_rel" in m}
    for s, d in zip(v.seeds, v.diffs):
        assert d == pytest.approx(rel[("ufp4", s)] - rel[("e2m1-ref", s)], abs=1e-12)
    # By hand from the printed differences: mean 6.62 / 5 = 1.324, squared deviations summing to 8.356, SD 1.445,
    # SE 0.646, t(0.975, 4) = 2.776, half-width 1.79.
    assert abs(v.stats.mean - 1.324) < 0.005 and abs(v.stats.half - 1.794) < 0.02
    assert v.stats.kind == "undetected" and (v.stats.above, v.stats.below) == (5, 0)
    t = res[("ufp4", "e2m1-ref", "train")]
    assert [round(d, 2) for d in t.diffs] == [0.23, 0.66, 0.90, 4.62, 0.98] and t.stats.kind == "undetected"
    # Seed 4 ends e2m1-ref 8.46 points above BF16, where seeds 0-3 ended below: no longer detected either way.
    e = res[("e2m1-ref", "bf16", "val")]
    assert e.stats.kind == "undetected" and (e.stats.above, e.stats.below) == (1, 4)
    # nvfp4: seeds 0-2 had ended below BF16 by more than the interval's half-width; seeds 3 and 4 (made, like their
    # BF16 runs, with deterministic algorithms) end -2.39 and +7.68, and over five seeds nothing is detected.
    nb = res[("nvfp4", "bf16", "val")]
    assert nb.seeds == (0, 1, 2, 3, 4) and [round(d, 2) for d in nb.diffs] == [-4.10, -6.45, -7.93, -2.39, 7.68]
    assert nb.stats.kind == "undetected" and (nb.stats.above, nb.stats.below) == (1, 4)
    # ufp4 - nvfp4: above zero on all five seeds. By hand from the printed differences +0.42, +4.32, +7.48, +3.88,
    # +2.16: mean 18.26 / 5 = 3.652, squared deviations summing to 27.82, SD 2.637, SE 1.179, half-width 3.27; the
    # interval lies above zero, so ufp4 is detected worse.
    nv = res[("ufp4", "nvfp4", "val")]
    assert nv.seeds == (0, 1, 2, 3, 4) and [round(d, 2) for d in nv.diffs] == [0.42, 4.32, 7.48, 3.88, 2.16]
    assert abs(nv.stats.mean - 3.652) < 0.005 and abs(nv.stats.half - 3.274) < 0.02
    assert nv.stats.kind == "worse" and (nv.stats.above, nv.stats.below) == (5, 0)
    assert res[("ufp4", "nvfp4", "train")].stats.kind == "undetected"  # +4.27, interval -0.03 to +8.57
    mx = res[("mxfp4", "bf16", "val")]  # five mxfp4 runs, each far above BF16
    assert mx.seeds == (0, 1, 2, 3, 4) and [round(d, 2) for d in mx.diffs] == [28.90, 23.20, 22.49, 35.30, 33.65]
    # By hand: mean 143.54 / 5 = 28.708; squared deviations 0.04, 30.34, 38.66, 43.45, 24.42, summing to 136.92,
    # SD 5.851, SE 2.616, half-width 2.776 * 2.616 = 7.26; interval +21.45 to +35.97.
    assert abs(mx.stats.mean - 28.708) < 0.005 and abs(mx.stats.half - 7.26) < 0.02
    assert mx.stats.kind == "worse" and mx.stats.low > 21


def test_committed_second_corpus_runs():
    # The python-doc study is its own: its FP4 runs against its own BF16 runs, apart from linux-doc's.
    ms = st.metrics(committed_runs())
    (mode, results), = st.paired(ms, "small", 2000, corpus="python-doc")
    assert mode == "exact"
    res = {(p.a, p.b, p.measure): p for p in results}
    v = res[("ufp4", "e2m1-ref", "val")]
    # From the runs' validation losses (rounded: ufp4 1.0197, 1.0257, 1.0322; e2m1-ref 1.0366, 1.0140, 1.0154;
    # BF16 1.0236, 1.0112, 1.0090): 100 * (1.0197 - 1.0366) / 1.0236 = -1.65 from the rounded losses, -1.66 from
    # the unrounded ones; 100 * (1.0257 - 1.0140) / 1.0112 = 1.16 (1.15); 100 * (1.0322 - 1.0154) / 1.0090 = 1.66.
    # Seeds 3 and 4 (ufp4 1.0431, 1.0374; e2m1-ref 1.0016, 1.0099; BF16 1.0254, 1.0185): 100 * 0.0415 / 1.0254 =
    # 4.05 and 100 * 0.0275 / 1.0185 = 2.70.
    assert v.seeds == (0, 1, 2, 3, 4) and [round(d, 2) for d in v.diffs] == [-1.66, 1.15, 1.66, 4.05, 2.70]
    assert v.stats.kind == "undetected" and (v.stats.above, v.stats.below) == (4, 1)
    # ufp4 against BF16 on this corpus: +1.38 on average, above zero on four of five seeds, an interval of
    # +0.09 to +2.68 (by hand: mean 6.92 / 5 = 1.384, SD 1.040, SE 0.465, half-width 1.29): detected worse.
    ub = res[("ufp4", "bf16", "val")]
    assert [round(d, 2) for d in ub.diffs] == [-0.39, 1.43, 2.30, 1.72, 1.86]
    assert abs(ub.stats.mean - 1.384) < 0.005 and abs(ub.stats.half - 1.29) < 0.02 and ub.stats.kind == "worse"
    assert res[("e2m1-ref", "bf16", "val")].stats.kind == "undetected"
    # nvfp4 (five seeds) is not apart from BF16; mxfp4 (three) is far above it here too.
    nb = res[("nvfp4", "bf16", "val")]
    assert nb.seeds == (0, 1, 2, 3, 4) and [round(d, 2) for d in nb.diffs] == [0.79, -0.71, 0.76, -2.47, -1.28]
    assert nb.stats.kind == "undetected"
    assert [round(d, 2) for d in res[("ufp4", "nvfp4", "val")].diffs] == [-1.18, 2.14, 1.54, 4.20, 3.14]
    # mxfp4 (five seeds): 18.70, 18.84, 21.57, 14.50, 18.90, by hand mean 92.51 / 5 = 18.50, SD 2.54, SE 1.13,
    # half-width 2.776 * 1.13 = 3.15: detected worse.
    mb = res[("mxfp4", "bf16", "val")]
    assert [round(d, 2) for d in mb.diffs] == [18.70, 18.84, 21.57, 14.50, 18.90]
    assert abs(mb.stats.mean - 18.50) < 0.005 and abs(mb.stats.half - 3.15) < 0.01 and mb.stats.kind == "worse"
    assert st.paired(ms, "small", 2000) == []  # no linux-doc runs of that length


def test_committed_ablation_with_seeds():
    # ufp4 without RHT against ufp4, small model, 6000 steps, seeds 0-2 (the ablation's three runs): from the
    # validation losses (ufp4-rht-none 1.1212, 1.08383, 1.0513; ufp4 1.0519, 1.08381, 1.1123; BF16 1.0921, 1.1074,
    # 1.1174): 100 * 0.0693 / 1.0921 = 6.35, 100 * 0.00002 / 1.1074 = 0.00, 100 * -0.0610 / 1.1174 = -5.46; mean
    # 0.30, SD 5.91, SE 3.41, half-width 4.303 * 3.41 = 14.68: nothing detectable. Seeds 3 and 4 of ufp4 have no
    # ablation run and are left out, as the report says.
    (mode, results), = st.paired(st.metrics(committed_runs()), "small", 6000)
    v = {(p.a, p.b, p.measure): p for p in results}[("ufp4-rht-none", "ufp4", "val")]
    assert v.seeds == (0, 1, 2) and [round(d, 2) for d in v.diffs] == [6.35, 0.00, -5.46]
    assert abs(v.stats.mean - 0.30) < 0.005 and abs(v.stats.half - 14.68) < 0.02 and v.stats.kind == "undetected"
    assert (v.stats.above, v.stats.below) == (2, 1)


def test_committed_runs_pooled_over_the_two_corpora():
    # Each corpus's longest small-model study that has ufp4 and e2m1-ref: linux-doc 6000 steps, python-doc 2000;
    # their per-seed differences as the studies give them, then one interval over all ten.
    ms = st.metrics(committed_runs())
    parts, res = st.report.pooled(ms)
    assert parts == [("linux-doc", 6000, (0, 1, 2, 3, 4)), ("python-doc", 2000, (0, 1, 2, 3, 4))]
    per = {c: {p.measure: p for _, r in st.paired(ms, "small", n, c) for p in r if (p.a, p.b) == ("ufp4", "e2m1-ref")}
           for c, n, _ in parts}
    for measure in ("val", "train"):
        diffs, stats = res[measure]
        assert diffs == per["linux-doc"][measure].diffs + per["python-doc"][measure].diffs
        assert stats == paired.paired_stats(diffs)
    # By hand from the printed differences +0.12, +0.76, +0.58, +3.78, +1.38, -1.66, +1.15, +1.66, +4.05, +2.70:
    # mean 14.52 / 10 = 1.452, SD 1.718, SE 0.543, t(0.975, 9) = 2.262, half-width 1.23: +0.22 to +2.68, above 0.
    v = res["val"][1]
    assert abs(v.mean - 1.452) < 0.005 and abs(v.half - 1.229) < 0.01 and v.kind == "worse"
    assert (v.above, v.below) == (9, 1) and res["train"][1].kind == "worse"
    assert "**small, pooled over corpora (linux-doc 6000 steps" in st.status(committed_runs())
    # One corpus: nothing to pool, no line.
    one = [r for r in committed_runs() if st.report.corpus_of(r) == "linux-doc"]
    assert st.report.pooled(st.metrics(one)) is None and "pooled" not in st.status(one)


def test_committed_one_seed_study_gets_no_interval():
    _, mode, res = study(committed_runs(), "large", 2000)
    assert mode == "fast"
    v = res[("ufp4", "e2m1-ref", "val")]
    assert v.stats.n == 1 and v.stats.half is None and v.stats.kind == "one"
    assert round(v.diffs[0], 2) == 10.94
    nv = res[("nvfp4", "bf16", "val")]
    assert nv.seeds == (0,) and nv.only_b == (1,)  # BF16 has a second seed, nvfp4 not


def test_committed_paired_json_is_what_the_report_makes():
    with open(os.path.join(ROOT, "docs", "results", "training-paired.json")) as f:
        committed = json.load(f)
    assert committed == json.loads(json.dumps(st.paired_json(committed_runs())))


def synthetic_run(recipe, seed, val, mode="exact", steps=10):
    return {"name": f"test-{recipe}-s{seed}", "model": "test", "params": 1, "block_params": 1, "recipe": recipe,
            "gemm_mode": "bf16" if recipe == "bf16" else mode, "seed": seed, "steps": list(range(1, steps + 1)),
            "train_loss": [val + 0.1] * steps, "val_steps": [steps], "val_loss": [val], "tokens_per_s": 1.0,
            "concurrent_runs": 1, "diverged": None,
            "config": {"d": 64, "layers": 2, "seq": 64, "batch": 4, "steps": steps}}


def test_report_tables_and_status_from_paired_statistics():
    base = {0: 2.00, 1: 2.10, 2: 1.95, 3: 2.05}
    runs = [synthetic_run("bf16", s, v) for s, v in base.items()]
    runs += [synthetic_run("e2m1-ref", s, v) for s, v in base.items()]
    # ufp4 ends 2.0 or 2.1 points of BF16 higher on every seed: a clear, consistent difference, yet smaller than
    # the BF16 seed spread of (2.10 − 1.95) / 2.025 = 7.41%.
    runs += [synthetic_run("ufp4", s, v * (1.02 + 0.001 * (s % 2))) for s, v in base.items()]
    runs.append(synthetic_run("nvfp4", 0, 2.0))
    status = st.status(runs)
    assert status.startswith("- **test, 10 steps: ufp4 vs e2m1-ref over 4 seeds: ufp4 trained worse than e2m1-ref**")
    assert "BF16 seed-to-seed spread, for context: 7.41" in status
    tables = st.tables(runs)
    row = next(x for x in tables.split("\n") if x.startswith("| `ufp4` − `e2m1-ref` | val |"))
    assert "| 0, 1, 2, 3 | +2.00, +2.10, +2.00, +2.10 | +2.05 |" in row
    assert row.endswith("| 4 / 0 | ufp4 worse than e2m1-ref by 2.05 ± 0.09 points |")
    row = next(x for x in tables.split("\n") if x.startswith("| `ufp4` − `nvfp4` | val |"))
    assert "| 0 (not paired: seeds 1, 2, 3 of ufp4 have no nvfp4 run) |" in row and "one seed" in row
    # One seed of each: not decided, and the status says there is no interval.
    one = [synthetic_run("bf16", 0, 2.0), synthetic_run("ufp4", 0, 2.2), synthetic_run("e2m1-ref", 0, 2.0)]
    assert "one seed, not decided" in st.status(one) and "one seed gives no interval" in st.status(one)


def test_report_keeps_gemm_modes_apart():
    # exact and fast runs of one study are compared within their mode, each against the same BF16 runs.
    runs = [synthetic_run("bf16", s, 2.0 + 0.1 * s) for s in range(2)]
    runs += [synthetic_run(r, s, 2.0 + 0.1 * s, "exact") for r in ("ufp4", "e2m1-ref") for s in range(2)]
    runs += [synthetic_run("ufp4", s, 2.2 + 0.1 * s, "fast") for s in range(2)]
    runs += [synthetic_run("e2m1-ref", s, 2.0 + 0.1 * s, "fast") for s in range(2)]
    for r in runs:
        r["name"] += "-" + r["gemm_mode"]
    ms = st.metrics(runs)
    got = dict(st.paired(ms, "test", 10))
    assert sorted(got) == ["exact", "fast"]
    assert got["exact"][0].stats.kind == "same" and got["fast"][0].stats.kind == "worse"
    status = st.status(runs).split("\n")
    assert len(status) == 2
    assert status[0].startswith("- **test, 10 steps, exact GEMMs: ufp4 vs e2m1-ref over 2 seeds: no difference: "
                                "identical runs**")
    assert status[1].startswith("- **test, 10 steps, fast GEMMs: ufp4 vs e2m1-ref over 2 seeds: ufp4 trained worse")
    assert "fast GEMMs. Paired differences" in st.tables(runs)


def test_ranks_average_ties_and_spearman_follows_them():
    assert paired.ranks([3.0, 1.0, 2.0, 1.0]) == [3.0, 0.5, 2.0, 0.5]
    # Spearman's rho of the proxy: the Pearson correlation of the ranks; a reversed order gives -1 exactly.
    assert st.report.spearman([1.0, 2.0, 3.0, 4.0], [8.0, 6.0, 4.0, 2.0]) == -1.0
    # rho with one swapped pair of four: 1 - 6 * 2 / (4 * 15) = 0.8, up to the last bit of the division.
    assert st.report.spearman([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8, rel=1e-15)
    assert math.isnan(paired.pearson([1.0, 1.0], [2.0, 3.0]))  # no spread: no correlation


def test_proxy_against_the_committed_paired_effects():
    # The pairs with an interval in the committed runs, and the trace statistics' differences A - B, each mean
    # recomputed here from the analysis JSON's GEMM rows.
    pairs = st.report.proxy_pairs(committed_runs())
    assert [(s, p.a, p.b, p.stats.n) for s, _, p in pairs] == [
        ("small, 1500 steps, linux-doc", "ufp4", "e2m1-ref", 3),
        ("small, 3000 steps, linux-doc", "ufp4", "e2m1-ref", 2),
        ("small, 6000 steps, linux-doc", "ufp4", "e2m1-ref", 5), ("small, 6000 steps, linux-doc", "ufp4", "nvfp4", 5),
        ("small, 6000 steps, linux-doc", "ufp4", "mxfp4", 5),
        ("small, 6000 steps, linux-doc", "ufp4-rht-none", "ufp4", 3),
        ("small, 6000 steps, linux-doc", "ufp4-rht-wgrad", "ufp4", 3),
        ("small, 6000 steps, linux-doc", "ufp4-rht-fwd-wgrad", "ufp4", 3),
        ("small, 6000 steps, linux-doc", "ufp4-sr-none", "ufp4", 3),
        ("small, 6000 steps, linux-doc", "ufp4-sr-grads", "ufp4", 3),
        ("small, 6000 steps, linux-doc", "e2m1-rht-all", "e2m1-ref", 3),
        ("large, 4000 steps, linux-doc", "ufp4", "e2m1-ref", 3), ("large, 4000 steps, linux-doc", "ufp4", "nvfp4", 3),
        ("small, 2000 steps, python-doc", "ufp4", "e2m1-ref", 5),
        ("small, 2000 steps, python-doc", "ufp4", "nvfp4", 5), ("small, 2000 steps, python-doc", "ufp4", "mxfp4", 5)]
    path = os.path.join(ROOT, "docs", "results", "analysis-doc-lm.json")
    stats = st.report.proxy_stats(path)
    rows = json.load(open(path))["gemms"]

    def mean(rec, field, pass_=None):
        xs = [r[field] for r in rows if r.get("recipe") == rec and (pass_ is None or r["pass"] == pass_)]
        return sum(xs) / len(xs)

    for rec in ("ufp4", "e2m1-ref", "nvfp4", "mxfp4"):
        assert stats[rec] == {"sqnr": mean(rec, "sqnr_db"), "sqnr_dw": mean(rec, "sqnr_db", "bwd_dw"),
                              "eta": mean(rec, "eta")}
    table = st.report.proxy_paired_table([("doc-lm", stats)], pairs)
    rows6000 = [r for r in table.splitlines() if r.startswith("| small, 6000 steps, linux-doc (exact) |")]
    heads = ("5 | +1.32 (-0.47 to +3.12)", "5 | +3.65 (+0.38 to +6.93)", "5 | -27.70 (-34.04 to -21.35)")
    ends = ("not decided (the interval holds 0)", "disagrees", "agrees")
    for row, b, head, end in zip(rows6000, ("e2m1-ref", "nvfp4", "mxfp4"), heads, ends):
        d = stats["ufp4"]["sqnr"] - stats[b]["sqnr"]
        assert row.startswith(f"| small, 6000 steps, linux-doc (exact) | `ufp4` − `{b}` | {head} | ")
        assert f"{d:+.2f} / " in row and d > 0
        assert row.endswith(f"| {end}; SQNR favours ufp4 on every trace |")


def test_proxy_joins_a_traces_ablation_analysis_and_leaves_out_what_no_trace_has():
    # One trace's presets and ablations in two analysis files joined by '+'; a trace analysed under the presets
    # only has no figures for the ablation pairs: a dash in the table, and a pair that no trace has is left out.
    res = os.path.join(ROOT, "docs", "results")
    presets, ablations = (os.path.join(res, f) for f in ("analysis-doc-lm.json", "analysis-doc-lm-ablations.json"))
    both = st.report.proxy_stats(presets + "+" + ablations)
    alone = st.report.proxy_stats(presets)
    assert set(alone) == set(st.report.PRESETS)
    assert set(both) == set(st.report.PRESETS) | set(st.ABLATIONS)
    assert all(both[r] == alone[r] for r in st.report.PRESETS)
    rows = json.load(open(ablations))["gemms"]
    for rec in ("ufp4-sr-none", "e2m1-rht-all"):
        dw = [r["sqnr_db"] for r in rows if r.get("recipe") == rec and r["pass"] == "bwd_dw"]
        assert dw and both[rec]["sqnr_dw"] == sum(dw) / len(dw)
    with pytest.raises(ValueError, match="no GEMM rows for recipe"):
        st.report.proxy_stats(ablations)  # the presets are required
    runs = committed_runs()
    pairs = st.report.proxy_pairs(runs, [("presets only", alone)])
    assert pairs and all(p.a in st.report.PRESETS and p.b in st.report.PRESETS for _, _, p in pairs)
    every = st.report.proxy_pairs(runs, [("presets only", alone), ("with ablations", both)])
    abl = [p for _, _, p in every if p.a == "e2m1-rht-all"]
    assert len(abl) == 1 and abl[0].b == "e2m1-ref"
    table = st.report.proxy_paired_table([("presets only", alone), ("with ablations", both)], every)
    row = next(r for r in table.splitlines() if "`e2m1-rht-all` − `e2m1-ref`" in r)
    d = both["e2m1-rht-all"]["sqnr"] - both["e2m1-ref"]["sqnr"]
    assert f"| – | {d:+.2f} / " in row
    assert row.endswith("SQNR favours " + ("e2m1-rht-all" if d > 0 else "e2m1-ref") + " on every trace |")


def test_a_second_corpus_is_a_study_of_its_own(tmp_path):
    # The committed small 1500-step runs, and the same runs again as if made on the second corpus with every loss
    # 0.5 higher and ufp4's 0.05 higher still: the report keeps the corpora apart (each FP4 run against the BF16 run
    # of its own corpus and seed) and names the corpus once there are two.
    first = [r for r in committed_runs() if r["model"] == "small" and r["config"]["steps"] == 1500]
    second = []
    for r in first:
        s = json.loads(json.dumps(r))
        s["corpus"], s["name"] = "python-doc", r["name"] + "-python-doc"
        bump = 0.5 + (0.05 if r["recipe"] == "ufp4" else 0.0)
        s["val_loss"] = [v + bump for v in r["val_loss"]]
        s["train_loss"] = [v + bump for v in r["train_loss"]]
        second.append(s)
    assert st.groups(first) == [("small", 1500, "linux-doc")]  # runs that name no corpus were made on the first
    runs = first + second
    assert st.groups(runs) == [("small", 1500, "linux-doc"), ("small", 1500, "python-doc")]
    ms = st.metrics(runs)
    by = {(m["corpus"], m["recipe"], m["seed"]): m for m in ms}
    for seed in range(3):
        m, bf = by[("python-doc", "ufp4", seed)], by[("python-doc", "bf16", seed)]
        assert m["val_rel"] == 100 * (m["val"] - bf["val"]) / bf["val"]
        assert by[("linux-doc", "ufp4", seed)]["val_rel"] == next(
            x for x in st.metrics(first) if x["recipe"] == "ufp4" and x["seed"] == seed)["val_rel"]
    # The first corpus's comparisons are those of its runs alone.
    alone = {(p.a, p.b, p.measure): p.diffs for _, res in st.paired(st.metrics(first), "small", 1500) for p in res}
    with_second = {(p.a, p.b, p.measure): p.diffs for _, res in st.paired(ms, "small", 1500, "linux-doc") for p in res}
    assert alone == with_second
    (_, res), = st.paired(ms, "small", 1500, "python-doc")
    v = next(p for p in res if (p.a, p.b, p.measure) == ("ufp4", "e2m1-ref", "val"))
    assert v.seeds == (0, 1, 2) and v.stats.kind == "worse"  # the 0.05 on every seed outweighs the seeds' spread
    text = st.tables(runs)
    assert "### small, linux-doc corpus: " in text and "### small, python-doc corpus: " in text
    status = st.status(runs)
    assert "**small, 1500 steps, linux-doc: ufp4 vs e2m1-ref" in status
    assert "**small, 1500 steps, python-doc: ufp4 vs e2m1-ref over 3 seeds: ufp4 trained worse" in status
    assert [s["corpus"] for s in st.paired_json(runs)["studies"]] == ["linux-doc", "python-doc"]
    # One corpus alone is not named.
    assert "### small: " in st.tables(first) and "linux-doc" not in st.status(first)
    # Figures: the first corpus's keep their names, the second's carry its name.
    written = st.report.plot(runs, str(tmp_path / "fig"))
    assert [os.path.basename(w) for w in written] == ["fig_small_1500.png", "fig_small_1500_python-doc.png"]
    assert all(os.path.getsize(w) > 10000 for w in written)
    # The proxy's paired effects are labelled by their study, the corpus named.
    labels = [s for s, _, _ in st.report.proxy_pairs(runs)]
    assert labels == ["small, 1500 steps, linux-doc"] * labels.count("small, 1500 steps, linux-doc") + [
        "small, 1500 steps, python-doc"] * labels.count("small, 1500 steps, python-doc")
    assert labels.count("small, 1500 steps, python-doc") >= 1 and labels.count("small, 1500 steps, linux-doc") >= 1
