"""fp4lab.torch with token counts the blocks do not divide (a 3x7-token micro-batch, one token): the weight-gradient
GEMM reduces over tokens, and its partial last block is defined as zero-padded (docs/spec.md, the block-scaled GEMM).
The layer's outputs and gradients equal, bit for bit, the golden model (fp4lab.quantize_with / fp4lab.gemm on numpy
arrays) run on operands zero-padded here by hand; a model trains on such micro-batches; an eval forward with grad
enabled runs."""
import numpy as np
import pytest
import torch
from torch import nn

import fp4lab
import fp4lab.torch as ft

LAYER = 1234


def golden_config(name: str, knobs: dict, seed: int, step: int, pass_: str, operand: str):
    # The recipe's settings for the operand with the SR key (seed, step, layer) as the training step sets it
    # (docs/spec.md §12), built through the package's own config(), not the layer's recipe.
    return fp4lab.config(name, pass_=pass_, operand=operand, seed=fp4lab._core.training_seed(seed, step),
                         stream=LAYER, **knobs)


def pad_k(x: np.ndarray, multiple: int) -> np.ndarray:
    k = x.shape[1]
    out = np.zeros((x.shape[0], -(-k // multiple) * multiple), np.float32)
    out[:, :k] = x
    return out


def golden_product(name, knobs, seed, step, pass_, a, b, mode, multiple):
    a, b = pad_k(np.ascontiguousarray(a, np.float32), multiple), pad_k(np.ascontiguousarray(b, np.float32), multiple)
    qa = fp4lab.quantize_with(a, golden_config(name, knobs, seed, step, pass_, "a"))
    qb = fp4lab.quantize_with(b, golden_config(name, knobs, seed, step, pass_, "b"))
    # fast mode on the CPU multiplies the same quantised operands with the golden GEMM too
    return torch.from_numpy(fp4lab.gemm(qa, qb))


def bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().view(np.uint32)


# The recipes' K multiple for wgrad: their block (16; 32 for mxfp4) and, where wgrad rotates, the RHT size (ufp4
# and nvfp4: 16; 32 with rht=32 on block 16).
@pytest.mark.parametrize("name,knobs,mode,multiple", [("ufp4", {}, "exact", 16), ("nvfp4", {}, "exact", 16),
                                                      ("nvfp4", {}, "fast", 16), ("mxfp4", {}, "exact", 32),
                                                      ("ufp4", {"rht": 32, "rht_seed": 9}, "exact", 32)])
@pytest.mark.parametrize("shape", [(3, 7), (1, 1)])
def test_partial_token_block_equals_padded_golden(name, knobs, mode, multiple, shape):
    seed = 5
    r = ft.Recipe(name, mode=mode, seed=seed, **knobs)
    assert r.k_multiple["bwd_dw"] == multiple
    torch.manual_seed(0)
    lin = ft.Linear(64, 32, recipe=r, layer_id=LAYER)
    x = torch.randn(*shape, 64, requires_grad=True)
    dy = torch.randn(*shape, 32)
    y = lin(x)
    y.backward(dy)
    assert lin.step == 1
    x2, dy2, w = x.detach().reshape(-1, 64).numpy(), dy.reshape(-1, 32).numpy(), lin.weight.detach().numpy()
    y_gold = golden_product(name, knobs, seed, 0, "fwd_y", x2, w, mode, multiple) + lin.bias.detach()
    dx_gold = golden_product(name, knobs, seed, 0, "bwd_dx", dy2, w.T, mode, multiple)
    dw_gold = golden_product(name, knobs, seed, 0, "bwd_dw", dy2.T, x2.T, mode, multiple)  # K = tokens, zero-padded
    assert (bits(y.reshape(-1, 32)) == bits(y_gold)).all()
    assert (bits(x.grad.reshape(-1, 64)) == bits(dx_gold)).all()
    assert (bits(lin.weight.grad) == bits(dw_gold)).all()
    assert (bits(lin.bias.grad) == bits(dy.reshape(-1, 32).sum(0))).all()


@pytest.mark.parametrize("name", ["ufp4", "nvfp4"])
def test_21_token_micro_batches_train(name):
    torch.manual_seed(0)
    model = ft.convert(nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)), ft.Recipe(name, seed=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 64, generator=g)
    target = torch.randn(3, 7, 64, generator=g)
    losses = []
    for _ in range(8):
        loss = nn.functional.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert model[0].step == model[2].step == 8
    assert losses[-1] < losses[0] * 0.9, losses


def test_eval_forward_with_grad_enabled():
    torch.manual_seed(0)
    lin = ft.Linear(64, 32, recipe="nvfp4", layer_id=LAYER)
    lin.eval()
    x = torch.randn(3, 7, 64)
    with torch.no_grad():
        y0 = lin(x)
    y = lin(x)  # grad enabled, the weight requires grad: the backward's shapes are checked, with 21 tokens
    assert y.requires_grad
    assert (bits(y) == bits(y0)).all()
    y.sum().backward()
    assert lin.weight.grad.shape == (32, 64) and lin.step == 0  # eval mode takes no training step
