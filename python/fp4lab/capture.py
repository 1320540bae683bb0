#!/usr/bin/env python3
"""Capture fp4lab trace v1 files (docs/spec.md §7) from the nn.Linear layers of any PyTorch model.

A trace is a folder of .safetensors files. For each captured linear layer `<gemm>` (its dotted module name)
the file `<gemm>.safetensors` holds the operands of the layer's three training GEMMs at one step:
  <gemm>.fwd_x  [tokens, in]   the input X (leading dims flattened), as the forward GEMM consumed it
  <gemm>.fwd_w  [out, in]      the weight W, as the forward GEMM consumed it
  <gemm>.bwd_dy [tokens, out]  the gradient dY of the layer's output, same token rows as fwd_x
and __metadata__ with "fp4lab.trace.version": "1", the model, the step and the capture command.

"Step" means the number of optimizer updates applied before the captured forward/backward pass.

Three ways to use it:
  * library:  cap = TraceCapture(model, pattern=r"layers\\.(0|7)\\.", steps={1000}, out_dir="traces",
                                 metadata={"model": "..."})
              for step in ...:
                  with cap.at(step):          # records only when step is in `steps`, writes on exit
                      loss = model(x).loss; loss.backward()
                  opt.step()
  * wrap an unmodified training script (counts optimizer.step() calls, finds the model as the first
    top-level module whose forward runs with matching nn.Linear children):
              capture_traces.py run --pattern 'mlp\\.' --steps 100,200 --out traces -- train.py --lr 1e-3
  * check a trace folder or file without PyTorch (numpy + ml_dtypes only): validates it as the C++ reader
    does and prints outlier statistics per tensor:
              capture_traces.py check workloads/tiny-lm/step_005000 [--json stats.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import struct
import sys
from typing import Dict, Iterable, List, Optional

TRACE_VERSION = "1"
SUFFIXES = ("fwd_x", "fwd_w", "bwd_dy")


class TraceError(Exception):
    """A one-line fault naming the file or module concerned."""


# ---------------------------------------------------------------------------------------------------------
# Capture (needs torch; imported lazily so `check` runs without it)
# ---------------------------------------------------------------------------------------------------------

def _torch():
    try:
        import torch  # noqa: PLC0415 — optional dependency, only for capture
    except ImportError:
        raise TraceError("capturing needs PyTorch, which this python3 cannot import") from None
    return torch


class TraceCapture:
    """Hooks the nn.Linear modules of `model` whose dotted names match `pattern` (re.search).

    At an armed step the first grad-enabled call of each matched module is recorded: X and W as the GEMM
    consumed them (cast to the autocast dtype when autocast is on, which is exactly the cast autocast
    applies), and dY from a hook on the output tensor. Only `max_tokens` token rows are kept (rounded down to a
    multiple of `token_multiple`): the first ones, or with `token_stride` s every s-th row (rows 0, s, 2s, …, so
    that a trace of a wide batch samples all of its sequences). With `max_out`, only that many output features
    are kept, evenly spaced (every ceil(out/max_out)-th row of W and column of dY), so that a wide layer fits a
    small trace. Either way the three tensors stay one consistent sub-GEMM of the layer's GEMMs.
    """

    def __init__(self, model, pattern: str, steps: Iterable[int], out_dir: str, *,
                 max_tokens: Optional[int] = None, token_multiple: int = 128, dim_multiple: int = 16,
                 store_dtype: str = "gemm", metadata: Optional[Dict[str, str]] = None,
                 name_prefix: str = "", token_stride: int = 1, max_out: Optional[int] = None):
        torch = _torch()
        if store_dtype not in ("gemm", "bf16", "f32"):
            raise TraceError(f"store_dtype must be gemm, bf16 or f32, not {store_dtype!r}")
        if token_multiple % dim_multiple:
            raise TraceError(f"token_multiple {token_multiple} is not a multiple of dim_multiple {dim_multiple}")
        if max_tokens is not None and max_tokens < token_multiple:
            raise TraceError(f"max_tokens {max_tokens} is below token_multiple {token_multiple}")
        if token_stride < 1:
            raise TraceError(f"token_stride must be positive, not {token_stride}")
        if max_out is not None and (max_out < dim_multiple or max_out % dim_multiple):
            raise TraceError(f"max_out {max_out} is not a positive multiple of dim_multiple {dim_multiple}")
        self.token_stride, self.max_out, self.dim_multiple = token_stride, max_out, dim_multiple
        self.steps = set(int(s) for s in steps)
        self.out_dir = out_dir
        self.max_tokens = max_tokens
        self.token_multiple = token_multiple
        self.store_dtype = store_dtype
        self.metadata = {"model": type(model).__name__, "command": _command_line()}
        self.metadata.update({k: str(v) for k, v in (metadata or {}).items()})
        rx = re.compile(pattern)
        self.modules = {}
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and rx.search(name):
                for what, n in (("in_features", mod.in_features), ("out_features", mod.out_features)):
                    if n % dim_multiple:
                        raise TraceError(f"module {name}: {what} = {n} is not a multiple of {dim_multiple} "
                                         f"(trace v1 needs it; narrow --pattern to skip this layer)")
                self.modules[name_prefix + name] = mod
        if not self.modules:
            raise TraceError(f"pattern {pattern!r} matches no nn.Linear module of {type(model).__name__}")
        self._handles = [mod.register_forward_hook(self._make_forward_hook(name))
                         for name, mod in self.modules.items()]
        self._step: Optional[int] = None
        self._rec: Dict[str, dict] = {}
        self.written: List[str] = []

    # -- arming -------------------------------------------------------------------------------------------
    def arm(self, step: int) -> bool:
        """Start recording for `step` if it is a chosen step. Returns whether it is."""
        self._rec = {}
        self._step = int(step) if int(step) in self.steps else None
        return self._step is not None

    def write(self) -> List[str]:
        """Write the records of the armed step (one file per module) and disarm. Returns the paths."""
        step, rec = self._step, self._rec
        self._step, self._rec = None, {}
        if step is None:
            return []
        missing = [n for n in self.modules if n not in rec]
        if missing:
            raise TraceError(f"step {step}: no grad-enabled forward reached {', '.join(missing)}")
        no_dy = [n for n, r in rec.items() if "dy" not in r]
        if no_dy:
            raise TraceError(f"step {step}: no backward pass reached {', '.join(no_dy)} (call backward() "
                             f"before the capture is written)")
        folder = os.path.join(self.out_dir, f"step_{step:06d}")
        os.makedirs(folder, exist_ok=True)
        paths = []
        for name, r in rec.items():
            tensors = {f"{name}.fwd_x": r["x"], f"{name}.fwd_w": r["w"], f"{name}.bwd_dy": r["dy"]}
            meta = dict(self.metadata)
            meta.update({
                "fp4lab.trace.version": TRACE_VERSION,
                "step": str(step),
                "gemm": name,
                "tokens_in_pass": str(r["tokens_total"]),
                "tokens_kept": (f"first {r['x'].shape[0]} rows" if self.token_stride == 1 else
                                f"{r['x'].shape[0]} rows, every {self.token_stride}th from row 0,") +
                               " of the flattened [tokens, features] input",
                "out_features_kept": r["out_kept"],
                "calls_in_step": str(r["calls"]),
                "gemm_dtype": r["gemm_dtype"],
            })
            path = os.path.join(folder, f"{name}.safetensors")
            save_safetensors(path, tensors, meta)
            paths.append(path)
        self.written += paths
        return paths

    class _At:
        def __init__(self, cap, step):
            self.cap, self.step = cap, step

        def __enter__(self):
            return self.cap.arm(self.step)

        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                self.cap.write()
            else:
                self.cap._step, self.cap._rec = None, {}
            return False

    def at(self, step: int):
        """Context manager: arm for `step`, write on a clean exit (run forward AND backward inside)."""
        return TraceCapture._At(self, step)

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- hooks --------------------------------------------------------------------------------------------
    def _keep_rows(self, n: int, name: str) -> int:
        k = n if self.max_tokens is None else min(n, self.max_tokens)
        k -= k % self.token_multiple
        if k == 0:
            raise TraceError(f"module {name}: only {n} token rows in the pass, fewer than token_multiple "
                             f"{self.token_multiple}")
        return k

    def _target_dtype(self, t):
        torch = _torch()
        if self.store_dtype == "bf16":
            return torch.bfloat16
        if self.store_dtype == "f32":
            return torch.float32
        # "gemm": what the GEMM consumed. Under autocast F.linear casts X and W to the autocast dtype.
        dev = t.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)
        else:
            dt = t.dtype
        return dt if dt in (torch.bfloat16, torch.float32) else torch.float32  # v1 holds BF16 or F32 only

    def _make_forward_hook(self, name: str):
        def hook(mod, args, output):
            if self._step is None:
                return
            torch = _torch()
            x = args[0] if args else None
            if not (torch.is_tensor(x) and torch.is_tensor(output) and output.requires_grad):
                return  # no gradient will come back through this call (eval, no_grad): not a training GEMM
            r = self._rec.get(name)
            if r is not None:
                r["calls"] += 1
                return  # keep the first call of the step (e.g. the first micro-batch)
            dt = self._target_dtype(x)
            x2 = x.detach().reshape(-1, x.shape[-1])
            k = self._keep_rows(x2.shape[0] // self.token_stride, name)
            rows = slice(0, k * self.token_stride, self.token_stride)
            w = mod.weight.detach()
            out = w.shape[0]
            cols, out_kept = slice(None), f"all {out}"
            if self.max_out is not None and out > self.max_out:
                stride = -(-out // self.max_out)
                n = len(range(0, out, stride))
                n -= n % self.dim_multiple
                cols, out_kept = slice(0, n * stride, stride), f"{n} of {out}, every {stride}th from 0"
            r = {"calls": 1, "tokens_total": x2.shape[0], "gemm_dtype": str(dt).replace("torch.", ""),
                 "x": _snapshot(x2[rows], dt), "w": _snapshot(w[cols], dt), "out_kept": out_kept}
            self._rec[name] = r

            def grad_hook(g, r=r, rows=rows, cols=cols, dt=dt):
                r["dy"] = _snapshot(g.detach().reshape(-1, g.shape[-1])[rows][:, cols], dt)

            output.register_hook(grad_hook)
        return hook


def _snapshot(t, dt):
    # Always a copy: on the CPU .to()/.cpu() may return the live tensor, which the optimizer then updates
    # in place before the file is written.
    return t.to("cpu", dt, copy=True).contiguous()


def save_safetensors(path: str, tensors, metadata: Dict[str, str]):
    """Writes torch tensors (BF16 or F32) as a safetensors file: an 8-byte little-endian header length, the JSON
    header (dtype, shape, data offsets, __metadata__), the raw little-endian data; under a temporary name, then
    renamed, so a killed capture leaves no truncated trace."""
    torch = _torch()
    names = {torch.bfloat16: "BF16", torch.float32: "F32"}
    header, chunks, off = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, [], 0
    for name, t in tensors.items():
        if t.dtype not in names:
            raise TraceError(f"{path}: tensor {name}: dtype {t.dtype} is not BF16 or F32")
        raw = t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _command_line(argv: Optional[List[str]] = None) -> str:
    argv = sys.argv if argv is None else argv
    return " ".join(shlex.quote(a) for a in ["python3"] + list(argv))


# ---------------------------------------------------------------------------------------------------------
# `run`: wrap an unmodified training script
# ---------------------------------------------------------------------------------------------------------

def run_wrapped(args) -> int:
    steps = parse_steps(args.steps)
    if not os.path.isfile(args.script[0]):
        raise TraceError(f"{args.script[0]}: no such training script")
    torch = _torch()
    import runpy  # noqa: PLC0415
    from torch.nn.modules import module as nn_module  # noqa: PLC0415
    from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: PLC0415

    meta = dict(kv.split("=", 1) for kv in args.meta)
    meta.setdefault("command", _command_line())
    state = {"depth": 0, "cap": None, "opt": None, "updates": 0, "tried": set()}

    def attach(root):
        cap = TraceCapture(root, args.pattern, steps, args.out, max_tokens=args.max_tokens,
                           token_stride=args.token_stride, max_out=args.max_out,
                           token_multiple=args.token_multiple, store_dtype=args.dtype,
                           metadata={"model": meta.pop("model", type(root).__name__), **meta})
        cap.arm(state["updates"])
        state["cap"] = cap
        print(f"capture_traces: attached to {type(root).__name__}: {len(cap.modules)} linear layers, "
              f"steps {sorted(steps)}", file=sys.stderr)

    def pre_hook(mod, _args):
        # The first module entered at depth 0 that holds matching linears is taken as the model.
        if state["depth"] == 0 and state["cap"] is None and id(mod) not in state["tried"]:
            state["tried"].add(id(mod))
            rx = re.compile(args.pattern)
            if any(isinstance(m, torch.nn.Linear) and rx.search(n) for n, m in mod.named_modules()):
                attach(mod)
        state["depth"] += 1

    def post_hook(mod, _args, _out):
        state["depth"] -= 1

    def step_hook(opt, _a, _k):
        if state["opt"] is None:
            state["opt"] = opt  # count the first optimizer's steps only
        if opt is not state["opt"]:
            return
        cap = state["cap"]
        if cap is not None:
            for p in cap.write():
                print(f"capture_traces: wrote {p}", file=sys.stderr)
        state["updates"] += 1
        if cap is not None:
            cap.arm(state["updates"])

    h1 = nn_module.register_module_forward_pre_hook(pre_hook)
    h2 = nn_module.register_module_forward_hook(post_hook, always_call=True)
    h3 = register_optimizer_step_post_hook(step_hook)
    script, sargv = args.script[0], args.script[1:]
    old_argv = sys.argv
    sys.argv = [script] + sargv
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = old_argv
        h1.remove(), h2.remove(), h3.remove()
    cap = state["cap"]
    if cap is None:
        raise TraceError(f"{script}: no module with nn.Linear layers matching {args.pattern!r} ran forward")
    if cap._step is not None and cap._rec:
        cap.write()  # a chosen step after the last optimizer.step() (e.g. an extra forward/backward)
    done = sorted({int(os.path.basename(os.path.dirname(p))[5:]) for p in cap.written})
    missing = sorted(steps - set(done))
    if missing:
        raise TraceError(f"{script}: the run ended before steps {missing} were captured "
                         f"({state['updates']} optimizer steps counted)")
    return 0


def parse_steps(text: str) -> set:
    try:
        steps = {int(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise TraceError(f"--steps: expected comma-separated integers, got {text!r}") from None
    if not steps or min(steps) < 0:
        raise TraceError(f"--steps: expected non-negative integers, got {text!r}")
    return steps


# ---------------------------------------------------------------------------------------------------------
# `check`: validation and statistics without torch
# ---------------------------------------------------------------------------------------------------------

_NP_DTYPES = {"F32": ("<f4", 4), "BF16": ("bf16", 2), "F16": ("<f2", 2)}


def read_safetensors(path: str):
    """Returns (metadata, {name: float32 ndarray}, {name: dtype string}). Raises TraceError on a bad file."""
    import numpy as np  # noqa: PLC0415
    import ml_dtypes  # noqa: PLC0415
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    if len(blob) < 8:
        raise TraceError(f"{path}: {len(blob)} bytes, too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        raise TraceError(f"{path}: header length {hlen} runs past the end of the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + hlen])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise TraceError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + hlen:]
    arrays, dtypes = {}, {}
    for name, info in header.items():
        try:
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise TraceError(f"{path}: tensor {name!r}: malformed header entry") from None
        if dt not in _NP_DTYPES:
            raise TraceError(f"{path}: tensor {name!r}: dtype {dt} is not F32, BF16 or F16")
        npdt, size = _NP_DTYPES[dt]
        n = math.prod(shape)
        if e - b != n * size or not 0 <= b <= e <= len(data):
            raise TraceError(f"{path}: tensor {name!r}: data offsets [{b}, {e}) do not fit shape {shape} "
                             f"{dt} inside {len(data)} bytes of data")
        a = np.frombuffer(data[b:e], dtype=ml_dtypes.bfloat16 if npdt == "bf16" else npdt).reshape(shape)
        arrays[name] = a.astype(np.float32)
        dtypes[name] = dt
    return meta, arrays, dtypes


def tensor_stats(a) -> Dict[str, float]:
    """Outlier statistics of a [rows, cols] tensor. Kurtosis is the plain 4th standardised moment of all
    elements (3 for a Gaussian); channel = column (the `in` features of X, the `out` features of dY)."""
    import numpy as np  # noqa: PLC0415
    a = a.astype(np.float64)
    mu, sd = a.mean(), a.std()
    rms = math.sqrt(float((a * a).mean()))
    col_rms = np.sqrt((a * a).mean(axis=0))
    med = float(np.median(col_rms))
    return {
        "kurtosis": float(((a - mu) ** 4).mean() / sd ** 4) if sd > 0 else float("nan"),
        "amax_over_rms": float(np.abs(a).max() / rms) if rms > 0 else float("nan"),
        "max_over_median_channel_rms": float(col_rms.max() / med) if med > 0 else float("inf"),
        "rms": rms,
    }


def check_trace(path: str, block: int = 16) -> List[dict]:
    """Validates a trace folder (or one file) as docs/spec.md §7 says; returns one dict per gemm."""
    import numpy as np  # noqa: PLC0415
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise TraceError(f"{path}: no .safetensors files in the folder")
    else:
        files = [path]
    out = []
    for f in files:
        meta, arrays, dtypes = read_safetensors(f)
        if meta.get("fp4lab.trace.version") != TRACE_VERSION:
            raise TraceError(f"{f}: __metadata__ lacks \"fp4lab.trace.version\": \"1\"")
        gemms = sorted({n.rsplit(".", 1)[0] for n in arrays if n.rsplit(".", 1)[-1] in SUFFIXES})
        if not gemms:
            raise TraceError(f"{f}: no <gemm>.fwd_x/.fwd_w/.bwd_dy tensors")
        for g in gemms:
            names = [f"{g}.{s}" for s in SUFFIXES]
            for n in names:
                if n not in arrays:
                    raise TraceError(f"{f}: gemm {g!r} lacks tensor {n!r}")
                if dtypes[n] not in ("BF16", "F32"):
                    raise TraceError(f"{f}: tensor {n!r} is {dtypes[n]}, trace v1 allows BF16 or F32")
                if arrays[n].ndim != 2:
                    raise TraceError(f"{f}: tensor {n!r} has shape {list(arrays[n].shape)}, expected 2-D")
                bad = np.flatnonzero(~np.isfinite(arrays[n]))
                if bad.size:
                    raise TraceError(f"{f}: tensor {n!r}: non-finite value at flat index {bad[0]}")
            x, w, dy = (arrays[n] for n in names)
            t, i = x.shape
            o = w.shape[0]
            if w.shape[1] != i or dy.shape != (t, o):
                raise TraceError(f"{f}: gemm {g!r}: shapes fwd_x {list(x.shape)}, fwd_w {list(w.shape)}, "
                                 f"bwd_dy {list(dy.shape)} disagree")
            for what, n in (("tokens", t), ("in", i), ("out", o)):
                if n % block:
                    raise TraceError(f"{f}: gemm {g!r}: {what} = {n} is not a multiple of {block}")
            out.append({"file": f, "gemm": g, "tokens": t, "in": i, "out": o, "dtype": dtypes[names[0]],
                        "step": meta.get("step", ""), "model": meta.get("model", ""),
                        "command": meta.get("command", ""),
                        "x": tensor_stats(x), "w": tensor_stats(w), "dy": tensor_stats(dy)})
    return out


def print_check(rows: List[dict]):
    print(f"{'gemm':<22} {'tokens':>6} {'in':>5} {'out':>5} {'dtype':>5}  "
          f"{'x kurt':>8} {'x amax/rms':>10} {'x chmax/med':>11}  {'dy kurt':>8} {'dy amax/rms':>11}")
    for r in rows:
        x, dy = r["x"], r["dy"]
        print(f"{r['gemm']:<22} {r['tokens']:>6} {r['in']:>5} {r['out']:>5} {r['dtype']:>5}  "
              f"{x['kurtosis']:>8.2f} {x['amax_over_rms']:>10.2f} {x['max_over_median_channel_rms']:>11.2f}  "
              f"{dy['kurtosis']:>8.2f} {dy['amax_over_rms']:>11.2f}")


# ---------------------------------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a training script and capture traces from its nn.Linear layers")
    r.add_argument("--pattern", required=True, help="regex searched in the dotted module names")
    r.add_argument("--steps", required=True, help="comma-separated optimizer-step counts to capture at")
    r.add_argument("--out", required=True, help="output folder; one step_NNNNNN/ sub-folder per step")
    r.add_argument("--max-tokens", type=int, default=None, help="keep at most this many token rows")
    r.add_argument("--token-multiple", type=int, default=128, help="kept token rows are a multiple of this")
    r.add_argument("--token-stride", type=int, default=1, help="keep every n-th token row (0, n, 2n, ...)")
    r.add_argument("--max-out", type=int, default=None, help="keep at most this many output features, evenly "
                   "spaced (rows of W, columns of dY)")
    r.add_argument("--dtype", choices=("gemm", "bf16", "f32"), default="gemm",
                   help="stored dtype: what the GEMM consumed (default), or forced BF16/F32")
    r.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="extra metadata")
    r.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py [its arguments]")
    c = sub.add_parser("check", help="validate a trace folder/file and print outlier statistics")
    c.add_argument("path")
    c.add_argument("--block", type=int, default=16, help="tokens/in/out must be multiples of this")
    c.add_argument("--json", default=None, help="also write the statistics as JSON to this file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "run":
            if args.script and args.script[0] == "--":
                args.script = args.script[1:]
            if not args.script:
                raise TraceError("run: name the training script after --")
            for kv in args.meta:
                if "=" not in kv:
                    raise TraceError(f"--meta: expected KEY=VALUE, got {kv!r}")
            return run_wrapped(args)
        rows = check_trace(args.path, args.block)
        print_check(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        print(f"{args.path}: {len(rows)} gemms valid (trace v1, block {args.block})")
        return 0
    except TraceError as e:
        print(f"capture_traces: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
