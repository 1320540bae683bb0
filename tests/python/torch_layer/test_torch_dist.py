"""fp4lab.torch under data parallelism on the CPU (gloo, 2 processes): DDP and FSDP2 (fully_shard) on a converted
model against one process running the same global batch, from the same weights at every step.

What is equal bit for bit, and why:
- every quantised operand of a rank's micro-batch equals the single-process operand on the same rows (fwd_y and
  bwd_dx: tokens in rows) or columns (bwd_dw: tokens in columns, the micro-batch's tokens a whole number of
  blocks): codes and block scales, with sr_shard placing the SR operands at their place in the global batch. The
  gradient operands (dY) carry a factor 2: each rank's loss is the mean over its half of the batch, so its dY is
  twice the global dY, exactly, and so are their block scales (the codes are the same);
- a rank's forward output rows, and its input gradient rows (times 2);
- the per-rank SR keys: (seed, step, layer, pass, operand) do not involve the rank.

What is bounded, and why: the loss (the mean of two half-batch means against one mean over the batch, within
2⁻²³ relative), and the weight and bias gradients. Those reduce over tokens: each rank sums its half of the
tokens, the all-reduce adds the two halves, and one process adds all tokens in one order (ufp4's 16-token blocks:
((b₀+b₁)+b₂)+b₃ against (b₀+b₁)+(b₂+b₃); MKL's blocking under bf16). The same products added in another order: the
difference is FP32 rounding, bounded elementwise by 8·2⁻²⁴·Σ|terms| (the sum of the absolute products, FP64).
Equal under mxfp4, whose 32-token blocks are one per rank. The reduced gradient itself is the exact average of
the ranks' own gradients. Not covered: nvfp4, whose per-tensor scale comes from the micro-batch's amax."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import fp4lab.torch as ft
from dist_ranks import Net, rank_part, copy_weights, full, run_ranks, step_beside_one_process, wrapped

WORLD, ROWS, STEPS = 2, 64, 2


def make(recipe):
    torch.manual_seed(0)
    return ft.convert(Net(torch.nn.functional.gelu), ft.Recipe(recipe, seed=5))


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(ROWS, 64, generator=g), torch.randn(ROWS, 16, generator=g)


class Capture:
    """The quantised operands each layer draws: (tag, layer name, step, pass, operand) -> (codes, scales)."""

    def __init__(self, tags):
        self.tags, self.ops, self.abs_terms = tags, {}, {}

    def __call__(self, layer, step, pass_, a, b, qa, qb, y, cfg):
        tag = self.tags.get(id(layer))
        if tag is None:
            return
        if tag == "ref" and pass_ == "bwd_dw":  # Σ|terms| of the wgrad GEMM the single process computed
            self.abs_terms[(layer.name, step)] = (torch.from_numpy(qa.dequantize()).double().abs()
                                                  @ torch.from_numpy(qb.dequantize()).double().abs().t())
        for op, q in (("a", qa), ("b", qb)):
            self.ops[(tag, layer.name, step, pass_, op)] = (torch.from_numpy(np.array(q.codes)),
                                                           torch.from_numpy(np.array(q.scales)))


def run(rank, recipe, wrap):
    # ref: one process on the global batch; dp: this rank's replica; local: the same replica unwrapped, whose
    # gradients are what this rank hands to the reduction.
    ref, dp, local = make(recipe), make(recipe), make(recipe)
    ft.sr_shard(dp, rank, WORLD)
    ft.sr_shard(local, rank, WORLD)
    cap = Capture({id(m): t for t, model in (("ref", ref), ("dp", dp)) for m in model.modules()})
    ft.ops.observers.append(cap)
    # Σ|terms| of the weight and bias gradients from the layers' own operands where they are not quantised (bf16)
    io = {}
    for name, m in ref.named_modules():
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(lambda m, a, name=name: io.__setitem__((name, "x"), a[0].detach()))
            m.register_full_backward_hook(lambda m, gi, go, name=name: io.__setitem__((name, "dy"), go[0]))
    model = wrapped(dp, wrap, (dp.fc1, dp.fc2, dp.head))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
    out = []
    for i in range(STEPS):
        x, t = batch(i)
        res = step_beside_one_process(ref, model, opt, local, x, t, rows, WORLD)
        partial = {}
        for n, p in local.named_parameters():
            parts = [torch.empty_like(p.grad) for _ in range(WORLD)]
            dist.all_gather(parts, p.grad)
            partial[n] = torch.stack(parts)
        terms = {}
        for name in ("fc1", "fc2", "head"):
            dy, xx = io[(name, "dy")].double().abs(), io[(name, "x")].double().abs()
            terms[f"{name}.weight"] = cap.abs_terms.get((name, i), dy.t() @ xx)
            terms[f"{name}.bias"] = dy.sum(0)
        out.append(dict(res, grads={n: full(p.grad).clone() for n, p in dp.named_parameters()},
                        grads_ref={n: p.grad.clone() for n, p in ref.named_parameters()}, partial=partial,
                        terms=terms))
        opt.step()
        copy_weights(dp, ref, local)  # the next step starts all three from the same weights
    ft.ops.observers.remove(cap)
    return {"steps": out, "ops": cap.ops}



def bits(t):
    return t.contiguous().view(torch.int32)


def operand_faults(ops, rank, ref_ops=None):
    """The (layer, step, pass, operand) whose quantised operand on this rank differs from the single process's on
    the same rows or token columns: codes, and block scales (times 2 for the dY operands: see the top)."""
    ref_ops = ops if ref_ops is None else ref_ops
    faults = []
    for (tag, name, step, p, op), (codes, scales) in ops.items():
        if tag != "dp":
            continue
        rc, rs = ref_ops[("ref", name, step, p, op)]
        rc, rs = rank_part(rank, p, op, codes, scales, rc, rs)
        dy = (p, op) in (("bwd_dx", "a"), ("bwd_dw", "a"))
        if not (torch.equal(codes, rc) and torch.equal(bits(scales), bits(rs * 2 if dy else rs))):
            faults.append((name, step, p, op))
    return faults


@pytest.mark.parametrize("recipe,wrap", [("bf16", "ddp"), ("ufp4", "ddp"), ("mxfp4", "ddp"), ("ufp4", "fsdp")])
def test_data_parallel_matches_one_process(tmp_path, recipe, wrap):
    res = run_ranks(tmp_path, run, recipe, wrap, world=WORLD)
    for r, rr in enumerate(res):
        if recipe != "bf16":
            assert len(rr["ops"]) == 2 * STEPS * 3 * 3 * 2 - (2 * STEPS * 3 * 2 if recipe == "mxfp4" else 0)
        assert operand_faults(rr["ops"], r) == []
        for s in rr["steps"]:
            assert torch.equal(bits(s["y"]), bits(s["y_ref"]))
            assert torch.equal(bits(s["dx"]), bits(2 * s["dx_ref"]))
            assert abs(s["loss"] - s["loss_ref"]) <= 2 ** -23 * s["loss_ref"]
    for i in range(STEPS):
        s0 = res[0]["steps"][i]
        for n, g in s0["grads"].items():
            assert torch.equal(bits(g), bits(res[1]["steps"][i]["grads"][n]))  # one reduced gradient
            # the reduction is the average of the ranks' own gradients, bit for bit (two terms: any order)
            assert torch.equal(bits(g), bits(s0["partial"][n].sum(0) / WORLD))
            ref = s0["grads_ref"][n]
            if recipe == "mxfp4" and not n.startswith("head") and n.endswith("weight"):
                # 32-token blocks, one per rank: the contract GEMM's one FP32 addition of the two block sums is
                # the all-reduce's addition
                assert torch.equal(bits(g), bits(ref))
            # The same terms summed in another order: |Δ| ≤ 8·2⁻²⁴·Σ|terms| (observed ≤ 4.5·2⁻²⁴·Σ|terms|
            # with MKL's FP32 GEMM under bf16, ≤ 1.2 under ufp4; the worst case for 64 terms is 128·2⁻²⁴·Σ|terms|).
            assert ((g.double() - ref.double()).abs() <= 8 * 2 ** -24 * s0["terms"][n]).all(), n


def test_sr_shard_places_micro_batch_in_global_batch():
    """One process: the second half of a batch through a replica marked rank 1 of 2 quantises the operands the
    whole batch's run quantises on those rows; unmarked, its SR operands (dY, stochastically rounded under ufp4)
    draw other words and differ, while its RTNE operands still agree."""
    x, t = batch(0)
    ref, half, plain = make("ufp4"), ft.sr_shard(make("ufp4"), 1, 2), make("ufp4")
    cap = Capture({id(m): tag for tag, model in (("ref", ref), ("dp", half), ("plain", plain))
                   for m in model.modules()})
    ft.ops.observers.append(cap)
    try:
        (ref(x) - t).pow(2).mean().backward()
        for model in (half, plain):
            (model(x[32:]) - t[32:]).pow(2).mean().backward()
    finally:
        ft.ops.observers.remove(cap)
    assert operand_faults(cap.ops, 1) == []
    plain_ops = {("dp",) + k[1:]: v for k, v in cap.ops.items() if k[0] == "plain"}
    faults = operand_faults(plain_ops, 1, cap.ops)
    assert sorted({(p, op) for _, _, p, op in faults}) == [("bwd_dw", "a"), ("bwd_dx", "a")]
    # every dY operand but fc1's dgrad, which does not run (the input needs no gradient)
    assert len(faults) == 2 * 3 - 1 and len(plain_ops) == 6 * 3 - 2


def test_quantizer_leaves_storage_resizable():
    """FSDP2 frees an unsharded parameter by resizing its storage to 0; Tensor.numpy() would have marked it as not
    resizable ('Trying to resize storage that is not resizable')."""
    w = torch.randn(32, 64)
    q = ft.quantize(w, ft.Recipe("ufp4").config("fwd_y", "b", layer=0, step=0))
    assert w.untyped_storage().resizable()
    w.untyped_storage().resize_(0)  # what FSDP2 does after the forward
    assert q.rows == 32 and np.asarray(q.codes).shape == (32, 64)
