"""One training run of the study: resumable, reproducible, its JSON written when it completes."""
import contextlib
import io
import json
import math
import os
import re
import sys
import time

from .corpus import CORPORA, DEFAULT_CORPUS, corpus_name, write_atomic
from .model import RECIPES, SIZES, build_model, make_recipe

EXIT_CONTINUE = 75  # the run stopped at --time-limit with its state in --checkpoint: run the same command again


def _load(data_dir: str, name: str):
    import numpy as np
    path = os.path.join(data_dir, name)
    try:
        a = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise SystemExit(f"{path}: {e.strerror}") from None
    return a


def use_deterministic_algorithms() -> None:
    """PyTorch's fixed-order algorithms, before any CUDA work. On a GPU, cuDNN attention's backward (and at least one
    other PyTorch kernel) adds in a varying order, so two runs of one command part after the first step (fp4lab's
    own kernels are order-independent already). cuBLAS reads the variable when it starts, so it goes first."""
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def run_name(size: str, recipe: str, mode: str, seed, steps, corpus: str = DEFAULT_CORPUS) -> str:
    """A run's name (its JSON, log and checkpoint files): scripts/train_study.sh names runs through `name`. Runs on
    any corpus but the first carry its name, so runs of the same settings on two corpora never share a name (a
    report keeps one run per name)."""
    tail = "" if corpus == DEFAULT_CORPUS else "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", corpus)
    return f"{size}-{recipe}-{'bf16' if recipe == 'bf16' else mode}-s{seed}-{steps}{tail}"


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
    corpus = corpus_name(args.data)
    if len(train_data) < 100 * (seq + 1) or len(val_data) < batch * seq + 1:
        raise SystemExit(f"{args.data}: too little text for sequence {seq}")
    device = torch.device(args.device)
    if args.graph and device.type != "cuda":
        raise SystemExit(f"--graph: CUDA graphs need a CUDA device, not {device}")
    if args.graph and args.capture_steps:
        raise SystemExit("--graph: trace capture (--capture-steps) hooks each step in Python; give one of the two")
    if args.deterministic:
        use_deterministic_algorithms()

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
        from ..capture import TraceCapture, parse_steps
        last_block = cfg["layers"] - 1
        cap = TraceCapture(model, args.capture_pattern or rf"^blocks\.(0|{last_block})\.(qkv|proj|fc1|fc2)$",
                           parse_steps(args.capture_steps), args.capture_dir, max_tokens=args.capture_tokens,
                           token_stride=args.capture_token_stride, max_out=args.capture_max_out,
                           metadata={"model": f"fp4lab.study {args.size}: byte-level SwiGLU decoder, d {cfg['d']}, "
                                              f"{cfg['layers']} layers, FFN {cfg['ffn']}, batch {batch} x {seq}",
                                     "recipe": args.recipe,
                                     "corpus": f"{corpus} ({CORPORA[corpus].what}, fp4lab-train corpus)"
                                     if corpus in CORPORA else corpus})
    losses = torch.zeros(args.steps, dtype=torch.float32, device=device)
    val_steps, val_loss = [], []
    train_time, wall_before, start = 0.0, 0.0, 0
    diverged = None
    # A run may span several invocations (--time-limit, --checkpoint): the checkpoint holds everything the next
    # step depends on, so a resumed run continues bit for bit where it stopped (on a GPU, with --deterministic).
    key = {"size": args.size, "recipe": args.recipe, "mode": args.mode, "seed": args.seed, "steps": args.steps,
           "cfg": cfg, "deterministic": args.deterministic, "corpus": corpus}
    concurrent = args.concurrent
    if args.checkpoint and os.path.exists(args.checkpoint):
        ck = torch.load(args.checkpoint, map_location=device, weights_only=False)
        ck["key"].setdefault("deterministic", False)  # checkpoints written before the option existed
        ck["key"].setdefault("corpus", DEFAULT_CORPUS)  # ... and before a second corpus
        if ck["key"] != key:
            raise SystemExit(f"{args.checkpoint}: a checkpoint of another run ({ck['key']}), not of this one")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        rng.bit_generator.state = ck["rng"]
        losses[: ck["step"]] = ck["losses"].to(device)
        val_steps, val_loss, train_time, wall_before, start = (ck["val_steps"], ck["val_loss"], ck["train_time"],
                                                               ck["wall_s"], ck["step"])
        concurrent = max(concurrent, ck.get("concurrent", 1))  # the most runs it shared the GPU with, over its parts
        if args.recipe != "bf16":
            ft.set_step(model, start)
        print(f"[{args.name}] resumed at step {start} from {args.checkpoint}", flush=True)

    def forward_backward(x, cache=True):
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), x[:, 1:].reshape(-1))
        loss.backward()
        return loss

    # --graph: the forward and backward of a step, captured in a CUDA graph after an eager step and replayed; the
    # gradient clipping and AdamW stay eager, so the learning rate is the float the eager step uses (a captured
    # optimizer would read it from an FP32 tensor and round it). The gradients are the graph's outputs: captured
    # with none present, as each eager step starts, so a replay writes them as the eager backward does (no
    # accumulation into zeros, which would turn a -0 into +0). Captured again after each evaluation, whose eager
    # forward may reallocate the layers' device buffers the graph holds (docs/python.md, CUDA graphs).
    graph = static_x = static_loss = None
    side = torch.cuda.Stream(device) if args.graph else None  # eager steps, the capture and replays share it
    t_start = time.time()
    step = start - 1
    for step in range(start, args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x = train_batch()
        if args.graph and step > start and graph is None:
            static_x = x.clone()
            opt.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                static_loss = forward_backward(static_x, cache=False)
            # The capture ran no kernel: this step's are the replay's below, with the step's SR key.
        if graph is not None:
            ft.set_step(model, step)
            static_x.copy_(x)
            graph.replay()
            loss = static_loss
        elif side is not None:  # the eager step before a capture, on the capture's stream (PyTorch's warm-up)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                opt.zero_grad(set_to_none=True)
                loss = forward_backward(x)
            torch.cuda.current_stream().wait_stream(side)
        else:
            with cap.at(step) if cap else contextlib.nullcontext():
                opt.zero_grad(set_to_none=True)
                loss = forward_backward(x)
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
        stop = not last and ((args.time_limit and time.time() - t_start > args.time_limit) or step + 1 == args.stop_at)
        if graph is not None and ((step + 1) % args.eval_every == 0 or last or stop):
            ft.set_step(model, step + 1)  # where an eager step leaves the layers (the evaluation and state read it)
        if (step + 1) % args.eval_every == 0 or last:
            val_steps.append(step + 1)
            val_loss.append(evaluate(n_val if last else args.eval_windows))
            print(f"[{args.name}] step {step + 1} validation loss {val_loss[-1]:.4f}", flush=True)
            graph = None  # captured again at the next step
        if stop:
            buf = io.BytesIO()
            torch.save({"key": key, "model": model.state_dict(), "opt": opt.state_dict(),
                        "rng": rng.bit_generator.state, "losses": losses[: step + 1].cpu(), "step": step + 1,
                        "val_steps": val_steps, "val_loss": val_loss, "train_time": train_time,
                        "wall_s": wall_before + time.time() - t_start, "concurrent": concurrent}, buf)
            write_atomic(args.checkpoint, buf.getvalue())
            why = "--stop-at" if step + 1 == args.stop_at else "time limit"
            print(f"[{args.name}] {why}: stopped after step {step + 1}, state in {args.checkpoint}", flush=True)
            sys.exit(EXIT_CONTINUE)
    done = step + 1
    run = {
        "name": args.name, "model": args.size, "params": params, "block_params": block_params,
        "corpus": corpus, "recipe": args.recipe, "recipe_detail": RECIPES[args.recipe],
        "gemm_mode": "bf16" if args.recipe == "bf16" else args.mode, "seed": args.seed,
        "steps": list(range(1, done + 1)), "train_loss": [float(v) for v in losses[:done].cpu().tolist()],
        "val_steps": val_steps, "val_loss": val_loss,
        "tokens_per_s": done * batch * seq / train_time,
        "config": {**cfg, "steps": args.steps, "warmup_steps": warm, "optimizer": "AdamW(0.9, 0.95), wd 0.1",
                   "grad_clip": 1.0, "schedule": "linear warm-up, cosine to 0.1", "precision":
                   "FP32 master weights, BF16 autocast", "val_tokens_final": int((n_val - n_val % batch) * seq),
                   "val_tokens_intermediate": int(min(args.eval_windows, n_val) // batch * batch * seq)},
        "diverged": diverged, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "deterministic": args.deterministic, "cuda_graph": args.graph, "concurrent_runs": concurrent,
        "wall_s": wall_before + time.time() - t_start,
        "fp4lab_version": fp4lab.__version__, "command": " ".join(sys.argv),
    }
    if args.out:
        write_atomic(args.out, (json.dumps(run) + "\n").encode())
    if args.checkpoint and os.path.exists(args.checkpoint):
        os.unlink(args.checkpoint)
    return run
