#!/usr/bin/env python3
"""Training-step time of a Mixtral-style mixture-of-experts decoder under fp4lab recipes, beside BF16 in the same
process.

Each block is attention (fused QKV and output projections, causal SDPA) and a Mixtral-style sparse MoE: a router
(a Linear to the experts, softmax, top-k, weights renormalised) and experts stored as transformers'
``MixtralExperts`` stores them (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I], SiLU), computed by the
transformers eager loop. ``fp4lab.torch.convert`` puts the attention projections and every expert's two GEMMs
under the recipe (the experts become ``fp4lab.torch.Experts``); the router, the embedding and the head stay BF16,
as Transformer Engine keeps routers in high precision. Each expert sees a data-dependent token count, so most
expert GEMMs take the zero-padded partial last block of docs/spec.md §5.

For each recipe and GEMM mode it prints the median step time over --steps timed steps (CUDA events, after --warmup
steps), the ratio to BF16 and the loss at the first and last step on a learnable synthetic token stream.

    python3 scripts/bench_moe_step.py [--recipes bf16,ufp4,nvfp4] [--modes fast,exact] [--json out.json]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn

import fp4lab
import fp4lab.torch as ft
from bench_train_step import batches, train_step  # the 103M benchmark's data stream and timed step


class MixtralStyleExperts(nn.Module):
    """The experts' parameters in transformers' MixtralExperts layout and its eager forward."""

    def __init__(self, experts, hidden, inter):
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inter, hidden) * hidden ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, inter) * inter ** -0.5)
        self.act_fn = F.silu

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = int(e[0])
            if e == self.num_experts:
                continue
            pos, idx = torch.where(mask[e])
            gate, up = F.linear(hidden_states[idx], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = F.linear(self.act_fn(gate) * up, self.down_proj[e]) * top_k_weights[idx, pos, None]
            final.index_add_(0, idx, h.to(final.dtype))
        return final


class SparseMoe(nn.Module):
    def __init__(self, hidden, inter, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = MixtralStyleExperts(experts, hidden, inter)

    def forward(self, x):
        b, t, h = x.shape
        x = x.reshape(-1, h)
        probs = F.softmax(self.router(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.experts(x, idx, w).view(b, t, h)


class Block(nn.Module):
    def __init__(self, d, heads, inter, experts, top_k):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.moe = SparseMoe(d, inter, experts, top_k)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.moe(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.d)
        self.blocks = nn.ModuleList(Block(a.d, a.heads, a.inter, a.experts, a.top_k) for _ in range(a.layers))
        self.norm = nn.RMSNorm(a.d)
        self.head = nn.Linear(a.d, a.vocab, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def run(a, recipe, mode, device):
    torch.manual_seed(0)
    model = Decoder(a).to(device, torch.bfloat16)
    coverage = None
    if recipe != "bf16":
        ft.convert(model, ft.Recipe(recipe, mode=mode, seed=0), include=r"^blocks\.", exclude=r"\.router$")
        coverage = str(model.fp4lab_report)
        n_exp = sum(isinstance(m, ft.Experts) for m in model.modules())
        assert n_exp == a.layers, f"{n_exp} of {a.layers} expert modules under the recipe"
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=device.type == "cuda")
    data = batches(a.vocab, a.batch, a.seq, device, seed=1)
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        loss, ms = train_step(model, next(data), a.vocab, opt, device, check=recipe != "bf16")
        losses.append(loss)
        if step >= a.warmup:
            times.append(ms)
    med = statistics.median(times)
    return {"recipe": recipe, "mode": mode if recipe != "bf16" else "-", "median_ms": med,
            "min_ms": min(times), "max_ms": max(times), "loss_first": losses[0], "loss_last": losses[-1],
            "steps_timed": len(times), "tokens_per_s": a.batch * a.seq / (med / 1e3), "coverage": coverage}


def table(info):
    m = info["model"]
    lines = [f"Mixtral-style MoE decoder: d {m['d']}, {m['layers']} layers, {m['experts']} experts (top-{m['top_k']}),"
             f" expert FFN {m['inter']}, sequence {m['seq']}, batch {m['batch']}; {info['device']}, median of "
             f"{info['rows'][0]['steps_timed']} steps",
             "", "| recipe | GEMMs | ms/step | min–max ms | tokens/s | × BF16 | loss first → last |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in info["rows"]:
        lines.append(f"| `{r['recipe']}` | {r['mode']} | {r['median_ms']:.2f} | {r['min_ms']:.1f}–{r['max_ms']:.1f} "
                     f"| {r['tokens_per_s']:,.0f} | {r['vs_bf16']:.2f} | {r['loss_first']:.3f} → "
                     f"{r['loss_last']:.3f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", default="bf16,ufp4,nvfp4")
    ap.add_argument("--modes", default="fast,exact")
    for k, v in (("d", 1024), ("layers", 4), ("heads", 16), ("inter", 2816), ("experts", 8), ("top-k", 2),
                 ("seq", 1024), ("batch", 8), ("vocab", 32000), ("warmup", 3), ("steps", 10)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    device = torch.device(a.device)
    rows = []
    for recipe in a.recipes.split(","):
        for mode in (a.modes.split(",") if recipe != "bf16" else ["-"]):
            r = run(a, recipe, mode, device)
            rows.append(r)
            print(f"{recipe:8s} {r['mode']:6s} {r['median_ms']:9.2f} ms/step  loss {r['loss_first']:.3f} -> "
                  f"{r['loss_last']:.3f}", flush=True)
    base = next((r["median_ms"] for r in rows if r["recipe"] == "bf16"), None)
    for r in rows:
        r["vs_bf16"] = r["median_ms"] / base if base else float("nan")
    cov = next((r["coverage"] for r in rows if r["coverage"]), None)
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    info = {"model": {k: getattr(a, k) for k in ("d", "layers", "heads", "inter", "experts", "top_k", "seq", "batch",
                                                  "vocab")},
            "device": dev, "torch": torch.__version__, "fp4lab": fp4lab.__version__, "rows": rows,
            "command": "python3 scripts/bench_moe_step.py " + " ".join(sys.argv[1:])}
    print(table(info))
    if cov:
        print("\nconvert's report (the first quantised run):\n" + cov)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
