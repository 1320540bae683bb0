"""fp4lab.torch.convert on a Hugging Face transformers LlamaForCausalLM (a small random LlamaConfig: nothing is
downloaded): every projection of the decoder layers converted, embeddings and lm_head left, and a few training
steps under every recipe with the loss finite and going down; the numerics monitor on it."""
import json
import math

import pytest
import torch
import transformers  # scripts/install-deps.sh installs it

import fp4lab.torch as ft
from hf_steps import train_steps


def make_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg)


PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")


def test_convert_report_llama():
    model = ft.convert(make_llama(), "ufp4", exclude=r"lm_head")
    rep = model.fp4lab_report
    assert rep.converted == [f"model.layers.{i}.{p}" for i in range(2) for p in PROJ]
    assert rep.left == ["lm_head"]
    assert isinstance(model.lm_head, torch.nn.Linear) and not isinstance(model.lm_head, ft.Linear)
    assert type(model.model.embed_tokens) is torch.nn.Embedding
    assert isinstance(model.model.layers[1].mlp.down_proj, ft.Linear)
    assert "model.layers.0.self_attn.k_proj [Linear]: converted" in str(rep)


@pytest.mark.parametrize("recipe", ft.RECIPES)
def test_llama_trains(recipe):
    model = ft.convert(make_llama(), ft.Recipe(recipe, seed=1), exclude=r"lm_head")
    model.train()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 128, (4, 16), generator=g)  # 64 tokens: a multiple of every block and RHT size
    losses = train_steps(model, ids, steps=4)
    assert all(math.isfinite(v) for v in losses), losses
    q = model.model.layers[0].self_attn.q_proj
    assert q.step == (0 if recipe == "bf16" else 4)  # the bf16 recipe is plain F.linear and keeps no SR step
    assert losses[-1] < losses[0] - 0.5, losses  # about 4.87 to 3.91 under each recipe


def test_monitor_on_llama(tmp_path):
    """The numerics monitor names the Llama projections by their qualified names, every pass and operand."""
    model = ft.convert(make_llama(), "nvfp4", exclude=r"lm_head")
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(7))
    with ft.monitor(model, every=1, out=tmp_path / "m.jsonl"):
        model(input_ids=ids, labels=ids).loss.backward()
    recs = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert sorted({(r["layer"], r["pass"], r["operand"]) for r in recs}) == sorted(
        (f"model.layers.{i}.{p}", q, o) for i in range(2) for p in PROJ for q in ("fwd_y", "bwd_dx", "bwd_dw")
        for o in "ab")
    assert len(recs) == 2 * 7 * 3 * 2
