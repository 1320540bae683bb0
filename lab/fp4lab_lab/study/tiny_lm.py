"""The decoder that made the bundled trace workloads/tiny-lm: a small byte-level SwiGLU decoder trained on Jane
Austen's six novels, with fp4lab trace capture (fp4lab.capture).

  corpus:  extracts the novels' text from the Debian package r-cran-janeaustenr (MIT; the novels are in the
           public domain) into plain UTF-8 files. Runs where apt works:
             apt-get download r-cran-janeaustenr
             python3 -m fp4lab_lab.study.tiny_lm corpus r-cran-janeaustenr_1.0.0-1_all.deb data/austen
  train:   trains the model (BF16 autocast, AdamW) and writes trace v1 files at the chosen steps (a step =
           optimizer updates applied before the captured forward/backward):
             python3 -m fp4lab_lab.study.tiny_lm train --data data/austen --out traces

Module names: layers.{i}.attn.qkv, layers.{i}.attn.proj, layers.{i}.mlp.fc1 (gate and up, fused),
layers.{i}.mlp.fc2. The held-out novel (default Persuasion) is the validation set.

It is not the study's decoder (fp4lab.study.model) and stays apart from it: rotary positions instead of learned
ones, dropout, an FP32 RMSNorm with eps 1e-6, the loss inside forward and other module names. Those are the
model whose operands the bundled trace holds (its metadata names this trainer), so folding it into the study's
model would leave the trace without the code that reproduces it.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib

from fp4lab._files import (ArgumentParser, DataError, UsageError, check_output_folder, check_outputs, console_main,
                      read_bytes, write_text)
from fp4lab.study.corpus import check_folder_outputs

NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]


# ---------------------------------------------------------------------------------------------------------
# corpus: read the character vectors out of R's lazy-load database (.rdx index + .rdb objects)
# ---------------------------------------------------------------------------------------------------------

class _RUnserialize:
    """Just enough of R's XDR serialization (format 2/3) for the janeaustenr data: lists, character,
    integer, real and logical vectors, pairlists, symbols and references."""

    def __init__(self, blob: bytes, what: str):
        self.b, self.p, self.refs, self.what = blob, 0, [], what
        if blob[:2] != b"X\n":
            raise ValueError(f"{what}: not R XDR serialization (starts {blob[:2]!r})")
        self.p = 2
        version = self._int()
        self._int(), self._int()
        if version == 3:
            n = self._int()
            self.p += n  # native encoding name

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.b, self.p)
        self.p += 4
        return v

    def item(self):
        flags = self._int()
        t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if t == 254:  # NILVALUE
            return None
        if t == 255:  # REFSXP
            return self.refs[(flags >> 8) - 1]
        if t == 1:  # SYMSXP
            v = self.item()
            self.refs.append(v)
            return v
        if t == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None
            v = self.b[self.p:self.p + n].decode("utf-8")
            self.p += n
            return v
        if t == 2:  # LISTSXP (pairlist): attributes, tag, car, cdr
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            return [(tag, car)] + (cdr or [])
        if t in (10, 13, 14, 16, 19):
            n = self._int()
            if t in (16, 19):
                v = [self.item() for _ in range(n)]
            elif t == 14:
                v = list(struct.unpack_from(f">{n}d", self.b, self.p))
                self.p += 8 * n
            else:
                v = list(struct.unpack_from(f">{n}i", self.b, self.p))
                self.p += 4 * n
            attrs = dict(self.item()) if has_attr else {}
            return (v, attrs)
        raise ValueError(f"{self.what}: unsupported R type {t} at byte {self.p - 4}")


def extract_austen(pkg_root: str) -> dict:
    d = os.path.join(pkg_root, "usr/lib/R/site-library/janeaustenr/data")
    with open(os.path.join(d, "Rdata.rdx"), "rb") as f:
        (index, _) = _RUnserialize(gzip.decompress(f.read()), "Rdata.rdx").item()
    (entries, attrs) = index[0]
    names = attrs["names"][0]
    with open(os.path.join(d, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    texts = {}
    for name, ((off, length), _) in zip(names, entries):
        blob = rdb[off:off + length]
        (n,) = struct.unpack(">I", blob[:4])
        raw = zlib.decompress(blob[4:])  # R's lazy-load "compress = TRUE": 4-byte length + zlib stream
        if len(raw) != n:
            raise ValueError(f"Rdata.rdb: object {name}: {len(raw)} bytes after inflating, header says {n}")
        (lines, _) = _RUnserialize(raw, f"Rdata.rdb:{name}").item()
        texts[name] = "\n".join("" if s is None else s for s in lines) + "\n"
    return texts


def cmd_corpus(args) -> int:
    names = [n + ".txt" for n in NOVELS]
    check_folder_outputs(args.out, names, [args.package])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = args.package
            if src.endswith(".deb"):
                subprocess.run(["dpkg-deb", "-x", src, tmp], check=True, stderr=subprocess.DEVNULL)
                src = tmp
            texts = extract_austen(src)
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise DataError(f"{args.package}: dpkg-deb cannot unpack it") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError, struct.error, zlib.error, EOFError) as e:
        raise DataError(f"{args.package}: not the janeaustenr data ({type(e).__name__}: {str(e)[:80]})") from None
    missing = [n for n in NOVELS if n not in texts]
    if missing:
        raise DataError(f"{args.package}: novels missing: {missing}")
    for n, name in zip(NOVELS, names):
        write_text(os.path.join(args.out, name), texts[n], [args.package], make_dirs=True)
        print(f"{n}: {len(texts[n].encode('utf-8'))} bytes")
    return 0


# ---------------------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------------------

def build_model(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)) * self.weight

    def rope(x, cos, sin):  # x [B, H, S, Dh]; rotate the two halves
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.h = cfg["heads"]
            self.qkv = nn.Linear(cfg["d"], 3 * cfg["d"], bias=False)
            self.proj = nn.Linear(cfg["d"], cfg["d"], bias=False)

        def forward(self, x, cos, sin):
            B, S, D = x.shape
            q, k, v = self.qkv(x).view(B, S, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, S, D))

    class SwiGLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(cfg["d"], 2 * cfg["hidden"], bias=False)  # [gate; up]
            self.fc2 = nn.Linear(cfg["hidden"], cfg["d"], bias=False)

        def forward(self, x):
            gate, up = self.fc1(x).chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * up)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn = RMSNorm(cfg["d"]), Attention()
            self.norm2, self.mlp = RMSNorm(cfg["d"]), SwiGLU()
            self.drop = nn.Dropout(cfg["dropout"])

        def forward(self, x, cos, sin):
            x = x + self.drop(self.attn(self.norm1(x), cos, sin))
            return x + self.drop(self.mlp(self.norm2(x)))

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], cfg["d"])
            self.layers = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.norm = RMSNorm(cfg["d"])
            self.head = nn.Linear(cfg["d"], cfg["vocab"], bias=False)
            dh = cfg["d"] // cfg["heads"]
            inv = 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh))
            ang = torch.outer(torch.arange(cfg["seq"]).float(), inv)
            self.register_buffer("cos", ang.cos()[None, None], persistent=False)
            self.register_buffer("sin", ang.sin()[None, None], persistent=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * cfg["layers"]) if name.endswith(("proj.weight", "fc2.weight")) \
                        else 0.02
                    nn.init.normal_(p, std=std)

        def forward(self, idx, targets=None):
            S = idx.shape[1]
            x = self.embed(idx)
            for layer in self.layers:
                x = layer(x, self.cos[:, :, :S], self.sin[:, :, :S])
            logits = self.head(self.norm(x))
            if targets is None:
                return logits
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return TinyLM()


# ---------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------

def load_bytes(folder: str, names):
    return b"".join(read_bytes(os.path.join(folder, n + ".txt")) for n in names)


def _check_train(args):
    """Every option of `train` and its outputs (the trace folder, the summary), before anything is read or built:
    a UsageError naming the first bad option, a DataError for an output that cannot be written."""
    def whole(opt, low, high=2**63 - 1):
        v = getattr(args, opt.lstrip("-").replace("-", "_"))
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise UsageError(f"{opt} {v}: not a whole number from {low} to {high}")

    for opt, low in (("--steps", 0), ("--batch", 1), ("--seq", 1), ("--d", 1), ("--heads", 1), ("--layers", 1),
                     ("--hidden", 1), ("--warmup", 0), ("--log-every", 1), ("--eval-every", 0),
                     ("--eval-batches", 1), ("--max-tokens", 1)):
        whole(opt, low)
    whole("--seed", 0, 2**64 - 2)  # the batches' generator takes seed + 1
    if args.d % args.heads or (args.d // args.heads) % 2:
        raise UsageError(f"--d {args.d}: not an even number of features for each of --heads {args.heads} (rotary "
                         "positions turn pairs)")
    for opt, v, what in (("--lr", args.lr, "a positive finite rate"), ("--wd", args.wd, "a finite decay of 0 or more"),
                         ("--dropout", args.dropout, "a probability from 0 up to 1")):
        if not (math.isfinite(v) and v >= 0 and (v > 0 or opt != "--lr") and (v < 1 or opt != "--dropout")):
            raise UsageError(f"{opt} {v}: not {what}")
    val = args.val.split(",")
    if not set(val) <= set(NOVELS) or set(val) == set(NOVELS):
        raise UsageError(f"--val {args.val}: not some, but not all, of {', '.join(NOVELS)}")
    steps = _capture_steps(args.capture_steps) if args.capture_steps else {args.steps}
    if args.out:
        check_output_folder(args.out)
    if args.summary:
        check_outputs([args.summary], [os.path.join(args.data, n + ".txt") for n in NOVELS])
    return steps


def _capture_steps(text: str) -> set:
    from fp4lab.capture import parse_steps
    try:
        return parse_steps(text)
    except ValueError:
        raise UsageError(f"--capture-steps {text!r}: not comma-separated non-negative integers") from None


def unigram_entropy(train: bytes, val: bytes):
    """Entropy of the train byte distribution and cross-entropy of val under it (add-one smoothed), nats."""
    counts = [1] * 256
    for b in train:
        counts[b] += 1
    tot = sum(counts)
    p = [c / tot for c in counts]
    h_train = -sum(pi * math.log(pi) for pi in p)
    vc = [0] * 256
    for b in val:
        vc[b] += 1
    h_val = -sum(c * math.log(p[i]) for i, c in enumerate(vc)) / len(val)
    return h_train, h_val


def cmd_train(args) -> int:
    import torch

    from fp4lab.capture import TraceCapture
    from fp4lab.trace import check as check_trace, print_check

    steps = _check_train(args)
    torch.manual_seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    val_names = args.val.split(",")
    train_names = [n for n in NOVELS if n not in val_names]
    train_b, val_b = load_bytes(args.data, train_names), load_bytes(args.data, val_names)
    if min(len(train_b), len(val_b)) < args.seq + 2:
        raise DataError(f"{args.data}: too little text for --seq {args.seq}")
    h_train, h_val = unigram_entropy(train_b, val_b)
    print(f"corpus: train {train_names} {len(train_b)} bytes, val {val_names} {len(val_b)} bytes; "
          f"unigram entropy {h_train:.3f} nats/byte (train), val cross-entropy under it {h_val:.3f}")
    train = torch.frombuffer(bytearray(train_b), dtype=torch.uint8).to(dev).long()
    val = torch.frombuffer(bytearray(val_b), dtype=torch.uint8).to(dev).long()

    cfg = {"vocab": 256, "d": args.d, "heads": args.heads, "layers": args.layers, "hidden": args.hidden,
           "seq": args.seq, "dropout": args.dropout}
    model = build_model(cfg).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": other, "weight_decay": 0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=(dev == "cuda"))
    desc = (f"TinyLM byte-level SwiGLU decoder: d={args.d} layers={args.layers} heads={args.heads} "
            f"hidden={args.hidden} seq={args.seq} params={nparam}; trained on Jane Austen's novels "
            f"{'+'.join(train_names)} (Debian r-cran-janeaustenr 1.0.0-1), BF16 autocast, AdamW lr={args.lr} "
            f"wd={args.wd} batch={args.batch}x{args.seq} warmup={args.warmup} cosine to {args.steps} steps, "
            f"dropout={args.dropout}, seed={args.seed}")
    print(desc)
    cap = None
    if args.out:
        try:
            cap = TraceCapture(model, args.pattern, steps, args.out, max_tokens=args.max_tokens,
                               metadata={"model": desc, "torch": torch.__version__,
                                         "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"})
        except ValueError as e:  # its checks of the pattern, the token count and the layers, all made here
            raise UsageError(f"trace capture: {e}") from None
        print(f"capturing {sorted(cap.modules)} at steps {sorted(steps)}, first {args.max_tokens} tokens")

    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)

    def batch(src, n, g):
        ix = torch.randint(0, src.numel() - args.seq - 1, (n,), device=dev, generator=g)
        off = torch.arange(args.seq + 1, device=dev)
        w = src[ix[:, None] + off]
        return w[:, :-1], w[:, 1:]

    @torch.no_grad()
    def evaluate(src, nbatch):
        model.eval()
        g = torch.Generator(device=dev).manual_seed(1234)  # same windows every evaluation
        tot = 0.0
        for _ in range(nbatch):
            x, y = batch(src, args.batch, g)
            with torch.autocast(dev, dtype=torch.bfloat16):
                tot += model(x, y).item()
        model.train()
        return tot / nbatch

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        t = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    t0 = time.time()
    run_loss = 0.0
    for step in range(args.steps + 1):
        # step == args.steps runs one more forward/backward with the final weights and no update, so a
        # capture at step N sees the model after N updates.
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step)
        x, y = batch(train, args.batch, gen)
        armed = cap.arm(step) if cap else False
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        if armed:
            for p in cap.write():
                print(f"  wrote {p}")
        if step < args.steps:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        opt.zero_grad(set_to_none=True)
        run_loss = run_loss + loss.detach()  # summed on the GPU: no host sync per step
        if (step + 1) % args.log_every == 0:
            print(f"step {step + 1:6d}  train loss {run_loss.item() / args.log_every:.4f} (mean of the last "
                  f"{args.log_every})  lr {lr_at(step):.2e}  {(time.time() - t0) / (step + 1) * 1e3:.1f} ms/step",
                  flush=True)
            run_loss = 0.0
        if args.eval_every and (step + 1) % args.eval_every == 0 and step < args.steps:
            print(f"step {step + 1:6d}  val loss {evaluate(val, args.eval_batches):.4f}", flush=True)
    tr, va = evaluate(train, args.eval_batches), evaluate(val, args.eval_batches)
    print(f"final (after {args.steps} updates, {args.eval_batches}x{args.batch}x{args.seq} tokens each): "
          f"train loss {tr:.4f} nats/byte ({tr / math.log(2):.3f} bits), val loss {va:.4f} nats/byte "
          f"({va / math.log(2):.3f} bits); unigram baseline {h_val:.3f} nats; "
          f"{time.time() - t0:.0f} s on {dev}")
    if args.summary:
        write_text(args.summary, json.dumps({"config": cfg, "params": nparam, "train_loss": tr, "val_loss": va,
                                             "unigram_entropy_train": h_train, "unigram_xent_val": h_val,
                                             "steps": args.steps, "seconds": time.time() - t0}, indent=1))
    if cap:
        for s in sorted(steps):
            folder = os.path.join(args.out, f"step_{s:06d}")
            print(f"trace {folder}:")
            print_check(check_trace(folder, 32))
    return 0


def main(argv=None) -> int:
    return console_main("python3 -m fp4lab_lab.study.tiny_lm", lambda: _run(argv))


def _run(argv) -> int:
    ap = ArgumentParser(prog="python3 -m fp4lab_lab.study.tiny_lm", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="extract the novels from the Debian package into text files")
    c.add_argument("package", help="r-cran-janeaustenr .deb, or the folder it was unpacked into")
    c.add_argument("out")
    t = sub.add_parser("train", help="train the model and capture traces")
    t.add_argument("--data", required=True, help="folder written by the corpus step")
    t.add_argument("--val", default="persuasion", help="held-out novel(s), comma-separated")
    t.add_argument("--out", default=None, help="trace output folder (no capture without it)")
    t.add_argument("--pattern", default=r"^layers\.(0|7)\.(attn\.(qkv|proj)|mlp\.(fc1|fc2))$")
    t.add_argument("--capture-steps", default=None, help="comma-separated; default: the final step")
    t.add_argument("--max-tokens", type=int, default=256)
    t.add_argument("--steps", type=int, default=5000)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=256)
    t.add_argument("--d", type=int, default=256)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--layers", type=int, default=8)
    t.add_argument("--hidden", type=int, default=1024)
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--lr", type=float, default=1.5e-3)
    t.add_argument("--wd", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--log-every", type=int, default=100)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--eval-batches", type=int, default=50)
    t.add_argument("--summary", default=None, help="write final figures as JSON here")
    args = ap.parse_args(argv)
    return cmd_corpus(args) if args.cmd == "corpus" else cmd_train(args)


if __name__ == "__main__":
    sys.exit(main())
