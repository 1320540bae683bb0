"""Hostile input to the Python package, one test per class: operand pairs the contract does not define, knobs that
mean something else than on the command line, and arguments the bindings would refuse with a signature dump.

The package comes from PYTHONPATH (ctest points it at the build's in-tree package); FP4LAB_BIN names the built
command line."""
import os
import subprocess

import numpy as np
import pytest

import fp4lab
from fp4lab import _core

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("FP4LAB_BIN", os.path.join(ROOT, "build", "bin", "fp4lab"))
X = np.random.default_rng(24).standard_normal((32, 64), dtype=np.float32)
SAME_ROTATION = "the contract multiplies operands quantised under the same rotation"


def one_line(e):
    text = str(e.value)
    assert "\n" not in text, text
    return text


# ---- a QTensor carries its configuration; gemm refuses pairs the contract does not define (docs/spec.md §5) ----

def test_qtensor_carries_its_rotation():
    q = fp4lab.quantize(X, "ufp4", role="fwd_x")
    assert (q.format, q.scale, q.block, q.tile2d, q.rht) == ("e1m2", "fp32", 16, False, 16)
    assert q.rht_signs == [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # te, docs/spec.md §3
    w = fp4lab.quantize(X, "nvfp4", role="fwd_w")
    assert (w.format, w.scale, w.tile2d, w.rht, w.rht_signs) == ("e2m1", "ue4m3", True, 0, None)
    s = fp4lab.quantize(X, rht=32, rht_seed=9)
    want = [float(t) for t in fp4lab.config(rht=32, rht_seed=9).to_dict()["rht_signs"].split(",")]
    assert s.rht == 32 and s.rht_signs == want


@pytest.mark.parametrize("a, b, want", [
    (dict(recipe="ufp4", role="fwd_x"), dict(recipe="nvfp4", role="fwd_w"),
     "operand A was rotated by RHT-16 (signs te) and operand B was not: " + SAME_ROTATION),
    (dict(recipe="mxfp4", role="fwd_x"), dict(recipe="e2m1-ref", block=32, rht=16, role="fwd_w"),
     "operand B was rotated by RHT-16 (signs te) and operand A was not: " + SAME_ROTATION),
    (dict(rht=16), dict(rht=16, rht_seed=3), "operand A was rotated by RHT-16 (signs te) and operand B by RHT-16 "
     "(signs 0x"),
    (dict(rht=16), dict(rht=32, rht_seed=3), "operand A was rotated by RHT-16 (signs te) and operand B by RHT-32"),
])
def test_gemm_refuses_operands_under_different_rotations(a, b, want):
    qa, qb = fp4lab.quantize(X, **a), fp4lab.quantize(X, **b)
    with pytest.raises(ValueError) as e:
        fp4lab.gemm(qa, qb)
    assert one_line(e).startswith(want)
    # Pairs the contract defines: the same rotation (or none) on both, grids and scale formats free per operand.
    fp4lab.gemm(qa, fp4lab.quantize(X, **a))
    bwd_dw = fp4lab.gemm(fp4lab.quantize(X, "ufp4", pass_="bwd_dw", role="bwd_dy"),
                         fp4lab.quantize(X, "nvfp4", pass_="bwd_dw", role="fwd_x"))
    assert bwd_dw.shape == (32, 32)


def test_rebuilt_qtensor_keeps_rotation_and_refuses_bad_parts():
    q = fp4lab.quantize(X, "ufp4")
    codes, scales = np.ascontiguousarray(q.codes), np.ascontiguousarray(q.scales)
    r = _core.make_qtensor(q.format, q.scale, q.block, q.tile2d, codes, scales, q.global_scale, q.rht, q.rht_signs)
    assert np.array_equal(fp4lab.gemm(r, q), fp4lab.gemm(q, q))
    plain = _core.make_qtensor(q.format, q.scale, q.block, q.tile2d, codes, scales, q.global_scale)
    with pytest.raises(ValueError, match="operand B was rotated by RHT-16"):
        fp4lab.gemm(plain, q)
    for g in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError) as e:
            _core.make_qtensor(q.format, q.scale, q.block, q.tile2d, codes, scales, g)
        assert one_line(e).startswith("global_scale must be a positive finite number")
    with pytest.raises(ValueError, match="RHT needs 16 signs, got 3"):
        _core.make_qtensor(q.format, q.scale, q.block, q.tile2d, codes, scales, 1.0, 16, [1.0, 1.0, 1.0])


def test_torch_paths_refuse_operands_under_different_rotations():
    torch = pytest.importorskip("torch")
    import fp4lab.torch as ft
    x = torch.from_numpy(X)
    qa, qb = ft.quantize(x, "ufp4", role="fwd_x"), ft.quantize(x, "nvfp4", role="fwd_w")
    for f in (lambda: ft.gemm(qa, qb), lambda: ft.product(qa, qb, "fast"), lambda: ft.product(qa, qb, "exact")):
        with pytest.raises(ValueError) as e:
            f()
        assert one_line(e).startswith("operand A was rotated by RHT-16 (signs te) and operand B was not")
    # A recipe whose fwd_y rotates one operand only fails at its first product, naming the reason.
    r = ft.Recipe("ufp4", per_operand={("fwd_y", "b"): {"rht": None}})
    lin = ft.Linear(64, 32, recipe=r)
    with pytest.raises(ValueError, match="operand A was rotated by RHT-16 .* and operand B was not"):
        lin(x)


# ---- rht=None is "no RHT" everywhere, as analyze() and the CLI's --rht none ----------------------------------

def test_rht_none_means_no_rotation():
    off = fp4lab.config("ufp4", rht="none")
    assert off.to_dict()["rht"] == 0
    for c in (fp4lab.config("ufp4", rht=None), fp4lab.config("ufp4", rht=0),
              fp4lab.config("ufp4", pass_="bwd_dw", role="fwd_x", rht=None)):
        assert c.to_dict()["rht"] == 0 and c.to_dict()["rht_signs"] == "", c.to_dict()
    q = fp4lab.quantize(X, "ufp4", rht=None)
    assert q.rht == 0 and np.array_equal(q.codes, fp4lab.quantize(X, "ufp4", rht="none").codes)
    # Leaving the knob out keeps the recipe's RHT.
    assert fp4lab.quantize(X, "ufp4").rht == 16
    torch = pytest.importorskip("torch")
    import fp4lab.torch as ft
    assert ft.Recipe("ufp4", rht=None).config("fwd_y", "a", layer=0, step=0).to_dict()["rht"] == 0


def test_rht_signs_of_the_wrong_shape_or_type():
    with pytest.raises(ValueError) as e:
        fp4lab.quantize(X, rht=16, rht_signs=np.ones((4, 4)))
    assert one_line(e) == "knob rht_signs: a 1-D sequence of +1/-1 entries or 'te', not a 2-D array"
    with pytest.raises(TypeError) as e:
        fp4lab.config(rht_signs=[[1, -1]] * 8)
    assert one_line(e) == "knob rht_signs: entries are +1 or -1, not list"
    with pytest.raises(ValueError) as e:
        fp4lab.config(rht_signs=3)
    assert one_line(e) == "--rht-signs: sign 1 is '3', not +1 or -1"
