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
              fp4lab-capture run --pattern 'mlp\\.' --steps 100,200 --out traces -- train.py --lr 1e-3
  * check a trace folder or file without PyTorch (fp4lab.trace): validates it with the C++ reader and
    prints outlier statistics per tensor:
              fp4lab-capture check workloads/tiny-lm/step_005000 [--json stats.json]
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import Dict, Iterable, List, Optional

from .trace import (TRACE_VERSION, TraceError, add_check_arguments, check as check_trace,  # noqa: F401
                    check_main, print_check, write_file)

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
            write_file(path, tensors, meta)
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
        print(f"fp4lab-capture: attached to {type(root).__name__}: {len(cap.modules)} linear layers, "
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
                print(f"fp4lab-capture: wrote {p}", file=sys.stderr)
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

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="fp4lab-capture", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
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
    add_check_arguments(sub.add_parser("check", help="validate a trace folder/file and print outlier statistics"))
    args = ap.parse_args(argv)
    if args.cmd == "check":
        return check_main(args, "fp4lab-capture")
    try:
        if args.script and args.script[0] == "--":
            args.script = args.script[1:]
        if not args.script:
            raise TraceError("run: name the training script after --")
        for kv in args.meta:
            if "=" not in kv:
                raise TraceError(f"--meta: expected KEY=VALUE, got {kv!r}")
        return run_wrapped(args)
    except TraceError as e:
        print(f"fp4lab-capture: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
