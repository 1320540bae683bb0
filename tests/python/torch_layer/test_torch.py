"""fp4lab.torch on CPU tensors: the forward GEMM and both backward GEMMs of fp4lab.torch.Linear bit-identical to
the golden model (the numpy API) applied to the same operands, for every recipe; SR reproducible across runs
and thread counts and keyed by step and layer; the bf16 recipe equal to nn.Linear; convert() keeping parameters
and state-dict keys; a small model's loss going down under every recipe.

On a machine with a GPU the same module also checks the CUDA path against the CPU path bit for bit."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import fp4lab
import fp4lab.torch as ft
from fp4lab import _core

QUANT_RECIPES = ["ufp4", "e2m1-ref", "nvfp4", "mxfp4"]
# The CUDA layer against the CPU's bits under the other SR draws too (the presets draw philox4).
DRAW_CASES = QUANT_RECIPES + ["ufp4@philox1", "ufp4@philox16", "nvfp4@philox16"]
CUDA = torch.cuda.is_available() and _core.cuda_built


def bits(t):
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return a.view(np.uint32)


def golden(a, b, recipe, p, layer, step, seed=0):
    """C = A · Bᵀ with both operands quantised by the numpy API under the recipe's training settings."""
    kw = dict(seed=_core.training_seed(seed, step), stream=layer)
    qa = fp4lab.quantize_with(np.ascontiguousarray(a, np.float32), fp4lab.config(recipe, pass_=p, operand="a", **kw))
    qb = fp4lab.quantize_with(np.ascontiguousarray(b, np.float32), fp4lab.config(recipe, pass_=p, operand="b", **kw))
    return fp4lab.gemm(qa, qb)


def make_layer(recipe, in_f=64, out_f=96, layer_id=3, seed=0, mode="exact"):
    """recipe: a preset's name, or NAME@DRAW for the preset under another SR draw (docs/spec.md §4)."""
    torch.manual_seed(seed)
    name, _, draw = recipe.partition("@")
    kw = {"sr_draw": draw} if draw else {}
    lin = ft.Linear(in_f, out_f, bias=False, recipe=ft.Recipe(name, mode=mode, **kw), layer_id=layer_id)
    return lin


@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_linear_gemms_bit_identical_to_golden(recipe):
    lin = make_layer(recipe)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 64, generator=g) * 3  # tokens = 64
    x[0, 5, 7] = 40.0  # an outlier, so the scales differ across blocks
    x.requires_grad_(True)
    dy = torch.randn(2, 32, 96, generator=g)
    for step in range(2):  # step 1 draws other SR bits
        assert lin.step == step
        y = lin(x)
        y.backward(dy)
        X = x.detach().reshape(64, 64).numpy()
        W = lin.weight.detach().numpy()
        DY = dy.reshape(64, 96).numpy()
        y_ref = golden(X, W, recipe, "fwd_y", 3, step)
        dx_ref = golden(DY, W.T, recipe, "bwd_dx", 3, step)
        dw_ref = golden(DY.T, X.T, recipe, "bwd_dw", 3, step)
        assert np.array_equal(bits(y.reshape(64, 96)), bits(y_ref)), (recipe, step, "fwd_y")
        assert np.array_equal(bits(x.grad.reshape(64, 64)), bits(dx_ref)), (recipe, step, "bwd_dx")
        assert np.array_equal(bits(lin.weight.grad), bits(dw_ref)), (recipe, step, "bwd_dw")
        x.grad = None
        lin.weight.grad = None


def test_bias_and_bf16_activations():
    torch.manual_seed(0)
    lin = ft.Linear(64, 32, bias=True, recipe="ufp4", layer_id=0).to(torch.bfloat16)
    x = torch.randn(64, 64).to(torch.bfloat16)
    y = lin(x)
    assert y.dtype == torch.bfloat16
    ref = golden(x.float().numpy(), lin.weight.float().detach().numpy(), "ufp4", "fwd_y", 0, 0)
    want = torch.from_numpy(ref).to(torch.bfloat16) + lin.bias.detach()
    assert torch.equal(y, want)


def test_autocast_casts_operands_as_f_linear_does():
    """Under BF16 autocast with FP32 master weights the quantiser sees the BF16 copies of X and W (what F.linear
    would give cuBLAS), the output is BF16, and the gradients reach the FP32 leaves."""
    torch.manual_seed(0)
    lin = ft.Linear(64, 32, bias=True, recipe="ufp4", layer_id=0)
    x = (torch.randn(64, 64) * 3).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    xb, wb = x.detach().to(torch.bfloat16).float().numpy(), lin.weight.detach().to(torch.bfloat16).float().numpy()
    ref = golden(xb, wb, "ufp4", "fwd_y", 0, 0)
    assert torch.equal(y, torch.from_numpy(ref).to(torch.bfloat16) + lin.bias.detach().to(torch.bfloat16))
    assert not torch.equal(torch.from_numpy(golden(x.detach().numpy(), lin.weight.detach().numpy(), "ufp4", "fwd_y",
                                                   0, 0)).to(torch.bfloat16), torch.from_numpy(ref).to(torch.bfloat16))
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32
    assert lin.bias.grad.dtype == torch.float32 and torch.isfinite(lin.weight.grad).all()


def test_bf16_recipe_is_nn_linear():
    torch.manual_seed(0)
    ref = nn.Linear(48, 80).to(torch.bfloat16)
    ours = ft.Linear.from_linear(ref, "bf16")
    x1 = torch.randn(5, 48).to(torch.bfloat16).requires_grad_(True)
    x2 = x1.detach().clone().requires_grad_(True)
    y1, y2 = ref(x1), ours(x2)
    assert torch.equal(y1, y2)
    dy = torch.randn_like(y1)
    y1.backward(dy)
    g1 = (x1.grad.clone(), ref.weight.grad.clone(), ref.bias.grad.clone())
    ref.weight.grad = ref.bias.grad = None
    y2.backward(dy)
    assert torch.equal(g1[0], x2.grad) and torch.equal(g1[1], ours.weight.grad) and torch.equal(g1[2], ours.bias.grad)


def test_sr_keyed_by_step_layer_and_seed():
    torch.manual_seed(0)
    dy = torch.randn(64, 64).numpy()
    r = ft.Recipe("ufp4")
    codes = lambda **k: fp4lab.quantize_with(dy, r.config("bwd_dx", "a", **k)).codes  # noqa: E731
    base = codes(layer=0, step=0)
    assert np.array_equal(base, codes(layer=0, step=0))
    assert not np.array_equal(base, codes(layer=0, step=1))
    assert not np.array_equal(base, codes(layer=1, step=0))
    assert not np.array_equal(base, fp4lab.quantize_with(dy, ft.Recipe("ufp4", seed=1).config("bwd_dx", "a", layer=0,
                                                                                                 step=0)).codes)
    # Operands that the recipe rounds to nearest do not depend on the key.
    assert np.array_equal(fp4lab.quantize_with(dy, r.config("fwd_y", "a", layer=0, step=0)).codes,
                          fp4lab.quantize_with(dy, r.config("fwd_y", "a", layer=5, step=9)).codes)


TRAIN_SNIPPET = r"""
import hashlib, sys, torch, fp4lab.torch as ft
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
ft.convert(m, ft.Recipe(sys.argv[2], seed=7))
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
for _ in range(3):
    x = torch.randn(64, 64, generator=g)
    loss = (m(x) - x.flip(1)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
h = hashlib.sha256()
for p in m.parameters():
    h.update(p.detach().numpy().tobytes())
print(h.hexdigest())
"""


def test_recipe_config_is_the_knobs_config_at_every_step_and_layer():
    # Recipe.config derives a step's settings from its layer's by the SR seed alone: they must be what the knobs
    # give for that (seed, step, layer), for the presets and the ablations, at any step.
    for name in QUANT_RECIPES + [a for a in fp4lab.ABLATIONS if a not in QUANT_RECIPES]:
        r = ft.Recipe(name, seed=7)
        for step in (0, 1, 2**40 + 3, 1):
            for layer in (0, 5):
                for p in ("fwd_y", "bwd_dx", "bwd_dw"):
                    for o in ("a", "b"):
                        want = fp4lab.config(name, pass_=p, operand=o, seed=_core.training_seed(7, step), stream=layer)
                        got = r.config(p, o, layer=layer, step=step)
                        assert got.to_dict() == want.to_dict(), (name, step, layer, p, o)


@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_training_reproducible_across_runs_and_thread_counts(recipe):
    digests = set()
    for threads in ("1", "2", "2"):
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        r = subprocess.run([sys.executable, "-c", TRAIN_SNIPPET, threads, recipe], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        digests.add(r.stdout.strip())
    assert len(digests) == 1, digests


def test_convert_keeps_parameters_and_state_dict():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 16)))
    keys = list(m.state_dict().keys())
    params = [id(p) for p in m.parameters()]
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    ft.convert(m, "e2m1-ref", exclude=r"^2\.1$")
    # nn.Linear's keys, and the SR step of each converted layer beside them.
    assert list(m.state_dict().keys()) == keys[:2] + ["0._extra_state"] + keys[2:4] + ["2.0._extra_state"] + keys[4:]
    assert [id(p) for p in m.parameters()] == params
    assert isinstance(m[0], ft.Linear) and isinstance(m[2][0], ft.Linear)
    assert type(m[2][1]) is nn.Linear  # excluded
    assert (m[0].layer_id, m[2][0].layer_id) == (ft.layer_id_of("0"), ft.layer_id_of("2.0"))
    m.load_state_dict(sd)  # checkpoints load either way, strictly
    m2 = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64))
    ft.convert(m2, "ufp4", include=r"^1$")
    assert type(m2[0]) is nn.Linear and isinstance(m2[1], ft.Linear)


def test_fast_mode_on_the_cpu_is_the_golden_gemm():
    # On the CPU fast mode multiplies the same quantised operands with the golden GEMM (there faster than
    # dequantising and torch's FP32 matmul), so its output is exact mode's, bit for bit.
    lin = make_layer("nvfp4", mode="fast")
    x = torch.randn(64, 64)
    y = lin(x)
    r = lin.recipe
    qa = ft.quantize(x, r.config("fwd_y", "a", layer=3, step=0))
    qb = ft.quantize(lin.weight, r.config("fwd_y", "b", layer=3, step=0))
    want = torch.from_numpy(fp4lab.gemm(qa, qb))
    assert torch.equal(y.view(torch.int32), want.view(torch.int32))
    assert torch.equal(make_layer("nvfp4")(x).view(torch.int32), y.view(torch.int32))
    assert torch.equal(ft.product(qa, qb, "fast").view(torch.int32), want.view(torch.int32))


def test_shape_faults():
    lin = make_layer("mxfp4")
    # 48 tokens: wgrad (K = tokens) takes them as 64, its last block zero-padded (docs/spec.md; the bits are checked
    # in test_torch_any_tokens.py).
    lin(torch.randn(48, 64, requires_grad=True)).sum().backward()
    assert lin.weight.grad.shape == (96, 64) and bool(lin.weight.grad.abs().sum() > 0)
    with torch.no_grad():
        assert lin(torch.randn(48, 64)).shape == (48, 96)  # inference needs no wgrad
    # in = 40 cannot work under ufp4 (fwd_y reduces over it): refused when the layer is made.
    with pytest.raises(ValueError, match="reduction dimension 40 is not a multiple of the block size 16"):
        ft.Linear(40, 32, recipe="ufp4", layer_id=0)
    with pytest.raises(ValueError, match="unknown recipe"):
        ft.Recipe("fp3")
    with pytest.raises(TypeError, match="unexpected keyword"):
        ft.Recipe("ufp4", fromat="e2m1")
    with pytest.raises(ValueError, match="unknown format"):
        ft.Recipe(format="e3m0")
    x = torch.randn(16, 32)
    x[3, 4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        ft.Linear(32, 16, recipe="ufp4", layer_id=0)(x)


@pytest.mark.parametrize("recipe", ["bf16"] + QUANT_RECIPES)
def test_small_model_learns(recipe):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    ft.convert(m, recipe)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2)
    target = torch.randn(32, 32, generator=g) / 4
    losses = []
    for _ in range(60):
        x = torch.randn(64, 32, generator=g)
        loss = (m(x) - x @ target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (recipe, losses[:5], losses[-10:])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", DRAW_CASES)
def test_cuda_linear_bit_identical_to_cpu(recipe):
    # FP32 and BF16 layers: a BF16 layer's exact GEMMs write BF16 C in the kernel's epilogue (and check it there),
    # which must be the CPU's FP32 contract values rounded to BF16.
    for dt in (torch.float32, torch.bfloat16):
        cpu = make_layer(recipe, mode="exact").to(dt)
        gpu = make_layer(recipe, mode="exact").cuda().to(dt)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 32, 64, generator=g).to(dt)
        dy = torch.randn(2, 32, 96, generator=g).to(dt)
        xc, xg = x.clone().requires_grad_(True), x.cuda().requires_grad_(True)
        yc, yg = cpu(xc), gpu(xg)
        yc.backward(dy)
        yg.backward(dy.cuda())
        assert yg.dtype == dt and xg.grad.dtype == dt and gpu.weight.grad.dtype == dt
        b = lambda t: t.detach().cpu().view(torch.int16 if dt == torch.bfloat16 else torch.int32)  # noqa: E731
        assert torch.equal(b(yc), b(yg)), (recipe, dt)
        assert torch.equal(b(xc.grad), b(xg.grad)), (recipe, dt)
        assert torch.equal(b(cpu.weight.grad), b(gpu.weight.grad)), (recipe, dt)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_quantize_and_reference_kernel_match_golden():
    torch.manual_seed(0)
    a = torch.randn(128, 256) * 5
    b = torch.randn(64, 256)
    for recipe in QUANT_RECIPES:
        for p in ("fwd_y", "bwd_dx", "bwd_dw"):
            ca, cb = fp4lab.config(recipe, pass_=p, operand="a"), fp4lab.config(recipe, pass_=p, operand="b")
            ha, hb = ft.quantize(a, ca), ft.quantize(b, cb)
            for path in ("fused", "unfused"):
                da, db = ft.quantize(a.cuda(), ca, rht_path=path), ft.quantize(b.cuda(), cb, rht_path=path)
                assert np.array_equal(da.to_host().codes, ha.codes) and np.array_equal(db.to_host().codes, hb.codes)
                assert np.array_equal(bits(da.to_host().scales), bits(ha.scales))
                want = bits(ft.gemm(ha, hb))
                assert np.array_equal(bits(ft.gemm(da, db)), want), (recipe, p, path)
                # The output check and the BF16 rounding in the kernel's epilogue: the same bits as the FP32 C
                # checked and converted after it.
                assert np.array_equal(bits(ft.gemm(da, db, check_finite="deferred")), want), (recipe, p, path)
                c16 = ft.gemm(da, db, check_finite="deferred", out_dtype=torch.bfloat16)
                assert c16.dtype == torch.bfloat16
                assert torch.equal(c16.cpu().view(torch.int16),
                                   ft.gemm(ha, hb).to(torch.bfloat16).view(torch.int16)), (recipe, p, path)
                ft.check_finite()
                assert np.array_equal(bits(ft.gemm(da, db, kernel="reference")), want), (recipe, p, path)
                # The fast GEMM with its fused epilogue off (the separate multiply and add) gives the same bits.
                was = fp4lab._core.cuda_gemm_fused_epilogue(False)
                try:
                    assert np.array_equal(bits(ft.gemm(da, db)), want), (recipe, p, path, "unfused epilogue")
                finally:
                    assert fp4lab._core.cuda_gemm_fused_epilogue(was) is False
                # Every tile variant of the fast GEMM (on an H200 the wgmma one too), forced as a step's GEMMs
                # would run it, in BF16 and FP32: the same bits.
                for v in range(fp4lab._core.cuda_gemm_variants()):
                    was = fp4lab._core.cuda_gemm_variant(v)
                    try:
                        assert np.array_equal(bits(ft.gemm(da, db)), want), (recipe, p, path, "variant", v)
                        c16v = ft.gemm(da, db, check_finite="deferred", out_dtype=torch.bfloat16)
                        assert torch.equal(c16v.view(torch.int16), c16.view(torch.int16)), (recipe, p, path, v)
                    finally:
                        assert fp4lab._core.cuda_gemm_variant(was) == v
                with pytest.raises(ValueError, match="no fast GEMM variant"):
                    fp4lab._core.cuda_gemm_variant(fp4lab._core.cuda_gemm_variants())
                assert torch.equal(ft.dequantize(da).cpu(), ft.dequantize(ha))
                assert torch.equal(ft._dequantize(da, torch.bfloat16).cpu(), ft.dequantize(ha).to(torch.bfloat16))
            # A BF16 tensor quantises on the GPU to the bits of its FP32 copy on the host.
            a16 = a.to(torch.bfloat16)
            h16, d16 = ft.quantize(a16, ca), ft.quantize(a16.cuda(), ca)
            assert np.array_equal(d16.to_host().codes, h16.codes), (recipe, p)
            assert np.array_equal(bits(d16.to_host().scales), bits(h16.scales)), (recipe, p)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_two_streams_at_once_give_the_golden_bits():
    # The kernels' scratch memory (amax buffers, the rotated and transposed copies, the GEMM's unpacked operands)
    # is one set per device and stream: two streams quantising and multiplying at once, with no synchronisation
    # between them, each get the golden model's bits. nvfp4 uses the tensor-amax scratch, the unfused RHT path the
    # rotated copy, the transposed views the transposed copy.
    torch.manual_seed(0)
    jobs = []
    for i, (recipe, p) in enumerate((("nvfp4", "bwd_dx"), ("ufp4", "bwd_dw"), ("mxfp4", "fwd_y"), ("ufp4", "fwd_y"))):
        a = torch.randn(1024 + 128 * i, 2048) * (1 + i)
        b = torch.randn(512, 2048)
        ca, cb = fp4lab.config(recipe, pass_=p, operand="a"), fp4lab.config(recipe, pass_=p, operand="b")
        want = bits(ft.gemm(ft.quantize(a, ca), ft.quantize(b, cb)))
        jobs.append((a.cuda(), b.t().contiguous().cuda(), ca, cb, want))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    out = []
    for it in range(8):
        for j, (a, bt, ca, cb, _) in enumerate(jobs):
            with torch.cuda.stream(streams[(j + it) % 2]):
                qa = ft.quantize(a, ca, rht_path="unfused", check_finite="deferred")
                qb = ft.quantize(bt.t(), cb, check_finite="deferred")  # a transposed view, read in place
                out.append((j, ft.gemm(qa, qb, check_finite="deferred")))
    torch.cuda.synchronize()
    ft.check_finite()
    for j, c in out:
        assert np.array_equal(bits(c), jobs[j][4]), j


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_gemm_epilogue_bound_is_the_contract_epilogue_rate_of_the_device():
    """The bound --bound and `fp4lab cuda bench` report: 4 FP32 instructions per output and block with FP32 scales
    (ufp4), 2 where both operands' scale kinds allow the fused form (nvfp4's UE4M3, mxfp4's UE8M0) while the fused
    epilogue is on, on 128 FP32 lanes of each of the device's SMs, 2 * block operations per output and block."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for recipe, want in (("ufp4", 4), ("nvfp4", 2), ("mxfp4", 2)):
        a, b = (fp4lab.config(recipe, pass_="fwd_y", operand=o) for o in ("a", "b"))
        rate, instructions, n, khz = fp4lab._core.cuda_gemm_epilogue_bound(0, a, b)
        assert (instructions, n) == (want, sms) and khz > 0, recipe
        assert rate == 128 * sms * khz * 1e3 / want * 2 * a.block, recipe
        if (sms, khz, recipe) == (132, 1980000, "ufp4"):  # an H100 SXM or H200 at its maximum clock
            assert rate == 267.63264e12  # kernels/README.md's 268 TOPS for block 16 with FP32 scales
        was = fp4lab._core.cuda_gemm_fused_epilogue(False)
        try:
            assert fp4lab._core.cuda_gemm_epilogue_bound(0, a, b)[1] == 4, recipe
        finally:
            fp4lab._core.cuda_gemm_fused_epilogue(was)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_transposed_views_and_fake_quantisation_match_the_row_major_operand():
    # The backward GEMMs' operands Wᵀ, dYᵀ and Xᵀ are transposed views: the kernels read them in place, with the
    # bits of the row-major copy; fake quantisation gives the dequantiser's BF16 values of that operand in one pass.
    torch.manual_seed(0)
    t = torch.randn(256, 96) * 3
    for recipe in QUANT_RECIPES:
        for p in ("fwd_y", "bwd_dx", "bwd_dw"):
            cfg = fp4lab.config(recipe, pass_=p, operand="a")
            for dt in (torch.float32, torch.bfloat16):
                src = t.to(dt).cuda()
                for view in (src, src.t()):
                    ref = ft.quantize(view.contiguous(), cfg)
                    q = ft.quantize(view, cfg)
                    assert np.array_equal(q.to_host().codes, ref.to_host().codes), (recipe, p, dt, view.shape)
                    assert np.array_equal(bits(q.to_host().scales), bits(ref.to_host().scales))
                    want = ft._dequantize(ref, torch.bfloat16)
                    got_q = ft.QTensorCUDA()
                    got = ft.fake_quantize(view, cfg, out=got_q)
                    assert got.dtype == torch.bfloat16 and got.shape == want.shape
                    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (recipe, p, dt, view.shape)
                    assert np.array_equal(got_q.to_host().codes, ref.to_host().codes)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", DRAW_CASES)
def test_cuda_fast_layer_is_the_product_of_dequantised_operands(recipe):
    # fast mode's fused path gives what product(…, "fast") makes of the quantised operands, bit for bit, in all
    # three GEMMs (the backward ones from transposed views).
    layer = make_layer(recipe, mode="fast").cuda().to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 32, 64, generator=g).to(torch.bfloat16).cuda().requires_grad_(True)
    dy = torch.randn(2, 32, 96, generator=g).to(torch.bfloat16).cuda()
    step = layer.step
    y = layer(x)
    y.backward(dy)
    cfg = lambda p, o: layer.recipe.config(p, o, layer=layer.layer_id, step=step)  # noqa: E731
    x2, dy2, w = x.detach().reshape(-1, 64), dy.reshape(-1, 96), layer.weight.detach()
    q = lambda v, p, o: ft.quantize(v.contiguous(), cfg(p, o))  # noqa: E731
    want_y = ft.product(q(x2, "fwd_y", "a"), q(w, "fwd_y", "b"), "fast")
    want_dx = ft.product(q(dy2, "bwd_dx", "a"), q(w.t(), "bwd_dx", "b"), "fast")
    want_dw = ft.product(q(dy2.t(), "bwd_dw", "a"), q(x2.t(), "bwd_dw", "b"), "fast")
    assert torch.equal(y.reshape(-1, 96).view(torch.int16), want_y.view(torch.int16))
    assert torch.equal(x.grad.reshape(-1, 64).view(torch.int16), want_dx.view(torch.int16))
    assert torch.equal(layer.weight.grad.view(torch.int16), want_dw.view(torch.int16))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", QUANT_RECIPES)
def test_cuda_fake_quantize_both_is_both_fake_quantisations(recipe):
    # One read for both orientations gives what the two fake_quantize calls give, bit for bit: BF16 and FP32
    # inputs, a shape that is not a multiple of the fused kernel's 64 x 128 tile, the step's operand pairs.
    g = torch.Generator().manual_seed(11)
    pairs = [(("fwd_y", "a"), ("bwd_dw", "b")), (("bwd_dx", "a"), ("bwd_dw", "a")), (("fwd_y", "b"), ("bwd_dx", "b"))]
    for dt in (torch.bfloat16, torch.float32):
        x = torch.randn(224, 352, generator=g).to(dt).cuda()
        for first, second in pairs:
            cfg = fp4lab.config(recipe, pass_=first[0], operand=first[1])
            cfg_t = fp4lab.config(recipe, pass_=second[0], operand=second[1])
            y, yt = ft.fake_quantize_both(x, cfg, cfg_t)
            assert torch.equal(y.view(torch.int16), ft.fake_quantize(x, cfg).view(torch.int16)), (first, dt)
            assert torch.equal(yt.view(torch.int16), ft.fake_quantize(x.t(), cfg_t).view(torch.int16)), (second, dt)
    with pytest.raises(ValueError, match="must be 2-D"):
        ft.fake_quantize_both(torch.zeros(2, 16, 16).cuda(), cfg, cfg_t)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_cuda_fast_layer_reads_x_w_and_dy_once_for_both_gemms(recipe, monkeypatch):
    # A BF16 fast layer quantises X and Xᵀ, W and Wᵀ, dY and dYᵀ in three calls of fake_quantize_both's body
    # (_fake_both), and its outputs and gradients are those of the path that quantises each operand on its own
    # (fast_pair turned off).
    import fp4lab.torch._layer as layer_mod
    import fp4lab.torch.ops as ops
    calls = []
    real = ops._fake_both
    monkeypatch.setattr(ops, "_fake_both", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))

    def run(pairs_on):
        layer = make_layer(recipe, mode="fast").cuda().to(torch.bfloat16)
        g = torch.Generator().manual_seed(5)
        x = torch.randn(2, 64, 64, generator=g).to(torch.bfloat16).cuda().requires_grad_(True)
        dy = torch.randn(2, 64, 96, generator=g).to(torch.bfloat16).cuda()
        if not pairs_on:
            monkeypatch.setattr(layer_mod, "fast_pair", lambda *a, **k: None)
        y = layer(x)
        y.backward(dy)
        monkeypatch.setattr(layer_mod, "fast_pair", ops.fast_pair)
        return y, x.grad, layer.weight.grad

    fused = run(True)
    assert calls == [torch.Size([128, 64]), torch.Size([96, 64]), torch.Size([128, 96])]
    calls.clear()
    single = run(False)
    assert calls == []
    for a, b, what in zip(fused, single, ("y", "dx", "dw")):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), what


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_fast_layer_under_no_grad_quantises_only_the_forward_operands(monkeypatch):
    # Without grad mode no backward follows: a fast layer whose input and weight require grad quantises X and W for
    # the forward only (two fake_quantize calls, no Xᵀ or Wᵀ from _fake_both), and gives the output it gives with
    # grad enabled.
    import fp4lab.torch.ops as ops
    both, single = [], []
    real_both, real_single = ops._fake_both, ops.fake_quantize
    monkeypatch.setattr(ops, "_fake_both", lambda *a, **k: both.append(a[0].shape) or real_both(*a, **k))
    monkeypatch.setattr(ops, "fake_quantize", lambda *a, **k: single.append(a[0].shape) or real_single(*a, **k))
    layer = make_layer("ufp4", mode="fast").cuda().to(torch.bfloat16)
    x = torch.randn(2, 64, 64).to(torch.bfloat16).cuda().requires_grad_(True)
    ft.set_step(layer, 4)
    with torch.no_grad():
        y0 = layer(x)
    assert both == [] and single == [torch.Size([128, 64]), torch.Size([96, 64])]
    ft.set_step(layer, 4)
    y1 = layer(x)
    assert len(both) == 2 and len(single) == 2
    assert torch.equal(y0.view(torch.int16), y1.detach().view(torch.int16))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_fast_layer_output_checks_read_the_operands_bounds(output_checks):
    # A fast layer's deferred output checks read the magnitude bounds fake_quantize_both leaves with the operands:
    # the three GEMMs of a step take the product check (no plain scan), and an output that does overflow BF16 is
    # still found (its bounds prove nothing, so it is scanned) and reported at the next check.
    layer = make_layer("ufp4", mode="fast").cuda().to(torch.bfloat16)
    assert layer.recipe.check_finite == "deferred"
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 64, 64, generator=g).to(torch.bfloat16).cuda()
    dy = torch.randn(2, 64, 96, generator=g).to(torch.bfloat16).cuda()  # dense: (a sum's is a strided view)
    layer(x.clone().requires_grad_(True)).backward(dy)
    assert output_checks.seen == ["product"] * 3
    ft.check_finite()  # nothing flagged
    output_checks.overflow_is_reported(layer, layer, x, dy)


def test_the_deferred_check_reads_a_landed_copy_and_waits_only_with_two_in_flight(monkeypatch):
    # The layers' read of the flag (ops._read_snapshots) on a stand-in device: a CPU flag, and events whose copies
    # land when the test says (or when waited for, which the test counts).
    import fp4lab.torch.ops as ops

    class Event:
        waits = 0

        def __init__(self):
            self.landed = True

        def record(self, stream):
            self.landed = False

        def query(self):
            return self.landed

        def synchronize(self):
            Event.waits += not self.landed
            self.landed = True

    flag = torch.zeros(1, dtype=torch.int32)
    monkeypatch.setattr(ops, "_flags", {0: flag})
    monkeypatch.setattr(ops, "_pending", {0: []})
    monkeypatch.setattr(ops, "_free", {0: [(Event(), torch.zeros(1, dtype=torch.int32)) for _ in range(3)]})
    monkeypatch.setattr(ops.torch.cuda, "current_stream", lambda i: None)

    def land_all():
        for ev, _, _ in ops._pending[0]:
            ev.landed = True

    def in_flight():
        return [at for _, _, at in ops._pending[0]]

    ops._read_snapshots(10)  # the copy before the fault
    flag[0] = ops._INPUT      # step 10's kernels flag an input
    ops._read_snapshots(11)  # copies the flag; the copy before it has not landed: nothing read, nothing waited
    assert Event.waits == 0 and in_flight() == [10, 11]
    ops._read_snapshots(11)  # the step's first layer again (a recomputed forward): no copy, no wait
    ops._read_snapshots(9)   # a model behind: no copy, no wait
    assert Event.waits == 0 and in_flight() == [10, 11]
    flag[0] |= ops._OUTPUT    # after step 11's copy, an output overflows too
    land_all()
    with pytest.raises(ValueError, match="cuda:0: an input tensor .* NaN or Inf before step 11 .*; also, the output "
                                         "of a quantised GEMM overflowed$"):
        ops._read_snapshots(12)
    # Cleared, and the step's own copy taken before the raise.
    assert int(flag[0]) == 0 and in_flight() == [12] and len(ops._free[0]) == 2 and Event.waits == 0
    land_all()
    # With the GPU behind (no copy lands), the third step waits for the oldest copy, and the fault of step 20 raises
    # at step 22, the read of step 21's copy.
    ops._read_snapshots(20)
    flag[0] = ops._OUTPUT
    ops._read_snapshots(21)
    ops._read_snapshots(22)  # waits for step 20's copy (clean)
    assert Event.waits == 1 and in_flight() == [21, 22]
    with pytest.raises(ValueError, match="output of a quantised GEMM overflowed before step 21$"):
        ops._read_snapshots(23)  # waits for step 21's, then for step 22's, which the clearing drops
    assert Event.waits == 3 and int(flag[0]) == 0 and in_flight() == [23] and len(ops._free[0]) == 2
    land_all()
    for s in range(30, 40):  # clean steps, every copy landing at once: no wait, at most one copy in flight
        ops._read_snapshots(s)
        assert len(ops._pending[0]) == 1
        land_all()
    assert Event.waits == 3


def event_waits(monkeypatch):
    """Each torch.cuda.Event.synchronize() call's event, as landed (True) or not yet (False, a real wait): torch's sync
    debug mode does not count an event wait."""
    seen, real = [], torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda ev: (seen.append(ev.query()), real(ev))[1])
    return seen


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_deferred_finite_check_raises_two_steps_later_under_sync_debug_mode(monkeypatch):
    layer = make_layer("ufp4").cuda()
    assert layer.recipe.check_finite == "deferred"
    layer(torch.randn(32, 64).cuda().requires_grad_(True)).sum().backward()  # the flag and its snapshots exist
    ft.check_finite()
    bad = torch.randn(32, 64).cuda()
    bad[3, 5] = float("nan")
    good = torch.randn(32, 64).cuda()  # (a copy from host memory that is not pinned synchronises)
    waits = event_waits(monkeypatch)
    torch.cuda.set_sync_debug_mode("error")  # a synchronisation raises RuntimeError
    try:
        # Step k holds the fault, and step k + 1's first forward copies the flag: neither waits for the GPU.
        layer(bad.requires_grad_(True)).sum().backward()
        layer(good.requires_grad_(True)).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert False not in waits
    k = layer.step - 2
    torch.cuda.synchronize()  # the copy has landed: step k + 2 reads it
    with pytest.raises(ValueError, match=f"NaN or Inf before step {k + 1} "):
        layer(torch.randn(32, 64).cuda())
    for _ in range(3):
        layer(torch.randn(32, 64).cuda())  # the flag and its copies were cleared
    # Without the wait, a fault at step m raises at step m + 2 or, with the GPU behind, at step m + 3.
    layer(bad)
    raised = []
    for i in range(1, 4):  # steps m + 1 .. m + 3
        try:
            layer(torch.randn(32, 64).cuda())
        except ValueError:
            raised.append(i)
    assert raised in ([2], [3])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_deferred_output_check_in_the_gemm_epilogue():
    # Finite operands whose product passes FP32: the fast kernel's epilogue sets the output bit, for an FP32 and a
    # BF16 C alike, and check_finite() reports it once.
    cfg = fp4lab.config("nvfp4", pass_="fwd_y", operand="a")  # no RHT, whose sums would overflow first
    a = torch.full((32, 64), 3e38).cuda()
    qa = ft.quantize(a, cfg)
    for dt in (torch.float32, torch.bfloat16):
        c = ft.gemm(qa, qa, check_finite="deferred", out_dtype=dt)  # no synchronisation, no error yet
        assert c.dtype == dt
        with pytest.raises(ValueError, match="overflowed since the last check"):
            ft.check_finite()
        ft.check_finite()  # the flag was cleared


def test_a_training_step_after_an_inference_mode_eval_at_its_step_trains():
    # Forwards share one step tensor per step value: an eval under torch.inference_mode at step s (which does not
    # advance the step) must not leave an inference tensor that the training forward at s then saves for backward.
    lin = make_layer("ufp4")
    x = torch.randn(32, 64)
    ft.set_step(lin, 987_654_321)  # a step no other test has reached
    lin.eval()
    with torch.inference_mode():
        y0 = lin(x)
    lin.train()
    xg = x.clone().requires_grad_(True)
    y1 = lin(xg)
    y1.sum().backward()
    assert torch.equal(y0, y1.detach()) and xg.grad is not None and lin.weight.grad is not None
    assert lin.step == 987_654_322


def test_capture_rules_refuse_what_a_replay_cannot_repeat():
    # The checks a forward captured in a CUDA graph runs (_layer.check_capture), on a CPU layer standing in for a
    # CUDA one: the device SR key must exist, a sync finite check cannot be captured, and a layer takes one step
    # per graph (a recomputed forward repeats its step; set_step starts a new capture).
    from fp4lab.torch._layer import check_capture
    lin, cpu = make_layer("ufp4"), torch.device("cpu")
    with pytest.raises(RuntimeError, match="run a step on cpu before capturing one in a CUDA graph"):
        check_capture(lin, lin, cpu, 0)
    lin._seed_dev = torch.zeros(1, dtype=torch.int64)
    check_capture(lin, lin, cpu, 4)
    check_capture(lin, lin, cpu, 4)
    with pytest.raises(RuntimeError, match=r"a second training step \(4, then 5\) of this layer in one captured"):
        check_capture(lin, lin, cpu, 5)
    ft.set_step(lin, 9)
    check_capture(lin, lin, cpu, 9)
    assert int(lin._seed_dev) == _core.training_seed(0, 9) - (2**64 if _core.training_seed(0, 9) >= 2**63 else 0)
    sync = ft.Linear(64, 96, recipe=ft.Recipe("ufp4", check_finite="sync"))
    sync._seed_dev = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="check_finite='sync' synchronises at every operand"):
        check_capture(sync, sync, cpu, 0)


def _graph_mlp(recipe, mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    return ft.convert(model, ft.Recipe(recipe, mode=mode)).cuda()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe,mode", [("ufp4", "exact"), ("ufp4", "fast"), ("nvfp4", "exact"), ("nvfp4", "fast")])
def test_cuda_an_eager_training_step_passes_sync_debug_mode_and_waits_on_no_event(recipe, mode, monkeypatch):
    # Forward, backward and a fused AdamW of an MLP under the deferred check: torch raises at any synchronisation
    # (a .item(), a blocking copy, a stream or device wait) once the flag and its host words exist (the first step),
    # and this GPU, never two steps behind, makes the layers wait on no copy of the flag, which each step reads.
    import fp4lab.torch.ops as ops
    reads, real = [], ops._read_snapshots
    monkeypatch.setattr(ops, "_read_snapshots", lambda step: (reads.append(step), real(step))[1])
    waits = event_waits(monkeypatch)
    model = _graph_mlp(recipe, mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(256, 64, generator=g).cuda() for _ in range(6)]
    torch.cuda.synchronize()
    for i, x in enumerate(xs):
        torch.cuda.set_sync_debug_mode("error" if i else "default")
        try:
            opt.zero_grad(set_to_none=False)
            (model(x) - x).square().mean().backward()
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    ft.check_finite()  # nothing flagged
    assert len(reads) >= len(xs) - 1 and False not in waits


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_the_deferred_check_waits_only_with_the_host_two_steps_ahead(monkeypatch):
    # Each forward behind 0.1 s of GPU sleep: the GPU falls behind at once. The first two forwards leave two copies
    # in flight without waiting; the third waits for the oldest, and only for it.
    layer = make_layer("ufp4").cuda()
    ft.set_step(layer, 10**9)  # later than any copy an earlier test left in flight: each forward takes one
    xs = [torch.randn(32, 64).cuda() for _ in range(4)]
    layer(xs[0])
    ft.check_finite()
    waits = event_waits(monkeypatch)
    landed = []
    for x in xs[1:]:
        torch.cuda._sleep(200_000_000)  # about 0.1 s at 2 GHz
        layer(x)
        landed.append(list(waits))
    torch.cuda.synchronize()
    assert landed[0] in ([], [True]) and landed[1] == landed[0] and landed[2] == landed[0] + [False]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
@pytest.mark.parametrize("recipe,mode", [("ufp4", "exact"), ("ufp4", "fast"), ("nvfp4", "exact")])
def test_cuda_captured_training_step_replays_the_eager_steps_bit_for_bit(recipe, mode):
    # A whole training step (forward, backward, AdamW) captured in a CUDA graph: the kernels read each replay's SR
    # key on the device, where set_step() wrote it, so the replays compute the eager steps' bits. (ufp4 rounds dY
    # stochastically: replays that kept the key of the captured step would part from eager's at step 4.)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(256, 64, generator=g).cuda() for _ in range(8)]

    def loss_of(model, x):
        return (model(x) - x).square().mean()

    eager = _graph_mlp(recipe, mode)
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2, fused=True, capturable=True)
    want = []
    for x in xs:
        opt.zero_grad(set_to_none=False)
        loss = loss_of(eager, x)
        loss.backward()
        opt.step()
        want.append(loss.detach().clone())

    model = _graph_mlp(recipe, mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True, capturable=True)
    static_x = xs[0].clone()
    got = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up steps, eager (steps 0-2)
        for x in xs[:3]:
            static_x.copy_(x)
            opt.zero_grad(set_to_none=False)
            loss = loss_of(model, static_x)
            loss.backward()
            opt.step()
            got.append(loss.detach().clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_loss = loss_of(model, static_x)
        static_loss.backward()
        opt.step()
    for step, x in enumerate(xs[3:], start=3):
        ft.set_step(model, step)
        static_x.copy_(x)
        opt.zero_grad(set_to_none=False)
        graph.replay()
        got.append(static_loss.detach().clone())
    ft.check_finite()
    assert [bits(t).tolist() for t in got] == [bits(t).tolist() for t in want]
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert np.array_equal(bits(p), bits(q)), n


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build of fp4lab")
def test_cuda_capture_before_any_eager_step_is_refused():
    model = _graph_mlp("ufp4", "fast")
    x = torch.randn(256, 64).cuda()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="run a step on cuda:0 before capturing one in a CUDA graph"):
        with torch.cuda.graph(graph):
            model(x).sum().backward()


def test_a_training_step_asks_no_module_for_an_attribute_it_lacks(monkeypatch):
    """The launch path asks each GEMM's module for its owner, sr_shard and reduce_amax marks: a name nn.Module's
    __getattr__ refuses raises AttributeError, several µs of host time, thirteen times a layer and step in fast
    mode. Stepped modules answer them as attributes (an unmarked module: itself, None, None); a step of a Linear, a
    Conv1D and an attention, forward and backward, asks nn.Module for nothing it lacks."""
    misses = []
    lookup = nn.Module.__getattr__

    def counting(self, name):
        try:
            return lookup(self, name)
        except AttributeError:
            misses.append((type(self).__name__, name))
            raise

    torch.manual_seed(0)
    r = ft.Recipe("ufp4", mode="fast")
    lin, conv = ft.Linear(64, 32, recipe=r), ft.Conv1D(32, 64, recipe=r)
    nn.init.normal_(conv.weight, std=0.02)  # Conv1D's weight starts uninitialised, as Hugging Face's
    attn = ft.MultiheadAttention(64, 4, recipe=r, batch_first=True)
    x = torch.randn(2, 16, 64, requires_grad=True)
    monkeypatch.setattr(nn.Module, "__getattr__", counting)
    (lin(x).sum() + conv(x).sum() + attn(x, x, x)[0].sum()).backward()
    assert misses == []
    assert lin.owner is lin and lin._sr_shard is None and lin._amax_reduce is None
