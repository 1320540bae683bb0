"""The study's decoder, its sizes and its recipes (the presets and the ablations)."""
import math

from .. import ABLATIONS, _core

# d_model, layers, heads, FFN width, sequence, batch (sequences), peak learning rate.
SIZES = {
    "small": dict(d=512, layers=10, heads=8, ffn=1408, seq=512, batch=16, lr=1.5e-3),
    "large": dict(d=1024, layers=8, heads=16, ffn=2816, seq=1024, batch=8, lr=6e-4),
    "test": dict(d=64, layers=2, heads=2, ffn=128, seq=64, batch=4, lr=3e-3),  # for the CPU test only
}

# name -> what it is: BF16, the presets, then the ablations of the paper's dense 1.5B study (RHT scope on the uniform
# grid, SR, and E2M1 with RHT everywhere), each said as the C++ table of named recipes says it (_core.recipe_rows();
# fp4lab.ABLATIONS). fp4lab.torch.Recipe takes every name but bf16's as it is.
_WHAT = {r["name"]: r["what"] for r in _core.recipe_rows()}
RECIPES = {"bf16": "BF16 GEMMs (autocast), the reference"}
RECIPES.update((n, _WHAT[n]) for n in _core.recipe_names())
RECIPES.update((n, _WHAT[n]) for n in ABLATIONS if n not in RECIPES)


# The SR draws (docs/spec.md §4) by name, and the presets' (QuantConfig's default).
SR_DRAWS = tuple(_core.SrDraw.__members__)
DEFAULT_SR_DRAW = _core.QuantConfig().sr_draw.name


def make_recipe(name: str, mode: str, seed: int, sr_draw: str = DEFAULT_SR_DRAW):
    """The run's fp4lab.torch.Recipe; another SR draw than the presets' is set on every operand."""
    import fp4lab.torch as ft
    if name == "bf16":
        return ft.Recipe("bf16")
    knobs = {} if sr_draw == DEFAULT_SR_DRAW else {"sr_draw": sr_draw}
    return ft.Recipe(name, mode=mode, seed=seed, check_finite="deferred", **knobs)


def build_model(cfg: dict, vocab: int = 256):
    """The decoder of docs/training.md (scripts/bench_train_step.py times the same one): cfg gives d, layers,
    heads, ffn and seq."""
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d, heads, ffn):
            super().__init__()
            self.heads = heads
            self.norm1 = nn.RMSNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.norm2 = nn.RMSNorm(d)
            self.fc1 = nn.Linear(d, 2 * ffn, bias=False)  # gate and up in one GEMM
            self.fc2 = nn.Linear(ffn, d, bias=False)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            g, u = self.fc1(self.norm2(x)).chunk(2, dim=-1)
            return x + self.fc2(F.silu(g) * u)

    class Decoder(nn.Module):
        def __init__(self, vocab, d, layers, heads, ffn, seq):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
            self.norm = nn.RMSNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers).
                    std = 0.02 / math.sqrt(2 * layers) if n.endswith(("proj.weight", "fc2.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            x = self.emb(idx) + self.pos.weight[: idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    return Decoder(vocab, cfg["d"], cfg["layers"], cfg["heads"], cfg["ffn"], cfg["seq"])
