"""fp4lab.torch.reduce_amax and sr_shard on MoE experts (fp4lab.torch.Experts) under FSDP2
(torch.distributed.fsdp.fully_shard; gloo, 2 processes on the CPU), against one process running the global batch
from the same weights: the Mixtral sparse-MoE block of test_torch_dist_experts.py (nvfp4, router in high
precision, an expert without tokens on each rank), its experts' fused [experts, ...] parameters sharded by FSDP2
along the experts and gathered whole before each forward and backward.

As under DDP: every expert's forward and dgrad token operands take the global batch's per-tensor scale (times 2
for dY: a rank's loss is the mean over half the batch), the block's output rows equal the single process's bit for
bit and its input-gradient rows too (times 2), over 2 optimizer steps. Not the weight gradients, which the contract
leaves: each rank's wgrad GEMM scales its own half-sum (and nvfp4 rotates 16 consecutive tokens of an expert
there, which a rank does not hold), and FSDP2's reduce-scatter adds the halves. Without reduce_amax rank 1's
experts scale X by its own amax and its outputs differ."""

import torch

import fp4lab.torch as ft
from dist_ranks import run_ranks
from test_torch_dist_experts import E, STEPS, WORLD, batch, bits, capture, make


def full(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (FSDP2 holds a DTensor shard of it)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def run(rank):
    from torch.distributed.fsdp import fully_shard

    ref, dp, plain = make(), make(), make()
    ft.reduce_amax(ft.sr_shard(dp, rank, WORLD))
    ft.sr_shard(plain, rank, WORLD)  # the same replica without the amax reduction
    scales = {}
    obs = capture({id(m.experts): t for t, m in (("ref", ref), ("dp", dp))}, scales)
    ft.ops.observers.append(obs)
    fully_shard(dp.experts)
    fully_shard(dp)
    assert type(dp.experts.gate_up_proj).__name__ == "DTensor"  # sharded: the experts' parameters are FSDP2's
    opt = torch.optim.SGD(dp.parameters(), lr=0.1)
    out = []
    try:
        for i in range(STEPS):
            x, t = batch(i)
            xg = x.clone().requires_grad_(True)
            y_ref = ref(xg)
            (y_ref - t).pow(2).mean().backward()
            xr = x[rank:rank + 1].clone().requires_grad_(True)
            y = dp(xr)
            opt.zero_grad()
            (y - t[rank:rank + 1]).pow(2).mean().backward()
            with torch.no_grad():
                y_plain = plain(xr)
            out.append({"y": y.detach(), "y_ref": y_ref.detach()[rank:rank + 1], "y_plain": y_plain,
                        "dx": xr.grad, "dx_ref": xg.grad[rank:rank + 1]})
            opt.step()
            with torch.no_grad():  # the next step starts all from the same weights
                for p, q, u in zip(ref.parameters(), dp.parameters(), plain.parameters()):
                    w = full(q)
                    p.copy_(w)
                    u.copy_(w)
            ref.zero_grad()
    finally:
        ft.ops.observers.remove(obs)
    return {"steps": out, "scales": scales}



def test_fsdp2_experts_amax_all_reduce_matches_one_process(tmp_path):
    res = run_ranks(tmp_path, run, world=WORLD)
    for r, rr in enumerate(res):
        for s in rr["steps"]:
            assert torch.equal(bits(s["y"]), bits(s["y_ref"]))
            assert torch.equal(bits(s["dx"]), bits(2 * s["dx_ref"]))
        dp = {k[1:]: v for k, v in rr["scales"].items() if k[0] == "dp"}
        # every expert's GEMMs but the one this rank sends no tokens (its empty GEMMs are not observed)
        assert {k[0] for k in dp} == {f"experts.{proj}.{e}" for proj in ("gate_up_proj", "down_proj")
                                      for e in range(E) if e != 1 - r}
        for (name, step, p, op), g in dp.items():
            if p != "bwd_dw":  # wgrad's rotated 16-token blocks are not the single process's (module docstring)
                want = rr["scales"][("ref", name, step, p, op)]
                assert torch.equal(bits(g), bits(want * 2 if p == "bwd_dx" and op == "a" else want)), (name, step, p)
    assert not any(torch.equal(bits(s["y_plain"]), bits(s["y_ref"])) for s in res[1]["steps"])
