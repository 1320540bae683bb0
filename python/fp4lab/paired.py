"""Paired comparison of training runs: which of two recipes trains to the lower loss, seed by seed.

Every recipe of one seed starts from the same initialisation and sees the same batches in the same order
(fp4lab.study), so two recipes are compared within each seed and the noise of the comparison is the
spread of the per-seed differences, not the spread of BF16 over seeds (docs/training.md).

Definitions, for recipes A and B, a measure L (the final validation loss, or the mean training loss over the last
10% of the steps) and the seeds s that have a run of A, of B and of BF16 (the reference):

- the per-seed difference, in points of the BF16-relative loss error of docs/spec.md §12:
  d_s = 100 · (L_A,s − L_B,s) / L_bf16,s, which is Δ_A,s − Δ_B,s with Δ = 100 · (L − L_bf16) / L_bf16; against
  BF16 itself (B = bf16) it is Δ_A,s. Negative: A ends at the lower loss.
- n = the number of such seeds; mean = Σ d_s / n; SD = √(Σ (d_s − mean)² / (n − 1)); SE = SD / √n;
- the 95% interval mean ± t · SE, t the 0.975 quantile of Student's t with n − 1 degrees of freedom (two-sided
  95%), from the table T975 (n = 2 … 31);
- the sign count: how many d_s are above, below and at zero;
- the verdict, from the interval alone: "A worse than B by |mean| ± t·SE points" when it lies above zero,
  "A better than B by …" when it lies below, "no difference detectable at ±t·SE points" when it holds zero; one
  seed gives no interval, no seed no comparison.

The arithmetic is IEEE-754 binary64 `+ − × ÷` and `math.sqrt` (correctly rounded) in a fixed order, the seeds in
ascending order, squares as products, the quantiles from a table: the same bits on every CPU (docs/spec.md §6.1).
The module needs nothing but the standard library. ranks() and pearson() (so Spearman's rho) follow the same rules;
the study's proxy and the simulator's validation (fp4lab.simval) both use them.

    from fp4lab import paired
    losses = {("ufp4", 0): {"val": 1.0519}, ("e2m1-ref", 0): {"val": 1.0506}, ("bf16", 0): {"val": 1.0921}, ...}
    r = paired.compare(losses, "ufp4", "e2m1-ref", "val")
    r.stats.mean, r.stats.half, r.verdict()
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import ABLATIONS

__all__ = ["DEFINITION", "T975", "t975", "PairedStats", "paired_stats", "PairResult", "compare", "compare_all",
           "pairs_for", "HEAD_TO_HEAD", "ABLATION_BASE", "REFERENCE", "ranks", "pearson"]

# The 0.975 quantile of Student's t distribution for 1..30 degrees of freedom, to 20 significant digits (Python
# rounds each literal correctly to binary64). tests/python/package/test_paired_stats.py checks every entry against the
# closed-form distribution function evaluated with the decimal module, and against the usual 3-decimal table.
T975 = {
    1: 12.706204736174704646, 2: 4.3026527297494638523, 3: 3.1824463052837095927, 4: 2.7764451051977943578,
    5: 2.5705818356363155147, 6: 2.4469118511449699711, 7: 2.3646242515927853417, 8: 2.3060041352041666833,
    9: 2.2621571627982055426, 10: 2.2281388519862747484, 11: 2.2009851600916398679, 12: 2.1788128296672288663,
    13: 2.1603686564627925015, 14: 2.1447866879178038287, 15: 2.1314495455597756821, 16: 2.1199052992212546745,
    17: 2.1098155778333170859, 18: 2.1009220402410384881, 19: 2.0930240544083097692, 20: 2.0859634472658648427,
    21: 2.0796138447276803951, 22: 2.0738730679040261658, 23: 2.0686576104190486515, 24: 2.0638985616280258492,
    25: 2.0595385527532977489, 26: 2.0555294386428732135, 27: 2.0518305164802855562, 28: 2.0484071417952451599,
    29: 2.0452296421327042982, 30: 2.0422724563012383100,
}

REFERENCE = "bf16"
# The definitions above in one sentence, for results files that carry their own reading.
DEFINITION = ("d_s = 100 * (L_A,s - L_B,s) / L_bf16,s per seed s with runs of A, B and bf16 (points of the "
              "BF16-relative loss error; negative: A ends lower); mean, SD (n - 1), SE = SD / sqrt(n); 95% interval "
              "mean +- t_0.975(n - 1) * SE; verdict: A worse/better than B when the interval lies above/below 0, "
              "otherwise no difference detectable at +- t * SE; one seed: no interval")
# The head-to-head comparisons of the study (docs/results/training.md): the paper's recipe against the E2M1 reference
# and the two other presets. A − B, so a positive difference means the first trained worse.
HEAD_TO_HEAD = (("ufp4", "e2m1-ref"), ("ufp4", "nvfp4"), ("ufp4", "mxfp4"))
# Each ablation of the paper's dense study against the preset it changes (fp4lab.ABLATIONS): the RHT-scope and SR
# variants change ufp4, E2M1 with RHT everywhere changes e2m1-ref.
ABLATION_BASE = {name: a.base for name, a in ABLATIONS.items() if name != a.base}


def t975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with df degrees of freedom (1..30)."""
    if df not in T975:
        raise ValueError(f"t quantile for {df} degrees of freedom: the table holds 1..{max(T975)}")
    return T975[df]


@dataclass(frozen=True)
class PairedStats:
    """Summary of n paired differences. mean is None for n = 0; sd, se, t, half, low and high are None for n < 2
    (one difference has no spread to measure)."""
    n: int
    mean: Optional[float]
    sd: Optional[float]
    se: Optional[float]
    t: Optional[float]
    half: Optional[float]  # t · SE, the half-width of the 95% interval
    low: Optional[float]
    high: Optional[float]
    above: int  # differences > 0 (A worse)
    below: int  # differences < 0 (A better)
    zero: int

    @property
    def kind(self) -> str:
        """'none' (no pair), 'one' (one seed, no interval), 'worse' (interval above 0), 'better' (below 0),
        'same' (every difference exactly 0) or 'undetected' (interval holds 0)."""
        if self.n == 0:
            return "none"
        if self.n == 1:
            return "one"
        if self.zero == self.n:
            return "same"
        if self.low > 0:
            return "worse"
        if self.high < 0:
            return "better"
        return "undetected"

    def as_dict(self) -> dict:
        """The figures as training-paired.json holds them."""
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "se": self.se, "t": self.t, "half_width": self.half,
                "low": self.low, "high": self.high,
                "signs": {"above": self.above, "below": self.below, "zero": self.zero}, "kind": self.kind}


def paired_stats(diffs: Sequence[float]) -> PairedStats:
    """Mean, SD, SE, 95% t-interval and sign count of paired differences, summed in the order given."""
    d = [float(x) for x in diffs]
    n = len(d)
    if any(math.isnan(x) or math.isinf(x) for x in d):
        raise ValueError("paired differences must be finite")
    above, below = sum(1 for x in d if x > 0), sum(1 for x in d if x < 0)
    zero = n - above - below
    if n == 0:
        return PairedStats(0, None, None, None, None, None, None, None, 0, 0, 0)
    total = 0.0
    for x in d:
        total += x
    mean = total / n
    if n == 1:
        return PairedStats(1, mean, None, None, None, None, None, None, above, below, zero)
    ss = 0.0
    for x in d:
        ss += (x - mean) * (x - mean)
    var = ss / (n - 1)
    sd = math.sqrt(var)
    se = math.sqrt(var / n)
    t = t975(n - 1)
    half = t * se
    return PairedStats(n, mean, sd, se, t, half, mean - half, mean + half, above, below, zero)


@dataclass(frozen=True)
class PairResult:
    """One comparison A − B on one measure within one study: the per-seed differences and their statistics,
    with the seeds that could not be paired (a run of one recipe only, or no BF16 run of that seed)."""
    a: str
    b: str
    measure: str
    seeds: Tuple = ()
    diffs: Tuple[float, ...] = ()
    stats: PairedStats = field(default_factory=lambda: paired_stats([]))
    only_a: Tuple = ()  # seeds with a run of A but none of B
    only_b: Tuple = ()
    no_reference: Tuple = ()  # seeds with both but no BF16 run to scale the difference by
    reference: str = REFERENCE

    def verdict(self, digits: int = 2, notes: bool = True) -> str:
        """The plain-language reading of the interval (see the module's docstring), with the seeds left unpaired
        unless notes is False."""
        s, k = self.stats, self.stats.kind
        note = self.unpaired_note() if notes else ""
        if k == "none":
            return f"{self.a} vs {self.b}: no seed with a run of both" + note
        if k == "one":
            return f"one seed ({s.mean:+.{digits}f} points): no interval from one seed, nothing decided" + note
        if k == "same":
            return f"no difference: identical on all {s.n} seeds" + note
        if k in ("worse", "better"):
            text = f"{self.a} {k} than {self.b} by {abs(s.mean):.{digits}f} ± {s.half:.{digits}f} points"
            if s.half == 0:
                text += f" (all {s.n} differences equal: the interval has no width)"
            return text + note
        return f"no difference detectable at ±{s.half:.{digits}f} points" + note

    def unpaired(self) -> str:
        """The seeds that could not be paired, in words ('' when every seed was)."""
        notes = []
        if self.only_a:
            notes.append(f"{_seeds(self.only_a)} of {self.a} {_have(self.only_a)} no {self.b} run")
        if self.only_b:
            notes.append(f"{_seeds(self.only_b)} of {self.b} {_have(self.only_b)} no {self.a} run")
        if self.no_reference:
            notes.append(f"{_seeds(self.no_reference)} {_have(self.no_reference)} no {self.reference} run")
        return "; ".join(notes)

    def unpaired_note(self) -> str:
        text = self.unpaired()
        return f" ({text}: not paired)" if text else ""

    def as_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "measure": self.measure, "seeds": list(self.seeds),
                "diffs": list(self.diffs), **self.stats.as_dict(),
                "verdict": self.verdict(notes=False),
                "unpaired": {"only_a": list(self.only_a), "only_b": list(self.only_b),
                             "no_reference": list(self.no_reference)}}


def _seeds(seeds) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def _have(seeds) -> str:
    return "has" if len(seeds) == 1 else "have"


def compare(losses: Mapping[Tuple[str, Hashable], Mapping[str, float]], a: str, b: str, measure: str,
            reference: str = REFERENCE) -> PairResult:
    """A − B on `measure` over the seeds that have a run of A, of B and of the reference. losses maps
    (recipe, seed) to {measure: loss}; every seed of one study, so the runs of one seed share their start."""
    sa = {s for r, s in losses if r == a}
    sb = {s for r, s in losses if r == b}
    sr = {s for r, s in losses if r == reference}
    both = sorted(sa & sb)
    seeds = [s for s in both if s in sr]
    diffs = []
    for s in seeds:
        ref = losses[(reference, s)][measure]
        diffs.append(100.0 * (losses[(a, s)][measure] - losses[(b, s)][measure]) / ref)
    return PairResult(a, b, measure, tuple(seeds), tuple(diffs), paired_stats(diffs), tuple(sorted(sa - sb)),
                      tuple(sorted(sb - sa)), tuple(s for s in both if s not in sr), reference)


def pairs_for(recipes: Iterable[str], reference: str = REFERENCE) -> List[Tuple[str, str]]:
    """The comparisons that matter among the recipes present: the head-to-head ones, each ablation against its
    base, then every recipe against the reference, in that order (the recipes' order kept within each)."""
    present = list(dict.fromkeys(recipes))
    have = set(present)
    out = [(x, y) for x, y in HEAD_TO_HEAD if x in have and y in have]
    out += [(x, ABLATION_BASE[x]) for x in present if x in ABLATION_BASE and ABLATION_BASE[x] in have]
    if reference in have:
        out += [(x, reference) for x in present if x != reference]
    return out


def compare_all(losses: Mapping[tuple, Mapping[str, float]], measures: Sequence[str] = ("val", "train"),
                reference: str = REFERENCE) -> Dict[tuple, List[PairResult]]:
    """Every comparison that matters in every study. losses maps (recipe, seed, *study) to {measure: loss}, where
    the study is whatever else tells runs apart that must not be compared (corpus, model size, training length,
    GEMM mode): keys (recipe, seed) make one study, (). Per study, the results in pairs_for order, each pair
    once per measure."""
    studies: Dict[tuple, Dict[Tuple[str, Hashable], Mapping[str, float]]] = {}
    for key, v in losses.items():
        recipe, seed, *study = key
        studies.setdefault(tuple(study), {})[(recipe, seed)] = v
    out = {}
    for study, ls in studies.items():
        recipes = [r for r, _ in ls]
        out[study] = [compare(ls, x, y, m, reference) for x, y in pairs_for(recipes, reference) for m in measures]
    return out


def ranks(v: Sequence[float]) -> List[float]:
    """0-based ranks of `v`, ties given the mean of their ranks."""
    order = sorted(range(len(v)), key=lambda i: v[i])
    rk = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for t in range(i, j + 1):
            rk[order[t]] = (i + j) / 2.0
        i = j + 1
    return rk


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Summed in list order with IEEE + - * / and sqrt only (no libm pow): the same bits on every machine."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) * (a - mx) for a in x)
    syy = sum((b - my) * (b - my) for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")
