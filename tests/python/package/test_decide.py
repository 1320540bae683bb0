"""`fp4lab decide` end to end on a small model, its figures checked exactly against the pieces it joins: the sim
JSON of `fp4lab sim` ("sim" runs here), the area of rtl/area.json, and the analysis JSON of `fp4lab analyze`; its
verdict against the rule it prints; its inputs never overwritten; the training evidence it bundles against the proxy
study it summarises."""
import json
import os
import subprocess
import sys

import pytest

import fp4lab
from fp4lab import decision as dc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODEL = os.path.join(ROOT, "workloads", "models", "gpt2.json")
TRACE = os.path.join(ROOT, "workloads", "tiny-lm", "step_005000")
CLI = os.environ.get("FP4LAB_BIN") or fp4lab.cli_path()
ENV = dict(os.environ, FP4LAB_BIN=CLI)
TOKENS = 256


def run_decide(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "fp4lab", "decide", *args], capture_output=True, text=True,
                          env=ENV, cwd=cwd)


@pytest.fixture(scope="module")
def decision(tmp_path_factory):
    out = tmp_path_factory.mktemp("decision")
    p = run_decide("--model", MODEL, "--tokens", str(TOKENS), "--trace", TRACE, "--design", "h200-class-e1m2",
                   "--recipes", "nvfp4,ufp4", "--resamples", "200", "--out", str(out))
    assert p.returncode == 0, p.stderr
    doc = json.load(open(out / "decision.json"))
    return out, doc, p.stdout


def sim_json(config, recipe, *extra):
    p = subprocess.run([CLI, "sim", "--config", config, *extra, "--model", MODEL, "--tokens", str(TOKENS),
                        "--recipe", recipe, "--json", "-"], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def test_cost_figures_are_the_sim_json_exactly(decision):
    _, doc, _ = decision
    runs = {(r["design"], r["recipe"]): r for r in doc["runs"]}
    assert set(runs) == {(d, r) for d in ("h200-class-e2m1", "h200-class-e1m2") for r in ("nvfp4", "ufp4")}
    for (design, recipe), r in runs.items():
        s = sim_json(design, recipe)
        t = s["total"]
        assert r["time_ms"] == t["time_us"] * 1e-3
        assert r["tokens"] == t["tokens"] == TOKENS
        assert r["tokens_per_s"] == TOKENS / (t["time_us"] * 1e-6)
        assert r["energy_j"] == t["energy_total_pj"] * 1e-12
        assert r["energy_per_token_mj"] == t["energy_total_pj"] * 1e-9 / TOKENS
        assert r["unit_mm2"] == s["area"]["unit_mm2"] and r["mac_array_mm2"] == s["area"]["mac_array_mm2"]
        assert r["throughput_per_mm2"] == r["tokens_per_s"] / s["area"]["unit_mm2"]
        assert r["native"] == all(g["native"] for g in s["gemms"])
    # E2M1-only runs ufp4 at the fallback rate, E1M2-only nvfp4; each runs its own grid natively
    assert runs[("h200-class-e2m1", "nvfp4")]["native"] and runs[("h200-class-e1m2", "ufp4")]["native"]
    assert not runs[("h200-class-e2m1", "ufp4")]["native"] and not runs[("h200-class-e1m2", "nvfp4")]["native"]


def test_area_is_rtl_area_json_times_what_is_built(decision):
    _, doc, _ = decision
    builds = json.load(open(os.path.join(ROOT, "rtl", "area.json")))["builds"]
    for r in doc["runs"]:
        cfg = sim_json(r["design"], r["recipe"])["config"]
        kind = cfg["mac.kind"]
        # the block MACs: SMs x units x the NAND2 equivalents Yosys gives the build mac_<kind>
        b = builds[f"mac_{kind}"]
        nand2 = b["transistors"] / 4 + 6 * b["ffs"]
        assert cfg[f"area.mac_{kind}_nand2"] == nand2
        assert r["mac_array_nand2"] == cfg["tcu.count"] * cfg["mac.units"] * nand2
        assert r["mac_array_mm2"] == r["mac_array_nand2"] * cfg["area.um2_per_nand2"] * 1e-6


def test_accuracy_figures_are_the_analysis_json_exactly(decision, tmp_path):
    _, doc, _ = decision
    subprocess.run([CLI, "analyze", "--trace", TRACE, "--recipe", "nvfp4,ufp4", "--json", str(tmp_path / "a.json")],
                   check=True, capture_output=True)
    rows = json.load(open(tmp_path / "a.json"))["gemms"]
    acc = doc["accuracy"]
    assert acc["records"] == 8 and acc["traces"] == [TRACE]
    for recipe in ("nvfp4", "ufp4"):
        mine = [r for r in rows if r.get("recipe") == recipe]
        assert len(mine) == 24  # 8 records x 3 passes
        total = 0.0
        for r in mine:  # the definition: the mean over every GEMM and pass, summed in row order
            total += r["sqnr_db"]
        assert acc["recipes"][recipe]["sqnr"]["value"] == total / len(mine)
        assert acc["recipes"][recipe]["sqnr_min"]["value"] == min(r["sqnr_db"] for r in mine)
        total = 0.0
        for r in mine:
            if r["pass"] == "bwd_dw":
                total += abs(1.0 - r["eta_measured"])
        assert acc["recipes"][recipe]["dw_bias"]["value"] == total / 8
        for k, m in acc["recipes"][recipe].items():
            assert m["low"] <= m["value"] <= m["high"] or k == "sqnr_min", (recipe, k, m)
    d = acc["differences"][0]
    assert (d["a"], d["b"]) == ("ufp4", "nvfp4")
    assert d["metrics"]["sqnr"]["value"] == acc["recipes"]["ufp4"]["sqnr"]["value"] - acc["recipes"]["nvfp4"]["sqnr"]["value"]


def test_verdict_follows_the_rule_it_states(decision):
    out, doc, stdout = decision
    runs = {(r["design"], r["recipe"]): r for r in doc["runs"]}
    b, u = runs[("h200-class-e2m1", "nvfp4")], runs[("h200-class-e1m2", "ufp4")]
    (v,) = doc["verdicts"]
    assert v["design"] == "h200-class-e1m2"
    assert v["cost"]["throughput_per_mm2"] == u["throughput_per_mm2"] / b["throughput_per_mm2"]
    assert v["cost"]["area"] == u["unit_mm2"] / b["unit_mm2"]
    r = v["cost"]["throughput_per_mm2"]
    assert v["cost"]["status"] == ("better" if r > 1.01 else "worse" if r < 0.99 else "equal")
    # the training evidence, read independently: ufp4 - nvfp4 effects whose 95% interval excludes zero
    ev = json.load(open(os.path.join(ROOT, "docs", "results", "proxy-study.json")))["effects"]
    worse = sum(1 for e in ev if (e["a"], e["b"]) == ("ufp4", "nvfp4") and e["low"] > 0)
    better = sum(1 for e in ev if (e["a"], e["b"]) == ("ufp4", "nvfp4") and e["high"] < 0)
    assert (doc["training"]["worse"], doc["training"]["better"]) == (worse, better)
    acc = "mixed" if worse and better else "worse" if worse else "better" if better else "not established"
    assert v["accuracy"]["status"] == acc
    expect = ("NO-GO" if acc == "worse" else
              ("GO" if v["cost"]["status"] != "worse" else "UNDECIDED") if acc == "better" else
              ("UNDECIDED" if v["cost"]["status"] == "better" else "NO-GO"))
    assert v["verdict"] == expect == doc["verdict"]["decision"]
    assert doc["verdict"]["sentence"].startswith(expect + " for gpt2 at 256 tokens per step")
    assert stdout.splitlines()[0] == doc["verdict"]["sentence"]
    # robustness: each assumption down and up, the baseline scaled alike
    assert [(x["key"], x["factor"]) for x in doc["robustness"]] == [
        (k, f) for k, _, fs in dc.ASSUMPTIONS for f in fs]
    mac = next(x for x in doc["robustness"] if x["key"] == "mac.units" and x["factor"] == 2.0)
    s_b, s_u = sim_json("h200-class-e2m1", "nvfp4", "--mac.units", "512"), sim_json("h200-class-e1m2", "ufp4",
                                                                                  "--mac.units", "512")
    ratio = (TOKENS / (s_u["total"]["time_us"] * 1e-6) / s_u["area"]["unit_mm2"]) / \
            (TOKENS / (s_b["total"]["time_us"] * 1e-6) / s_b["area"]["unit_mm2"])
    assert mac["designs"][0]["throughput_per_mm2"] == ratio


def test_report_and_figures_are_written_and_nothing_else(decision):
    out, doc, _ = decision
    assert sorted(os.listdir(out)) == sorted(dc.FILES)
    md = open(out / "report.md", encoding="utf-8").read()
    assert doc["verdict"]["sentence"] in md and doc["rule"] in md
    assert "no trace metric is supported as a predictor" in md  # the bundled evidence supports none
    for f in ("fig_pareto.png", "fig_layers.png"):
        assert doc["figures"][f] == "written"
        assert open(out / f, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert doc["layers"][0]["design"] == "h200-class-e2m1" and doc["layers"][1]["design"] == "h200-class-e1m2"
    for lay in doc["layers"]:
        run = next(r for r in doc["runs"] if (r["design"], r["recipe"]) == (lay["design"], lay["recipe"]))
        assert sum(x["time_ms"] for x in lay["layers"]) == pytest.approx(run["time_ms"], rel=1e-12)


def test_bundled_training_evidence_is_the_proxy_study_summarised():
    """The package carries the proxy study's summary (the wheel has no docs/): it must be what the study says."""
    doc = json.load(open(os.path.join(ROOT, "docs", "results", "proxy-study.json")))
    assert dc.evidence_summary(doc, "docs/results/proxy-study.json") == json.load(open(dc.EVIDENCE))


def test_output_that_is_an_input_is_refused_before_any_work(tmp_path):
    ev = tmp_path / "report.md"  # an input (--evidence) where an output would go
    doc = json.load(open(os.path.join(ROOT, "docs", "results", "proxy-study.json")))
    ev.write_text(json.dumps(doc))
    before = ev.read_bytes()
    p = run_decide("--model", MODEL, "--tokens", "256", "--evidence", str(ev), "--out", str(tmp_path))
    # an output that is an input is a usage error, as on the command line (docs/spec.md §11.1)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith("fp4lab decide: error: ") and "report.md" in p.stderr
    assert ev.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["report.md"]


@pytest.mark.parametrize("args, code, words", [
    (["--tokens", "256", "--out", "X"], 2, "--model"),
    (["--model", MODEL, "--out", "X"], 2, "--tokens"),
    (["--model", MODEL, "--tokens", "0", "--out", "X"], 2, "--tokens 0"),
    (["--model", MODEL, "--tokens", "256", "--recipes", "fp8", "--out", "X"], 2, "fp8"),
    (["--model", MODEL, "--tokens", "256", "--design", "no-such-unit", "--out", "X"], 2, "no-such-unit"),
    (["--model", "missing.json", "--tokens", "256", "--out", "X"], 1, "missing.json"),
    (["--model", MODEL, "--tokens", "256", "--grid", "mac.units", "--out", "X"], 2, "--grid"),
    (["--model", MODEL, "--tokens", "256", "--trace", TRACE, "--resamples", "5", "--out", "X"], 2, "--resamples"),
])
def test_bad_arguments_are_one_line_and_the_documented_code(tmp_path, args, code, words):
    args = [str(tmp_path / "out") if a == "X" else a for a in args]
    p = run_decide(*args, cwd=str(tmp_path))
    assert p.returncode == code, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and words in p.stderr, p.stderr
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_model_source_kinds_time_the_same_step(tmp_path):
    """The shape list `fp4lab sim --print-shapes` derives from the config gives the same runs as the config."""
    shapes = tmp_path / "gpt2.csv"
    p = subprocess.run([CLI, "sim", "--model", MODEL, "--tokens", str(TOKENS), "--print-shapes"], check=True,
                       capture_output=True, text=True)
    shapes.write_text(p.stdout)
    a = dc.decide(MODEL, tokens=TOKENS, designs=["h200-class-e1m2"], recipes=["nvfp4", "ufp4"], robustness=False)
    b = dc.decide(str(shapes), tokens=TOKENS, designs=["h200-class-e1m2"], recipes=["nvfp4", "ufp4"],
                  robustness=False)
    assert [r["time_ms"] for r in a["runs"]] == [r["time_ms"] for r in b["runs"]]
    assert [r["tokens_per_s"] for r in a["runs"]] == [r["tokens_per_s"] for r in b["runs"]]
    assert a["verdict"] == b["verdict"]


def test_a_recipe_the_model_cannot_take_is_left_out_and_said(tmp_path):
    """A captured layer 48 wide is whole blocks of 16 but not of 32: mxfp4 (block 32) is left out of the timing and
    the accuracy, the report says why, and the verdict's two recipes are still decided."""
    import numpy as np
    from fp4lab import trace as ft
    rng = np.random.default_rng(0)
    step = tmp_path / "run" / "step_000010"
    step.mkdir(parents=True)
    for name, (t, i, o) in {"mlp.fc1": (64, 48, 96), "mlp.fc2": (64, 96, 48)}.items():
        ft.write_file(str(step / f"{name}.safetensors"),
                      {f"{name}.fwd_x": rng.standard_normal((t, i), dtype=np.float32),
                       f"{name}.fwd_w": rng.standard_normal((o, i), dtype=np.float32),
                       f"{name}.bwd_dy": rng.standard_normal((t, o), dtype=np.float32)},
                      {"fp4lab.trace.version": "1", "step": "10", "tokens_in_pass": "512"})
    doc = dc.decide(str(step), traces=[str(step)], designs=["h200-class-e1m2"], robustness=False, resamples=100)
    assert set(doc["skipped"]) == {"mxfp4"} and "block size 32" in doc["skipped"]["mxfp4"]
    assert {r["recipe"] for r in doc["runs"]} == {"ufp4", "e2m1-ref", "nvfp4"}
    assert set(doc["accuracy"]["recipes"]) == {"ufp4", "e2m1-ref", "nvfp4"} and doc["accuracy"]["records"] == 2
    assert any(x.startswith("Recipe mxfp4 is left out") for x in doc["limits"])
    assert doc["model"]["label"] == os.path.join("run", "step_000010")
    # the verdict's own recipes may not be left out: one line naming the fault
    with pytest.raises(ValueError, match="block size 32"):
        dc.decide(str(step), designs=["h200-class-e1m2"], baseline_recipe="mxfp4", robustness=False)


def test_readme_quotes_the_committed_example_verdict():
    """README's verdict is the committed example's (docs/results/decision, scripts/decision_example.sh), and that
    example was made by the command README shows."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    doc = json.load(open(os.path.join(ROOT, "docs", "results", "decision", "decision.json")))
    quoted = " ".join(ln[2:] for ln in readme.splitlines() if ln.startswith("> "))
    assert doc["verdict"]["sentence"] in quoted
    assert doc["command"] == ("fp4lab decide --model workloads/models/llama2-7b.json --tokens 4096 --trace "
                              "workloads/tiny-lm/step_005000 --trace workloads/doc-lm/step_001999 "
                              "--out docs/results/decision")
    script = open(os.path.join(ROOT, "scripts", "decision_example.sh")).read()
    assert "--model workloads/models/llama2-7b.json --tokens 4096" in script and "--out docs/results/decision" in script
    md = open(os.path.join(ROOT, "docs", "results", "decision", "report.md"), encoding="utf-8").read()
    assert doc["verdict"]["sentence"] in md
