"""fp4lab.torch.convert on the Hugging Face models people train (small random configs: nothing is downloaded):
GPT-2's Conv1D projections convert and compute what a converted nn.Linear holding the transposed weight computes,
bit for bit; GPT-2 trains under a recipe; on Llama, GPT-2, Mixtral and Qwen2-MoE every parameter of two or more
dimensions belongs to a module the report names, converted or with the reason it is not; MoE experts stored as fused
3-D parameters convert, each expert's GEMMs bit-equal to fp4lab Linears holding its matrices and to the golden GEMM,
and Mixtral and Qwen2-MoE train with every expert under the recipe; include/exclude patterns that match nothing or
are no regular expression are one-line errors naming the option."""
import re

import numpy as np
import pytest
import torch
import transformers  # scripts/install-deps.sh installs it
from transformers.pytorch_utils import Conv1D as HFConv1D

import fp4lab
import fp4lab.torch as ft
from hf_steps import train_steps


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4", ft.Recipe("nvfp4", mode="fast", seed=3)])
def test_conv1d_equals_linear_with_transposed_weight(recipe):
    torch.manual_seed(0)
    conv = HFConv1D(48, 32)  # nf=48 outputs, nx=32 inputs: weight [32, 48]
    with torch.no_grad():
        conv.bias.normal_()
    lin = torch.nn.Linear(32, 48)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.t())
        lin.bias.copy_(conv.bias)
    fc = ft.Conv1D.from_conv1d(conv, recipe, layer_id=77)
    fl = ft.Linear.from_linear(lin, recipe, layer_id=77)  # the same SR key: the same random bits
    assert fc.weight is conv.weight and fc.weight.shape == (32, 48)
    x = torch.randn(2, 16, 32)
    xc, xl = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn(2, 16, 48)
    yc, yl = fc(xc), fl(xl)
    yc.backward(dy)
    yl.backward(dy)
    assert torch.equal(bits(yc), bits(yl))
    assert torch.equal(bits(xc.grad), bits(xl.grad))
    assert torch.equal(bits(conv.weight.grad.t()), bits(lin.weight.grad))
    assert torch.equal(bits(conv.bias.grad), bits(lin.bias.grad))
    # Not the plain Conv1D: the GEMMs are quantised.
    assert not torch.equal(yc, conv(x))
    assert fc.step == fl.step == 1


def make_gpt2(tie=True):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=tie)
    return transformers.GPT2LMHeadModel(cfg)


def make_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False))


def make_mixtral():
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64))


def make_qwen_moe():
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        shared_expert_intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64))


GPT2_PROJ = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def test_gpt2_conv1d_converted_and_trains():
    model = ft.convert(make_gpt2(), ft.Recipe("nvfp4", seed=1))
    rep = model.fp4lab_report
    assert rep.converted == [f"transformer.h.{i}.{p}" for i in range(2) for p in GPT2_PROJ] + ["lm_head"]
    assert rep.left == []
    c_attn = model.transformer.h[0].attn.c_attn
    assert isinstance(c_attn, ft.Conv1D) and c_attn.weight.shape == (64, 192)
    assert c_attn.layer_id == ft.layer_id_of("transformer.h.0.attn.c_attn")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(7))
    losses = train_steps(model, ids)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    for i in range(2):
        for p in GPT2_PROJ:
            mod = model.get_submodule(f"transformer.h.{i}.{p}")
            assert mod.step == 3
            assert not torch.equal(mod.weight, before[f"transformer.h.{i}.{p}.weight"])
    # The state dict keeps the plain model's keys and shapes (plus the SR steps).
    plain = make_gpt2().state_dict()
    sd = model.state_dict()
    assert {k for k in sd if not k.endswith("_extra_state")} == set(plain)
    assert all(sd[k].shape == v.shape for k, v in plain.items())


@pytest.mark.parametrize("make", [make_llama, make_gpt2, make_mixtral, make_qwen_moe])
def test_every_weight_matrix_is_in_the_report(make):
    model = ft.convert(make(), "ufp4")
    rep = model.fp4lab_report
    names = [e.name for e in rep]
    assert len(names) == len(set(names))
    for pname, p in model.named_parameters(remove_duplicate=False):
        if p.dim() < 2:
            continue
        owner = pname.rpartition(".")[0]
        assert any(owner == n or owner.startswith(n + ".") for n in names), f"{pname} is in no report entry"
    for e in rep:
        mod = model.get_submodule(e.name)
        if e.action == "converted":
            assert isinstance(mod, (ft.Linear, ft.Conv1D, ft.Experts)), e
        else:
            assert e.reason and not isinstance(mod, (ft.Linear, ft.Conv1D, ft.Experts)), e
    kinds = {e.kind: (e.action, e.reason) for e in rep}
    assert kinds["Embedding"][0] == "no matmul"
    if make in (make_mixtral, make_qwen_moe):
        experts = [e for e in rep if e.name.endswith("mlp.experts")]
        assert [e.name for e in experts] == [f"model.layers.{i}.mlp.experts" for i in range(2)]
        assert all(e.action == "converted" and "4 experts" in e.reason for e in experts)
        routers = [e for e in rep if e.name.endswith("mlp.gate")]  # kept in high precision by default
        assert len(routers) == 2 and all(e.action == "kept" and "router" in e.reason for e in routers)
    if make is make_qwen_moe:
        (gate,) = [e for e in rep if e.name == "model.layers.0.mlp.shared_expert_gate"]
        assert gate.action == "kept" and "routers=True" in gate.reason
        assert "model.layers.1.mlp.shared_expert.down_proj" in rep.converted


def test_gpt2_exclusions_reported():
    model = make_gpt2(tie=False)
    model.transformer.h[1].mlp.c_fc.register_forward_hook(lambda m, i, o: None)
    model = ft.convert(model, "ufp4", exclude=r"\.attn\.")
    rep = {e.name: e for e in model.fp4lab_report}
    assert rep["transformer.h.0.attn.c_attn"].action == "left"
    assert rep["transformer.h.0.attn.c_attn"].reason == "not matched by include/exclude"
    hooked = rep["transformer.h.1.mlp.c_fc"]
    assert hooked.action == "left" and "hooks (forward_hooks)" in hooked.reason
    assert isinstance(model.transformer.h[1].mlp.c_fc, HFConv1D)
    assert isinstance(model.transformer.h[1].mlp.c_proj, ft.Conv1D)
    assert rep["lm_head"].action == "converted"


@pytest.mark.parametrize("opt", ["include", "exclude"])
def test_pattern_matching_nothing_is_an_error(opt):
    model = make_llama()
    with pytest.raises(ValueError, match=rf"^convert\(\): {opt} 'lm_haed' matches no module of the model$"):
        ft.convert(model, "ufp4", **{opt: "lm_haed"})
    assert not any(isinstance(m, ft.Linear) for m in model.modules())  # refused before anything was swapped


@pytest.mark.parametrize("opt", ["include", "exclude"])
def test_bad_regex_names_the_option(opt):
    with pytest.raises(ValueError, match=rf"^convert\(\): {opt} 'layers\.\(': not a regular expression") as e:
        ft.convert(make_llama(), "ufp4", **{opt: r"layers.("})
    assert not isinstance(e.value, re.error) and "\n" not in str(e.value)


def golden_dw(name, seed, layer, dy, x, multiple):
    """The golden wgrad GEMM dYᵀ·X at step 0 of layer ``layer``, tokens zero-padded by hand to ``multiple``."""
    def pad(t):
        t = np.ascontiguousarray(t.detach().numpy().T, np.float32)
        out = np.zeros((t.shape[0], -(-t.shape[1] // multiple) * multiple), np.float32)
        out[:, :t.shape[1]] = t
        return out
    cfg = lambda o: fp4lab.config(name, pass_="bwd_dw", operand=o,  # noqa: E731
                                  seed=fp4lab._core.training_seed(seed, 0), stream=layer)
    qa, qb = fp4lab.quantize_with(pad(dy), cfg("a")), fp4lab.quantize_with(pad(x), cfg("b"))
    return torch.from_numpy(fp4lab.gemm(qa, qb))


@pytest.mark.parametrize("name", ["ufp4", "nvfp4"])
def test_experts_equal_per_expert_linears_and_golden(name):
    """Each expert's GEMMs are an fp4lab Linear's holding its matrix (SR key <name>.<proj>.<e>), bit for bit in the
    output and every gradient; an expert's down_proj weight gradient is the golden GEMM on its tokens padded."""
    hf = make_mixtral().model.layers[0].mlp.experts
    with torch.no_grad():
        hf.gate_up_proj.normal_(0, 0.1)
        hf.down_proj.normal_(0, 0.1)
    r = ft.Recipe(name, seed=2)
    ex = ft.Experts(hf, r)
    ex.name = "moe"
    assert ex.gate_up_proj is hf.gate_up_proj and ex.down_proj is hf.down_proj
    E = ex.num_experts
    g = torch.Generator().manual_seed(1)
    tokens = 21
    hidden = torch.randn(tokens, 64, generator=g)
    top_k_index = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(tokens)])
    top_k_weights = torch.softmax(torch.randn(tokens, 2, generator=g), -1)
    dy = torch.randn(tokens, 64, generator=g)
    x1 = hidden.clone().requires_grad_()
    y1 = ex(x1, top_k_index, top_k_weights)
    y1.backward(dy)
    assert ex.step == 1

    # The reference: the transformers eager loop with one fp4lab Linear per expert matrix.
    gus = [ft.Linear(64, 256, bias=False, recipe=r, layer_id=ft.layer_id_of(f"moe.gate_up_proj.{e}")) for e in range(E)]
    downs = [ft.Linear(128, 64, bias=False, recipe=r, layer_id=ft.layer_id_of(f"moe.down_proj.{e}")) for e in range(E)]
    with torch.no_grad():
        for e in range(E):
            gus[e].weight.copy_(hf.gate_up_proj[e])
            downs[e].weight.copy_(hf.down_proj[e])
    x2 = hidden.clone().requires_grad_()
    y2 = torch.zeros_like(x2)
    inner = {}
    for e in range(E):
        pos, tok = torch.where(top_k_index.t() == e)  # in the order transformers gathers them: by slot, then token
        if len(tok) == 0:
            continue
        gate, up = gus[e](x2[tok]).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        out = downs[e](h)
        out.retain_grad()
        inner[e] = (h, out)
        y2 = y2.index_add(0, tok, out * top_k_weights[tok, pos, None])
    y2.backward(dy)
    assert len(inner) == E and {len(torch.where(top_k_index == e)[0]) % 16 for e in range(E)} != {0}
    assert torch.equal(bits(y1), bits(y2))
    assert torch.equal(bits(x1.grad), bits(x2.grad))
    for e in range(E):
        assert torch.equal(bits(hf.gate_up_proj.grad[e]), bits(gus[e].weight.grad)), e
        assert torch.equal(bits(hf.down_proj.grad[e]), bits(downs[e].weight.grad)), e
        h, out = inner[e]
        gold = golden_dw(name, 2, ft.layer_id_of(f"moe.down_proj.{e}"), out.grad, h, 16)
        assert torch.equal(bits(hf.down_proj.grad[e]), bits(gold)), e


@pytest.mark.parametrize("make", [make_mixtral, make_qwen_moe])
def test_moe_models_train_with_every_expert_under_the_recipe(make):
    model = ft.convert(make(), ft.Recipe("nvfp4", seed=1), exclude=r"lm_head")
    experts = [m for m in model.modules() if isinstance(m, ft.Experts)]
    assert len(experts) == 2
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(7))  # 21 tokens
    seen = set()  # the quantised GEMMs that ran, by label (an observer of fp4lab.torch's GEMMs, as the monitor is)

    def observe(owner, step, pass_, a, b, qa, qb, y, cfg):
        seen.add(owner._label())

    ft.ops.observers.append(observe)
    try:
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
    finally:
        ft.ops.observers.remove(observe)
    opt.step()
    assert np.isfinite(loss.item())
    assert all(m.step == 1 for m in experts)
    for i in range(2):
        hit = {e for e in range(4) if f"model.layers.{i}.mlp.experts.down_proj.{e}" in seen}
        assert hit and all(f"model.layers.{i}.mlp.experts.gate_up_proj.{e}" in seen for e in hit)
        ex = model.get_submodule(f"model.layers.{i}.mlp.experts")
        for e in range(4):  # an expert gets a gradient exactly when its GEMMs ran under the recipe
            assert bool(ex.down_proj.grad[e].abs().sum() > 0) == (e in hit)
    # A hooked experts module is left, and says why.
    m = make()
    m.model.layers[1].mlp.experts.register_forward_hook(lambda *a: None)
    rep = {e.name: e for e in ft.convert(m, "ufp4").fp4lab_report}
    e = rep["model.layers.1.mlp.experts"]
    assert e.action == "left" and e.reason.startswith("fused 3-D MoE expert parameters (gate_up_proj [4, ")
    assert "hooks (forward_hooks)" in e.reason and rep["model.layers.0.mlp.experts"].action == "converted"


@pytest.mark.parametrize("make", [make_llama, make_gpt2, make_mixtral])
def test_export_state_dict_loads_strictly_into_the_plain_model(make, tmp_path):
    model = ft.convert(make(), ft.Recipe("nvfp4", seed=1))
    ids = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(7))
    model(input_ids=ids, labels=ids).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # trained weights, not the init a fresh model has
    plain = make()
    with pytest.raises(RuntimeError, match="Unexpected key.*_extra_state"):
        plain.load_state_dict(model.state_dict(), strict=True)
    sd = ft.export_state_dict(model)
    assert not any(k.endswith("_extra_state") for k in sd)
    assert set(sd) == set(plain.state_dict())
    plain.load_state_dict(sd, strict=True)
    assert all(torch.equal(v, sd[k]) for k, v in plain.state_dict().items())
    # A converted model loads it strictly too, and keeps its own steps.
    again = ft.convert(make(), ft.Recipe("nvfp4", seed=1))
    ft.set_step(again, 5)
    again.load_state_dict(sd, strict=True)
    assert {m.step for m in again.modules() if isinstance(m, (ft.Linear, ft.Conv1D, ft.Experts))} == {5}
    # save_pretrained with it writes what from_pretrained reads with no unexpected or missing keys.
    model.save_pretrained(tmp_path, state_dict=dict(sd))  # (save_pretrained pops keys from the dict it is given)
    loaded, info = type(plain).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    assert all(torch.equal(v, sd[k]) for k, v in loaded.state_dict().items())
