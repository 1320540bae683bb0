"""One training run of the study: resumable, reproducible, its JSON written when it completes. Every option, input
and output is checked before the first step (a UsageError or DataError naming it), so a run never ends late on
something it could have seen at its start."""
import contextlib
import io
import json
import math
import os
import re
import sys
import time

from .._files import DataError, UsageError, check_output_folder, check_outputs, read_bytes
from .corpus import CORPORA, DEFAULT_CORPUS, check_folder_outputs, corpus_name, write_atomic
from .model import DEFAULT_SR_DRAW, RECIPES, SIZES, build_model, make_recipe

EXIT_CONTINUE = 75  # the run stopped at --time-limit with its state in --checkpoint: run the same command again
MIN_STEPS = 10  # the metric averages the last 10% of the steps
MAX_STEPS = 10**8  # the run keeps every step's loss (4 bytes each on the device, a number each in its JSON)
SEED_END = 2**64  # seeds are 0 to 2^64 - 1: fp4lab.torch.Recipe's range, which torch and numpy take too


def _load(data_dir: str, name: str):
    import numpy as np
    return np.frombuffer(read_bytes(os.path.join(data_dir, name)), dtype=np.uint8)


def use_deterministic_algorithms() -> None:
    """PyTorch's fixed-order algorithms, before any CUDA work. On a GPU, cuDNN attention's backward (and at least one
    other PyTorch kernel) adds in a varying order, so two runs of one command part after the first step (fp4lab's
    own kernels are order-independent already). cuBLAS reads the variable when it starts, so it goes first."""
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def run_name(size: str, recipe: str, mode: str, seed, steps, corpus: str = DEFAULT_CORPUS,
             sr_draw: str = DEFAULT_SR_DRAW) -> str:
    """A run's name (its JSON, log and checkpoint files): scripts/train_study.sh names runs through `name`. Runs on
    any corpus but the first carry its name, so runs of the same settings on two corpora never share a name (a
    report keeps one run per name); runs under an SR draw other than the default carry its name ("-philox1")."""
    tail = "" if corpus == DEFAULT_CORPUS else "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", corpus)
    if sr_draw != DEFAULT_SR_DRAW and recipe != "bf16":
        tail += "-" + sr_draw
    return f"{size}-{recipe}-{'bf16' if recipe == 'bf16' else mode}-s{seed}-{steps}{tail}"


def _whole(opt: str, value, low: int, high=None, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise UsageError(f"{opt} {value}: {why}")


def check_options(args):
    """(the run's configuration: the size's, with --seq, --batch and --lr applied; the capture steps or None), every
    option value checked first: a UsageError naming the first bad one, before anything is read, built or written."""
    for opt, value, known in (("--size", args.size, SIZES), ("--recipe", args.recipe, RECIPES),
                              ("--mode", args.mode, ("exact", "fast"))):
        if value not in known:
            raise UsageError(f"{opt} {value}: not one of {', '.join(known)}")
    cfg = dict(SIZES[args.size])
    for k in ("seq", "batch", "lr"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    _whole("--steps", args.steps, MIN_STEPS, MAX_STEPS,
           f"not from {MIN_STEPS} to {MAX_STEPS:,} (the metric averages the last 10% of the steps)")
    _whole("--seq", cfg["seq"], 1, why="not a positive number of tokens")
    _whole("--batch", cfg["batch"], 1, why="not a positive number of sequences")
    lr = cfg["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise UsageError(f"--lr {lr}: not a positive finite learning rate")
    _whole("--seed", args.seed, 0, SEED_END - 1, "not a seed from 0 to 2^64 - 1")
    _whole("--eval-every", args.eval_every, 1, why="not a positive number of steps")
    _whole("--log-every", args.log_every, 1, why="not a positive number of steps")
    _whole("--eval-windows", args.eval_windows, 1, why="not a positive number of sequences")
    _whole("--eval-windows", args.eval_windows, cfg["batch"],
           why=f"fewer than one batch ({cfg['batch']} sequences): an evaluation takes whole batches")
    _whole("--concurrent", args.concurrent, 1, why="not a positive number of runs")
    if args.time_limit is not None and (not args.checkpoint or not args.time_limit > 0):
        raise UsageError("--time-limit needs --checkpoint and a positive number of seconds")
    if args.stop_at is not None and (not args.checkpoint or not 0 < args.stop_at < args.steps):
        raise UsageError("--stop-at needs --checkpoint and a step between 1 and --steps")
    steps = None
    if args.capture_steps is not None:
        from ..capture import parse_steps
        try:
            steps = parse_steps(args.capture_steps)
        except ValueError:
            steps = None
        if not steps or max(steps) >= args.steps:  # a step past the run's last would silently capture nothing
            raise UsageError(f"--capture-steps {args.capture_steps!r}: not comma-separated steps from 0 to "
                             f"{args.steps - 1} (a step counts the updates applied before the captured pass)")
    return cfg, steps


def _device(name):
    """The torch device of --device (the GPU where there is one when None), or a UsageError."""
    import torch
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"--device {name!r}: not a device (cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= n:
            raise UsageError(f"--device {name}: no such CUDA device here ({n} available)")
    elif dev.type != "cpu":
        raise UsageError(f"--device {name}: the study runs on cpu or cuda, not {dev.type}")
    return dev


def _token_fault(model, tokens: int):
    """Why the converted layers cannot take `tokens` token rows a pass (bwd_dw reduces over them), or None: the
    layers' own check, which they run at each forward, run before the first step."""
    from ..torch._layer import check_shapes
    from ..torch.linear import Linear
    for m in model.modules():
        if isinstance(m, Linear) and not m.recipe.passthrough:
            try:
                check_shapes(m._label(), m.recipe, m.layer_id, 0, tokens, m.in_features, m.out_features)
            except ValueError as e:
                return str(e)
    return None


# fp4lab.capture.TraceCapture's arguments as this command spells them, for its refusals.
_CAPTURE_OPTIONS = {"max_tokens": "--capture-tokens", "token_stride": "--capture-token-stride",
                    "max_out": "--capture-max-out", "--pattern": "--capture-pattern", "pattern": "--capture-pattern",
                    "out_dir": "--capture-dir"}
_CAPTURE_WORDS = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, _CAPTURE_OPTIONS)) + r")\b")


def _capture(model, args, cfg, steps, corpus, inputs):
    """The run's trace capture (fp4lab.capture), its refusals a UsageError naming this command's options, and its
    records' paths held to the output rules before the first step."""
    from ..capture import TraceCapture, record_file_name
    batch, seq = cfg["batch"], cfg["seq"]
    last_block = cfg["layers"] - 1
    try:
        cap = TraceCapture(model, args.capture_pattern or rf"^blocks\.(0|{last_block})\.(qkv|proj|fc1|fc2)$",
                           steps, args.capture_dir, max_tokens=args.capture_tokens,
                           token_stride=args.capture_token_stride, max_out=args.capture_max_out, inputs=inputs,
                           metadata={"model": f"fp4lab.study {args.size}: byte-level SwiGLU decoder, d {cfg['d']}, "
                                              f"{cfg['layers']} layers, FFN {cfg['ffn']}, batch {batch} x {seq}",
                                     "recipe": args.recipe,
                                     # the command's name when the bundled traces were captured, kept so
                                     # that a capture writes the same metadata
                                     "corpus": f"{corpus} ({CORPORA[corpus].what}, fp4lab-train corpus)"
                                     if corpus in CORPORA else corpus})
    except (ValueError, re.error) as e:  # TraceError: its checks of the arguments, all made here
        raise UsageError(_CAPTURE_WORDS.sub(lambda m: _CAPTURE_OPTIONS[m.group(1)], str(e))) from None
    rows = batch * seq // cap.token_stride
    if rows < cap.token_multiple:
        raise UsageError(f"--capture-steps {args.capture_steps}: a step's {batch * seq} token rows (--batch {batch}, "
                         f"--seq {seq}) keep {rows} at --capture-token-stride {cap.token_stride}, fewer than the "
                         f"{cap.token_multiple} of a trace record")
    for s in sorted(steps):
        check_folder_outputs(os.path.join(args.capture_dir, f"step_{s:06d}"),
                             [record_file_name(n) for n in cap.modules], inputs)
    return cap


# What a checkpoint holds: its fields and their types (torch.load with weights_only=True gives no other objects).
_CHECKPOINT = {"key": dict, "model": dict, "opt": dict, "losses": "tensor", "step": int, "val_steps": list,
               "val_loss": list, "train_time": (int, float), "wall_s": (int, float)}


def _first(e: Exception) -> str:
    """The first sentence of an exception's message, for a one-line fault."""
    return " ".join(str(e).split()).split(". ")[0][:120]


def _not_checkpoint(path: str, why: str) -> DataError:
    return DataError(f"{path}: not a checkpoint of this command ({why})")


def load_checkpoint(path: str, device):
    """The state a run saved (a dict of tensors, numbers, strings, lists and dicts), loaded without running any of
    the file's code (torch.load with weights_only=True), or a DataError naming the file."""
    import pickle

    import torch
    blob = read_bytes(path)
    if not blob:
        raise _not_checkpoint(path, "an empty file")
    try:
        ck = torch.load(io.BytesIO(blob), map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise _not_checkpoint(path, "no pickle of tensors, numbers, strings, lists and dicts alone; refused "
                                    "without running any of it") from None
    except Exception as e:  # noqa: BLE001  (whatever a damaged or foreign file makes the reader raise)
        raise _not_checkpoint(path, f"{type(e).__name__}: {_first(e)}") from None
    if not isinstance(ck, dict):
        raise _not_checkpoint(path, f"a {type(ck).__name__}, not a dict")
    for k, t in _CHECKPOINT.items():
        v = ck.get(k)
        if not (torch.is_tensor(v) if t == "tensor" else isinstance(v, t) and not isinstance(v, bool)):
            raise _not_checkpoint(path, f"no {k!r} of the right type")
    return ck


def _rng_tensor(state: dict):
    """numpy's PCG64 state as 40 bytes in a uint8 tensor (a checkpoint holds tensors, not numpy's objects): the
    128-bit state and increment, has_uint32 and uinteger, little-endian."""
    import torch
    s = state["state"]
    raw = (s["state"].to_bytes(16, "little") + s["inc"].to_bytes(16, "little")
           + int(state["has_uint32"]).to_bytes(4, "little") + int(state["uinteger"]).to_bytes(4, "little"))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def _rng_state(t) -> dict:
    """The PCG64 state of _rng_tensor's tensor; a checkpoint written before the state was a tensor holds the dict."""
    import torch
    if isinstance(t, dict):
        return t
    if not (torch.is_tensor(t) and t.dtype == torch.uint8 and t.shape == (40,)):
        raise ValueError("the data order's generator state is not 40 bytes")
    raw = bytes(t.cpu().tolist())
    word = lambda a, b: int.from_bytes(raw[a:b], "little")  # noqa: E731
    return {"bit_generator": "PCG64", "state": {"state": word(0, 16), "inc": word(16, 32)},
            "has_uint32": word(32, 36), "uinteger": word(36, 40)}


def cmd_train(args):
    """One run (`fp4lab-train train`): returns its JSON's dict, or None where it stopped at --time-limit or --stop-at
    with its state in --checkpoint (the command then exits EXIT_CONTINUE). An option the run cannot take is a
    UsageError, an input or output it cannot use a DataError, each raised before the first step."""
    cfg, capture_steps = check_options(args)
    seq, batch = cfg["seq"], cfg["batch"]
    if args.graph and capture_steps is not None:
        raise DataError("--graph: trace capture (--capture-steps) hooks each step in Python; give one of the two")
    device = _device(args.device)
    if args.graph and device.type != "cuda":
        raise DataError(f"--graph: CUDA graphs need a CUDA device, not {device}")
    if not os.path.isdir(args.data):
        raise DataError(f"{args.data}: not a folder (--data names a folder of train.bin and val.bin)")
    # Outputs: the run's JSON and its checkpoint (rewritten when the run stops, removed when it completes), and the
    # capture's folder, none of them an input; checked now, not when the run ends.
    inputs = [os.path.join(args.data, n) for n in ("train.bin", "val.bin", "corpus.json")]
    outputs = [p for p in (args.out, args.checkpoint) if p]  # the JSON first
    if args.checkpoint and os.path.isdir(args.checkpoint):
        raise DataError(f"{args.checkpoint}: a folder, not a checkpoint file")
    check_outputs(outputs, inputs)
    if args.out and os.path.exists(args.out) and not args.force:
        raise DataError(f"{args.out}: exists (--force to replace)")
    if capture_steps is not None:
        check_output_folder(args.capture_dir)

    import numpy as np
    import torch
    import torch.nn.functional as F
    import fp4lab
    import fp4lab.torch as ft

    train_data, val_data = _load(args.data, "train.bin"), _load(args.data, "val.bin")
    corpus = corpus_name(args.data)
    # BF16 runs round nothing stochastically: no draw (None) in their key, record or name.
    sr_draw = None if args.recipe == "bf16" else getattr(args, "sr_draw", DEFAULT_SR_DRAW)
    args.name = args.name or run_name(args.size, args.recipe, args.mode, args.seed, args.steps, corpus, sr_draw)
    if len(train_data) < 100 * (seq + 1) or len(val_data) < batch * seq + 1:
        raise DataError(f"{args.data}: too little text for sequence {seq} and batch {batch} (train.bin needs "
                        f"{100 * (seq + 1):,} bytes, val.bin {batch * seq + 1:,})")
    if args.deterministic:
        use_deterministic_algorithms()

    torch.manual_seed(args.seed)
    model = build_model(cfg).to(device)
    recipe = make_recipe(args.recipe, args.mode, args.seed, sr_draw)
    if args.recipe != "bf16":
        ft.convert(model, recipe, include=r"^blocks\.")
        fault = _token_fault(model, batch * seq)
        if fault:
            raise UsageError(f"--seq {seq}: a step of batch {batch} has {batch * seq} token rows, which {args.recipe} "
                             f"cannot take ({fault})")
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

    cap = _capture(model, args, cfg, capture_steps, corpus, inputs + outputs) if capture_steps is not None else None
    losses = torch.zeros(args.steps, dtype=torch.float32, device=device)
    val_steps, val_loss = [], []
    train_time, wall_before, start = 0.0, 0.0, 0
    diverged = None
    # A run may span several invocations (--time-limit, --checkpoint): the checkpoint holds everything the next
    # step depends on, so a resumed run continues bit for bit where it stopped (on a GPU, with --deterministic).
    key = {"size": args.size, "recipe": args.recipe, "mode": args.mode, "seed": args.seed, "steps": args.steps,
           "cfg": cfg, "deterministic": args.deterministic, "corpus": corpus, "sr_draw": sr_draw}
    concurrent = args.concurrent
    if args.checkpoint and os.path.exists(args.checkpoint):
        ck = load_checkpoint(args.checkpoint, device)
        ck["key"].setdefault("deterministic", False)  # checkpoints written before the option existed
        ck["key"].setdefault("corpus", DEFAULT_CORPUS)  # ... and before a second corpus
        # ... and before the philox4 draw: those runs drew philox1 (BF16 runs none)
        ck["key"].setdefault("sr_draw", None if args.recipe == "bf16" else "philox1")
        if ck["key"] != key:
            raise DataError(f"{args.checkpoint}: a checkpoint of another run ({str(ck['key'])[:300]}), not of this one")
        start, parts = ck["step"], ck.get("concurrent", 1)  # checkpoints before --concurrent existed: one run
        if not (0 < start < args.steps and tuple(ck["losses"].shape) == (start,) and isinstance(parts, int)
                and len(ck["val_steps"]) == len(ck["val_loss"]) and all(type(v) is int for v in ck["val_steps"])
                and all(type(v) in (int, float) for v in ck["val_loss"])):
            raise _not_checkpoint(args.checkpoint, f"its step {start}, losses and validation record disagree")
        try:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            for p in model.parameters():  # load_state_dict takes moments of any shape; the first step would not
                if any(torch.is_tensor(v) and v.dim() and v.shape != p.shape for v in opt.state.get(p, {}).values()):
                    raise ValueError("optimizer state of another shape than its parameter")
            rng.bit_generator.state = _rng_state(ck["rng"])
            losses[:start] = ck["losses"].to(device)
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as e:
            raise _not_checkpoint(args.checkpoint, f"{type(e).__name__}: {_first(e)}") from None
        val_steps, val_loss, train_time, wall_before = (list(ck["val_steps"]), list(ck["val_loss"]), ck["train_time"],
                                                        ck["wall_s"])
        concurrent = max(concurrent, parts)  # the most runs it shared the GPU with, over its parts
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
            # Tensors, numbers, strings, lists and dicts only: what torch.load(weights_only=True) reads back.
            torch.save({"key": key, "model": model.state_dict(), "opt": opt.state_dict(),
                        "rng": _rng_tensor(rng.bit_generator.state), "losses": losses[: step + 1].cpu(),
                        "step": step + 1, "val_steps": val_steps, "val_loss": val_loss, "train_time": train_time,
                        "wall_s": wall_before + time.time() - t_start, "concurrent": concurrent}, buf)
            write_atomic(args.checkpoint, buf.getvalue(), inputs + outputs[:-1])
            why = "--stop-at" if step + 1 == args.stop_at else "time limit"
            print(f"[{args.name}] {why}: stopped after step {step + 1}, state in {args.checkpoint}", flush=True)
            return None
    done = step + 1
    run = {
        "name": args.name, "model": args.size, "params": params, "block_params": block_params,
        "corpus": corpus, "recipe": args.recipe, "recipe_detail": RECIPES[args.recipe],
        "gemm_mode": "bf16" if args.recipe == "bf16" else args.mode, "seed": args.seed, "sr_draw": sr_draw,
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
        write_atomic(args.out, (json.dumps(run) + "\n").encode(), inputs + outputs[1:])
    if args.checkpoint and os.path.exists(args.checkpoint):
        os.unlink(args.checkpoint)
    return run
