"""sr_shard quantises a data-parallel rank's own rows only, at their place in the global batch, on the CPU and on a
CUDA device: two ranks are emulated in one process by splitting a batch's rows, and each rank's quantised
operands must be the single process's, bit for bit, on its rows (tokens in rows) or token columns (bwd_dw).

The second half of each batch is the first half negated, so every token operand's amax (per block, rotated too)
is the same on each half as on the whole: each rank's nvfp4 per-tensor scale is then the single process's without
an amax all-reduce (test_torch_dist_amax.py runs that all-reduce over gloo). The CUDA tests (names with "cuda") need
a GPU and a CUDA build; there the single process's operands come from the CUDA quantiser kernels and a rank's SR
operands from the same kernels given the rows' global indices (_core.cuda_quantize_at), which the tests below also
hold to the golden quantiser's bits (_core.quantize_f32_at), with no host quantiser call on the way."""
import fp4lab
import numpy as np
import pytest
import torch

import fp4lab.torch as ft
from fp4lab import _core
from fp4lab.torch import _quantizers

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
WORLD, N, K, OUT, LAYER = 2, 32, 64, 48, 11


def host(q):
    """(codes, block scales, global scale) of a QTensor or QTensorCUDA, on the host."""
    if not isinstance(q, _core.QTensor):
        q = q.to_host()
    return np.array(q.codes), np.array(q.scales), np.float32(q.global_scale)


def batch(dev):
    g = torch.Generator().manual_seed(7)
    x0, dy0 = torch.randn(N, K, generator=g), torch.randn(N, OUT, generator=g)
    x0[3, 5] = 9.0  # a large element: the amax is not where the other half's largest element happens to be
    return torch.cat([x0, -x0]).to(dev), torch.cat([dy0, -dy0]).to(dev)


def make(recipe, dev):
    torch.manual_seed(0)
    return ft.Linear(K, OUT, recipe=ft.Recipe(recipe, seed=5), layer_id=LAYER).to(dev)


def step(model, x, dy):
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(dy)
    return y.detach(), x.grad


def run_ranks(recipe, dev, sharded=True):
    """(the single process's operands, output and dX; each rank's), operands by (pass, operand)."""
    x, dy = batch(dev)
    ops = {}

    def observe(layer, step_, pass_, a, b, qa, qb, y, cfg):
        for o, q in (("a", qa), ("b", qb)):
            ops[(id(layer), pass_, o)] = host(q)

    ref = make(recipe, dev)
    ranks = [make(recipe, dev) for _ in range(WORLD)]
    if sharded:
        for r, m in enumerate(ranks):
            ft.sr_shard(m, r, WORLD)
    ft.ops.observers.append(observe)
    try:
        out = [step(ref, x, dy)] + [step(m, x[r * N:(r + 1) * N], dy[r * N:(r + 1) * N]) for r, m in enumerate(ranks)]
    finally:
        ft.ops.observers.remove(observe)
    per = [{k[1:]: v for k, v in ops.items() if k[0] == id(m)} for m in [ref] + ranks]
    return per, out


def part(kind, v, r):
    """Rank r's part of the single process's operand (codes, scales, global scale)."""
    codes, scales, g = v
    if kind == "rows":
        return codes[r * N:(r + 1) * N], scales[r * N:(r + 1) * N], g
    b = codes.shape[1] // scales.shape[1]
    return codes[:, r * N:(r + 1) * N], scales[:, r * N // b:(r + 1) * N // b], g


KIND = {("fwd_y", "a"): "rows", ("bwd_dx", "a"): "rows", ("bwd_dw", "a"): "cols", ("bwd_dw", "b"): "cols"}


def bits(v):
    return np.ascontiguousarray(np.atleast_1d(v)).view(np.uint8)


def faults(per, recipe):
    """The (rank, pass, operand) whose quantised token operand is not the single process's part, bit for bit."""
    bad = []
    for r in range(WORLD):
        for key, kind in KIND.items():
            want, got = part(kind, per[0][key], r), per[1 + r][key]
            if not all(np.array_equal(bits(w), bits(h)) for w, h in zip(want, got)):
                bad.append((r,) + key)
    return bad


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("recipe", ["nvfp4", "ufp4"])
def test_ranks_quantise_the_single_process_rows_cuda(recipe, dev):
    per, out = run_ranks(recipe, dev)
    assert faults(per, recipe) == []
    (y, dx), ranks = out[0], out[1:]
    for r, (yr, dxr) in enumerate(ranks):  # a token row's output and input gradient depend on its row only
        rows = slice(r * N, (r + 1) * N)
        assert torch.equal(yr.view(torch.int32), y[rows].contiguous().view(torch.int32))
        assert torch.equal(dxr.view(torch.int32), dx[rows].contiguous().view(torch.int32))


@pytest.mark.parametrize("dev", DEVICES)
def test_unsharded_ranks_draw_other_words_cuda(dev):
    # Without sr_shard the SR operands (dY) draw the words of other elements and differ: the second rank's dgrad
    # operand (its rows are the first rank's indices) and both ranks' wgrad operands (their columns are); the RTNE
    # operands agree.
    per, _ = run_ranks("nvfp4", dev, sharded=False)
    assert faults(per, "nvfp4") == [(0, "bwd_dw", "a"), (1, "bwd_dx", "a"), (1, "bwd_dw", "a")]


@pytest.mark.parametrize("dev", DEVICES)
def test_rows_anywhere_in_a_tensor_cuda(dev):
    # An expert's token rows are scattered rows of its global operand: quantised at those rows they are the whole's
    # rows, under SR, a per-tensor scale (the rows hold the whole's amax) and RHT.
    g = torch.Generator().manual_seed(3)
    whole = torch.randn(64, K, generator=g)
    whole[7, 3] = 20.0
    whole = whole.to(dev)
    idx = torch.tensor([0, 1, 2, 7, 8, 30, 31, 32, 63])
    cfg = ft.Recipe("nvfp4", seed=9).config("bwd_dw", "a", layer=4, step=2)
    want = host(ft.ops.quantize(whole, cfg))
    q = _quantizers.quantize_rows_of(whole[idx.to(dev)], cfg, "bwd_dw", "a", idx)
    got = host(q)  # on CUDA: the CUDA quantiser's operand, at the rows' global indices
    assert np.array_equal(got[0], want[0][idx.numpy()])
    assert np.array_equal(got[1].view(np.uint32), want[1][idx.numpy()].view(np.uint32))
    assert got[2] == want[2]
    # as the rows of a tensor of their own they draw other words
    alone = host(_quantizers.quantize_rows_of(whole[idx.to(dev)], cfg, "bwd_dw", "a"))
    assert not np.array_equal(alone[0], want[0][idx.numpy()])


def test_a_rank_quantises_its_rows_only(monkeypatch):
    """The quantiser work of a sharded rank is its micro-batch's, as an unsharded replica's: no global-sized operand
    (sr_shard once quantised a world_size-times larger zero-padded one)."""
    counts = {}
    for name in ("quantize_f32", "quantize_f32_amax", "quantize_f32_at"):
        fn = getattr(_core, name)

        def counted(x, *a, _fn=fn, **kw):
            counts["n"] = counts.get("n", 0) + x.shape[0] * x.shape[1]
            return _fn(x, *a, **kw)

        monkeypatch.setattr(_core, name, counted)
    x, dy = batch("cpu")
    work = []
    for sharded in (False, True):
        counts["n"] = 0
        m = make("nvfp4", "cpu")
        if sharded:
            ft.sr_shard(m, 1, WORLD)
        step(m, x[N:], dy[N:])
        work.append(counts["n"])
    assert work[0] > 0 and work[1] == work[0]


def test_quantize_f32_at_refuses_bad_rows():
    cfg = ft.Recipe("nvfp4", seed=1).config("bwd_dx", "a", layer=0, step=0)
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="one row index per row"):
        _core.quantize_f32_at(x, cfg, np.arange(3, dtype=np.int64), 1.0)
    with pytest.raises(ValueError, match="negative"):
        _core.quantize_f32_at(x, cfg, np.array([0, 1, -2, 3], dtype=np.int64), 1.0)
    with pytest.raises(ValueError, match="amax"):
        _core.quantize_f32_at(x, cfg, np.arange(4, dtype=np.int64), float("nan"))
    tiles = ft.Recipe("nvfp4", seed=1).config("fwd_y", "b", layer=0, step=0)
    with pytest.raises(ValueError, match="16x16 tiles"):
        _core.quantize_f32_at(torch.randn(16, 32), tiles, np.arange(16, dtype=np.int64), 1.0)


def refuse_host_quantisers(monkeypatch):
    """Every golden quantiser entry (and the host amax) raises: a CUDA run must not call one."""
    def refuse(name):
        def call(*a, **kw):
            raise AssertionError(f"_core.{name} called on a CUDA run")
        return call

    for name in ("quantize_f32", "quantize_f32_amax", "quantize_f32_at", "tensor_amax"):
        monkeypatch.setattr(_core, name, refuse(name))


@CUDA
def test_reduce_amax_over_nccl_on_cuda_tensors(tmp_path, monkeypatch):
    """reduce_amax with CUDA operands: the amax all-reduce runs on the device (NCCL reduces device tensors only)
    and the operands are the unmarked model's (one rank: the reduced amax is the rank's own), quantised on the
    device (no host quantiser call)."""
    import torch.distributed as dist
    if not dist.is_nccl_available():
        pytest.skip("torch without NCCL")
    refuse_host_quantisers(monkeypatch)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        x, dy = batch("cuda")
        ref, marked = make("nvfp4", "cuda"), ft.reduce_amax(make("nvfp4", "cuda"))
        (y0, dx0), (y1, dx1) = step(ref, x, dy), step(marked, x, dy)
        assert torch.equal(y0.view(torch.int32), y1.view(torch.int32))
        assert torch.equal(dx0.view(torch.int32), dx1.view(torch.int32))
        assert torch.equal(ref.weight.grad.view(torch.int32), marked.weight.grad.view(torch.int32))
    finally:
        dist.destroy_process_group()


# ---- the CUDA quantiser at given rows with a given amax, against the golden one ------------------------------
CUDA_BUILT = pytest.mark.skipif(not (torch.cuda.is_available() and _core.cuda_built),
                                reason="needs a CUDA device and a CUDA build of fp4lab")
# Every scale kind, block 16 and 32, RTNE and SR, no RHT, RHT-16/32 (fused) and RHT-128 (its own pass).
ROW_CONFIGS = {
    "nvfp4_dy_sr": dict(recipe="nvfp4", pass_="bwd_dx", operand="a", seed=9),
    "nvfp4_dw_sr": dict(recipe="nvfp4", pass_="bwd_dw", operand="a", seed=9),
    "nvfp4_x_rtne": dict(recipe="nvfp4", pass_="fwd_y", operand="a"),
    "ufp4_dw_sr": dict(recipe="ufp4", pass_="bwd_dw", operand="a", seed=3),
    "mxfp4_sr_b32": dict(recipe="mxfp4", rounding="sr", seed=4),
    "mxfp4_ceil_sr_b16": dict(recipe="mxfp4", scale=fp4lab.Scale.ue8m0_ceil, block=16, rounding="sr", seed=4),
    "fp32scale_rht16_sr": dict(recipe="mxfp4", scale="fp32", block=16, rounding="sr", rht=16, rht_seed=2, seed=5),
    "ue4m3_rht128_sr": dict(recipe="nvfp4", rounding="sr", rht=128, rht_seed=3, seed=6),
    "int4_rht32_sr": dict(format="int4", rht=32, rht_seed=2, rounding="sr", seed=8),
}
ROWS, COLS = 48, 256


def row_config(name):
    return fp4lab.config(**ROW_CONFIGS[name])


@pytest.mark.parametrize("name", sorted(ROW_CONFIGS))
def test_row_configs_are_what_their_names_say(name):
    # The CUDA tests below run only on a GPU: this checks their table where every run can.
    cfg = row_config(name)
    for word, check in (("sr", lambda c: c.rounding == fp4lab.Rounding.sr),
                        ("ceil", lambda c: c.scale == fp4lab.Scale.ue8m0_ceil),
                        ("fp32scale", lambda c: c.scale == fp4lab.Scale.fp32),
                        ("b16", lambda c: c.block == 16), ("b32", lambda c: c.block == 32),
                        ("rht16", lambda c: c.rht == 16), ("rht32", lambda c: c.rht == 32),
                        ("rht128", lambda c: c.rht == 128)):
        if word in name.split("_"):
            assert check(cfg), (name, word, cfg)


def row_input(seed=21):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, COLS, generator=g) * torch.logspace(-3, 3, ROWS, base=2.0)[:, None]
    x[5, 17] = 40.0
    return x


def gapped_index(seed=5):
    # Rows of a tensor 3x as tall, with gaps, permuted (the second half reversed, the first shuffled).
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(ROWS, dtype=torch.int64) * 3 + torch.arange(ROWS) % 3
    return torch.cat([idx[:ROWS // 2][torch.randperm(ROWS // 2, generator=g)], idx[ROWS // 2:].flip(0)])


def same_bits(gpu, gold):
    """Codes, scale codes, block scales (as uint32) and the tensor scale (as uint32) equal."""
    gpu = gpu.to_host()
    assert np.array_equal(np.asarray(gpu.codes), np.asarray(gold.codes))
    assert (gpu.scale_codes is None) == (gold.scale_codes is None)
    if gold.scale_codes is not None:
        assert np.array_equal(np.asarray(gpu.scale_codes), np.asarray(gold.scale_codes))
    assert np.array_equal(np.asarray(gpu.scales).view(np.uint32), np.asarray(gold.scales).view(np.uint32))
    assert np.float32(gpu.global_scale).view(np.uint32) == np.float32(gold.global_scale).view(np.uint32)


@CUDA_BUILT
@pytest.mark.parametrize("name", sorted(ROW_CONFIGS))
def test_cuda_quantize_at_equals_golden_bits_cuda(name):
    cfg = row_config(name)
    x, idx = row_input(), gapped_index()
    amax = 3.5 * _core.tensor_amax(x, cfg)  # not x's own: a kernel that took its own fails under ue4m3
    gold = _core.quantize_f32_at(x, cfg, idx.numpy(), amax)
    xc, ic = x.cuda(), idx.cuda()
    same_bits(_core.cuda_quantize_at(xc, cfg, ic, amax), gold)
    # x^T read in place, and BF16 widened as it is loaded
    same_bits(_core.cuda_quantize_at(xc.t().contiguous(), cfg, ic, amax, transposed=True), gold)
    xb = x.to(torch.bfloat16)
    same_bits(_core.cuda_quantize_at(xb.cuda(), cfg, ic, amax), _core.quantize_f32_at(xb.float(), cfg, idx.numpy(),
                                                                                        amax))
    # None: x's own amax, taken on the device
    same_bits(_core.cuda_quantize_at(xc, cfg, ic, None),
              _core.quantize_f32_at(x, cfg, idx.numpy(), _core.tensor_amax(x, cfg)))
    # into a given operand, returned
    out = _core.CudaQTensor()
    assert _core.cuda_quantize_at(xc, cfg, ic, amax, out=out) is out
    same_bits(out, gold)


@CUDA_BUILT
@pytest.mark.parametrize("name", sorted(ROW_CONFIGS) + ["nvfp4_w_tiles"])
def test_cuda_quantize_amax_equals_golden_bits_cuda(name):
    cfg = (fp4lab.config("nvfp4", pass_="fwd_y", operand="b") if name == "nvfp4_w_tiles" else row_config(name))
    x = row_input(23)
    amax = 2.25 * _core.tensor_amax(x, cfg)
    same_bits(_core.cuda_quantize_amax(x.cuda(), cfg, amax), _core.quantize_f32_amax(x, cfg, amax))
    assert np.float32(_core.cuda_tensor_amax(x.cuda(), cfg)).view(np.uint32) == \
        np.float32(_core.tensor_amax(x, cfg)).view(np.uint32)


@CUDA_BUILT
def test_cuda_quantize_at_refuses_bad_rows_cuda():
    # The host binding's checks and messages (test_quantize_f32_at_refuses_bad_rows).
    cfg = ft.Recipe("nvfp4", seed=1).config("bwd_dx", "a", layer=0, step=0)
    x = torch.randn(4, 32, device="cuda")
    with pytest.raises(ValueError, match="one row index per row"):
        _core.cuda_quantize_at(x, cfg, torch.arange(3, device="cuda"), 1.0)
    with pytest.raises(ValueError, match="negative"):
        _core.cuda_quantize_at(x, cfg, torch.tensor([0, 1, -2, 3], device="cuda"), 1.0)
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="amax"):
            _core.cuda_quantize_at(x, cfg, torch.arange(4, device="cuda"), bad)
        with pytest.raises(ValueError, match="amax"):
            _core.cuda_quantize_amax(x, cfg, bad)
    tiles = ft.Recipe("nvfp4", seed=1).config("fwd_y", "b", layer=0, step=0)
    with pytest.raises(ValueError, match="16x16 tiles"):
        _core.cuda_quantize_at(torch.randn(16, 32, device="cuda"), tiles, torch.arange(16, device="cuda"), 1.0)
    x[1, 2] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        _core.cuda_quantize_at(x, cfg, torch.arange(4, device="cuda"), 1.0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        _core.cuda_tensor_amax(x, cfg)


@CUDA_BUILT
@pytest.mark.parametrize("recipe", ["nvfp4", "ufp4"])
def test_sharded_cuda_ranks_call_no_host_quantiser_cuda(recipe, monkeypatch):
    # sr_shard and reduce_amax on CUDA operands: every operand is quantised on the device (no golden quantiser
    # call, no host amax), and the ranks still equal the single process (test_ranks_quantise_the_single_process_rows).
    refuse_host_quantisers(monkeypatch)
    per, _ = run_ranks(recipe, "cuda")
    assert faults(per, recipe) == []
