"""Capture fp4lab trace v1 files (docs/spec.md §7) from the nn.Linear layers of any PyTorch model.

A trace is a folder of .safetensors files. For each captured linear layer `<gemm>` (its dotted module name)
the file `<gemm>.safetensors` (`/`, `\\`, `%` and control characters of the name written as `%XX`, so that it
is always one file of the step folder: record_file_name) holds the operands of the layer's three training GEMMs
at one step:
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
import numbers
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from typing import Callable, Dict, List, Optional

from ._files import ArgumentParser, UsageError, check_output_folder, compile_regex, console_main
from .trace import (SUFFIX, TRACE_VERSION, TraceError, _check_outputs, add_check_arguments,  # noqa: F401
                    check as check_trace, check_main, print_check, write_file)

# ---------------------------------------------------------------------------------------------------------
# Capture (needs torch; imported lazily so `check` runs without it)
# ---------------------------------------------------------------------------------------------------------

def _torch():
    try:
        import torch  # noqa: PLC0415 — optional dependency, only for capture
    except ImportError:
        raise TraceError("capturing needs PyTorch, which this python3 cannot import") from None
    return torch


def record_file_name(gemm: str) -> str:
    """The file name of a gemm's record in its step folder: `<gemm>.safetensors`, with `/`, `\\`, `%` and control
    characters written as `%XX` (their UTF-8 bytes), so that any module name is one file inside the step folder
    (never a path out of it, whatever `/` or `..` it holds) and two names never share a file."""
    return "".join("".join(f"%{b:02X}" for b in c.encode("utf-8")) if c in "/\\%" or ord(c) < 0x20 or c == "\x7f"
                   else c for c in gemm) + SUFFIX


def _step_folder(step: int) -> str:
    return f"step_{step:06d}"


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _settings_fault(spell: Callable[[str], str], *, max_tokens, token_multiple, dim_multiple, token_stride,
                    max_out, store_dtype) -> Optional[str]:
    """The first fault of the capture's sub-sampling settings, naming the argument as `spell` writes it (the
    constructor's keyword, or fp4lab-capture's option), or None: one check for both, before any work."""
    for name, v, optional in (("token_multiple", token_multiple, False), ("dim_multiple", dim_multiple, False),
                              ("token_stride", token_stride, False), ("max_tokens", max_tokens, True),
                              ("max_out", max_out, True)):
        if not (optional and v is None) and not (_is_int(v) and 0 < v < 2 ** 63):
            return f"{spell(name)} {v!r}: not a positive integer"
    if store_dtype not in ("gemm", "bf16", "f32"):
        return f"{spell('store_dtype')} must be gemm, bf16 or f32, not {store_dtype!r}"
    if token_multiple % dim_multiple:
        return (f"{spell('token_multiple')} {token_multiple} is not a multiple of {spell('dim_multiple')} "
                f"{dim_multiple}")
    if max_tokens is not None and max_tokens < token_multiple:
        return f"{spell('max_tokens')} {max_tokens} is below {spell('token_multiple')} {token_multiple}"
    if max_out is not None and max_out % dim_multiple:
        return f"{spell('max_out')} {max_out} is not a positive multiple of {spell('dim_multiple')} {dim_multiple}"
    return None


def _compile(pattern, what: str):
    return compile_regex(pattern, what, TraceError)


class TraceCapture:
    """Hooks the nn.Linear modules of `model` whose dotted names match `pattern` (re.search).

    At an armed step the first grad-enabled call of each matched module is recorded: X and W as the GEMM
    consumed them (cast to the autocast dtype when autocast is on, which is exactly the cast autocast
    applies), and dY from a hook on the output tensor. Only `max_tokens` token rows are kept (rounded down to a
    multiple of `token_multiple`): the first ones, or with `token_stride` s every s-th row (rows 0, s, 2s, …, so
    that a trace of a wide batch samples all of its sequences). With `max_out`, only that many output features
    are kept, evenly spaced (every ceil(out/max_out)-th row of W and column of dY), so that a wide layer fits a
    small trace. Either way the three tensors stay one consistent sub-GEMM of the layer's GEMMs.

    Every argument is checked here, before any step runs (a TraceError, a ValueError naming it). Records are
    written to `out_dir/step_NNNNNN/<record_file_name(gemm)>` under the command line's output rules, never over one
    of the files `inputs`.
    """

    def __init__(self, model, pattern: str, steps: Iterable[int], out_dir: str, *,
                 max_tokens: Optional[int] = None, token_multiple: int = 128, dim_multiple: int = 16,
                 store_dtype: str = "gemm", metadata: Optional[Dict[str, str]] = None,
                 name_prefix: str = "", token_stride: int = 1, max_out: Optional[int] = None, inputs=()):
        torch = _torch()
        if not isinstance(model, torch.nn.Module):
            raise TraceError(f"model: a torch.nn.Module, not {type(model).__name__}")
        fault = _settings_fault(str, max_tokens=max_tokens, token_multiple=token_multiple,
                                dim_multiple=dim_multiple, token_stride=token_stride, max_out=max_out,
                                store_dtype=store_dtype)
        if fault:
            raise TraceError(fault)
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
            raise TraceError(f"steps {steps!r}: an iterable of step numbers, not {type(steps).__name__}")
        steps = list(steps)
        if not all(_is_int(s) and s >= 0 for s in steps):
            raise TraceError(f"steps {steps!r}: not all non-negative integers")
        if not isinstance(name_prefix, str):
            raise TraceError(f"name_prefix {name_prefix!r}: text, not {type(name_prefix).__name__}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TraceError(f"metadata: a mapping of names to values, not {type(metadata).__name__}")
        try:
            check_output_folder(out_dir)
            for s in steps:
                check_output_folder(os.path.join(out_dir, _step_folder(s)))
        except ValueError as e:  # a DataError or UsageError of the path
            raise TraceError(f"out_dir {e}") from None
        try:
            metadata = {str(k): str(v) for k, v in (metadata or {}).items()}
            for kv in metadata.items():
                "".join(kv).encode("utf-8")
        except UnicodeError:
            raise TraceError("metadata: a key or value is not valid UTF-8") from None
        self.inputs = list(inputs)
        self.token_stride, self.max_out, self.dim_multiple = token_stride, max_out, dim_multiple
        self.steps = set(int(s) for s in steps)
        self.out_dir = os.fspath(out_dir)
        self.max_tokens = max_tokens
        self.token_multiple = token_multiple
        self.store_dtype = store_dtype
        self.metadata = {"model": type(model).__name__, "command": _command_line()}
        self.metadata.update(metadata)
        rx = _compile(pattern, "pattern")
        self.modules = {}
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and rx.search(name):
                for what, n in (("in_features", mod.in_features), ("out_features", mod.out_features)):
                    if n % dim_multiple:
                        raise TraceError(f"module {name}: {what} = {n} is not a multiple of {dim_multiple} "
                                         f"(trace v1 needs it; narrow --pattern to skip this layer)")
                gemm = name_prefix + name
                if not gemm:
                    raise TraceError("the model itself is the nn.Linear matched: give it a name_prefix")
                try:
                    file = os.fsencode(record_file_name(gemm))
                    gemm.encode("utf-8")
                except UnicodeError:
                    raise TraceError(f"module {gemm!r}: the name is not valid UTF-8") from None
                if len(file) > 255:  # NAME_MAX of the file systems in use; found now, not after the step
                    raise TraceError(f"module {gemm[:80]!r}...: its record's file name would be {len(file)} bytes, "
                                     f"over the 255 a file name may have")
                self.modules[gemm] = mod
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
        folder = os.path.join(self.out_dir, _step_folder(step))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise TraceError(f"{folder}: cannot make the folder ({e.strerror or e})") from None
        # Every record's path is checked before the first is written: none lands on an input or a folder.
        _check_outputs([os.path.join(folder, record_file_name(name)) for name in rec], self.inputs)
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
            path = os.path.join(folder, record_file_name(name))
            write_file(path, tensors, meta, self.inputs)
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

_OPTION = {"store_dtype": "--dtype", "dim_multiple": "the trace's dimension multiple"}


def _check_run(args) -> set:
    """`run`'s options and paths, every one before the script starts (UsageError for an option, TraceError for a
    path): the chosen steps."""
    steps = parse_steps(args.steps)
    try:
        _compile(args.pattern, "--pattern")
    except TraceError as e:
        raise UsageError(str(e)) from None
    fault = _settings_fault(lambda n: _OPTION.get(n, "--" + n.replace("_", "-")), max_tokens=args.max_tokens,
                            token_multiple=args.token_multiple, dim_multiple=16, token_stride=args.token_stride,
                            max_out=args.max_out, store_dtype=args.dtype)
    if fault:
        raise UsageError(fault)
    for kv in args.meta:
        if "=" not in kv:
            raise UsageError(f"--meta {kv!r}: not KEY=VALUE")
    if args.script and args.script[0] == "--":
        args.script = args.script[1:]
    if not args.script:
        raise UsageError("run: name the training script after --")
    if not os.path.isfile(args.script[0]):
        raise TraceError(f"{args.script[0]}: no such training script")
    try:
        check_output_folder(args.out)
    except ValueError as e:
        raise (UsageError if isinstance(e, UsageError) else TraceError)(f"--out {e}") from None
    return steps


def run_wrapped(args) -> int:
    steps = _check_run(args)
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
                           metadata={"model": meta.pop("model", type(root).__name__), **meta},
                           inputs=[args.script[0]])  # the records never overwrite the script
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
        n = state["updates"]
        raise TraceError(f"{script}: the run ended before steps {missing} were captured: step S is the forward "
                         f"and backward after S optimizer steps, and the run made {n} (the last step it captures "
                         f"is {n - 1 if n else 0})")
    return 0


def parse_steps(text: str) -> set:
    """The steps of `--steps` (comma-separated non-negative integers), or a UsageError naming it."""
    try:
        steps = {int(s) for s in text.split(",") if s.strip()}
    except ValueError:
        steps = set()
    if not steps or min(steps) < 0:
        raise UsageError(f"--steps {text!r}: not comma-separated non-negative integers")
    return steps


# ---------------------------------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    return console_main("fp4lab-capture", lambda: _main(argv))


def _main(argv: Optional[List[str]]) -> int:
    ap = ArgumentParser(prog="fp4lab-capture", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a training script and capture traces from its nn.Linear layers")
    r.add_argument("--pattern", required=True, help="regex searched in the dotted module names")
    r.add_argument("--steps", required=True, help="comma-separated optimizer-step counts to capture at: step S is the forward and backward that "
                   "follow S optimizer steps (0: the first)")
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
        return check_main(args)
    return run_wrapped(args)


if __name__ == "__main__":
    sys.exit(main())
