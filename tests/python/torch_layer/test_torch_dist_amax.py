"""fp4lab.torch.reduce_amax: Transformer Engine's amax all-reduce for nvfp4's per-tensor scales under DDP and FSDP2
(gloo, 2 processes on the CPU), against one process running the global batch from the same weights.

With reduce_amax and sr_shard on, every quantised operand of a rank equals the single process's on its rows
(fwd_y, bwd_dx: tokens in rows) or token columns (bwd_dw): codes, block scales and the per-tensor scale (times 2
for the dY operands: a rank's loss is the mean over half the batch, so its dY is exactly twice the global dY); so
are the forward output rows and the input-gradient rows (times 2). Without reduce_amax a rank's X and dY operands
take their micro-batch's amax and differ. Not bit for bit, as the contract has it: the loss (a mean of two
half-batch means) and the weight and bias gradients, which reduce over tokens: each rank's GEMM applies the
per-tensor scales to its own half-sum, and the all-reduce adds the halves (docs/python.md, data parallelism)."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

import fp4lab.torch as ft
from dist_ranks import Net, rank_part, copy_weights, run_ranks, step_beside_one_process, wrapped

WORLD, ROWS, STEPS = 2, 64, 2


def make():
    torch.manual_seed(0)
    return ft.convert(Net(torch.relu), ft.Recipe("nvfp4", seed=5))


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    x = torch.randn(ROWS, 64, generator=g)
    x[:ROWS // 2] *= 4  # the first rank's half holds the larger amax: the second rank's own would differ
    return x, torch.randn(ROWS, 16, generator=g)


def capture(tags, ops):
    def observe(layer, step, pass_, a, b, qa, qb, y, cfg):
        tag = tags.get(id(layer))
        if tag is not None:
            for op, q in (("a", qa), ("b", qb)):
                ops[(tag, layer.name, step, pass_, op)] = (torch.from_numpy(np.array(q.codes)),
                                                           torch.from_numpy(np.array(q.scales)),
                                                           torch.tensor(q.global_scale))
    return observe


def run(rank, wrap):
    ref, dp, plain = make(), make(), make()
    ft.reduce_amax(ft.sr_shard(dp, rank, WORLD))
    ft.sr_shard(plain, rank, WORLD)  # the same replica without the amax reduction
    ops = {}
    obs = capture({id(m): t for t, model in (("ref", ref), ("dp", dp), ("plain", plain)) for m in model.modules()}, ops)
    ft.ops.observers.append(obs)
    model = wrapped(dp, wrap, (dp.fc1, dp.fc2, dp.head))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
    out = []
    for i in range(STEPS):
        x, t = batch(i)
        out.append(step_beside_one_process(ref, model, opt, plain, x, t, rows, WORLD))
        opt.step()
        copy_weights(dp, ref, plain)  # the next step starts all three from the same weights
    ft.ops.observers.remove(obs)
    return {"steps": out, "ops": ops}



def bits(t):
    return t.contiguous().view(torch.int32)


def operand_faults(ops, rank, tag):
    """(layer, step, pass, operand) of each operand of replica ``tag`` that differs from the single process's on the
    same rows or token columns: codes, block scales, and the per-tensor scale (times 2 for dY)."""
    faults = []
    for (t, name, step, p, op), (codes, scales, glob) in ops.items():
        if t != tag:
            continue
        rc, rs, rg = ops[("ref", name, step, p, op)]
        rc, rs = rank_part(rank, p, op, codes, scales, rc, rs)
        dy = (p, op) in (("bwd_dx", "a"), ("bwd_dw", "a"))
        if not (torch.equal(codes, rc) and torch.equal(bits(scales), bits(rs))
                and torch.equal(bits(glob), bits(rg * 2 if dy else rg))):
            faults.append((name, step, p, op))
    return faults


@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_amax_all_reduce_matches_one_process(tmp_path, wrap):
    res = run_ranks(tmp_path, run, wrap, world=WORLD)
    for r, rr in enumerate(res):
        ops = rr["ops"]
        # 3 layers x 3 GEMMs x 2 operands a step, fc1's dgrad absent (the input of the replicas needs a gradient,
        # plain's does not)
        assert len([k for k in ops if k[0] == "dp"]) == STEPS * 3 * 3 * 2
        assert operand_faults(ops, r, "dp") == []
        # Without the reduction the token operands of a rank scale by its own amax: the second rank's input X
        # (fc1's fwd_y A and bwd_dw B) has a quarter of the first's.
        plain = {(name, p, op) for name, _, p, op in operand_faults(ops, r, "plain")}
        if r == 1:
            assert {("fc1", "fwd_y", "a"), ("fc1", "bwd_dw", "b")} <= plain
        assert not {(n, p, o) for n, p, o in plain if (p, o) in (("fwd_y", "b"), ("bwd_dx", "b"))}  # weights
        for s in rr["steps"]:
            assert torch.equal(bits(s["y"]), bits(s["y_ref"]))
            assert torch.equal(bits(s["dx"]), bits(2 * s["dx_ref"]))
            assert abs(s["loss"] - s["loss_ref"]) <= 2 ** -23 * s["loss_ref"]


def test_reduce_amax_needs_a_process_group():
    with pytest.raises(RuntimeError, match=r"^reduce_amax\(\): torch\.distributed is not initialised"):
        ft.reduce_amax(make())
    model = ft.reduce_amax(make(), enabled=False)  # turning it off needs none
    # Set on the instance (the class answers None for a module reduce_amax never marked).
    assert all(m.__dict__.get("_amax_reduce", 0) is None for m in model.modules() if isinstance(m, ft.Linear))


def test_compiled_model_reduces_amax_in_eager_mode(tmp_path, monkeypatch):
    """Under torch.compile the GEMMs of a model marked by reduce_amax or sr_shard leave the graph and run as in eager
    mode, with eager's bits, rather than being compiled without the marks."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        calls = []
        real = dist.all_reduce
        monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: (calls.append(t.numel()), real(t, *a, **k))[1])
        x, t = batch(0)
        eager, model = ft.reduce_amax(make()), ft.reduce_amax(make())
        compiled = torch.compile(model, backend="aot_eager")
        for m in (eager, compiled):
            (m(x) - t).pow(2).mean().backward()
        # 3 layers: X (fwd_y A, bwd_dw B) and dY (bwd_dx A, bwd_dw A) but fc1's dgrad (x needs no gradient)
        assert calls == [2] * (2 * (3 * 4 - 1))
        for p, q in zip(eager.parameters(), model.parameters()):
            assert torch.equal(bits(p.grad), bits(q.grad))
        # sr_shard alike: a compiled replica marked rank 1 of 2 draws eager's SR words, not the unmarked model's.
        marked, compiled_marked, unmarked = ft.sr_shard(make(), 1, 2), ft.sr_shard(make(), 1, 2), make()
        for m in (marked, torch.compile(compiled_marked, backend="aot_eager"), unmarked):
            (m(x) - t).pow(2).mean().backward()
        assert torch.equal(bits(marked.fc1.weight.grad), bits(compiled_marked.fc1.weight.grad))
        assert not torch.equal(bits(marked.fc1.weight.grad), bits(unmarked.fc1.weight.grad))
    finally:
        dist.destroy_process_group()


def test_a_model_marked_after_it_was_compiled_takes_the_marks_at_its_next_step(tmp_path, monkeypatch):
    """reduce_amax and sr_shard on a model already compiled and run: its next step reduces the amax and draws the
    shard's SR words, as an eager model marked at the same point does (the marks shadow class defaults that the
    compiled graph read)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        calls = []
        real = dist.all_reduce
        monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: (calls.append(t.numel()), real(t, *a, **k))[1])
        for mark in (ft.reduce_amax, lambda m: ft.sr_shard(m, 1, 2)):
            eager, model = make(), make()
            compiled = torch.compile(model, backend="aot_eager")
            for i in range(2):
                if i == 1:
                    mark(eager)
                    mark(model)
                calls.clear()
                for m in (eager, compiled):
                    m.zero_grad(set_to_none=True)
                    x, t = batch(i)
                    (m(x) - t).pow(2).mean().backward()
                # reduce_amax: one all-reduce per operand amax, in each model, once marked (test above).
                assert calls == ([2] * (2 * (3 * 4 - 1)) if i == 1 and mark is ft.reduce_amax else [])
                for p, q in zip(eager.parameters(), model.parameters()):
                    assert torch.equal(bits(p.grad), bits(q.grad))
            if mark is not ft.reduce_amax:  # (one rank's reduced amax is its own: reduce_amax keeps the bits here)
                unmarked = make()
                for i in range(2):
                    unmarked.zero_grad(set_to_none=True)
                    x, t = batch(i)
                    (unmarked(x) - t).pow(2).mean().backward()
                # The shard's words changed the step's bits: the compiled model did not keep the unmarked graph.
                assert not torch.equal(bits(unmarked.fc1.weight.grad), bits(model.fc1.weight.grad))
    finally:
        dist.destroy_process_group()
