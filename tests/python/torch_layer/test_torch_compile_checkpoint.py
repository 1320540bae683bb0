"""Activation checkpointing inside a torch.compile'd model: the compiled graph recomputes a checkpointed region's
forward reading the SR step counter after the forward advanced it, so its gradients would differ from eager's without
a word. fp4lab refuses it at the first backward with one line that says what to do; eager checkpointing keeps
eager's bits, and a compiled model without checkpointing is untouched."""
import copy

import pytest
import torch
import torch.utils.checkpoint as tc
from torch import nn

import fp4lab.torch as ft


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, checkpoint=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.checkpoint = checkpoint  # None, or use_reentrant's value

    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.checkpoint is None else tc.checkpoint(b, x, use_reentrant=self.checkpoint)
        return x


def bits(t):
    return t.detach().view(torch.int32)


def step(model, x, t):
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()  # a reentrant checkpoint records a graph only for an input that requires grad
    loss = (model(x) - t).square().mean()
    loss.backward()
    return loss


def grads(model):
    return [bits(p.grad) for p in model.parameters()]


X, T = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)), torch.randn(64, 32)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpointing_inside_a_compiled_model_is_refused(backend):
    torch.manual_seed(0)
    model = ft.convert(Net(checkpoint=False), "nvfp4")
    # A copy of the same names trained further (an eager one, and a compiled one without checkpointing) must not
    # hide the fault: the operators tell modules apart by instance, not by name.
    ahead = copy.deepcopy(model)
    ahead.checkpoint = None
    for m in (ahead, torch.compile(copy.deepcopy(ahead), backend=backend)):
        for _ in range(3):
            step(m, X, T)
    compiled = torch.compile(model, backend=backend)
    with pytest.raises(RuntimeError, match=r"^blocks\.\d\.fc\d: activation checkpointing inside a torch\.compile'd "
                                           r"graph recomputes the forward with SR step 1, which no forward took: "
                                           r"checkpoint in eager mode, or compile without activation checkpointing"):
        step(compiled, X, T)


def test_eager_checkpointing_and_compiled_model_keep_eager_bits():
    torch.manual_seed(0)
    plain = ft.convert(Net(), "nvfp4")
    ckpt = {r: copy.deepcopy(plain) for r in (False, True)}
    for r, m in ckpt.items():
        m.checkpoint = r
    compiled_model = copy.deepcopy(plain)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    for _ in range(2):  # the second step's recomputation is keyed by step 1, which the check must let through
        ref = step(plain, X, T)
        for m in ckpt.values():
            assert torch.equal(bits(step(m, X, T)), bits(ref))
            assert all(torch.equal(a, b) for a, b in zip(grads(m), grads(plain)))
        assert torch.equal(bits(step(compiled, X, T)), bits(ref))
        assert all(torch.equal(a, b) for a, b in zip(grads(compiled_model), grads(plain)))
    assert plain.blocks[1].fc2.step == 2


def test_hf_gradient_checkpointing_under_compile_is_refused():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = ft.convert(transformers.LlamaForCausalLM(cfg), "nvfp4", exclude=r"lm_head")
    model.train()
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(7))
    compiled = torch.compile(model, backend="aot_eager")
    loss = compiled(input_ids=ids, labels=ids).loss
    with pytest.raises(RuntimeError, match=r"^model\.layers\.0\.\S+: activation checkpointing inside a "
                                           r"torch\.compile'd graph"):
        loss.backward()
