"""The SR step across copies and checkpoints: an AveragedModel (EMA) copy keeps the step it was copied at and does not
follow the live model's (its eval forwards do not depend on it: every recipe rounds forward operands to nearest;
set_step makes it follow); a Hugging Face model saved with its steps, loaded by from_pretrained and converted again
takes them back with load_steps and trains on bit for bit as the original does."""
import copy

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import fp4lab.torch as ft
from hf_steps import train_steps
from fp4lab._files import DataError


def bits(t):
    return t.detach().contiguous().view(torch.int32)


@pytest.mark.parametrize("recipe", ["ufp4", "nvfp4"])
def test_ema_copy_keeps_its_step_and_evaluates_independently_of_it(recipe):
    torch.manual_seed(0)
    model = ft.convert(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)), ft.Recipe(recipe, seed=2))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, t = torch.randn(32, 64), torch.randn(32, 32)
    for _ in range(3):
        opt.zero_grad()
        (model(x) - t).pow(2).mean().backward()
        opt.step()
        ema.update_parameters(model)
    assert model[0].step == 3 and ema.module[0].step == 0  # the copy does not follow
    ema.eval()
    with torch.no_grad():
        y0 = ema(x)
        ft.set_step(ema.module, model[0].step)  # following it, where a copy is trained on
        y3 = ema(x)
    assert ema.module[0].step == 3 and torch.equal(bits(y0), bits(y3))
    # Its training forwards, though, draw the SR bits of their own step: the step is what set_step makes it.
    ema.train()
    g = []
    for s in (0, 3):
        ft.set_step(ema.module, s)
        ema.zero_grad()
        (ema(x) - t).pow(2).mean().backward()
        g.append(ema.module[0].weight.grad.clone())
    assert not torch.equal(g[0], g[1])


def make_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def train(model, steps, ids):
    """The FP32 losses (Python floats hold them exactly) of `steps` SGD steps."""
    return train_steps(model, ids, steps=steps, lr=0.05, optimizer=torch.optim.SGD)


def test_from_pretrained_then_convert_takes_the_steps_back(tmp_path):
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(7))
    model = ft.convert(make_llama(), ft.Recipe("nvfp4", seed=1), exclude=r"lm_head")
    train(model, 3, ids)
    model.save_pretrained(tmp_path / "ckpt")  # the whole state dict: weights and the SR steps
    cont = train(copy.deepcopy(model), 2, ids)  # the second loss follows the first step's SR gradients

    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ckpt")
    ft.convert(loaded, ft.Recipe("nvfp4", seed=1), exclude=r"lm_head")
    assert loaded.model.layers[0].mlp.up_proj.step == 0  # what convert alone gives
    restart = train(copy.deepcopy(loaded), 2, ids)
    assert ft.load_steps(loaded, tmp_path / "ckpt") == 14  # 2 blocks x 7 projections
    assert {m.step for m in loaded.modules() if isinstance(m, ft.Linear)} == {3}
    resumed = train(loaded, 2, ids)
    assert resumed == cont
    assert restart[1] != cont[1]  # from step 0 the SR bits differ
    # A state dict works as well as the folder; one saved without the steps is refused by its first key.
    assert ft.load_steps(loaded, model.state_dict()) == 14
    with pytest.raises(DataError, match=r"^load_steps\(\): model\.layers\.0\.self_attn\.q_proj\._extra_state: not "
                                        r"in the checkpoint"):
        ft.load_steps(loaded, ft.export_state_dict(model))
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(DataError, match=r"bad\.safetensors: not a readable \.safetensors file"):
        ft.load_steps(loaded, tmp_path / "bad.safetensors")
