#!/usr/bin/env python3
"""Train a SwiGLU decoder from scratch under BF16 and under fp4lab's FP4 recipes, and report the paper's metric.

The question (UFP4, arXiv 2606.20381): does the uniform E1M2 grid with RHT on all three training GEMMs (`ufp4`)
train closer to BF16 than the E2M1 reference recipe (`e2m1-ref`), and what do RHT scope and SR on dY contribute?
Every run of one model size starts from the same initialisation and sees the same batches in the same order; only
the arithmetic of the blocks' linear layers changes (fp4lab.torch.convert; the embedding and the output head stay
BF16). docs/training.md reports the results; docs/spec.md §12 defines the metric.

  corpus  Extracts the English reStructuredText sources of the Linux kernel documentation (about 25 MB of English
          prose, GPL-2.0) from the Debian package linux-doc-<version>, installed or as a .deb file, into byte
          token files (vocabulary = 256 bytes) with a held-out validation split (every file whose path's CRC-32
          is 0 mod 20):
            apt-get download linux-doc-6.12      # or apt-get install linux-doc-6.12
            python3 scripts/train_fp4.py corpus --deb linux-doc-6.12_*.deb data/linux-doc
  train   One run; writes its JSON (the fields of docs/results/training.json's runs) when it completes:
            python3 scripts/train_fp4.py train --data data/linux-doc --size small --recipe ufp4 --out runs/x.json
  report  Merges run files into docs/results/training.json, writes the paired comparisons of the recipes
          (fp4lab.paired: per-seed differences, 95% t-intervals, verdicts) to docs/results/training-paired.json,
          the tables of docs/training.md between their markers and the loss-curve figures:
            python3 scripts/train_fp4.py report runs/*.json
  recipes Lists the recipes this script knows (the presets and the ablations) with what each changes.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import struct
import sys
import tarfile
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_CONTINUE = 75  # the run stopped at --time-limit with its state in --checkpoint: run the same command again
ROOT = os.path.dirname(HERE)

# ---------------------------------------------------------------------------------------------------------
# Models and recipes
# ---------------------------------------------------------------------------------------------------------

# d_model, layers, heads, FFN width, sequence, batch (sequences), peak learning rate.
SIZES = {
    "small": dict(d=512, layers=10, heads=8, ffn=1408, seq=512, batch=16, lr=1.5e-3),
    "large": dict(d=1024, layers=8, heads=16, ffn=2816, seq=1024, batch=8, lr=6e-4),
    "test": dict(d=64, layers=2, heads=2, ffn=128, seq=64, batch=4, lr=3e-3),  # for the CPU test only
}

NO_RHT = {"rht": 0}
# name -> (preset, per_pass overrides, per_operand overrides, what it is). The ablations are those of the paper's
# dense 1.5B study (docs/spec.md §8): RHT scope on the uniform grid, SR on dY, and E2M1 with RHT everywhere.
RECIPES = {
    "bf16": ("bf16", {}, {}, "BF16 GEMMs (autocast), the reference"),
    "nvfp4": ("nvfp4", {}, {}, "Transformer Engine's NVFP4 recipe"),
    "mxfp4": ("mxfp4", {}, {}, "OCP MXFP4"),
    "e2m1-ref": ("e2m1-ref", {}, {}, "E2M1, FP32 scales, RHT on bwd_dw, SR on dY (the paper's E2M1 baseline)"),
    "ufp4": ("ufp4", {}, {}, "E1M2, FP32 scales, RHT on all three GEMMs, SR on dY (the paper's recipe)"),
    "ufp4-rht-none": ("ufp4", {"fwd_y": NO_RHT, "bwd_dx": NO_RHT, "bwd_dw": NO_RHT}, {}, "ufp4 without RHT"),
    "ufp4-rht-wgrad": ("ufp4", {"fwd_y": NO_RHT, "bwd_dx": NO_RHT}, {}, "ufp4 with RHT on bwd_dw only"),
    "ufp4-rht-fwd-wgrad": ("ufp4", {"bwd_dx": NO_RHT}, {}, "ufp4 with RHT on fwd_y and bwd_dw"),
    "ufp4-sr-none": ("ufp4", {p: {"rounding": "rtne"} for p in ("fwd_y", "bwd_dx", "bwd_dw")}, {},
                     "ufp4 with round-to-nearest-even everywhere"),
    "ufp4-sr-grads": ("ufp4", {"bwd_dx": {"rounding": "sr"}, "bwd_dw": {"rounding": "sr"}}, {},
                      "ufp4 with SR on every operand of the two gradient GEMMs"),
    "e2m1-rht-all": ("e2m1-ref", {"fwd_y": {"rht": 16}, "bwd_dx": {"rht": 16}}, {},
                     "e2m1-ref with RHT on all three GEMMs"),
}


def make_recipe(name: str, mode: str, seed: int):
    import fp4lab.torch as ft
    preset, per_pass, per_operand, _ = RECIPES[name]
    if preset == "bf16":
        return ft.Recipe("bf16")
    return ft.Recipe(preset, mode=mode, seed=seed, per_pass=per_pass or None, per_operand=per_operand or None,
                     check_finite="deferred")


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


# ---------------------------------------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------------------------------------

SOURCES = "usr/share/doc/{pkg}/html/_sources/"


def _deb_data_tar(path: str) -> tarfile.TarFile:
    """The data.tar.* member of a Debian package (an ar archive), opened with tarfile."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"!<arch>\n":
        raise SystemExit(f"{path}: not a Debian package (no ar header)")
    p = 8
    while p + 60 <= len(blob):
        name = blob[p:p + 16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(blob[p + 48:p + 58].decode("ascii").strip())
        except ValueError:
            raise SystemExit(f"{path}: malformed ar member header at byte {p}") from None
        body = blob[p + 60:p + 60 + size]
        if len(body) != size:
            raise SystemExit(f"{path}: truncated (member {name!r} needs {size} bytes)")
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise SystemExit(f"{path}: zstd-compressed data member; extract it with dpkg-deb -x and pass --root")
            return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")
        p += 60 + size + (size & 1)
    raise SystemExit(f"{path}: no data.tar member")


def _is_english_source(rel: str) -> bool:
    return rel.endswith(".rst.txt") and not rel.startswith("translations/")


def _collect(args):
    """(package, version, {relative path: bytes}) from a .deb or an installed tree."""
    files = {}
    if args.deb:
        base = os.path.basename(args.deb)
        pkg, version = (base.split("_") + ["", ""])[:2]
        with _deb_data_tar(args.deb) as tar:
            for m in tar.getmembers():
                name = m.name[2:] if m.name.startswith("./") else m.name
                prefix = SOURCES.format(pkg=pkg)
                if m.isfile() and name.startswith(prefix) and _is_english_source(name[len(prefix):]):
                    files[name[len(prefix):]] = tar.extractfile(m).read()
    else:
        root = args.root
        docs = os.path.join(root, "usr/share/doc")
        pkgs = sorted(d for d in os.listdir(docs) if d.startswith("linux-doc-")) if os.path.isdir(docs) else []
        if not pkgs:
            raise SystemExit(f"{docs}: no linux-doc-<version> package installed (apt-get install linux-doc-6.12, or "
                             "pass --deb)")
        pkg, version = pkgs[-1], "installed"
        src = os.path.join(root, SOURCES.format(pkg=pkg))
        for dp, _, fns in os.walk(src):
            for fn in fns:
                rel = os.path.relpath(os.path.join(dp, fn), src)
                if _is_english_source(rel):
                    with open(os.path.join(dp, fn), "rb") as f:
                        files[rel] = f.read()
    if not files:
        raise SystemExit(f"{args.deb or args.root}: no English .rst.txt sources found")
    return pkg, version, files


def _write_atomic(path: str, data: bytes) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def cmd_corpus(args):
    import hashlib
    pkg, version, files = _collect(args)
    train, val = [], []
    for rel in sorted(files):
        (val if zlib.crc32(rel.encode()) % 20 == 0 else train).append(files[rel])
    sep = b"\n\n"
    blobs = {"train.bin": sep.join(train), "val.bin": sep.join(val)}
    meta = {"package": pkg, "version": version, "files": {"train": len(train), "val": len(val)},
            "bytes": {k[:-4]: len(v) for k, v in blobs.items()},
            "sha256": {k[:-4]: hashlib.sha256(v).hexdigest() for k, v in blobs.items()},
            "split": "validation = files whose relative path has CRC-32 = 0 mod 20; files joined by a blank line",
            "tokens": "bytes (vocabulary 256)"}
    for k, v in blobs.items():
        _write_atomic(os.path.join(args.out, k), v)
    _write_atomic(os.path.join(args.out, "corpus.json"), (json.dumps(meta, indent=1) + "\n").encode())
    print(f"{pkg} {version}: {len(train)} train files ({meta['bytes']['train']:,} bytes), {len(val)} validation "
          f"files ({meta['bytes']['val']:,} bytes) -> {args.out}")


# ---------------------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------------------

def _load(data_dir: str, name: str):
    import numpy as np
    path = os.path.join(data_dir, name)
    try:
        a = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise SystemExit(f"{path}: {e.strerror}") from None
    return a


def run_name(size: str, recipe: str, mode: str, seed, steps) -> str:
    """A run's name (its JSON, log and checkpoint files): scripts/train_study.sh names runs through `name`."""
    return f"{size}-{recipe}-{'bf16' if recipe == 'bf16' else mode}-s{seed}-{steps}"


def cmd_train(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import fp4lab
    import fp4lab.torch as ft

    cfg = dict(SIZES[args.size])
    for k in ("seq", "batch", "lr"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    seq, batch = cfg["seq"], cfg["batch"]
    if args.steps < 10:
        raise SystemExit(f"--steps {args.steps}: at least 10 (the metric averages the last 10%)")
    if args.out and os.path.exists(args.out) and not args.force:
        raise SystemExit(f"{args.out}: exists (--force to replace)")
    train_data, val_data = _load(args.data, "train.bin"), _load(args.data, "val.bin")
    if len(train_data) < 100 * (seq + 1) or len(val_data) < batch * seq + 1:
        raise SystemExit(f"{args.data}: too little text for sequence {seq}")
    device = torch.device(args.device)
    if args.deterministic:
        # On a GPU, cuDNN attention's backward (and at least one other PyTorch kernel) adds in a varying order, so
        # two runs of one command part after the first step; these settings pick fixed-order algorithms (fp4lab's
        # own kernels are order-independent already). cuBLAS reads the variable when it starts, so it goes first.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)

    torch.manual_seed(args.seed)
    model = build_model(cfg).to(device)
    recipe = make_recipe(args.recipe, args.mode, args.seed)
    if args.recipe != "bf16":
        ft.convert(model, recipe, include=r"^blocks\.")
    block_params = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    warm = max(1, args.steps // 50)

    def lr_at(step):  # linear warm-up, cosine decay to a tenth
        if step < warm:
            return cfg["lr"] * (step + 1) / warm
        t = (step - warm) / max(1, args.steps - warm)
        return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    # The data order depends on the seed only: every recipe of one seed sees the same batches.
    rng = np.random.Generator(np.random.PCG64([args.seed, 0x64617461]))
    offsets = np.arange(seq + 1)

    def train_batch():
        starts = rng.integers(0, len(train_data) - seq - 1, size=batch)
        return torch.from_numpy(train_data[starts[:, None] + offsets].astype(np.int64)).to(device, non_blocking=True)

    n_val = (len(val_data) - 1) // seq
    val_windows = np.arange(n_val) * seq

    def evaluate(max_windows):
        model.eval()
        k = min(max_windows, n_val)
        w = val_windows[: k - k % batch]
        total = torch.zeros((), dtype=torch.float64, device=device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            for i in range(0, len(w), batch):
                x = torch.from_numpy(val_data[w[i:i + batch, None] + offsets].astype(np.int64)).to(device)
                logits = model(x[:, :-1])
                total += F.cross_entropy(logits.float().reshape(-1, 256), x[:, 1:].reshape(-1), reduction="sum")
        model.train()
        return total.item() / (len(w) * seq)

    cap = None
    if args.capture_steps:
        sys.path.insert(0, HERE)
        from capture_traces import TraceCapture, parse_steps
        last_block = cfg["layers"] - 1
        cap = TraceCapture(model, args.capture_pattern or rf"^blocks\.(0|{last_block})\.(qkv|proj|fc1|fc2)$",
                           parse_steps(args.capture_steps), args.capture_dir, max_tokens=args.capture_tokens,
                           token_stride=args.capture_token_stride, max_out=args.capture_max_out,
                           metadata={"model": f"train_fp4.py {args.size}: byte-level SwiGLU decoder, d {cfg['d']}, "
                                              f"{cfg['layers']} layers, FFN {cfg['ffn']}, batch {batch} x {seq}",
                                     "recipe": args.recipe, "corpus": "linux-doc (scripts/train_fp4.py corpus)"})
    losses = torch.zeros(args.steps, dtype=torch.float32, device=device)
    val_steps, val_loss = [], []
    train_time, wall_before, start = 0.0, 0.0, 0
    diverged = None
    # A run may span several invocations (--time-limit, --checkpoint): the checkpoint holds everything the next
    # step depends on, so a resumed run continues bit for bit where it stopped (on a GPU, with --deterministic).
    key = {"size": args.size, "recipe": args.recipe, "mode": args.mode, "seed": args.seed, "steps": args.steps,
           "cfg": cfg, "deterministic": args.deterministic}
    if args.checkpoint and os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint, map_location=device, weights_only=False)
        ck["key"].setdefault("deterministic", False)  # checkpoints written before the option existed
        if ck["key"] != key:
            raise SystemExit(f"{args.checkpoint}: a checkpoint of another run ({ck['key']}), not of this one")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        rng.bit_generator.state = ck["rng"]
        losses[: ck["step"]] = ck["losses"].to(device)
        val_steps, val_loss, train_time, wall_before, start = (ck["val_steps"], ck["val_loss"], ck["train_time"],
                                                               ck["wall_s"], ck["step"])
        if args.recipe != "bf16":
            ft.set_step(model, start)
        print(f"[{args.name}] resumed at step {start} from {args.checkpoint}", flush=True)
    t_start = time.time()
    step = start - 1
    for step in range(start, args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x = train_batch()
        with cap.at(step) if cap else contextlib.nullcontext():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 256), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses[step] = loss.detach()
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_time += time.perf_counter() - t0
        last = step + 1 == args.steps
        if (step + 1) % args.log_every == 0 or last:
            if args.recipe != "bf16" and device.type == "cuda":
                try:
                    ft.check_finite()
                except ValueError as e:
                    diverged = f"step {step}: {e}"
            recent = losses[max(0, step + 1 - args.log_every): step + 1]
            if not torch.isfinite(recent).all():
                diverged = diverged or f"step {step}: non-finite training loss"
            print(f"[{args.name}] step {step + 1}/{args.steps} loss {recent.mean().item():.4f} "
                  f"{(step + 1) * batch * seq / train_time:,.0f} tok/s", flush=True)
            if diverged:
                print(f"[{args.name}] stopped: {diverged}", flush=True)
                break
        if (step + 1) % args.eval_every == 0 or last:
            val_steps.append(step + 1)
            val_loss.append(evaluate(n_val if last else args.eval_windows))
            print(f"[{args.name}] step {step + 1} validation loss {val_loss[-1]:.4f}", flush=True)
        if args.time_limit and not last and time.time() - t_start > args.time_limit:
            buf = io.BytesIO()
            torch.save({"key": key, "model": model.state_dict(), "opt": opt.state_dict(),
                        "rng": rng.bit_generator.state, "losses": losses[: step + 1].cpu(), "step": step + 1,
                        "val_steps": val_steps, "val_loss": val_loss, "train_time": train_time,
                        "wall_s": wall_before + time.time() - t_start}, buf)
            _write_atomic(args.checkpoint, buf.getvalue())
            print(f"[{args.name}] time limit: stopped after step {step + 1}, state in {args.checkpoint}", flush=True)
            sys.exit(EXIT_CONTINUE)
    done = step + 1
    run = {
        "name": args.name, "model": args.size, "params": params, "block_params": block_params,
        "recipe": args.recipe, "recipe_detail": RECIPES[args.recipe][3],
        "gemm_mode": "bf16" if args.recipe == "bf16" else args.mode, "seed": args.seed,
        "steps": list(range(1, done + 1)), "train_loss": [float(v) for v in losses[:done].cpu().tolist()],
        "val_steps": val_steps, "val_loss": val_loss,
        "tokens_per_s": done * batch * seq / train_time,
        "config": {**cfg, "steps": args.steps, "warmup_steps": warm, "optimizer": "AdamW(0.9, 0.95), wd 0.1",
                   "grad_clip": 1.0, "schedule": "linear warm-up, cosine to 0.1", "precision":
                   "FP32 master weights, BF16 autocast", "val_tokens_final": int((n_val - n_val % batch) * seq),
                   "val_tokens_intermediate": int(min(args.eval_windows, n_val) // batch * batch * seq)},
        "diverged": diverged, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "deterministic": args.deterministic, "concurrent_runs": args.concurrent,
        "wall_s": wall_before + time.time() - t_start,
        "fp4lab_version": fp4lab.__version__, "command": " ".join(sys.argv),
    }
    if args.out:
        _write_atomic(args.out, (json.dumps(run) + "\n").encode())
    if args.checkpoint and os.path.exists(args.checkpoint):
        os.unlink(args.checkpoint)
    return run


# ---------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------

CORE = ["bf16", "nvfp4", "mxfp4", "e2m1-ref", "ufp4"]
ABLATIONS = ["ufp4-rht-none", "ufp4-rht-wgrad", "ufp4-rht-fwd-wgrad", "ufp4", "ufp4-sr-none", "ufp4-sr-grads",
             "e2m1-rht-all"]
PAPER = {"e2m1-ref": "Dense 1.5B 1.2570, MoE 7.9B 2.3596, MoE 124B 1.7308",
         "ufp4": "Dense 1.5B 0.9673, MoE 7.9B 1.8469, MoE 124B 1.3863"}


def tail_mean(run, frac=0.1):
    n = len(run["train_loss"])
    k = max(1, int(round(n * frac)))
    return sum(run["train_loss"][-k:]) / k


def _stats(xs):
    """Mean and sample standard deviation, summed in list order with IEEE + - * / and sqrt only (no libm pow,
    no numpy reduction), so the same bits on every machine (docs/spec.md §6.1)."""
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) * (x - mean) for x in xs) / (n - 1)) if n > 1 else float("nan")
    return mean, sd


def groups(runs):
    """The studies among the runs: (model, training length in steps), each compared only within itself, since
    the learning-rate schedule spans the whole length."""
    order = {n: i for i, n in enumerate(SIZES)}
    return sorted({(r["model"], r["config"]["steps"]) for r in runs}, key=lambda g: (order[g[0]], g[1]))


def metrics(runs):
    """Per run: final validation loss, last-10% training loss, and both relative to the BF16 run of the same
    model, length and seed (same initialisation and batches; docs/spec.md §12), in %."""
    bf = {(r["model"], r["config"]["steps"], r["seed"]): r for r in runs if r["recipe"] == "bf16"}
    out = []
    for r in runs:
        m = {"name": r["name"], "model": r["model"], "length": r["config"]["steps"], "recipe": r["recipe"],
             "gemm_mode": r["gemm_mode"], "seed": r["seed"],
             "val": r["val_loss"][-1] if r["val_loss"] else float("nan"),
             "train": tail_mean(r), "tokens_per_s": r["tokens_per_s"], "steps": len(r["steps"]),
             "concurrent": r.get("concurrent_runs", 1), "diverged": r.get("diverged")}
        ref = bf.get((r["model"], m["length"], r["seed"]))
        if ref is not None and r["recipe"] != "bf16" and len(ref["steps"]) == len(r["steps"]):
            m["val_rel"] = 100 * (m["val"] - ref["val_loss"][-1]) / ref["val_loss"][-1]
            m["train_rel"] = 100 * (m["train"] - tail_mean(ref)) / tail_mean(ref)
        out.append(m)
    return out


def noise_band(ms, model, length):
    """The BF16 seed-to-seed spread: (max − min) / mean of the BF16 runs' loss, in %, per measure."""
    b = [m for m in ms if m["model"] == model and m["length"] == length and m["recipe"] == "bf16"]
    if len(b) < 2:
        return None
    band = {}
    for key in ("val", "train"):
        xs = [m[key] for m in b]
        band[key] = 100 * (max(xs) - min(xs)) / (sum(xs) / len(xs))
    band["seeds"] = len(b)
    return band


def _fmt(v, spec):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def tables(runs) -> str:
    ms = metrics(runs)
    order = {n: i for i, n in enumerate(CORE + ABLATIONS)}
    lines = []
    for model, length in groups(runs):
        rs = [m for m in ms if m["model"] == model and m["length"] == length]
        r0 = next(r for r in runs if r["model"] == model and r["config"]["steps"] == length)
        c = r0["config"]
        band = noise_band(ms, model, length)
        lines += [f"### {model}: {r0['block_params'] / 1e6:.1f}M parameters in the blocks ({r0['params'] / 1e6:.1f}M "
                  f"in all), d {c['d']}, {c['layers']} layers, sequence {c['seq']}, batch {c['batch']}, "
                  f"{c['steps']} steps ({c['steps'] * c['seq'] * c['batch'] / 1e6:.1f}M tokens)", "",
                  "Per recipe, the mean over its seeds of the BF16-relative loss error (each seed against the BF16 "
                  "run of the same seed), and the BF16 seed-to-seed spread for context:", "",
                  "| recipe | GEMMs | seeds | Δ val loss %, mean (per seed) | Δ train loss % (last 10%), mean "
                  "(per seed) | paper's Δ % (loss, last 1000 steps) |", "|---|---|---:|---|---|---|"]
        recs = sorted({(m["recipe"], m["gemm_mode"]) for m in rs if "val_rel" in m},
                      key=lambda k: (order.get(k[0], 99), k[1]))
        for rec, mode in recs:
            sel = sorted((m for m in rs if m["recipe"] == rec and m["gemm_mode"] == mode and "val_rel" in m),
                         key=lambda m: m["seed"])
            cells = []
            for key in ("val_rel", "train_rel"):
                mean, _ = _stats([m[key] for m in sel])
                cells.append(f"{mean:+.2f} ({', '.join(f'{m[key]:+.2f}' for m in sel)})")
            lines.append(f"| `{rec}` | {mode} | {len(sel)} | {cells[0]} | {cells[1]} | {PAPER.get(rec, '')} |")
        if band:
            lines.append(f"| BF16 seed-to-seed spread ({band['seeds']} seeds, (max − min) / mean) | bf16 | "
                         f"{band['seeds']} | {band['val']:.2f} | {band['train']:.2f} | |")
        lines += ["", "Every run:", "",
                  "| run | recipe | GEMMs | seed | val loss | Δ val % | train loss (last 10%) | Δ train % | "
                  "tokens/s | runs per GPU (at most) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for m in sorted(rs, key=lambda m: (order.get(m["recipe"], 99), m["gemm_mode"], m["seed"])):
            note = f" — stopped: {m['diverged']}" if m["diverged"] else ""
            lines.append(f"| `{m['name']}`{note} | `{m['recipe']}` | {m['gemm_mode']} | {m['seed']} | "
                         f"{m['val']:.4f} | {_fmt(m.get('val_rel'), '+.2f')} | {m['train']:.4f} | "
                         f"{_fmt(m.get('train_rel'), '+.2f')} | {m['tokens_per_s']:,.0f} | {m['concurrent']} |")
        lines.append("")
        studies = paired(ms, model, length)
        for mode, results in studies:
            lines += paired_table(results, band, mode if len(studies) > 1 else None)
        lines += [verdict(ms, model, length), ""]
    return "\n".join(lines)


def _paired_module():
    """fp4lab.paired from this tree: it needs only the standard library, so the report runs without the compiled
    core and always with the definitions committed beside the results."""
    name = "fp4lab_paired_report"
    if name not in sys.modules:
        import importlib.util
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "python", "fp4lab", "paired.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # before it runs: dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]


MEASURES = (("val", "final validation loss"), ("train", "training loss over the last 10%"))


def paired(ms, model, length):
    """The paired comparisons of one study (fp4lab.paired): [(GEMM mode, [PairResult, ...])], one entry per GEMM
    mode of its FP4 runs, each against the BF16 runs of the study. Only runs that reached their last step take
    part (a stopped run has no final loss)."""
    pm = _paired_module()
    order = {n: i for i, n in enumerate(CORE + ABLATIONS)}
    rs = sorted((m for m in ms if m["model"] == model and m["length"] == length and m["steps"] == length
                 and not m["diverged"]), key=lambda m: (order.get(m["recipe"], 99), m["recipe"], m["seed"]))
    modes = sorted({m["gemm_mode"] for m in rs if m["recipe"] != "bf16"})
    losses = {}
    for mode in modes:
        for m in rs:
            if m["recipe"] == "bf16" or m["gemm_mode"] == mode:
                losses[(m["recipe"], m["seed"], mode)] = {"val": m["val"], "train": m["train"]}
    out = pm.compare_all(losses, measures=[k for k, _ in MEASURES])
    return [(mode, out.get((mode,), [])) for mode in modes]


def _pm2(x):
    return "–" if x is None else f"{x:+.2f}"


def paired_table(results, band, mode=None) -> list:
    """Markdown rows of the paired comparisons of one study and GEMM mode."""
    if not results:
        return []
    head = (f"{mode} GEMMs. " if mode else "") + (
            "Paired differences A − B in points of the BF16-relative loss error, 100 · (L_A − L_B) / L_bf16 with "
            "every L of the same seed (negative: A ends lower), over the seeds with runs of A, B and BF16; the 95% "
            "interval is mean ± t · SE with n − 1 degrees of freedom, and the verdict is read from it alone")
    head += (f" (the BF16 seed-to-seed spread, {band['val']:.2f} and {band['train']:.2f}, is context, not the "
             "yardstick):" if band else ":")
    lines = [head, "", "| A − B | measure | seeds | per seed | mean | SE | 95% interval | above / below 0 | verdict |",
             "|---|---|---|---|---:|---:|---|---|---|"]
    for p in results:
        s = p.stats
        seeds = ", ".join(str(x) for x in p.seeds) or "none"
        if p.unpaired():
            seeds += f" (not paired: {p.unpaired()})"
        interval = "–" if s.low is None else f"{s.low:+.2f} to {s.high:+.2f}"
        se = "–" if s.se is None else f"{s.se:.2f}"
        signs = f"{s.above} / {s.below}" + (f" ({s.zero} at 0)" if s.zero else "")
        lines.append(f"| `{p.a}` − `{p.b}` | {'val' if p.measure == 'val' else 'train (last 10%)'} | {seeds} | "
                     f"{', '.join(f'{d:+.2f}' for d in p.diffs) or '–'} | {_pm2(s.mean)} | {se} | {interval} | "
                     f"{signs} | {p.verdict(notes=False)} |")
    return lines + [""]


def paired_json(runs) -> dict:
    """Every study's paired comparisons as docs/results/training-paired.json holds them."""
    ms = metrics(runs)
    pm = _paired_module()
    studies = []
    for model, length in groups(runs):
        band = noise_band(ms, model, length)
        for mode, results in paired(ms, model, length):
            studies.append({"model": model, "length": length, "gemm_mode": mode,
                            "bf16_spread_pct": None if band is None else {k: band[k] for k in ("val", "train")},
                            "bf16_seeds": None if band is None else band["seeds"],
                            "pairs": [p.as_dict() for p in results]})
    return {"definition": pm.DEFINITION, "measures": dict(MEASURES), "studies": studies}


_CLAIM = {"worse": "ufp4 trained worse than e2m1-ref", "better": "ufp4 trained better than e2m1-ref (ufp4 < "
          "e2m1-ref holds)", "undetected": "no difference detectable", "same": "no difference: identical runs",
          "one": "one seed, not decided", "none": "not paired"}


def verdict(ms, model, length) -> str:
    """ufp4 against e2m1-ref in one study, from the paired statistics of fp4lab.paired: the 95% interval of the
    per-seed differences decides, on each measure; the BF16 seed-to-seed spread is quoted as context."""
    study = f"{model}, {length} steps"
    found = [(mode, [p for p in res if (p.a, p.b) == ("ufp4", "e2m1-ref")]) for mode, res in paired(ms, model, length)]
    found = [(mode, ps) for mode, ps in found if ps and ps[0].stats.n]
    if not found:
        have = sorted({f"{m['recipe']} seed {m['seed']}" for m in ms if m["model"] == model and
                       m["length"] == length and m["recipe"] in ("ufp4", "e2m1-ref")})
        return (f"**{study}: ufp4 vs e2m1-ref** — not both run with a common seed (of the two, run: "
                f"{', '.join(have) or 'neither'}).")
    band = noise_band(ms, model, length)
    out = []
    for mode, ps in found:
        kinds = [p.stats.kind for p in ps]
        claim = _CLAIM[kinds[0]] if len(set(kinds)) == 1 else "; ".join(
            f"{what}: {_CLAIM[k]}" for (_, what), k in zip(MEASURES, kinds))
        n = ps[0].stats.n
        where = f"{study}" + (f", {mode} GEMMs" if len(found) > 1 else "")
        parts = []
        for p, (key, what) in zip(ps, MEASURES):
            s = p.stats
            per = ", ".join(f"{d:+.2f}" for d in p.diffs)
            if s.n == 1:
                parts.append(f"{what}: ufp4 − e2m1-ref = {s.mean:+.2f} points (seed {p.seeds[0]}; one seed gives "
                             "no interval)")
            else:
                parts.append(f"{what}: ufp4 − e2m1-ref = {s.mean:+.2f} ± {s.half:.2f} points (95% interval "
                             f"{s.low:+.2f} to {s.high:+.2f}, t with {n - 1} df; per seed {per}; {s.above} above "
                             f"zero, {s.below} below)" + p.unpaired_note())
        ctx = (f"BF16 seed-to-seed spread, for context: {band['val']:.2f} and {band['train']:.2f} over "
               f"{band['seeds']} seeds" if band else "no second BF16 seed to show the seed-to-seed spread")
        out.append(f"**{where}: ufp4 vs e2m1-ref over {n} seed{'s' if n != 1 else ''}: {claim}** — " +
                   "; ".join(parts) + f"; {ctx}.")
    return "\n- ".join(out)


def status(runs) -> str:
    """The status block of docs/training.md: one verdict per study."""
    ms = metrics(runs)
    return "\n".join(f"- {verdict(ms, model, length)}" for model, length in groups(runs))


def replace_block(text: str, marker: str, body: str) -> str:
    start, end = f"<!-- {marker} -->", f"<!-- end of {marker} -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"markers '{start}' / '{end}' not found")
    return text[: i + len(start)] + "\n" + body.rstrip() + "\n" + text[j:]


def plot(runs, path_prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    colors = {n: f"C{i}" for i, n in enumerate(CORE + [a for a in ABLATIONS if a not in CORE])}
    seed_style = ["-", ":", "--", "-."]  # one line style per seed, so the seeds of one recipe can be told apart
    for model, length in groups(runs):
        rs = [r for r in runs if r["model"] == model and r["config"]["steps"] == length]
        bf = {r["seed"]: r for r in rs if r["recipe"] == "bf16"}
        abl = [r for r in rs if r["recipe"] in ABLATIONS and r["recipe"] != "ufp4"]
        panels = 3 if abl else 2 if len(bf) < len(rs) else 1  # BF16 runs alone: their validation curves
        fig, ax = plt.subplots(1, panels, figsize=(6.2 * panels, 4.8), squeeze=False)
        ax = ax[0]

        def rel_curve(a, r):
            ref = bf.get(r["seed"])
            if ref is None or r is ref or len(r["train_loss"]) != len(ref["train_loss"]):
                return
            w = max(1, len(r["train_loss"]) // 20)  # moving mean over 5% of the run
            d = [100 * (x - y) / y for x, y in zip(r["train_loss"], ref["train_loss"])]
            sm = [sum(d[i - w + 1: i + 1]) / w for i in range(w - 1, len(d))]
            a.plot(r["steps"][w - 1:], sm, seed_style[r["seed"] % len(seed_style)], color=colors.get(r["recipe"], "k"),
                   label=f"{r['recipe']} s{r['seed']}")

        for r in rs:
            if r["recipe"] in CORE:
                ax[0].plot(r["val_steps"], r["val_loss"], seed_style[r["seed"] % len(seed_style)], marker=".",
                           color=colors[r["recipe"]], label=f"{r['recipe']} s{r['seed']}")
                if panels > 1:
                    rel_curve(ax[1], r)
        for r in abl:
            rel_curve(ax[2], r)
        if abl:
            for r in rs:
                if r["recipe"] == "ufp4" and r["seed"] == 0:
                    rel_curve(ax[2], r)
        study = f"{model}, {length} steps"
        ax[0].set(xlabel="step", ylabel="validation loss (nats/byte)", title=f"{study}: validation loss")
        if panels > 1:
            ax[1].set(xlabel="step", ylabel="% vs BF16 of the same seed", title=f"{study}: training loss vs BF16 "
                      "(moving mean)")
        if abl:
            ax[2].set(xlabel="step", ylabel="% vs BF16 of the same seed", title=f"{study}: ablations (seed 0)")
        n = max(len(r["steps"]) for r in rs)
        for a in ax[1:]:
            a.axhline(0, color="k", lw=0.5)
            a.set_xlim(n // 5, n)
        for a in ax:
            a.grid(alpha=0.3)
            a.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        out = f"{path_prefix}_{model}_{length}.png"
        fig.savefig(out + ".tmp.png", dpi=100)
        os.replace(out + ".tmp.png", out)
        plt.close(fig)
        written.append(out)
    return written


def cmd_report(args):
    runs, seen = [], set()
    for p in args.runs:
        with open(p) as f:
            r = json.load(f)
        if r["name"] in seen:
            raise SystemExit(f"{p}: run name {r['name']!r} given twice")
        seen.add(r["name"])
        runs.append(r)
    if args.merge and os.path.exists(args.json):
        with open(args.json) as f:
            for r in json.load(f)["runs"]:
                if r["name"] not in seen:
                    runs.append(r)
                    seen.add(r["name"])
    if not runs:  # never replace a results file with an empty one
        raise SystemExit(f"report: no runs to write to {args.json} (give run JSONs, or --merge to redo the report "
                         "of the runs already there)")
    order = {n: i for i, n in enumerate(SIZES)}
    runs.sort(key=lambda r: (order[r["model"]], r["name"]))
    _write_atomic(args.json, (json.dumps({"runs": runs}, separators=(",", ":")) + "\n").encode())
    if args.paired_json is None:
        args.paired_json = os.path.splitext(args.json)[0] + "-paired.json"
    if args.paired_json:
        _write_atomic(args.paired_json, (json.dumps(paired_json(runs), indent=1) + "\n").encode())
    if args.doc:
        with open(args.doc) as f:
            text = f.read()
        text = replace_block(text, "training tables: scripts/train_fp4.py report", tables(runs))
        text = replace_block(text, "training status: scripts/train_fp4.py report", status(runs))
        _write_atomic(args.doc, text.encode())
    figs = plot(runs, args.figures) if args.figures else []
    print(f"{len(runs)} runs -> {args.json}" + (f", {args.paired_json}" if args.paired_json else "") +
          (f", {args.doc}" if args.doc else "") +
          "".join(f", {p}" for p in figs))


PRESETS = ["nvfp4", "mxfp4", "e2m1-ref", "ufp4"]


def spearman(xs, ys):
    """Spearman's rho, with the rank and correlation code the simulator's validation uses (ties averaged)."""
    sys.path.insert(0, HERE)
    from sim_validation import pearson, ranks
    return pearson(ranks(xs), ranks(ys))


def proxy_sqnr(analysis_path):
    """Mean GEMM-output SQNR (dB) per recipe over every GEMM and pass of `fp4lab analyze --recipe` output."""
    with open(analysis_path) as f:
        j = json.load(f)
    out = {}
    for rec in PRESETS:
        xs = [r["sqnr_db"] for r in j["gemms"] if r.get("recipe") == rec]
        if not xs:
            raise SystemExit(f"{analysis_path}: no GEMM rows for recipe {rec} (run analyze with --recipe "
                             f"{','.join(PRESETS)})")
        out[rec] = sum(xs) / len(xs)
    return out


def cmd_proxy(args):
    """Does a recipe's mean GEMM-output SQNR on a trace predict its loss ranking? One row per trace and per
    study (model and length)."""
    with open(args.training) as f:
        runs = json.load(f)["runs"]
    ms = metrics(runs)
    traces = []
    for spec in args.analysis:
        label, _, path = spec.partition("=")
        traces.append((label, proxy_sqnr(path)))
    # The studies with every preset at this seed: a ranking of fewer recipes says little.
    outcome = {}
    for g in groups(runs):
        o = {m["recipe"]: m["val_rel"] for m in ms if (m["model"], m["length"]) == g and m["recipe"] in PRESETS
             and "val_rel" in m and m["seed"] == args.seed}
        if len(o) == len(PRESETS):
            outcome[g] = o
    studies = list(outcome)
    lines = ["| trace | " + " | ".join(f"`{r}` SQNR dB" for r in PRESETS) + " | SQNR ranking (best first) |",
             "|---|" + "---:|" * len(PRESETS) + "---|"]
    for label, sq in traces:
        rank = " > ".join(sorted(PRESETS, key=lambda r: -sq[r]))
        lines.append(f"| {label} | " + " | ".join(f"{sq[r]:.2f}" for r in PRESETS) + f" | {rank} |")
    lines += ["", f"| model, length (seed {args.seed}) | " + " | ".join(f"`{r}` Δ val %" for r in PRESETS) +
              " | loss ranking (best first) | " + " | ".join(f"Spearman vs {label}" for label, _ in traces) + " |",
              "|---|" + "---:|" * len(PRESETS) + "---|" + "---:|" * len(traces)]
    for study in studies:
        rank = " > ".join(sorted(PRESETS, key=lambda r: outcome[study][r]))
        rhos = []
        for _, sq in traces:
            # A good proxy: higher SQNR, lower loss error, so rho(SQNR, −Δloss) = +1.
            rhos.append(spearman([sq[r] for r in PRESETS], [-outcome[study][r] for r in PRESETS]))
        lines.append(f"| {study[0]}, {study[1]} steps | " +
                     " | ".join(f"{outcome[study][r]:+.2f}" for r in PRESETS) +
                     f" | {rank} | " + " | ".join(f"{x:+.2f}" for x in rhos) + " |")
    text = "\n".join(lines)
    if args.doc:
        with open(args.doc) as f:
            doc = f.read()
        _write_atomic(args.doc, replace_block(doc, "proxy tables: scripts/train_fp4.py proxy", text).encode())
    else:
        print(text)
    if args.figure:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(studies), figsize=(6 * len(studies), 4.6), squeeze=False)
        for ax, study in zip(axes[0], studies):
            band = noise_band(ms, *study)
            if band:
                ax.axhspan(-band["val"] / 2, band["val"] / 2, color="0.85", label="± half the BF16 seed spread")
            for k, (label, sq) in enumerate(traces):
                ax.plot([sq[r] for r in PRESETS], [outcome[study][r] for r in PRESETS], "o", color=f"C{k}",
                        label=label)
                for r in PRESETS:
                    ax.annotate(r, (sq[r], outcome[study][r]), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            ax.axhline(0, color="k", lw=0.5)
            ax.set(xlabel="mean GEMM-output SQNR on the trace (dB)", ylabel="Δ final validation loss vs BF16 (%)",
                   title=f"{study[0]} model, {study[1]} steps: proxy against outcome")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.figure + ".tmp.png", dpi=100)
        os.replace(args.figure + ".tmp.png", args.figure)
        plt.close(fig)
    print(f"proxy: {len(traces)} traces x {len(studies)} studies" + (f" -> {args.doc}" if args.doc else "") +
          (f", {args.figure}" if args.figure else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="extract the token files from the linux-doc package")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--deb", help="a linux-doc-<version>_*.deb file")
    g.add_argument("--root", default="/", help="the root of an installed system (default /)")
    c.add_argument("out", help="output folder")
    t = sub.add_parser("train", help="one training run")
    t.add_argument("--data", required=True)
    t.add_argument("--size", choices=sorted(SIZES), default="small")
    t.add_argument("--recipe", choices=sorted(RECIPES), default="bf16")
    t.add_argument("--mode", choices=["exact", "fast"], default="exact")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--seq", type=int)
    t.add_argument("--batch", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--eval-every", type=int, default=250)
    t.add_argument("--eval-windows", type=int, default=256, help="validation sequences per intermediate evaluation")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--device", default=None)
    t.add_argument("--name")
    t.add_argument("--out")
    t.add_argument("--force", action="store_true")
    t.add_argument("--deterministic", action="store_true", help="PyTorch's deterministic algorithms: on a GPU, "
                   "two runs of one command then agree bit for bit (on the CPU they always do); an operation without "
                   "one stops the run")
    t.add_argument("--concurrent", type=int, default=1, help="runs sharing the GPU (recorded, for tokens/s)")
    t.add_argument("--checkpoint", help="resume from this file if it exists; where --time-limit saves the state")
    t.add_argument("--time-limit", type=float, help="stop after this many seconds at a step boundary, save the state "
                   f"to --checkpoint and exit {EXIT_CONTINUE}")
    t.add_argument("--capture-steps", help="write trace v1 folders at these steps (updates applied before the pass)")
    t.add_argument("--capture-dir", default="traces")
    t.add_argument("--capture-pattern", help="modules to capture (default qkv, proj, fc1, fc2 of the first and the "
                   "last block)")
    t.add_argument("--capture-tokens", type=int, default=256, help="token rows kept per GEMM")
    t.add_argument("--capture-token-stride", type=int, default=1, help="keep every n-th token row")
    t.add_argument("--capture-max-out", type=int, help="keep at most this many output features, evenly spaced")
    r = sub.add_parser("report", help="merge runs into training.json, docs tables and figures")
    r.add_argument("runs", nargs="*")
    r.add_argument("--json", default=os.path.join(ROOT, "docs/results/training.json"))
    r.add_argument("--merge", action="store_true", help="keep the runs already in --json that are not given")
    r.add_argument("--paired-json", help="the paired comparisons of every study (fp4lab.paired), as JSON (default: "
                   "beside --json, its name with -paired; empty: not written)")
    r.add_argument("--doc", default=os.path.join(ROOT, "docs/training.md"))
    r.add_argument("--figures", default=os.path.join(ROOT, "docs/fig_training"))
    x = sub.add_parser("proxy", help="mean GEMM-output SQNR per recipe on traces against the loss ranking")
    x.add_argument("analysis", nargs="+", metavar="LABEL=ANALYSIS.json", help="fp4lab analyze --recipe "
                   + ",".join(PRESETS) + " --json output")
    x.add_argument("--training", default=os.path.join(ROOT, "docs/results/training.json"))
    x.add_argument("--seed", type=int, default=0, help="the seed whose runs give the outcome (every preset has it)")
    x.add_argument("--doc", default=os.path.join(ROOT, "docs/training.md"))
    x.add_argument("--figure", default=os.path.join(ROOT, "docs/fig_training_proxy.png"))
    sub.add_parser("recipes", help="list the recipes")
    n = sub.add_parser("name", help="the run name of each scripts/train_study.sh run spec")
    n.add_argument("specs", nargs="+", metavar="SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS]")
    args = ap.parse_args(argv)
    if args.cmd == "corpus":
        cmd_corpus(args)
    elif args.cmd == "train":
        if args.device is None:
            import torch
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.steps < 1 or args.eval_every < 1 or args.log_every < 1 or args.eval_windows < 1:
            ap.error("--steps, --eval-every, --log-every and --eval-windows must be positive")
        if args.time_limit is not None and (not args.checkpoint or not args.time_limit > 0):
            ap.error("--time-limit needs --checkpoint and a positive number of seconds")
        args.name = args.name or run_name(args.size, args.recipe, args.mode, args.seed, args.steps)
        cmd_train(args)
    elif args.cmd == "report":
        cmd_report(args)
    elif args.cmd == "proxy":
        cmd_proxy(args)
    elif args.cmd == "name":
        for spec in args.specs:
            f = spec.split(":", 5)
            if len(f) < 5:
                ap.error(f"{spec}: not SIZE:RECIPE:MODE:SEED:STEPS[:EXTRA ARGS]")
            print(run_name(*f[:5]))
    else:
        for n, (preset, pp, po, what) in RECIPES.items():
            print(f"{n:20s} {what}")


if __name__ == "__main__":
    main()
