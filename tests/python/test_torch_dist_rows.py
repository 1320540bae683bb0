"""sr_shard quantises a data-parallel rank's own rows only, at their place in the global batch, on the CPU and on a
CUDA device: two ranks are emulated in one process by splitting a batch's rows, and each rank's quantised
operands must be the single process's, bit for bit, on its rows (tokens in rows) or token columns (bwd_dw).

The second half of each batch is the first half negated, so every token operand's amax (per block, rotated too)
is the same on each half as on the whole: each rank's nvfp4 per-tensor scale is then the single process's without
an amax all-reduce (test_torch_dist_amax.py runs that all-reduce over gloo). The CUDA tests (names with "cuda") need
a GPU and a CUDA build; there the single process's operands come from the CUDA quantiser kernels and a rank's SR
operands from the golden quantiser, so they also hold the kernels to the golden model's bits on a slice of rows."""
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
    got = host(ft.ops._to_device(q, whole.device) if whole.is_cuda else q)  # on CUDA: the kernels' operand of it
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


@CUDA
def test_reduce_amax_over_nccl_on_cuda_tensors(tmp_path):
    """reduce_amax with CUDA operands: the amax all-reduce runs on the device (NCCL reduces device tensors only)
    and the operands are the unmarked model's (one rank: the reduced amax is the rank's own)."""
    import torch.distributed as dist
    if not dist.is_nccl_available():
        pytest.skip("torch without NCCL")
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
