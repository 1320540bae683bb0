#!/usr/bin/env python3
"""Training-step time of a 103M-parameter SwiGLU decoder under fp4lab recipes, beside BF16 in the same process.

The model (d 1024, 8 layers, 16 heads, FFN 2816, sequence 1024, batch 8, BF16 weights, AdamW) is the one
docs/spec.md §12 gives reference timings for. Every linear layer of the blocks runs under the recipe
(fp4lab.torch.convert); the embedding and the output head stay BF16. For each recipe and GEMM mode it prints the
median step time over --steps timed steps (CUDA events, after --warmup steps), the host's time to queue an eager
step (below the step time: the GPU is the bound), the ratio to BF16, and the loss at
the first and the last step on a learnable synthetic token stream (so a recipe that breaks training shows).
--size small|large times the models of fp4lab.study (fp4lab-train) instead, and --recipes takes its recipe
names (the presets and the ablations of docs/training.md).

    python3 scripts/bench_train_step.py [--size small] [--recipes bf16,ufp4,nvfp4] [--modes fast,exact]
        [--compile bf16,ufp4] [--graph bf16,ufp4] [--unfused-epilogue nvfp4] [--gemm-variant 3] [--monitor 100]
        [--separate-operands ufp4] [--plain-output-check ufp4] [--profile ufp4:fast] [--host-profile ufp4:fast] [--launch-cost]
        [--bound ufp4,nvfp4]
        [--json out.json]
    python3 scripts/bench_train_step.py table [--by-mode] RESULTS.json...   (markdown tables of measured results;
        --by-mode: one row per recipe and GEMM mode, eager, compiled and captured side by side)
"""
import argparse
import bisect
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import fp4lab
import fp4lab.torch as ft

# The decoder and the recipes of docs/training.md.
from fp4lab.study import RECIPES, SIZES, build_model, make_recipe
from fp4lab.study.model import DEFAULT_SR_DRAW, SR_DRAWS
from fp4lab.study.train import use_deterministic_algorithms

SHAPE_KEYS = ("d", "layers", "heads", "ffn", "seq", "batch", "vocab")
# docs/spec.md §12's reference shape, used when --size is not given: the large model with a 32000-token vocabulary.
SPEC_SHAPE = dict({k: SIZES["large"][k] for k in SHAPE_KEYS if k != "vocab"}, vocab=32000)


def batches(vocab, batch, seq, device, seed):
    """A learnable stream: each sequence repeats a random 64-token motif with 10% of tokens replaced at random."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    while True:
        motif = torch.randint(0, vocab, (batch, 64), generator=g)
        x = motif.repeat(1, seq // 64 + 1)[:, : seq + 1]
        noise = torch.rand(x.shape, generator=g) < 0.1
        x = torch.where(noise, torch.randint(0, vocab, x.shape, generator=g), x)
        yield x.to(device, non_blocking=True)


def step_on(model, x, vocab, opt):
    """Forward, backward and AdamW of one step of next-token cross-entropy on the tokens x; the loss tensor. The
    phases are named for --profile's account of the GPU's idle time."""
    with torch.profiler.record_function("step:forward"):
        loss = F.cross_entropy(model(x[:, :-1]).float().view(-1, vocab), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    with torch.profiler.record_function("step:backward"):
        loss.backward()
    with torch.profiler.record_function("step:optimizer"):
        opt.step()
    return loss


def train_step(model, x, vocab, opt, device, check=False):
    """One AdamW step of next-token cross-entropy on the tokens x: (loss as a float, milliseconds), timed by CUDA
    events on a GPU and by the wall clock on the CPU. check: then read the deferred finite check (fp4lab on CUDA)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    loss = step_on(model, x, vocab, opt)
    if device.type != "cuda":
        return loss.item(), (time.perf_counter() - t0) * 1e3
    end.record()
    # The host's share: the wall time until every kernel of the step is queued. Below the GPU time, the step waits
    # for the GPU (device-bound); near it, for Python and launches (host-bound).
    train_step.host_ms = (time.perf_counter() - t0) * 1e3
    end.synchronize()
    if check:
        ft.check_finite()
    return loss.item(), start.elapsed_time(end)


def back_to_back_ms(args, one_step, data):
    """--pipelined: milliseconds a step over args.steps steps run back to back, timed by CUDA events around all of
    them, with one synchronisation at the end: the host queues a step while the GPU runs the one before, as a loop
    that does not read the loss each step runs. one_step(x) runs a step on a batch already on the device."""
    xs = [next(data) for _ in range(args.steps)]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for x in xs:
        one_step(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / len(xs)


def setup(args, recipe, mode, device, capturable=False):
    """The model (seed 0, blocks under the recipe), its AdamW and the data stream every row of a run starts from."""
    torch.manual_seed(0)
    cfg = {"d": args.d, "layers": args.layers, "heads": args.heads, "ffn": args.ffn, "seq": args.seq}
    model = build_model(cfg, args.vocab).to(device, torch.bfloat16)
    if recipe != "bf16":
        name, _, draw = recipe.partition("@")  # ufp4@philox16: the recipe under another SR draw
        ft.convert(model, make_recipe(name, mode, seed=0, sr_draw=draw or DEFAULT_SR_DRAW), include=r"^blocks\.")
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=fused, **({"capturable": True} if capturable else {}))
    return model, opt, batches(args.vocab, args.batch, args.seq, device, seed=1)


def run(args, recipe, mode, device, profile=False, compiled=False, monitor_every=0, steps=None):
    model, opt, data = setup(args, recipe, mode, device)
    times, losses, host = [], [], []
    prof = None
    mon = None
    steps = steps or args.steps
    if monitor_every:
        mon = ft.monitor(model, every=monitor_every, out=os.path.join(args.tmp, f"monitor-{recipe}-{mode}.jsonl"))
    train_model = torch.compile(model, fullgraph=True) if compiled else model
    for step in range(args.warmup + steps):
        if profile and step == args.warmup + args.steps - 2:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                      torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        loss, ms = train_step(train_model, next(data), args.vocab, opt, device, check=recipe != "bf16")
        losses.append(loss)
        if step >= args.warmup:
            times.append(ms)
            if device.type == "cuda":
                host.append(train_step.host_ms)
    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.profile_rows), flush=True)
        idle_report(prof, args.tmp)
    pipelined = None
    if args.pipelined and steps == args.steps:  # (a profiled row's profile has ended)
        pipelined = back_to_back_ms(args, lambda x: step_on(train_model, x, args.vocab, opt), data)
        if recipe != "bf16":
            ft.check_finite()
    if mon is not None:
        mon.close()
    params = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    parts = ([mode] if recipe != "bf16" else []) + (["compile"] if compiled else []) + \
        ([f"monitor/{monitor_every}"] if monitor_every else [])
    label = "+".join(parts) or "-"
    row = {"recipe": recipe, "mode": label, "median_ms": statistics.median(times), "mean_ms": statistics.mean(times),
           "min_ms": min(times), "max_ms": max(times), "loss_first": losses[0], "loss_last": losses[-1],
           "block_params": params, "steps_timed": len(times),
           "tokens_per_s": args.batch * args.seq / (statistics.median(times) / 1e3)}
    if mon is not None:
        row["monitor_records"] = mon.records
    if host:
        row["host_ms"] = statistics.median(host)
    if pipelined is not None:
        row["pipelined_ms"] = pipelined
    if steps != args.steps:
        row["step_ms"] = times  # a monitor row and its baseline, step by step (the steps after the warm-up)
    return row


def trace_spans(prof, tmp: str) -> list:
    """The complete events ("ph": "X") of a profile's Chrome trace, read through a file in tmp that is then removed."""
    path = os.path.join(tmp, "profile-trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.remove(path)
    return [e for e in events if e.get("ph") == "X"]


def idle_report(prof, tmp: str) -> None:
    """Where the GPU waits for the host in the profiled steps: the time between the step's GPU work (kernels, copies,
    fills) and from the step's start to its first work, each gap charged to the phase whose host code launched the
    work that ended it (the time a step cannot lose to the GPU; a captured step has none), and to that work's name."""
    spans = trace_spans(prof, tmp)
    phases = sorted((e["ts"], e["ts"] + e["dur"], e["name"].removeprefix("step:")) for e in spans
                    if e.get("cat") == "user_annotation" and e["name"].startswith("step:"))
    # Kernels are launched through the runtime (cudaLaunchKernel) or the driver (cuLaunchKernelEx: cuBLAS).
    launched = {e["args"]["correlation"]: e["ts"] for e in spans
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    work = sorted((e["ts"], e["ts"] + e["dur"], e["name"], launched.get(e.get("args", {}).get("correlation")))
                  for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))

    starts = [a for a, _, name in phases if name == "forward"]  # where each step begins on the host

    def phase_of(t):
        if t is None:
            return "launch not in the trace"  # still GPU work of the step: its time is busy, not idle
        return next((name for a, b, name in phases if a <= t <= b), None)

    by_phase, by_work, busy, end, step = {}, {}, 0.0, None, None
    for a, b, name, t in work:
        ph = phase_of(t)
        if ph is None:
            continue  # launched between the steps (the loss read, the next batch): not in a step's time
        s = step if t is None else bisect.bisect_right(starts, t) - 1
        if s != step and s >= 0:
            # A step's first gap runs from where the step begins (or the last step's work ends, if later), not
            # from the last step's work: the time between steps is not a step's.
            step, end = s, starts[s] if end is None else max(end, starts[s])
        if end is not None and a > end:
            by_phase[ph] = by_phase.get(ph, 0.0) + (a - end)
            short = name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0][-60:]
            by_work[short] = by_work.get(short, 0.0) + (a - end)
        busy += max(0.0, b - max(a, end if end is not None else a))
        end = b if end is None else max(end, b)
    steps = sum(1 for _, _, name in phases if name == "forward") or 1
    idle = sum(by_phase.values())
    print(f"GPU idle inside the profiled steps: {idle / steps / 1e3:.2f} ms a step (busy {busy / steps / 1e3:.2f} "
          f"ms), by the phase that launched the waiting work: "
          + ", ".join(f"{k} {v / steps / 1e3:.2f}" for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])),
          flush=True)
    for name, us in sorted(by_work.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {us / steps / 1e3:7.3f} ms a step before {name}", flush=True)


# The contract GEMM's main kernels (kernels/src/gemm.cu): the work the epilogue bound bounds. Their prepare pass stays
# with the rest of the step; the SM100 native kernel (gemm_sm100.cu) scales inside the tensor core and has no such
# epilogue. test_training ties the names to the source.
CONTRACT_GEMM_KERNELS = ("gemm_mma_kernel", "gemm_wgmma_kernel")


def kernel_ms(prof, tmp: str, names) -> float:
    """GPU milliseconds a profiled step spends in the kernels whose names hold one of ``names`` (the steps counted
    by their forward marks)."""
    spans = trace_spans(prof, tmp)
    steps = sum(1 for e in spans if e.get("cat") == "user_annotation" and e["name"] == "step:forward") or 1
    us = sum(e["dur"] for e in spans if e.get("cat") == "kernel" and any(n in e["name"] for n in names))
    return us / steps / 1e3


def gemm_bound_ms(model, tokens: int, device) -> dict:
    """The step's contract GEMMs at their epilogue bound (fp4lab._core.cuda_gemm_epilogue_bound): each fp4lab layer
    of the model runs three GEMMs of 2 * tokens * in * out operations (forward, input and weight gradients), each at
    the rate its operands' configs allow on this device."""
    ms, ops, forms, sms, khz = 0.0, 0, set(), 0, 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    for m in model.modules():
        if isinstance(m, ft.Linear) and not m.recipe.passthrough:
            n = 2 * tokens * m.in_features * m.out_features
            for p in fp4lab._core.PASSES:
                a, b = (m.recipe.config(p, o, layer=m.layer_id, step=0) for o in ("a", "b"))
                rate, instructions, sms, khz = fp4lab._core.cuda_gemm_epilogue_bound(index, a, b)
                ms += n / rate * 1e3
                ops += n
                forms.add((instructions, a.block, rate))
    return {"gemm_bound_ms": ms, "gemm_ops": ops, "epilogue_forms": sorted(forms), "sms": sms, "clock_khz": khz}


def exact_bound(args, recipe: str, device) -> dict:
    """Where a recipe's exact step stands against its computed bound: the step with its contract GEMMs (timed in two
    profiled eager steps, after two more) replaced by the same GEMMs at the epilogue bound. The GEMMs are the same
    kernels eager and captured, so the bound applies to every row of the recipe's exact mode."""
    model, opt, data = setup(args, recipe, "exact", device)
    for _ in range(2):
        train_step(model, next(data), args.vocab, opt, device, check=True)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                              torch.profiler.ProfilerActivity.CPU])
    with prof:
        for _ in range(2):
            train_step(model, next(data), args.vocab, opt, device, check=True)
    return dict(gemm_ms=kernel_ms(prof, args.tmp, CONTRACT_GEMM_KERNELS),
                **gemm_bound_ms(model, args.batch * args.seq, device))


def bound_rows(rows: list, bounds: dict, base_ms: float) -> list:
    """Each exact row of a recipe in ``bounds`` with its bound: bound_ms (the row's step less its contract GEMMs'
    time plus their time at the bound), bound_vs_bf16 and over_bound (the row's step over its bound, less 1).
    Returns the lines that say so."""
    lines = []
    for row in rows:
        b = bounds.get(row["recipe"])
        parts = row["mode"].split("+")
        # Eager, compiled and captured rows run the GEMMs exact_bound timed; a forced variant or epilogue does not.
        if b is None or parts[0] != "exact" or not set(parts[1:]) <= {"compile", "graph"}:
            continue
        bound = row["median_ms"] - b["gemm_ms"] + b["gemm_bound_ms"]
        row.update(b, bound_ms=bound, bound_vs_bf16=bound / base_ms, over_bound=row["median_ms"] / bound - 1)
        forms = ", ".join(f"{i} FP32 instructions per output and {blk}-block ({r / 1e12:.0f} TOPS)"
                          for i, blk, r in b["epilogue_forms"])
        lines.append(f"{row['recipe']} {row['mode']}: {row['median_ms']:.2f} ms, of which the contract GEMMs "
                     f"{b['gemm_ms']:.2f}; at the epilogue bound ({forms}) they take {b['gemm_bound_ms']:.2f}, "
                     f"so the step's bound is {bound:.2f} ms ({bound / base_ms:.2f}x BF16) and the step is "
                     f"{100 * row['over_bound']:.0f}% above it")
    return lines


def host_profile(args, device):
    """Three steps (after the warm-up) of --host-profile's recipe under cProfile: the functions by their own time,
    then by their cumulative time.
    The backward runs on the profiled thread (autograd's device threads are invisible to cProfile), so the layers'
    backward Python is in the table too."""
    import cProfile
    import pstats
    recipe, _, mode = args.host_profile.partition(":")
    compiled = mode.endswith("+compile")
    model, opt, data = setup(args, recipe, mode.removesuffix("+compile"), device)
    train_model = torch.compile(model, fullgraph=True) if compiled else model
    for _ in range(args.warmup):
        train_step(train_model, next(data), args.vocab, opt, device, check=recipe != "bf16")
    prof = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        prof.enable()
        for _ in range(3):
            train_step(train_model, next(data), args.vocab, opt, device, check=recipe != "bf16")
        prof.disable()
    print(f"host profile, {recipe} {mode}, 3 steps:", flush=True)
    stats = pstats.Stats(prof).sort_stats("tottime")
    stats.print_stats(args.profile_rows)
    stats.sort_stats("cumulative").print_stats(args.profile_rows)


def patched_rows(args, recipe, mode, device, patches, suffix):
    """run's rows for the recipe (eager; captured where --graph asks) with each (obj, name, value) of patches set
    meanwhile, their mode marked by suffix: a path beside the default one."""
    was = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        rows = [run(args, recipe, mode, device)]
        if recipe in args.graph.split(","):
            rows.append(run_graph(args, recipe, mode, device))
    finally:
        for obj, name, value in was:
            setattr(obj, name, value)
    for row in rows:
        row["mode"] += suffix
    return rows


def run_graph(args, recipe, mode, device):
    """The same steps with the whole training step (forward, backward, AdamW) captured once in a CUDA graph and
    replayed: no Python and no host work between kernels. Each replay's SR key is set by ft.set_step (the captured
    quantisers read it on the device) and its batch copied into the captured input first; the timed span is the
    replay. (That a replay computes the eager step's bits is tested in tests/python/torch_layer/test_torch.py, on a model
    whose kernels are all deterministic; this model's attention backward is not.)"""
    model, opt, data = setup(args, recipe, mode, device, capturable=True)
    static_x = next(data).clone()

    def step():
        logits = model(static_x[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), static_x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss

    losses, times = [], []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up steps the capture needs, eager, counted as steps 0-2
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            losses.append(step().item())
            static_x.copy_(next(data))
    torch.cuda.current_stream().wait_stream(side)
    if recipe != "bf16":
        ft.check_finite()
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_loss = step()
    for i in range(3, 3 + args.warmup + args.steps):
        if recipe != "bf16":
            ft.set_step(model, i)
        opt.zero_grad(set_to_none=False)  # (outside the graph: the captured backward accumulates into the grads)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        losses.append(static_loss.item())
        static_x.copy_(next(data))
        if i >= 3 + args.warmup:
            times.append(start.elapsed_time(end))
    pipelined = None
    if args.pipelined:
        later = iter(range(3 + args.warmup + args.steps, 3 + args.warmup + 2 * args.steps))

        def one_step(x):
            if recipe != "bf16":
                ft.set_step(model, next(later))
            opt.zero_grad(set_to_none=False)
            static_x.copy_(x)
            graph.replay()
        pipelined = back_to_back_ms(args, one_step, data)
    if recipe != "bf16":
        ft.check_finite()
    params = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    row = {"recipe": recipe, "mode": "graph" if recipe == "bf16" else mode + "+graph",
           "median_ms": statistics.median(times), "mean_ms": statistics.mean(times), "min_ms": min(times),
           "max_ms": max(times), "loss_first": losses[0], "loss_last": losses[-1], "block_params": params,
           "steps_timed": len(times), "tokens_per_s": args.batch * args.seq / (statistics.median(times) / 1e3)}
    if pipelined is not None:
        row["pipelined_ms"] = pipelined
    return row


def launch_cost(device):
    """Host time per call of the layer's CUDA launch path (µs, calls issued back to back, no synchronisation between
    them): what bounds a step that the GPU is not the limit of. Operands of the 103M model's largest shape."""
    from fp4lab.torch import ops

    def host_us(f, n):
        f()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            f()
        us = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        return us

    x = torch.randn(8192, 1024, device=device, dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    r = ft.Recipe("ufp4", mode="fast")
    cfg = r.config("fwd_y", "a", layer=3, step=5)
    step = torch.tensor(5)
    new_step = iter(range(10**9))
    bound = torch.full((8,), 1.0, device=device)  # magnitude bounds that prove the product finite (no scan)
    for what, f, n in (
            ("fake_quantize (one operand)", lambda: ops.fake_quantize(x, cfg, check_finite="deferred"), 2000),
            ("torch.matmul alone (BF16, cuBLAS)", lambda: torch.matmul(x, w.t()), 500),
            ("matmul + deferred output check", lambda: ops._fast_matmul(x, w, "deferred"), 500),
            ("one fast GEMM, eager (two operands, product, check)",
             lambda: ops.qmatmul(x, w, step, r, 3, "fwd_y", "L", {}, None), 500),
            ("one fast GEMM, the compiled path's operator (fp4lab::fast_qmatmul)",
             lambda: torch.ops.fp4lab.fast_qmatmul(x, w, step, r.key, 3, "fwd_y", "L"), 500),
            ("one tensor's two fast operands, compiled (fp4lab::fast_pair)",
             lambda: torch.ops.fp4lab.fast_pair(x, step, r.key, 3, "fwd_y.a,bwd_dw.b", "L"), 500),
            ("one fast GEMM of two pairs' operands, compiled (fp4lab::fast_mm)",
             lambda: torch.ops.fp4lab.fast_mm(x, w, bound, bound, r.key), 500),
            ("Recipe.config at a new step", lambda: r.config("fwd_y", "a", layer=3, step=next(new_step)), 2000)):
        print(f"{what:70s} {host_us(f, n):8.1f} us of host a call", flush=True)
    # A whole eager layer on 64 tokens, whose kernels take a few µs: the host's time alone. The first layer of a step
    # reads the deferred check (a synchronisation); a second, in eval mode, keeps that step and its graph.
    first, lin = (ft.Linear(1024, 1024, bias=False, recipe=r).to(device, torch.bfloat16) for _ in range(2))
    xs = torch.randn(64, 1024, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 1024, device=device, dtype=torch.bfloat16)
    first(xs)
    lin.eval()
    cfg_t = r.config("bwd_dw", "b", layer=3, step=5)
    xd, ws = xs.detach(), w[:64]
    for what, f, n in (("fake_quantize_both, 64x1024 (one read)",
                        lambda: ops.fake_quantize_both(xd, cfg, cfg_t, check_finite="deferred"), 1000),
                       ("torch.matmul alone, 64 tokens", lambda: torch.matmul(xd, ws.t()), 1000),
                       ("matmul + deferred output check, 64 tokens",
                        lambda: ops._fast_matmul(xd, ws, "deferred"), 1000),
                       ("one fast Linear's forward, eager, 64 tokens", lambda: lin(xs), 1000),
                       ("one fast Linear's forward and backward, eager, 64 tokens",
                        lambda: lin(xs).backward(dy), 1000)):
        print(f"{what:70s} {host_us(f, n):8.1f} us of host a call", flush=True)


def monitor_overhead(args, row: dict, base: dict, every: int) -> dict:
    """The monitor's cost from a monitored run and an unmonitored one of the same model, seed, data and steps, step
    against step. A sampled step (the layers' step counter counts the warm-up, so step i of the timed ones is step
    warmup + i) computes the statistics; the step after it reads them back and writes the records, so both count.
    The other steps run the same path in both runs: their differences are the drift between two runs, subtracted,
    and their spread is the noise."""
    d = [m - b for m, b in zip(row["step_ms"], base["step_ms"])]
    sampled = [i for i in range(len(d)) if (args.warmup + i) % every == 0]
    paid = sorted({j for i in sampled for j in (i, i + 1) if j < len(d)})
    rest = [d[i] for i in range(len(d)) if i not in paid]
    drift = statistics.mean(rest)
    extra = sum(d[i] - drift for i in paid) / len(sampled) if sampled else 0.0
    return {"monitor_overhead": sum(row["step_ms"]) / sum(base["step_ms"]) - 1.0,
            "monitor_sampled_steps": len(sampled),
            "monitor_sampled_extra_ms": extra,
            "monitor_unsampled_diff_ms": {"mean": drift, "sd": statistics.stdev(rest)},
            # The monitor's own cost: a sample's extra time (its step and the read-back), spread over the `every`
            # steps it stands for.
            "monitor_cost": extra / (every * statistics.mean(base["step_ms"]))}


def table(info: dict) -> str:
    """A results JSON of this script as a markdown table (docs/training.md carries these verbatim)."""
    m = info["model"]
    size = f"`{info['size']}` model" if info.get("size") else "docs/spec.md §12 shape"
    lines = [f"{size}: d {m['d']}, {m['layers']} layers, sequence {m['seq']}, batch {m['batch']}, vocabulary "
             f"{m['vocab']}, {info['block_params'] / 1e6:.1f}M parameters in the blocks; {info['device']}, median "
             f"of {info['rows'][0]['steps_timed']} steps",
             "", "| recipe | GEMMs | ms/step | min–max ms | tokens/s | × BF16 |", "|---|---|---:|---:|---:|---:|"]
    for r in info["rows"]:
        mon = f" (mean {r['mean_ms']:.2f} ms over {r['steps_timed']} steps, {100 * r['monitor_overhead']:+.1f}% " \
              "against the same mode's mean)" if "monitor_overhead" in r else ""
        lines.append(f"| `{r['recipe']}` | {r['mode']}{mon} | {r['median_ms']:.2f} | "
                     f"{r['min_ms']:.1f}–{r['max_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['vs_bf16']:.2f} |")
    return "\n".join(lines)


def mode_table(info: dict) -> str:
    """A results JSON of this script as one markdown row per recipe and GEMM mode: eager, compiled and captured
    steps side by side, each with its ratio to the eager BF16 step (the first row), and for exact rows with a bound
    (--bound) the bound and how far the captured step (else the eager one) is above it. A run with --pipelined adds
    the same table of its back-to-back steps, each against BF16's eager steps back to back."""
    ways = {}  # (recipe, mode) -> {"eager" | "compile" | "graph": row}
    for r in info["rows"]:
        parts = [p for p in r["mode"].split("+") if p != "-"]  # BF16's eager row is "-"
        mode = "" if r["recipe"] == "bf16" else parts[0]
        way = "graph" if "graph" in parts else "compile" if "compile" in parts else "eager"
        if len(parts) - (mode != "") - (way != "eager") == 0:  # other variants (+monitor, +unfused-...) left out
            ways.setdefault((r["recipe"], mode), {})[way] = r

    def lines(key, bounded):
        base = info["rows"][0][key]
        head = "| recipe | GEMMs | eager ms | × BF16 | compiled ms | × BF16 | captured ms | × BF16 |"
        out = [head + (" bound ms | × BF16 | above bound |" if bounded else ""),
               "|---|---|" + "---:|" * (6 + 3 * bounded)]
        for (recipe, mode), w in ways.items():
            cells = []
            for way in ("eager", "compile", "graph"):
                r = w.get(way)
                cells += [f"{r[key]:.2f}", f"{r[key] / base:.2f}"] if r and key in r else ["–", ""]
            if bounded:
                r = w.get("graph", w.get("eager"))
                cells += ([f"{r['bound_ms']:.2f}", f"{r['bound_vs_bf16']:.2f}", f"{100 * r['over_bound']:.0f}%"]
                          if r and "bound_ms" in r else ["", "", ""])
            out.append(f"| {recipe} | {mode} | " + " | ".join(cells) + " |")
        return out

    out = lines("median_ms", any("bound_ms" in r for r in info["rows"]))
    if "pipelined_ms" in info["rows"][0]:
        n = info["rows"][0]["steps_timed"]
        out += ["", f"Back to back ({n} steps, one synchronisation), against BF16's eager steps back to back:", ""]
        out += lines("pipelined_ms", False)
    return "\n".join(out)


def main():
    if sys.argv[1:2] == ["table"]:  # print the tables of results already measured
        by_mode = sys.argv[2:3] == ["--by-mode"]
        for path in sys.argv[2 + by_mode:]:
            print((mode_table if by_mode else table)(json.load(open(path))) + "\n")
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", default="bf16,ufp4,nvfp4",
                    help="comma-separated; NAME@DRAW runs a recipe under another SR draw (philox1, the original; "
                         "philox16, 8 bits an element: docs/spec.md §4)")
    ap.add_argument("--modes", default="fast,exact")
    ap.add_argument("--size", choices=sorted(SIZES),
                    help="take the shape of this model of fp4lab.study (byte vocabulary, 256) instead of "
                         "docs/spec.md §12's; a shape flag given as well overrides it")
    for k in SHAPE_KEYS:
        ap.add_argument(f"--{k}", type=int, help=f"default {SPEC_SHAPE[k]}")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", metavar="RECIPE:MODE",
                    help="also profile two steps of this run (MODE+compile: of its compiled run): top CUDA kernels")
    ap.add_argument("--profile-rows", type=int, default=18, help="rows of the profile's table")
    ap.add_argument("--host-profile", metavar="RECIPE:MODE",
                    help="also run three steps of this recipe under cProfile (MODE+compile: compiled) and print the "
                         "Python functions by their own and by their cumulative time: where an eager step's host "
                         "time goes")
    ap.add_argument("--bound", default="", metavar="RECIPES",
                    help="CUDA: also profile two exact steps of each and report where each of its exact rows stands "
                         "against its computed bound (the step with the contract GEMMs at their epilogue bound)")
    ap.add_argument("--compile", default="", metavar="RECIPES",
                    help="also time these recipes (e.g. bf16,ufp4; NAME:MODE for one mode, as ufp4:fast) under "
                         "torch.compile(model, fullgraph=True)")
    ap.add_argument("--graph", default="", metavar="RECIPES",
                    help="also time these recipes with the whole step (forward, backward, AdamW) captured in a CUDA "
                         "graph and replayed")
    ap.add_argument("--unfused-epilogue", default="", metavar="RECIPES",
                    help="also time these recipes' exact rows with the GEMM's fused epilogue off (the separate "
                         "multiply and add; the same bits, docs/datapath.md section 3): what the fused form saves")
    ap.add_argument("--gemm-variant", type=int, default=None, metavar="V",
                    help="also time every exact row (eager, and captured where --graph asks) with the fast GEMM's "
                         "tile variant V forced (fp4lab cuda bench lists them; the same bits): one beside the default")
    ap.add_argument("--separate-operands", default="", metavar="RECIPES",
                    help="also time these recipes' fast rows (eager, and captured where --graph asks) with each "
                         "operand quantised on its own, as before fast_pair read X, W and dY once for both of their "
                         "GEMMs (the same bits): what the one read saves")
    ap.add_argument("--plain-output-check", default="", metavar="RECIPES",
                    help="also time these recipes' fast rows (eager, and captured where --graph asks) with every "
                         "GEMM output scanned for NaN/Inf, as before the checks read the operands' magnitude bounds "
                         "(the same bits): what the bounds save")
    ap.add_argument("--pipelined", action="store_true",
                    help="also time each row's steps back to back, one synchronisation for all of them (CUDA)")
    ap.add_argument("--launch-cost", action="store_true",
                    help="first print the host time per call of the layer's CUDA launch path (no training)")
    ap.add_argument("--deterministic", action="store_true",
                    help="PyTorch's deterministic algorithms, as fp4lab-train --deterministic sets them (run the "
                         "benchmark with and without it to see their cost)")
    ap.add_argument("--monitor", type=int, default=0, metavar="N",
                    help="also time each fp4lab row with fp4lab.torch.monitor(every=N) over 2N steps, paired step "
                         "for step with the same 2N steps unmonitored: the monitor's overhead")
    args = ap.parse_args()
    shape = dict(SIZES[args.size], vocab=256) if args.size else SPEC_SHAPE
    for k in SHAPE_KEYS:
        if getattr(args, k) is None:
            setattr(args, k, shape[k])
    unknown = [r for r in args.recipes.split(",")
               if r.partition("@")[0] not in RECIPES
               or "@" in r and (r.startswith("bf16@") or r.partition("@")[2] not in SR_DRAWS)]
    if unknown:
        ap.error(f"unknown recipe {', '.join(unknown)}; known: {', '.join(RECIPES)} (NAME@{'|'.join(SR_DRAWS)}: a "
                 "recipe other than bf16 under that SR draw)")
    device = torch.device(args.device)
    stray = [r for r in args.bound.split(",") if r and r not in args.recipes.split(",")]
    if stray or (args.bound and (device.type != "cuda" or "exact" not in args.modes.split(","))):
        ap.error(f"--bound {args.bound}: " + (f"{', '.join(stray)} not in --recipes" if stray else
                                              "the bound is the CUDA GEMM's: it needs a CUDA --device"
                                              if device.type != "cuda" else "it bounds exact rows: --modes has none"))
    odd = [c for c in args.compile.split(",") if ":" in c and (c.partition(":")[0] not in args.recipes.split(",")
                                                                or c.partition(":")[2] not in args.modes.split(","))]
    if odd:
        ap.error(f"--compile {', '.join(odd)}: NAME:MODE names a recipe of --recipes and a mode of --modes")
    if args.pipelined and device.type != "cuda":
        ap.error("--pipelined times steps by CUDA events: it needs a CUDA --device")
    if args.deterministic:
        use_deterministic_algorithms()
    if args.seq % 64 or args.batch * args.seq % 32:
        ap.error("--seq must be a multiple of 64 and batch * seq of 32 (the recipes' block and RHT sizes)")
    if args.gemm_variant is not None:
        if device.type != "cuda":
            ap.error("--gemm-variant times the CUDA GEMM: it needs a CUDA --device")
        n = fp4lab._core.cuda_gemm_variants()
        if not 0 <= args.gemm_variant < n:
            ap.error(f"--gemm-variant {args.gemm_variant}: this device's fast GEMM has variants 0 to {n - 1}")
    if args.launch_cost and device.type == "cuda":
        launch_cost(device)
    if args.host_profile:
        host_profile(args, device)
    rows = []
    names = args.recipes.split(",")
    if "bf16" in names:
        names.remove("bf16")
    names.insert(0, "bf16")  # the baseline always runs, first, in this process: rows[0] is its eager row
    bounds = {}  # --bound's recipes: exact_bound's figures
    args.tmp = tempfile.mkdtemp(prefix="fp4lab-bench-")
    try:
        for r in names:
            for mode in (["-"] if r == "bf16" else args.modes.split(",")):
                first = len(rows)
                wanted = args.compile.split(",")
                for compiled in [False] + ([True] if r in wanted or f"{r}:{mode}" in wanted else []):
                    want = f"{r}:{mode}" + ("+compile" if compiled else "")
                    rows.append(run(args, r, mode, device, profile=args.profile == want, compiled=compiled))
                if r in args.graph.split(","):
                    rows.append(run_graph(args, r, mode, device))
                if r in args.unfused_epilogue.split(",") and mode == "exact" and device.type == "cuda":
                    was = fp4lab._core.cuda_gemm_fused_epilogue(False)
                    try:
                        row = run(args, r, mode, device)
                    finally:
                        fp4lab._core.cuda_gemm_fused_epilogue(was)
                    row["mode"] += "+unfused-epilogue"
                    rows.append(row)
                if r in args.separate_operands.split(",") and mode == "fast" and device.type == "cuda":
                    import fp4lab.torch._layer as layer_mod
                    rows.extend(patched_rows(args, r, mode, device, [(layer_mod, "fast_pair", lambda *a, **k: None)],
                                             "+separate-operands"))
                if r in args.plain_output_check.split(",") and mode == "fast" and device.type == "cuda":
                    from fp4lab.torch import ops
                    rows.extend(patched_rows(args, r, mode, device, [(ops, "_product_bounds", lambda b: None)],
                                             "+plain-output-check"))
                if args.gemm_variant is not None and mode == "exact" and device.type == "cuda":
                    was = fp4lab._core.cuda_gemm_variant(args.gemm_variant)
                    try:
                        forced = [run(args, r, mode, device)]
                        if r in args.graph.split(","):
                            forced.append(run_graph(args, r, mode, device))
                    finally:
                        fp4lab._core.cuda_gemm_variant(was)
                    for row in forced:
                        row["mode"] += f"+variant{args.gemm_variant}"
                    rows.extend(forced)
                if r in args.bound.split(",") and mode == "exact" and device.type == "cuda":
                    bounds[r] = exact_bound(args, r, device)
                if args.monitor and r != "bf16":
                    # 2N steps with the monitor and, paired, the same 2N steps without it.
                    base = run(args, r, mode, device, steps=2 * args.monitor)
                    row = run(args, r, mode, device, monitor_every=args.monitor, steps=2 * args.monitor)
                    row.update(monitor_overhead(args, row, base, args.monitor), baseline_step_ms=base["step_ms"])
                    rows.append(row)
                for row in rows[first:]:
                    print(f"{r:18s} {row['mode']:24s} {row['median_ms']:9.2f} ms/step (mean {row['mean_ms']:.2f}, "
                          f"min {row['min_ms']:.2f}, max {row['max_ms']:.2f})"
                          + (f", host {row['host_ms']:.2f} ms queuing it" if "host_ms" in row else "")
                          + (f", back to back {row['pipelined_ms']:.2f}" if "pipelined_ms" in row else "")
                          + f"  loss {row['loss_first']:.3f} -> {row['loss_last']:.3f}", flush=True)
    finally:
        shutil.rmtree(args.tmp, ignore_errors=True)
    base = rows[0]["median_ms"]
    for row in rows:
        row["vs_bf16"] = row["median_ms"] / base
    print(f"\n{'recipe':18s} {'mode':24s} {'ms/step':>9s} {'tokens/s':>10s} {'x BF16':>7s}  loss first -> last")
    for row in rows:
        extra = (f"  monitor cost {100 * row['monitor_cost']:.1f}% of a step at every={args.monitor}; total "
                 f"{100 * row['monitor_overhead']:+.1f}% over {row['steps_timed']} steps paired with "
                 f"the same steps unmonitored ({row['monitor_sampled_steps']} sampled, "
                 f"{row['monitor_sampled_extra_ms']:+.0f} ms each with its read-back; other steps differ by "
                 f"{row['monitor_unsampled_diff_ms']['mean']:+.2f} ± {row['monitor_unsampled_diff_ms']['sd']:.2f} ms)"
                 if "monitor_overhead" in row else "")
        print(f"{row['recipe']:18s} {row['mode']:24s} {row['median_ms']:9.2f} {row['tokens_per_s']:10,.0f} "
              f"{row['vs_bf16']:7.2f}  "
              f"{row['loss_first']:.3f} -> {row['loss_last']:.3f}{extra}")
    for line in bound_rows(rows, bounds, base):
        print(line)
    if "pipelined_ms" in rows[0]:  # BF16's eager row, always first
        eager = rows[0]["pipelined_ms"]
        print(f"\nBack to back ({args.steps} steps, one synchronisation), against BF16 eager back to back "
              f"({eager:.2f} ms)")
        for row in rows:
            if "pipelined_ms" in row:
                row["pipelined_vs_bf16"] = row["pipelined_ms"] / eager
                print(f"{row['recipe']:18s} {row['mode']:24s} {row['pipelined_ms']:9.2f} "
                      f"{row['pipelined_vs_bf16']:7.2f}")
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "fp4lab": fp4lab.__version__, "command": " ".join(sys.argv),
            "size": args.size, "deterministic": args.deterministic, "model": {k: getattr(args, k) for k in SHAPE_KEYS},
            "block_params": rows[0]["block_params"], "rows": rows}
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(info, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    # (A monitor row trains 2N steps, where this short learning-rate schedule need not keep the loss falling: only
    # a non-finite loss counts there.)
    bad = [r for r in rows if not math.isfinite(r["loss_last"])
           or ("monitor_overhead" not in r and r["loss_last"] >= r["loss_first"])]
    if bad:
        print("loss did not go down under: " + ", ".join(f"{r['recipe']}/{r['mode']}" for r in bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
