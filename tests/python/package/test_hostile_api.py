"""Hostile input to the Python package, one test per class: operand pairs the contract does not define, knobs that
mean something else than on the command line, and arguments the bindings would refuse with a signature dump.

The package comes from PYTHONPATH (ctest points it at the build's in-tree package). The CUDA case runs where the
package was built with CUDA and a GPU is present."""
import numpy as np
import pytest

import fp4lab
from fp4lab import _core

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
    # A recipe whose fwd_y rotates one operand only is refused when it is made, with the same reason.
    with pytest.raises(ValueError) as e:
        ft.Recipe("ufp4", per_operand={("fwd_y", "b"): {"rht": None}})
    assert one_line(e).startswith("Recipe(): fwd_y: operand A was rotated by RHT-16 (signs te) and operand B was not")
    ft.Recipe("ufp4", per_pass={"fwd_y": {"rht": None}})  # both operands unrotated: defined


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


# ---- fp4lab.torch: an empty batch, sizes a recipe cannot take, overflow in fast mode, integer arguments ---------

@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_linear_on_no_tokens_is_nn_linear(mode):
    torch = pytest.importorskip("torch")
    import fp4lab.torch as ft
    torch.manual_seed(0)
    lin = ft.Linear(64, 32, recipe=ft.Recipe("ufp4", mode=mode))
    ref = torch.nn.Linear(64, 32)
    ref.load_state_dict({k: v for k, v in lin.state_dict().items() if k != "_extra_state"})
    for shape in ((0, 64), (3, 0, 64)):
        x, xr = torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
        y, yr = lin(x), ref(xr)
        assert y.shape == yr.shape == (*shape[:-1], 32)
        y.sum().backward()
        yr.sum().backward()
        assert x.grad.shape == x.shape
        assert torch.equal(lin.weight.grad, ref.weight.grad) and torch.equal(lin.bias.grad, ref.bias.grad)
        assert not lin.weight.grad.any()
        lin.zero_grad()
        ref.zero_grad()


def test_linear_sizes_the_recipe_cannot_take_are_refused_at_construction():
    pytest.importorskip("torch")
    import fp4lab.torch as ft
    for args, want in (((40, 32), "fwd_y operand a [tokens, 40]: reduction dimension 40 is not a multiple of the "
                                  "block size 16"),
                       ((64, 24), "bwd_dx operand a [tokens, 24]: reduction dimension 24 is not a multiple"),
                       ((80, 64, "mxfp4"), "reduction dimension 80 is not a multiple of the block size 32")):
        with pytest.raises(ValueError) as e:
            ft.Linear(*args[:2], recipe=args[2] if len(args) > 2 else "ufp4")
        assert want in one_line(e)
    ft.Linear(40, 24, recipe="bf16")  # plain F.linear takes any size
    ft.Linear(64, 32, recipe="ufp4")


def test_fast_mode_refuses_an_overflowing_output_as_exact_mode_does():
    torch = pytest.importorskip("torch")
    import fp4lab.torch as ft
    x = torch.full((16, 64), 1e3)
    for mode in ("exact", "fast"):
        lin = ft.Linear(64, 32, bias=False, recipe=ft.Recipe("ufp4", mode=mode))
        with torch.no_grad():
            lin.weight.fill_(3e37)
        with pytest.raises(ValueError) as e:
            lin(x)
        assert one_line(e) == "GEMM output overflows FP32 at C[0, 0]", mode
        qa, qb = ft.quantize(x, "ufp4", role="fwd_x"), ft.quantize(lin.weight.detach(), "ufp4", role="fwd_w")
        with pytest.raises(ValueError, match="GEMM output overflows FP32 at C"):
            ft.product(qa, qb, mode)


def test_integer_arguments_give_one_line_errors():
    torch = pytest.importorskip("torch")
    import fp4lab.torch as ft
    lin = ft.Linear(64, 32)
    cases = [(lambda: ft.Recipe("ufp4", seed=-1), ValueError, "Recipe(): seed must be an integer from 0 to 2**64 - 1"),
             (lambda: ft.Recipe("ufp4", seed=2**64), ValueError, "Recipe(): seed must be an integer"),
             (lambda: ft.Recipe("ufp4", seed=1.5), TypeError, "Recipe(): seed must be an int, not float"),
             (lambda: ft.Recipe("ufp4", seed=True), TypeError, "Recipe(): seed must be an int, not bool"),
             (lambda: ft.set_step(lin, -1), ValueError, "set_step(): step must be an integer from 0 to 2**63 - 1"),
             (lambda: ft.set_step(lin, 2**70), ValueError, "set_step(): step must be an integer"),
             (lambda: ft.set_step(lin, 3.0), TypeError, "set_step(): step must be an int, not float"),
             (lambda: setattr(lin, "step", "7"), TypeError, "step: step must be an int, not str"),
             (lambda: ft.Linear(64, 32, layer_id=2**29), ValueError, "Linear(): layer_id must be an integer"),
             (lambda: ft.Linear(64, 32, layer_id=1.0), TypeError, "Linear(): layer_id must be an int")]
    for f, kind, want in cases:
        with pytest.raises(kind) as e:
            f()
        assert one_line(e).startswith(want), one_line(e)
    ft.set_step(lin, torch.tensor(5))  # an integer tensor is an int
    assert lin.step == 5 and ft.Recipe("ufp4", seed=np.uint64(2**64 - 1)).seed == 2**64 - 1


def test_cuda_operands_refuse_different_rotations_and_overflow():
    torch = pytest.importorskip("torch")
    import fp4lab.torch as ft
    if not (_core.cuda_built and torch.cuda.is_available()):
        pytest.skip("no CUDA build or no GPU")
    x = torch.from_numpy(X).cuda()
    qa, qb = ft.quantize(x, "ufp4", role="fwd_x"), ft.quantize(x, "nvfp4", role="fwd_w")
    assert (qa.rht, qb.rht, qb.rht_signs, qb.tile2d) == (16, 0, None, True)
    for f in (lambda: ft.gemm(qa, qb), lambda: ft.gemm(qa, qb, kernel="reference"), lambda: ft.product(qa, qb, "fast")):
        with pytest.raises(ValueError) as e:
            f()
        assert one_line(e).startswith("operand A was rotated by RHT-16 (signs te) and operand B was not")
    # The same rotation on the host and on the device: the golden layout carries it back.
    assert qa.to_host().rht_signs == fp4lab.quantize(X, "ufp4", role="fwd_x").rht_signs
    big = torch.full((16, 64), 1e3, device="cuda")
    w = torch.full((32, 64), 3e37, device="cuda")
    for mode in ("exact", "fast"):
        lin = ft.Linear(64, 32, bias=False, recipe=ft.Recipe("ufp4", mode=mode, check_finite="sync")).cuda()
        with torch.no_grad():
            lin.weight.copy_(w)
        with pytest.raises(ValueError, match="overflow"):
            lin(big)
        torch.cuda.synchronize()
        ft.check_finite()  # a sync recipe leaves no deferred flag behind
    lin = ft.Linear(64, 32, bias=False, recipe=ft.Recipe("ufp4", mode="fast", check_finite="deferred")).cuda()
    with torch.no_grad():
        lin.weight.copy_(w)
    lin(big)  # no synchronisation: the device flag records the overflow
    with pytest.raises(ValueError, match="the output of a quantised GEMM overflowed"):
        ft.check_finite()
