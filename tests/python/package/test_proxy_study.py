"""The proxy study (`fp4lab-train proxy-study`, fp4lab/study/proxy_study.py): the rank
correlations against values worked out by hand (ties included), the generator against its published reference values, the bootstrap
reproducible from its seed and equal, resample by resample, to the plain correlation of the resample, the
orientation of the effects immaterial, and docs/results/training.md's table and docs/results/proxy-study.json equal to
what the command makes of the committed results. Needs numpy only (scipy, where installed, as a cross-check)."""
import json
import math
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from fp4lab import paired
from fp4lab.study import report as rp
from fp4lab.study import proxy_study as ps

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
RES = os.path.join(ROOT, "docs", "results")
TRACES = [("tiny-lm step 5000", "docs/results/analysis.json+docs/results/analysis-ablations.json"),
          ("doc-lm step 1999", "docs/results/analysis-doc-lm.json+docs/results/analysis-doc-lm-ablations.json")]


def py(*args, **kw):
    """The lab's study command, which runs the proxy study."""
    return subprocess.run([sys.executable, "-m", "fp4lab_lab.study", *args], capture_output=True, text=True, **kw)


def block(text, marker):
    i = text.index(f"<!-- {marker} -->") + len(f"<!-- {marker} -->")
    return text[i:text.index(f"<!-- end of {marker} -->")].strip()


# ---------------------------------------------------------------------------------------------------------
# Rank correlations against hand-worked values
# ---------------------------------------------------------------------------------------------------------

def test_spearman_equals_hand_worked_values_with_and_without_ties():
    # No ties, one swapped pair of four: 1 − 6·2 / (4·15) = 0.8; the doubled ranks give 64 / √(80·80) exactly.
    assert ps.spearman([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == 0.8
    assert ps.spearman([1.0, 2.0, 3.0, 4.0], [8.0, 6.0, 4.0, 2.0]) == -1.0
    # Ties in both: ranks (0.5, 0.5, 2, 3) and (0, 1, 2.5, 2.5), deviations from 1.5 (−1, −1, .5, 1.5) and
    # (−1.5, −.5, 1, 1): Σxy = 4, Σx² = Σy² = 4.5, ρ = 8/9.
    assert ps.spearman([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 3.0]) == 8 / 9
    # −0.0 and +0.0 are one value (a metric the recipes share), tied.
    assert ps.spearman([-0.0, 0.0, 1.0], [1.0, 2.0, 3.0]) == ps.spearman([0.0, 0.0, 1.0], [1.0, 2.0, 3.0])
    assert math.isnan(ps.spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # no spread: no correlation
    # Weights repeat points: the same as the expanded sample, bit for bit.
    x, y, w = [0.3, -1.0, 2.0, 0.3], [1.0, 5.0, -2.0, 0.0], [2, 0, 3, 1]
    ex = [i for i in range(4) for _ in range(w[i])]
    assert ps.spearman(x, y, w) == ps.spearman([x[i] for i in ex], [y[i] for i in ex])


def test_spearman_agrees_with_the_ranks_and_pearson_of_fp4lab_paired_and_with_scipy():
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(3, 20)
        x = [float(rng.randint(-3, 3)) for _ in range(n)]  # many ties
        y = [rng.choice([0.5, -1.25, 2.0, rng.uniform(-3, 3)]) for _ in range(n)]
        want = paired.pearson(paired.ranks(x), paired.ranks(y))
        got = ps.spearman(x, y)
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-13, abs=1e-15)
    stats = pytest.importorskip("scipy.stats")
    x, y = [1, 1, 2, 3, 3, 3, 7, 0], [2.0, 1.0, 1.0, 4.0, 0.0, 4.0, 9.0, -1.0]
    assert ps.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], rel=1e-14)
    assert ps.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y)[0], rel=1e-14)


def test_kendall_tau_b_equals_hand_worked_values_with_ties():
    # Pairs of (1,1,2,3) against (1,2,3,3): four concordant, one tied in x only, one tied in y only, none
    # discordant: 4 / √((6 − 1)(6 − 1)) = 0.8.
    assert ps.kendall_tau_b([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 3.0]) == 0.8
    # No ties: 5 concordant and 1 discordant of 6 pairs: 4/6.
    assert ps.kendall_tau_b([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == 4 / 6
    assert ps.kendall_tau_b([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == -1.0
    assert math.isnan(ps.kendall_tau_b([2.0, 2.0], [1.0, 3.0]))


# ---------------------------------------------------------------------------------------------------------
# The generator, the percentile rule and the bootstrap
# ---------------------------------------------------------------------------------------------------------

def test_splitmix64_gives_the_reference_outputs():
    # Vigna's splitmix64.c from seed 0 and from seed 1234567.
    assert [int(v) for v in ps.splitmix64(0, 3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [int(v) for v in ps.splitmix64(1234567, 3)] == [6457827717110365317, 3203168211198807973,
                                                           9817491932198370423]
    # The vector form against the scalar recurrence, over a stream long enough to wrap the state.
    state, mask, want = 2**64 - 5, 2**64 - 1, []
    for _ in range(1000):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        want.append(z ^ (z >> 31))
    assert [int(v) for v in ps.splitmix64(2**64 - 5, 1000)] == want


def test_percentile_interval_is_the_inverse_empirical_distribution():
    rng = random.Random(3)
    for m in (1, 2, 39, 40, 41, 999, 1000, 10000):
        v = [rng.uniform(-1, 1) for _ in range(m)]
        lo, hi = ps.percentile_interval(v)
        assert (lo, hi) == tuple(np.quantile(v, [0.025, 0.975], method="inverted_cdf"))
    assert ps.percentile_interval([]) == (None, None)


def test_bootstrap_is_reproducible_from_its_seed_and_each_resample_is_the_plain_correlation():
    x = [0.5, 0.5, 0.5, 1.0, -2.0, 0.0, 0.0, 3.0]
    y = [-0.4, -0.8, 1.3, -3.6, 0.3, 1.2, 0.6, 27.7]
    singles = [[i] for i in range(len(x))]
    pairs = [[0, 1, 2], [3], [4], [5, 6], [7]]
    a = ps.bootstrap({"x": x}, y, singles, 2000, seed=7)
    assert ps.bootstrap({"x": x}, y, singles, 2000, seed=7) == a
    assert ps.bootstrap({"x": x}, y, singles, 2000, seed=8) != a
    w = ps.resample_weights(singles, len(x), 2000, 7)
    assert (w.sum(axis=1) == len(x)).all()
    wp = ps.resample_weights(pairs, len(x), 2000, 7)
    assert all((wp[:, g] == wp[:, g[:1]]).all() for g in pairs)  # a drawn pair brings all its effects
    assert (wp[:, [0, 3, 4, 5, 7]].sum(axis=1) == len(pairs)).all()
    rhos = ps.bootstrap_rhos(x, y, w)
    for r in range(0, 2000, 97):
        idx = [i for i in range(len(x)) for _ in range(int(w[r, i]))]
        want = ps.spearman([x[i] for i in idx], [y[i] for i in idx])
        assert (math.isnan(want) and math.isnan(rhos[r])) or rhos[r] == want  # bit for bit
    defined = [v for v in rhos.tolist() if not math.isnan(v)]
    assert a["x"] == (*ps.percentile_interval(defined), len(defined))


def test_an_effect_named_the_other_way_round_changes_no_figure():
    x = [1.5, 1.5, 2.4, -1.4, 0.0, 1.1]
    y = [-0.4, -1.3, -3.7, -0.3, 1.2, 0.9]
    groups = [[0, 1], [2], [3], [4], [5]]
    a = ps.correlate(x, y, groups, decided=[2], resamples=500)
    # B − A instead of A − B for the third and fourth effects: both differences change sign.
    xf, yf = list(x), list(y)
    for j in (2, 3):
        xf[j], yf[j] = -x[j], -y[j]
    b = ps.correlate(xf, yf, groups, decided=[2], resamples=500)
    for k in ("spearman", "kendall_tau_b", "interval_effects", "interval_pairs", "favours_lower",
              "favours_higher", "decided_lower", "decided_higher"):
        assert a[k] == b[k], k
    assert a["favours_lower"] == 2 and a["favours_higher"] == 3  # x = 0 counts as neither
    # No effects (a subset the runs leave empty): no correlation and no interval, not a failure.
    none = ps.correlate([], [], [], resamples=10)
    assert none["spearman"] is None and none["interval_pairs"] == {"low": None, "high": None, "defined": 0}


# ---------------------------------------------------------------------------------------------------------
# The committed study
# ---------------------------------------------------------------------------------------------------------

def test_trace_metrics_are_the_means_of_the_analysis_rows():
    path = os.path.join(RES, "analysis-doc-lm.json")
    st = ps.trace_metrics(path)
    rows = [r for r in json.load(open(path))["gemms"] if r.get("recipe") == "ufp4"]
    dw = [r for r in rows if r["pass"] == "bwd_dw"]
    fwd = [r for r in rows if r["pass"] == "fwd_y"]
    assert len(rows) == 24 and len(dw) == 8
    assert st["ufp4"]["sqnr"] == pytest.approx(sum(r["sqnr_db"] for r in rows) / 24, rel=1e-15)
    assert st["ufp4"]["sqnr_bwd_dw"] == pytest.approx(sum(r["sqnr_db"] for r in dw) / 8, rel=1e-15)
    assert st["ufp4"]["sqnr_min"] == min(r["sqnr_db"] for r in rows)
    assert st["ufp4"]["dw_bias"] == pytest.approx(sum(abs(1 - r["eta_measured"]) for r in dw) / 8, rel=1e-14)
    assert st["ufp4"]["chain"] == pytest.approx(abs(sum(1 - r["eta"] for r in fwd)), rel=1e-14)
    # The existing proxy's figures are the same means.
    old = rp.proxy_stats(path)
    assert old["ufp4"]["sqnr"] == pytest.approx(st["ufp4"]["sqnr"], rel=1e-15)
    assert old["ufp4"]["sqnr_dw"] == pytest.approx(st["ufp4"]["sqnr_bwd_dw"], rel=1e-15)


def test_docs_training_proxy_study_is_regenerated_by_its_command(tmp_path):
    """docs/results/training.md's proxy-study table and docs/results/proxy-study.json are what the command documented
    above the table makes of the committed results, byte for byte; the committed document is not touched."""
    doc = os.path.join(ROOT, "docs", "results", "training.md")
    committed = open(doc, encoding="utf-8").read()
    documented = 'python3 -m fp4lab_lab.study proxy-study "' + '='.join(TRACES[0]) + '" \\\n  "' + "=".join(TRACES[1])
    assert documented + '"' in committed
    copy = tmp_path / "training.md"
    shutil.copy(doc, copy)
    out = tmp_path / "proxy-study.json"
    r = py("proxy-study", *("=".join(t) for t in TRACES), "--doc", str(copy), "--json", str(out), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert block(copy.read_text(encoding="utf-8"), ps.MARKER) == block(committed, ps.MARKER)
    assert copy.read_text(encoding="utf-8") == committed
    assert out.read_bytes() == open(os.path.join(RES, "proxy-study.json"), "rb").read()
    result = json.loads(out.read_text(encoding="utf-8"))
    # One row per metric, at least four, each with its correlation and interval on every trace.
    rows = [ln for ln in block(committed, ps.MARKER).splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == len(ps.METRICS) >= 4
    assert len(result["effects"]) == 16 and all(len(t["effects"]) == 16 for t in result["traces"])
    for t in result["traces"]:
        for k, _, _, _ in ps.METRICS:
            m = t["metrics"][k]["all"]
            assert m["interval_effects"]["low"] <= m["spearman"] <= m["interval_effects"]["high"]
            assert m["interval_effects"]["defined"] > 9900


def test_proxy_study_refuses_bad_input_in_one_line_before_writing(tmp_path):
    ana = os.path.join(RES, "analysis.json")
    rows = json.load(open(ana))
    next(r for r in rows["gemms"] if r.get("recipe") == "nvfp4")["sqnr_db"] = None  # exact: no dB
    (tmp_path / "null.json").write_text(json.dumps(rows))
    rows = json.load(open(ana))
    next(r for r in rows["gemms"] if r.get("recipe") == "ufp4")["eta"] = float("inf")  # Infinity in the JSON
    (tmp_path / "inf.json").write_text(json.dumps(rows))
    rows = json.load(open(ana))
    for r in rows["gemms"]:
        if r.get("recipe") == "mxfp4" and r["pass"] == "bwd_dx":
            r["pass"] = ["bwd_dx"]  # not a pass name
    (tmp_path / "pass.json").write_text(json.dumps(rows))
    doc = tmp_path / "doc.md"
    keep = f"text\n<!-- {ps.MARKER} -->\nold\n<!-- end of {ps.MARKER} -->\n"
    doc.write_text(keep)
    out = tmp_path / "out.json"
    cases = [
        (("t=" + str(tmp_path / "null.json"),), 1, str(tmp_path / "null.json") + ": recipe nvfp4: a GEMM row"),
        (("t=" + str(tmp_path / "inf.json"),), 1, str(tmp_path / "inf.json") + ": recipe ufp4: a GEMM row"),
        (("t=" + str(tmp_path / "pass.json"),), 1, str(tmp_path / "pass.json") + ": recipe mxfp4: GEMM rows of"),
        (("no-label",), 2, "no-label: not LABEL=ANALYSIS.json"),
        ((f"t={ana}", "--resamples", "0"), 2, "--resamples 0"),
        ((f"t={ana}", "--json", ana), 2, ana),  # an input as the output
    ]
    for args, code, text in cases:
        r = py("proxy-study", *args, "--doc", str(doc), *(() if "--json" in args else ("--json", str(out))),
               cwd=ROOT)
        assert r.returncode == code, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and text in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert doc.read_text() == keep and not out.exists()
    # A document without the study's markers: one line naming it, nothing written.
    doc.write_text("text\n")
    r = py("proxy-study", f"t={ana}", "--doc", str(doc), "--json", str(out), "--resamples", "10", cwd=ROOT)
    assert r.returncode == 1 and f"{doc}: markers" in r.stderr and not out.exists()
    # The presets' analysis alone: the ten effects of the presets, the table in place of the old block.
    doc.write_text(keep)
    r = py("proxy-study", f"t={ana}", "--doc", str(doc), "--json", str(out), "--resamples", "10", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(out.read_text())["traces"][0]["effects"]) == 10
    assert doc.read_text().startswith(f"text\n<!-- {ps.MARKER} -->\n| metric | better | ρ, t (95%: effects; pairs)")
