"""fp4lab.torch.reduce_amax on MoE experts (fp4lab.torch.Experts) under DDP (gloo, 2 processes on the CPU), against
one process running the global batch from the same weights.

A Mixtral sparse-MoE block (transformers, from a small config) is converted under nvfp4 (router kept in high
precision). Its router sends rank 0's tokens to experts 0 and 2 or 3 and rank 1's to experts 1 and 2 or 3, so
expert 0 gets no tokens on rank 1 and expert 1 none on rank 0: with reduce_amax every rank still runs every
expert's GEMMs and joins their amax all-reduces. Then the token operands of each expert's forward and dgrad GEMMs
(X, dY) take the global batch's per-tensor scale (the single process's; times 2 for dY: a rank's loss is the mean
over half the batch), and the block's output rows equal the single process's bit for bit (nvfp4's forward rounds to
nearest). Not the wgrad operands: nvfp4 rotates (RHT) 16 consecutive tokens of an expert there, and a rank's 16 are
not the single process's. Without reduce_amax a rank's expert scales by its own tokens' amax and the outputs
differ. With sr_shard beside it, each expert's dgrad operand dY (stochastically rounded) draws the single
process's random words (its rows placed at the expert's rows of the global batch), so the input gradient rows
equal the single process's (times 2); without it they differ."""

import torch
import transformers  # scripts/install-deps.sh installs it
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

import fp4lab.torch as ft
from dist_ranks import run_ranks

WORLD, TOKENS, STEPS, E = 2, 32, 2, 4


def make():
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(transformers.MixtralConfig(hidden_size=64, intermediate_size=32,
                                                             num_local_experts=E, num_experts_per_tok=2))
    with torch.no_grad():
        block.experts.gate_up_proj.normal_(0, 0.1)
        block.experts.down_proj.normal_(0, 0.1)
        block.gate.weight.zero_()
        block.gate.weight[0, 0], block.gate.weight[1, 0] = 10.0, -10.0  # feature 0's sign picks expert 0 or 1
        block.gate.weight[2:, 1:].normal_(0, 0.1)
    return ft.convert(block, ft.Recipe("nvfp4", seed=5))


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    x = torch.randn(WORLD, TOKENS, 64, generator=g)
    x[0, :, 0] = x[0, :, 0].abs() + 1  # rank 0's tokens: expert 0 first
    x[1, :, 0] = -x[1, :, 0].abs() - 1  # rank 1's: expert 1 first
    x[0] *= 4  # the first rank's half holds the larger amax: the second rank's own would differ
    return x, torch.randn(WORLD, TOKENS, 64, generator=g)


def capture(tags, scales):
    def observe(layer, step, pass_, a, b, qa, qb, y, cfg):
        tag = tags.get(id(getattr(layer, "owner", layer)))
        if tag is not None:
            for op, q in (("a", qa), ("b", qb)):
                scales[(tag, layer._label(), step, pass_, op)] = torch.tensor(q.global_scale)
    return observe


def run(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref, dp, plain, unsharded = make(), make(), make(), make()
    ft.reduce_amax(unsharded)  # the amax reduction without sr_shard: its dY draws this rank's SR words
    ft.reduce_amax(ft.sr_shard(dp, rank, WORLD))
    ft.sr_shard(plain, rank, WORLD)  # the same replica without the amax reduction
    scales = {}
    obs = capture({id(m.experts): t for t, m in (("ref", ref), ("dp", dp), ("plain", plain))}, scales)
    ft.ops.observers.append(obs)
    model = DDP(dp)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for i in range(STEPS):
        x, t = batch(i)
        xg = x.clone().requires_grad_(True)
        y_ref = ref(xg)
        ref.zero_grad()
        (y_ref - t).pow(2).mean().backward()
        xr = x[rank:rank + 1].clone().requires_grad_(True)
        y = model(xr)
        opt.zero_grad()
        (y - t[rank:rank + 1]).pow(2).mean().backward()
        xu = xr.detach().clone().requires_grad_(True)
        (unsharded(xu) - t[rank:rank + 1]).pow(2).mean().backward()
        with torch.no_grad():
            y_plain = plain(xr)
            _, _, index = dp.gate(xr.reshape(-1, 64))
        out.append({"y": y.detach(), "y_ref": y_ref.detach()[rank:rank + 1], "y_plain": y_plain,
                    "dx": xr.grad, "dx_unsharded": xu.grad, "dx_ref": xg.grad[rank:rank + 1], "experts": sorted(set(index.flatten().tolist()))})
        opt.step()
        with torch.no_grad():  # the next step starts all three from the same weights
            for p, q, u, v in zip(ref.parameters(), dp.parameters(), plain.parameters(), unsharded.parameters()):
                p.copy_(q)
                u.copy_(q)
                v.copy_(q)
    ft.ops.observers.remove(obs)
    return {"steps": out, "scales": scales}



def bits(t):
    return t.contiguous().view(torch.int32)


def test_experts_amax_all_reduce_matches_one_process(tmp_path):
    res = run_ranks(tmp_path, run, world=WORLD)
    for r, rr in enumerate(res):
        for s in rr["steps"]:
            assert 1 - r not in s["experts"] and r in s["experts"], s["experts"]  # an expert without tokens here
            assert torch.equal(bits(s["y"]), bits(s["y_ref"]))
            assert torch.equal(bits(s["dx"]), bits(2 * s["dx_ref"]))
        scales = rr["scales"]
        dp = {k[1:]: v for k, v in scales.items() if k[0] == "dp"}
        # Every expert's three GEMMs, both operands, each step, tokens or not (the empty ones are not observed).
        gemms = {(name, step) for name, step, _, _ in dp}
        assert {name for name, _ in gemms} == {f"experts.{proj}.{e}" for proj in ("gate_up_proj", "down_proj")
                                               for e in range(E) if e != 1 - r}
        assert len(dp) == len(gemms) * 3 * 2 and len(gemms) == STEPS * 2 * (E - 1)
        for (name, step, p, op), g in dp.items():
            if p == "bwd_dw":
                # wgrad rotates (RHT) 16 consecutive tokens of the expert's: a rank's 16 are not the single
                # process's, so neither is the rotated amax (the contract leaves the weight gradients anyway).
                continue
            want = scales[("ref", name, step, p, op)]
            dy = (p, op) in (("bwd_dx", "a"), ("bwd_dw", "a"))
            assert torch.equal(bits(g), bits(want * 2 if dy else want)), (name, step, p, op)
    # Without sr_shard the experts' dY operands draw each rank's own SR words: the input gradients differ.
    assert not all(torch.equal(bits(s["dx_unsharded"]), bits(2 * s["dx_ref"])) for rr in res for s in rr["steps"])
    # Without the reduction rank 1's experts scale X by its own, smaller, amax: its outputs differ.
    assert not any(torch.equal(bits(s["y_plain"]), bits(s["y_ref"])) for s in res[1]["steps"])
