#!/usr/bin/env python3
"""CPU training-step time of a small Hugging Face Llama under fp4lab recipes in `exact` and `fast` mode, beside the
plain model, paired: each round times one step of every variant, so load on the machine hits them alike.

The model (hidden 256, FFN 512, 2 layers, 4 heads, vocabulary 512, 4 sequences of 128 tokens; every linear layer
but the head converted) is built from a config: nothing is downloaded. Prints, per variant, the median and the
fastest of the timed rounds and their ratio to the plain model, and per recipe fast/exact.

    nice -n 10 python3 scripts/cpu_step_modes.py [--recipes ufp4,nvfp4] [--rounds 16] [--warmup 2]
"""
import argparse
import copy
import statistics
import time

import torch
import transformers

import fp4lab.torch as ft


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", default="ufp4,nvfp4")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    base = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(1))
    models = {"plain": base}
    recipes = args.recipes.split(",")
    for rec in recipes:
        for mode in ("exact", "fast"):
            models[f"{rec} {mode}"] = ft.convert(copy.deepcopy(base), ft.Recipe(rec, mode=mode), exclude="lm_head")
    times = {k: [] for k in models}
    for i in range(args.warmup + args.rounds):
        for k, m in models.items():
            t = time.perf_counter()
            m(input_ids=ids, labels=ids).loss.backward()
            if i >= args.warmup:
                times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    print(f"{'variant':14s} {'median ms':>10s} {'fastest ms':>11s} {'x plain (fastest)':>18s}")
    for k in models:
        print(f"{k:14s} {med[k] * 1e3:10.1f} {low[k] * 1e3:11.1f} {low[k] / low['plain']:18.2f}")
    for rec in recipes:
        print(f"{rec}: fast/exact {low[rec + ' fast'] / low[rec + ' exact']:.2f} (fastest), "
              f"{med[rec + ' fast'] / med[rec + ' exact']:.2f} (median)")


if __name__ == "__main__":
    main()
