"""`fp4lab plot`: the figures of an analysis JSON and a sweep CSV come from the installed package, are named after
the data they draw, and its inputs are never overwritten; bad inputs are one line and the documented code."""
import json
import os
import subprocess
import sys

import pytest

import fp4lab
from fp4lab import plots

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ANALYSIS = os.path.join(ROOT, "docs", "results", "analysis.json")
CLI = os.environ.get("FP4LAB_BIN") or fp4lab.cli_path()
ENV = dict(os.environ, FP4LAB_BIN=CLI)
PNG = b"\x89PNG\r\n\x1a\n"


def run_plot(*args):
    return subprocess.run([sys.executable, "-m", "fp4lab", "plot", *args], capture_output=True, text=True, env=ENV)


def test_analysis_figures_are_written_and_labelled_by_their_trace(tmp_path):
    p = run_plot("analysis", ANALYSIS, "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(plots.ANALYSIS_FILES)
    for f in plots.ANALYSIS_FILES:
        assert (tmp_path / f).read_bytes()[:8] == PNG
    # the label is the analysed trace, not a fixed "bundled trace"
    doc = json.load(open(ANALYSIS))
    assert plots._trace_label(doc, ANALYSIS) == doc["config"]["trace"] == "workloads/tiny-lm/step_005000"
    assert plots._trace_label({"config": {"trace": ["a", "b"]}}, "x.json") == "a, b"
    assert plots._trace_label({}, "/p/my-run.json") == "my-run.json"


def test_sweep_pareto_from_a_sweep_csv(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'[defaults]\nconfig = "h200-class-dual"\nmodel = "{ROOT}/workloads/models/gpt2.json"\n'
                     'tokens = 256\n[[grid]]\nname = "u{mac.units}_{recipe}"\nrecipe = ["ufp4", "nvfp4"]\n'
                     'mac.units = [128, 256]\n')
    subprocess.run([CLI, "sim", "--sweep", str(sweep), "--out", str(tmp_path / "s")], check=True, capture_output=True)
    out = tmp_path / "fig"
    p = run_plot("sweep", str(tmp_path / "s.csv"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "fig_sweep_pareto.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, code, words", [
    (["analysis", "missing.json", "--out", "O"], 1, "missing.json"),
    (["sweep", ANALYSIS, "--out", "O"], 1, "time_us"),
    (["analysis", ANALYSIS], 2, "--out"),
    (["nothing", ANALYSIS, "--out", "O"], 2, "nothing"),
])
def test_bad_input_is_one_line(tmp_path, args, code, words):
    p = run_plot(*[str(tmp_path / "o") if a == "O" else a for a in args])
    assert p.returncode == code and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr, p.stderr


def test_an_output_that_is_its_input_is_refused(tmp_path):
    src = tmp_path / "fig_recipes.png"  # the analysis JSON under the name of an output
    src.write_bytes(open(ANALYSIS, "rb").read())
    before = src.read_bytes()
    p = run_plot("analysis", str(src), "--out", str(tmp_path))
    assert p.returncode == 2 and "fig_recipes.png" in p.stderr, p.stderr
    assert src.read_bytes() == before and os.listdir(tmp_path) == ["fig_recipes.png"]
