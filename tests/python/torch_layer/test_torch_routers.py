"""MoE routers under fp4lab.torch.convert (Mixtral and Qwen2-MoE from small configs: nothing is downloaded): by
default they stay in high precision, reported "kept" with the reason and the option that converts them;
``routers=True`` converts them, the router's logits GEMM bit-equal to an fp4lab Linear holding its weight (forward
and both gradients) and the rest of its forward the router's own, and the model trains; a router whose forward is
not one F.linear with its weight is left with that reason."""
import copy

import pytest
import torch
import transformers  # scripts/install-deps.sh installs it
from torch import nn

import fp4lab.torch as ft
from hf_steps import train_steps


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def make_mixtral(experts=16):
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=experts, num_experts_per_tok=2, max_position_embeddings=64))


def make_qwen_moe(experts=16):
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        shared_expert_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=experts, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64))


ROUTERS = {make_mixtral: ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"],
           make_qwen_moe: [f"model.layers.{i}.mlp.{g}" for i in range(2) for g in ("gate", "shared_expert_gate")]}


@pytest.mark.parametrize("make", [make_mixtral, make_qwen_moe])
def test_routers_kept_in_high_precision_by_default(make):
    model = make()
    kinds = {n: type(m) for n, m in model.named_modules()}
    model = ft.convert(model, "nvfp4")
    rep = {e.name: e for e in model.fp4lab_report}
    for name in ROUTERS[make]:
        e = rep[name]
        assert e.action == "kept" and "high precision" in e.reason and "routers=True" in e.reason, e
        assert type(model.get_submodule(name)) is kinds[name]  # not swapped
        assert name not in model.fp4lab_report.left and name not in model.fp4lab_report.converted
    assert all(rep[f"model.layers.{i}.mlp.experts"].action == "converted" for i in range(2))


@pytest.mark.parametrize("make", [make_mixtral, make_qwen_moe])
def test_converted_router_is_a_linear_logits_gemm(make):
    model = ft.convert(make(), ft.Recipe("nvfp4", seed=4), routers=True)
    name = "model.layers.1.mlp.gate"
    rep = {e.name: e for e in model.fp4lab_report}
    assert rep[name].action == "converted" and "logits GEMM" in rep[name].reason
    router = model.get_submodule(name)
    assert isinstance(router, ft.Router) and router.layer_id == ft.layer_id_of(name) and router.step == 0
    ref_router = copy.deepcopy(make().get_submodule(name))  # the router's own forward, in high precision
    lin = ft.Linear(64, 16, bias=False, recipe=ft.Recipe("nvfp4", seed=4), layer_id=ft.layer_id_of(name))
    with torch.no_grad():
        lin.weight.copy_(router.weight)
    x = torch.randn(3, 7, 64)  # 21 tokens: a partial block of wgrad's tokens
    xr, xl = x.clone().requires_grad_(), x.clone().requires_grad_()
    logits, scores, index = router(xr)
    want = lin(xl.reshape(-1, 64))
    assert torch.equal(bits(logits), bits(want))
    g = torch.randn(21, 16)
    logits.backward(g)
    want.backward(g)
    assert torch.equal(bits(xr.grad), bits(xl.grad))
    assert torch.equal(bits(router.weight.grad), bits(lin.weight.grad))
    assert router.step == 1
    # The rest is the router's own forward on those logits: its softmax, top-k and normalisation.
    with torch.no_grad():
        ref_router.weight.copy_(router.weight)
        _, ref_scores, ref_index = ref_router(x)
        probs = torch.softmax(want.float(), dim=-1)
    top, top_index = torch.topk(probs, 2, dim=-1)
    assert torch.equal(index, top_index)
    assert torch.equal(bits(scores), bits((top / top.sum(-1, keepdim=True)).to(scores.dtype)))
    assert not torch.equal(scores, ref_scores)  # 4-bit logits: not the high-precision router's weights


def test_converted_routers_train_and_save():
    model = ft.convert(make_qwen_moe(), ft.Recipe("ufp4", seed=2), routers=True)
    rep = {e.name: e for e in model.fp4lab_report}
    # The shared expert's gate, Linear(64, 1), is converted like any nn.Linear, or left with the reason.
    assert rep["model.layers.0.mlp.shared_expert_gate"].action == "left"
    assert "reduction dimension 1 is not a multiple of the block size 16" in \
        rep["model.layers.0.mlp.shared_expert_gate"].reason
    gate = model.model.layers[0].mlp.gate
    before = gate.weight.detach().clone()
    ids = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(1))
    losses = train_steps(model, ids)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    assert gate.step == 3 and not torch.equal(gate.weight, before)
    sd = model.state_dict()
    assert int(sd["model.layers.0.mlp.gate._extra_state"]) == 3
    plain = make_qwen_moe()
    plain.load_state_dict(ft.export_state_dict(model), strict=True)
    assert torch.equal(plain.model.layers[0].mlp.gate.weight, gate.weight)


def test_router_with_too_few_experts_or_another_gemm_is_left():
    # 4 experts: the logits' gradient reduces over 4, which block 16 cannot take.
    model = ft.convert(make_mixtral(experts=4), "ufp4", routers=True)
    e = {e.name: e for e in model.fp4lab_report}["model.layers.0.mlp.gate"]
    assert e.action == "left" and e.reason.startswith("a MoE router: bwd_dx operand a") and "block size 16" in e.reason

    class MatmulRouter(nn.Module):  # logits by a matmul, not F.linear: Router would not see the GEMM
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 64))

        def forward(self, x):
            return torch.topk(x @ self.weight.t(), 2, dim=-1)

    model = make_mixtral()
    model.model.layers[0].mlp.gate = MatmulRouter()
    model = ft.convert(model, "ufp4", routers=True)
    e = {e.name: e for e in model.fp4lab_report}["model.layers.0.mlp.gate"]
    assert e.action == "left" and "0 F.linear calls with its weight" in e.reason
    assert isinstance(model.model.layers[0].mlp.gate, MatmulRouter)
    assert isinstance(model.model.layers[1].mlp.gate, ft.Router)


def test_sr_shard_marks_routers():
    # A converted router is a data-parallel replica's token GEMM like a Linear: sr_shard places its stochastically
    # rounded dY rows (ufp4 rounds dgrad's dY so) at the replica's rows of the global batch, as for a Linear.
    r = ft.Recipe("ufp4", seed=4)
    name = "model.layers.0.mlp.gate"
    marked = ft.sr_shard(ft.convert(make_mixtral(), r, routers=True), 1, 2).get_submodule(name)
    lin = ft.sr_shard(ft.Linear(64, 16, bias=False, recipe=r, layer_id=ft.layer_id_of(name)), 1, 2)
    plain = ft.convert(make_mixtral(), r, routers=True).get_submodule(name)
    with torch.no_grad():
        lin.weight.copy_(marked.weight)
    x = torch.randn(32, 64)
    g = torch.randn(32, 16)
    grads = []
    for m in (marked, lin, plain):
        xi = x.clone().requires_grad_(True)
        out = m(xi)
        (out[0] if isinstance(out, tuple) else out).backward(g)
        grads.append(xi.grad)
    assert torch.equal(bits(grads[0]), bits(grads[1]))
    assert not torch.equal(bits(grads[0]), bits(grads[2]))


def test_monitor_records_router_and_sharded_expert_gemms(tmp_path):
    import json

    model = ft.convert(make_mixtral(), ft.Recipe("nvfp4", seed=1), routers=True)
    model.model.layers[0].mlp.experts._sr_shard = (0, 1)  # what sr_shard marks, minus the all-gather of 1 rank
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        with ft.monitor(model, every=1, out=tmp_path / "m.jsonl"):
            model(input_ids=ids, labels=ids).loss.backward()
    finally:
        torch.distributed.destroy_process_group()
    layers = {json.loads(line)["layer"] for line in (tmp_path / "m.jsonl").read_text().splitlines()}
    assert {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"} <= layers
    # The sharded experts' GEMMs (each forward's own objects) are recorded under the experts' GEMM names.
    assert any(n.startswith("model.layers.0.mlp.experts.gate_up_proj.") for n in layers)
    assert any(n.startswith("model.layers.1.mlp.experts.down_proj.") for n in layers)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_router_compiles_whole_with_eager_bits(backend):
    # torch.compile(fullgraph=True) of a converted router: 0 graph breaks (its logits GEMM goes through the fp4lab
    # operators under the TorchFunctionMode that routes it), one graph for every SR step, and eager's logits,
    # routing, input and weight gradients bit for bit over 3 training steps (21 tokens: a partial block of wgrad's
    # tokens). The router's own softmax and normalisation are torch code, which inductor fuses in its own order
    # (its scores then differ from eager's in the last bit, as an unconverted router's do): bit-equal under
    # aot_eager, and kept out of the loss so that the GEMMs' gradients compare under inductor too.
    model = ft.convert(make_mixtral(), ft.Recipe("nvfp4", seed=4), routers=True)
    router = model.get_submodule("model.layers.1.mlp.gate")
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(5))
    explained = torch._dynamo.explain(copy.deepcopy(router))(x)  # a copy: explain's forward takes a step
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    eager, model = router, copy.deepcopy(router)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch._dynamo.reset()
    for step in range(3):
        got = []
        for m in (eager, compiled):
            xr = x.clone().requires_grad_()
            logits, scores, index = m(xr)
            logits.square().sum().backward()
            got.append((logits, scores, index, xr.grad))
        (le, se, ie, ge), (lc, sc, ic, gc) = got
        assert torch.equal(bits(le), bits(lc)) and torch.equal(ie, ic), step
        assert backend == "inductor" or torch.equal(bits(se), bits(sc)), step
        assert torch.equal(bits(ge), bits(gc)), step
        assert torch.equal(bits(eager.weight.grad), bits(model.weight.grad)), step
        if step == 0:
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # no graph per step
    assert eager.step == model.step == 3


def test_experts_refuse_an_expert_index_past_the_experts():
    experts = ft.Experts(make_mixtral(experts=8).model.layers[0].mlp.experts, "nvfp4")
    x, weights = torch.randn(5, 64), torch.full((5, 2), 0.5)
    with pytest.raises(ValueError, match=r"expert index outside \[0, 8\]"):
        experts(x, torch.tensor([[0, 1]] * 4 + [[2, 9]]), weights)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_experts_forward_reads_the_host_once_cuda():
    # The experts' token counts come to the host in one read a forward, not one per expert: the forward (in high
    # precision, whose GEMMs do not synchronise) makes one synchronising CUDA call, whatever the number of experts.
    import warnings

    experts = ft.Experts(make_mixtral(experts=8).model.layers[0].mlp.experts, "bf16").cuda()
    x = torch.randn(40, 64, device="cuda")
    index = torch.randint(0, 8, (40, 2), generator=torch.Generator().manual_seed(0)).cuda()
    weights = torch.full((40, 2), 0.5, device="cuda")
    experts(x, index, weights)  # warm-up: first calls may synchronise once (allocator, libraries)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            experts(x, index, weights)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch's one-line notice that the debug mode is a prototype is not a synchronisation
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
