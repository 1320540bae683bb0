"""fp4lab_lab.simval (lab/fp4lab_lab/simval.py), the simulator's validation against the H200: the split rule on a
hand-made shape set and on the committed timings (the halves docs/results/sim-validation.json records), the
metrics on a two-row example worked out by hand and on the committed rows (the recorded summary), and the
`fp4lab sim` commands it derives against the ones the committed results record."""
import json
import os

import pytest

from fp4lab_lab import simval  # lab/ on PYTHONPATH (tests/python/CMakeLists.txt)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
RESULTS = os.path.join(ROOT, "docs", "results")


@pytest.fixture(scope="module")
def recorded():
    with open(os.path.join(RESULTS, "sim-validation.json")) as f:
        return json.load(f)


def test_split_alternates_over_work_then_dimensions():
    # Work: 2x2 -> 4, 2x4 and 4x2 -> 8 (tied; the dimensions order them), 3x3 -> 9, 4x4 -> 16.
    got = simval.split_of([(4, 4), (3, 3), (4, 2), (2, 4), (2, 2)])
    assert got == {(2, 2): "calibration", (2, 4): "validation", (4, 2): "calibration", (3, 3): "validation",
                   (4, 4): "calibration"}


def test_split_of_the_committed_timings_is_the_recorded_one(recorded):
    rows = simval.assign_split(ROOT, simval.load_measured([os.path.join(ROOT, s) for s in recorded["source"]]))
    want = {(r["kernel"], r["recipe"], r["shape"]): r["split"] for r in recorded["rows"]}
    assert {(r["kernel"], r["recipe"], r["shape"]): r["split"] for r in rows} == want
    assert sum(1 for h in want.values() if h == "validation") == 198  # 90 quantiser + 108 GEMM rows


def test_plan_shapes_hold_the_sweep_and_every_layer_gemm():
    quants, gemms = simval.shape_sets(ROOT)
    assert (16384, 16384) in quants and (256, 256, 256) in gemms
    for f in os.listdir(os.path.join(ROOT, "workloads", "shapes")):
        if f.endswith(".csv"):
            for _, t, i, o in simval.read_layers(os.path.join(ROOT, "workloads", "shapes", f)):
                g, q = simval.layer_shapes(t, i, o)
                assert set(g) <= set(gemms) and q <= set(quants), f


def test_metrics_of_two_rows_by_hand():
    rows = [{"kernel": "gemm_fast", "recipe": "ufp4", "shape": "1x1x1", "measured_us": 100.0, "predicted_us": 90.0},
            {"kernel": "gemm_fast", "recipe": "ufp4", "shape": "2x2x2", "measured_us": 200.0, "predicted_us": 300.0}]
    m = simval.metrics(rows)
    # Errors -10 % and +50 %: MAPE 30, mean +20, the worst the second row; both orders agree (r = 1).
    assert (m["n"], m["mape"], m["mean_signed_error"], m["worst_error"]) == (2, 30.0, 20.0, 50.0)
    assert m["worst"] == "gemm_fast ufp4 2x2x2"
    assert m["pearson_log"] == pytest.approx(1.0) and m["spearman"] == pytest.approx(1.0)
    rows[1]["predicted_us"] = 80.0  # now -60 %, and the predictions in the opposite order
    m = simval.metrics(rows)
    assert (m["mape"], m["worst_error"]) == (35.0, -60.0)
    assert m["pearson_log"] == pytest.approx(-1.0) and m["spearman"] == pytest.approx(-1.0)
    assert simval.metrics([]) is None


def test_exact_log_is_the_correctly_rounded_one():
    assert simval.exact_log(1) == 0.0
    assert simval.exact_log(2) == 0.6931471805599453
    assert simval.exact_log(1e10) == 23.025850929940457


def test_summary_of_the_recorded_rows_is_the_recorded_summary(recorded):
    assert simval.summary(recorded["rows"]) == recorded["summary"]


def test_recorded_commands_are_the_ones_derived(recorded):
    for r in recorded["rows"]:
        assert " ".join(simval.command_for(r)) == r["command"], r
    with open(os.path.join(RESULTS, "sim-h200-step.json")) as f:
        step = json.load(f)
    for r in step["rows"]:
        args = simval.step_command(ROOT, r["shapes"], r["recipe"], r["mac_kind"], r["sr_as_fast_as_rtne"])
        assert " ".join(args) == r["command"], r


def test_unknown_operand_label_is_refused():
    with pytest.raises(ValueError, match="no recipe"):
        simval.recipe_of("int4_b32_bf16scale")
