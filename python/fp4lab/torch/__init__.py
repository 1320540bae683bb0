"""fp4lab on PyTorch tensors: the quantiser and the contract GEMM on CPU tensors (the golden model) and on CUDA
tensors (the CUDA kernels, without copies), and a drop-in ``Linear`` that trains under a recipe.

A recipe (docs/spec.md §2, §12) says, per training GEMM of a linear layer and per operand, which grid, block,
scale, 2-D weight tiles, RHT and rounding apply; both operands of every GEMM are quantised along that GEMM's
reduction dimension:

    fwd_y  = X · Wᵀ    A = X   [tokens, in]   B = W   [out, in]      K = in
    bwd_dx = dY · W    A = dY  [tokens, out]  B = Wᵀ  [in, out]      K = out
    bwd_dw = dYᵀ · X   A = dYᵀ [out, tokens]  B = Xᵀ  [in, tokens]   K = tokens

The GEMM's FP32 output is cast to the activation dtype; master weights, optimizer state and everything outside
the linear layers are untouched. Stochastic rounding draws its bits from (seed, step, layer, pass, operand)
(``fp4lab._core.training_seed``), so a run is reproducible bit for bit on any device and thread count.

Two GEMM modes: ``exact`` (the contract kernels, bit-identical to the golden model and the RTL) and ``fast``
(the same quantised operands, dequantised and multiplied by torch's matmul: cuBLAS in BF16 on CUDA, FP32 on
the CPU).

    import fp4lab.torch as ft
    ft.convert(model, "ufp4", exclude=r"lm_head")     # every other nn.Linear now trains under UFP4
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import re
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fp4lab as _fp
from fp4lab import _core

__all__ = ["Recipe", "Linear", "convert", "ConvertReport", "ConvertEntry", "layer_id_of", "set_step", "quantize",
           "gemm", "product", "dequantize", "QTensorCUDA", "check_finite", "RECIPES"]

# bf16 is the passthrough recipe (plain F.linear); the others are the presets of docs/spec.md §2.
RECIPES = ("bf16",) + tuple(_core.recipe_names())
_PASSES = ("fwd_y", "bwd_dx", "bwd_dw")


class Recipe:
    """A training recipe: a preset name (or "bf16") plus any knob set on top, a GEMM mode and an SR seed.

    ``Recipe("ufp4")``, ``Recipe("e2m1-ref", mode="fast")``, ``Recipe(format="e1m2", rht=16)`` (knobs alone, on
    the defaults e1m2 / block 16 / fp32 scale / no RHT / RTNE). Knobs apply to every operand of every pass, as on
    the command line; ``per_pass={"fwd_y": {"rht": 0}}`` and ``per_operand={("bwd_dx", "a"): {...}}`` narrow them.

    Immutable, compared and hashed by value; ``repr`` is the call that builds it, and copies, pickles and
    ``torch.save`` carry only that call (the C++ settings are rebuilt on demand).
    """

    def __init__(self, name: Optional[str] = None, *, mode: str = "exact", seed: int = 0,
                 per_pass: Optional[Dict[str, Dict[str, Any]]] = None,
                 per_operand: Optional[Dict[Tuple[str, str], Dict[str, Any]]] = None,
                 check_finite: str = "sync", **knobs):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Recipe(): name must be a str or None, not {type(name).__name__}")
        if mode not in ("exact", "fast"):
            raise ValueError(f"mode must be 'exact' or 'fast', not {mode!r}")
        if check_finite not in ("sync", "deferred"):
            raise ValueError(f"check_finite must be 'sync' or 'deferred', not {check_finite!r}")
        if name is not None and name not in RECIPES:
            raise ValueError(f"unknown recipe '{name}' (known: {', '.join(RECIPES)})")
        if name == "bf16" and (knobs or per_pass or per_operand):
            raise ValueError("the bf16 recipe is plain BF16 and takes no knobs")
        for p in (per_pass or {}):
            if p not in _PASSES:
                raise ValueError(f"unknown pass '{p}' (known: {', '.join(_PASSES)})")
        for p, o in (per_operand or {}):
            if p not in _PASSES or o not in ("a", "b"):
                raise ValueError(f"per_operand keys are (pass, 'a'|'b'), not {(p, o)!r}")
        # The arguments, as given: repr, equality, hashing and pickling all use them.
        args: Dict[str, Any] = {"mode": mode, "seed": int(seed)}
        if per_pass:
            args["per_pass"] = {p: dict(v) for p, v in per_pass.items()}
        if per_operand:
            args["per_operand"] = {tuple(k): dict(v) for k, v in per_operand.items()}
        if check_finite != "sync":
            args["check_finite"] = check_finite
        args.update(knobs)
        set_ = object.__setattr__
        set_(self, "_name_arg", name)
        set_(self, "_args", args)
        set_(self, "name", name or "custom")
        set_(self, "mode", mode)
        set_(self, "seed", int(seed))
        set_(self, "check_finite", check_finite)
        set_(self, "passthrough", name == "bf16")
        kn: Dict[Tuple[str, str], dict] = {}
        for p in _PASSES:
            for o in ("a", "b"):
                k = dict(knobs)
                k.update((per_pass or {}).get(p, {}))
                k.update((per_operand or {}).get((p, o), {}))
                for bad in ("seed", "stream", "pass_", "role"):
                    if bad in k:
                        raise ValueError(f"{bad} is set by the training step, not by the recipe")
                kn[(p, o)] = _fp._knobs("Recipe", None if self.passthrough else name, None, None, k)
        set_(self, "_knobs", kn)
        set_(self, "_configs", {})
        if not self.passthrough:
            for p in _PASSES:  # resolve once now, so a bad knob fails here and not in the first backward
                for o in ("a", "b"):
                    self.config(p, o, layer=0, step=0)

    def __setattr__(self, name, value):
        raise AttributeError(f"fp4lab.torch.Recipe is immutable (make another Recipe rather than setting {name})")

    def config(self, pass_: str, operand: str, *, layer: int, step: int) -> "_core.QuantConfig":
        """The QuantConfig of one operand of one pass at a training step, SR keyed by (seed, step, layer)."""
        key = (pass_, operand, layer, step)
        c = self._configs.get(key)
        if c is None:
            if len(self._configs) > 4096:  # one step's worth for a large model; older steps are not asked again
                self._configs.clear()
            k = dict(self._knobs[(pass_, operand)])
            k["seed"] = str(_core.training_seed(self.seed, step))
            k["stream"] = str(layer)
            c = self._configs[key] = _core.operand_config(k, pass_, operand)
        return c

    def __repr__(self) -> str:
        args = [repr(self._name_arg)] if self._name_arg is not None else []
        args += [f"{k}={v!r}" for k, v in self._args.items()]
        return f"fp4lab.torch.Recipe({', '.join(args)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Recipe) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def __reduce__(self):
        return (_recipe_from_args, (self._name_arg, self._args))

    # Immutable: a copy is the object itself (a model and its deep copy share their recipe).
    def __copy__(self) -> "Recipe":
        return self

    def __deepcopy__(self, memo) -> "Recipe":
        return self


def _recipe_from_args(name: Optional[str], args: Dict[str, Any]) -> Recipe:
    return Recipe(name, **args)


def _as_recipe(recipe: Any) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe(recipe)


# ---- operations on tensors ------------------------------------------------------------------------------------

class QTensorCUDA:
    """A quantised operand on the GPU: the kernels' device layout (two codes per byte, element 2i in the low
    nibble), with torch views of its buffers (``packed_codes``, ``scales``, ``global_scale``)."""

    def __init__(self, handle=None):
        self._h = handle if handle is not None else _core.CudaQTensor()

    @property
    def shape(self) -> Tuple[int, int]:
        return (self._h.rows, self._h.cols)

    def __getattr__(self, name):
        return getattr(self._h, name)

    def to_host(self) -> "_core.QTensor":
        """The golden layout (one code per byte) on the host, for a bit-for-bit comparison."""
        torch.cuda.current_stream().synchronize()
        return self._h.to_host()


_flags: Dict[int, torch.Tensor] = {}


def _nonfinite_flag(device: torch.device) -> torch.Tensor:
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _flags:
        _flags[i] = torch.zeros(1, dtype=torch.int32, device=device)
    return _flags[i]


def check_finite() -> None:
    """Raises ValueError when a CUDA operand quantised with check_finite='deferred' held NaN or Inf since the last
    call (one synchronisation; a training loop calls it once a step), and clears the flag."""
    for i, f in _flags.items():
        if int(f.item()):
            f.zero_()
            raise ValueError(f"cuda:{i}: an input tensor of a quantised GEMM held NaN or Inf "
                             "(4-bit grids have no such codes)")


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


@_fp._one_line_errors
def quantize(x: torch.Tensor, cfg: Any = None, *, out: Optional[QTensorCUDA] = None, rht_path: str = "fused",
             check_finite: str = "sync", **knobs):
    """Quantise a 2-D tensor along its last dimension. ``cfg`` is a QuantConfig (``fp4lab.config``) or a recipe
    name with ``knobs`` as in ``fp4lab.quantize``. A CPU tensor goes through the golden model and gives an
    ``fp4lab.QTensor``; a CUDA tensor through the CUDA kernels (fused or unfused RHT) and gives a QTensorCUDA."""
    if not isinstance(cfg, (_core.QuantConfig, str, type(None))):
        raise TypeError(f"quantize(): cfg must be a QuantConfig or a recipe name, not {type(cfg).__name__}")
    if not isinstance(cfg, _core.QuantConfig):
        cfg = _fp.config(cfg, **knobs)
    elif knobs:
        raise TypeError("give a QuantConfig or knobs, not both")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize(): x must be a torch.Tensor, not {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"quantize(): x must be 2-D [rows, K], got shape {list(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"quantize(): x must be float32, bfloat16 or float16, not {x.dtype}")
    x = x.detach()
    if x.is_cuda and x.dtype == torch.bfloat16:
        x = x.contiguous()  # the kernels widen BF16 to FP32 as they load it (exactly)
    else:
        # One copy at most: FP16/BF16 widen exactly to FP32, and a transposed view is laid out row-major.
        x = x.to(torch.float32, memory_format=torch.contiguous_format).contiguous()
    if x.is_cuda:
        if not _core.cuda_built:
            raise RuntimeError("this fp4lab was built without CUDA")
        q = out if out is not None else QTensorCUDA()
        flag = _nonfinite_flag(x.device) if check_finite == "deferred" else None
        with torch.cuda.device(x.device):
            _core.cuda_quantize(x, cfg, q._h, _stream(), rht_path, check_finite == "sync", flag)
        return q
    if x.device.type != "cpu":
        raise ValueError(f"quantize(): tensors on {x.device.type} are not supported (CPU and CUDA are)")
    return _core.quantize_f32(x.numpy(), cfg)


@_fp._one_line_errors
def dequantize(q) -> torch.Tensor:
    """FP32 values of a quantised operand: (grid value · block scale) · global scale, in that FP32 order."""
    return _dequantize(q, torch.float32)


def _dequantize(q, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(q, QTensorCUDA):
        out = torch.empty(q.shape, dtype=dtype, device=q.packed_codes.device)
        with torch.cuda.device(out.device):
            _core.cuda_dequantize(q._h, out, _stream())
        return out
    return torch.from_numpy(q.dequantize()).to(dtype)


@_fp._one_line_errors
def gemm(qa, qb, *, kernel: str = "fast") -> torch.Tensor:
    """C = A · Bᵀ, FP32 [M, N], under the datapath contract: the golden model for host operands, the CUDA
    kernels for device operands (``kernel`` "fast": int8 tensor cores; "reference": one thread per output)."""
    if isinstance(qa, QTensorCUDA) and isinstance(qb, QTensorCUDA):
        dev = qa.packed_codes.device
        c = torch.empty((qa.rows, qb.rows), dtype=torch.float32, device=dev)
        with torch.cuda.device(dev):
            _core.cuda_gemm(qa._h, qb._h, c, _stream(), kernel)
        return c
    if isinstance(qa, _core.QTensor) and isinstance(qb, _core.QTensor):
        return torch.from_numpy(_core.gemm(qa, qb))
    raise TypeError("gemm(): both operands must come from fp4lab.torch.quantize on the same kind of device")


# ---- the training layer -------------------------------------------------------------------------------------

@_fp._one_line_errors
def product(qa, qb, mode: str = "exact") -> torch.Tensor:
    """A · Bᵀ of two quantised operands in a GEMM mode: "exact" is ``gemm`` (the datapath contract, FP32);
    "fast" multiplies the dequantised operands with torch's matmul: cuBLAS on BF16 values with FP32 accumulation
    and a BF16 product on CUDA, FP32 on the CPU."""
    if mode == "exact":
        return gemm(qa, qb)
    if mode != "fast":
        raise ValueError(f"mode must be 'exact' or 'fast', not {mode!r}")
    if isinstance(qa, QTensorCUDA):
        return torch.matmul(_dequantize(qa, torch.bfloat16), _dequantize(qb, torch.bfloat16).t())
    return torch.matmul(dequantize(qa), dequantize(qb).t())


def _quantize_operand(x: torch.Tensor, cfg, pass_: str, operand: str, recipe: Recipe, cache: dict):
    """One operand of a training GEMM; a fault names the pass, the operand and its shape. CUDA operands reuse the
    layer's device buffers from step to step."""
    try:
        if x.is_cuda:
            return quantize(x, cfg, out=cache.setdefault(f"{pass_}.{operand}", QTensorCUDA()),
                            check_finite=recipe.check_finite)
        return quantize(x, cfg)
    except ValueError as e:
        raise ValueError(f"{pass_} operand {operand} {list(x.shape)}: {e}") from None


def _qmatmul(a: torch.Tensor, b: torch.Tensor, cfg, recipe: Recipe, cache: dict, pass_: str) -> torch.Tensor:
    """A [M, K] · B [N, K]ᵀ with both operands quantised along K under the pass's settings (``cfg(pass, operand)``),
    in the recipe's mode."""
    qa = _quantize_operand(a, cfg(pass_, "a"), pass_, "a", recipe, cache)
    qb = _quantize_operand(b, cfg(pass_, "b"), pass_, "b", recipe, cache)
    return product(qa, qb, recipe.mode)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer: "Linear", step: int):
        recipe = layer.recipe
        x2 = x.reshape(-1, x.shape[-1])
        cfg = lambda p, o: recipe.config(p, o, layer=layer.layer_id, step=step)  # noqa: E731
        with layer._naming_faults():
            y = _qmatmul(x2, weight, cfg, recipe, layer._qcache, "fwd_y")
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias.to(x.dtype)
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.step, ctx.has_bias = layer, step, bias is not None
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        layer, step = ctx.layer, ctx.step
        if torch.is_grad_enabled():
            # create_graph=True: the quantised GEMMs have no derivative of their own, and a graph through this
            # backward would silently lack the quantisers' part.
            raise RuntimeError(f"{layer._label()}: double backward (create_graph=True) through an fp4lab Linear "
                               "is not supported")
        x, weight = ctx.saved_tensors
        recipe = layer.recipe
        cfg = lambda p, o: recipe.config(p, o, layer=layer.layer_id, step=step)  # noqa: E731
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        with layer._naming_faults():
            if ctx.needs_input_grad[0]:
                # dgrad: dX = dY · W, reduced over out: A = dY [tokens, out], B = Wᵀ [in, out].
                dx = _qmatmul(dy2, weight.t(), cfg, recipe, layer._qcache, "bwd_dx")
                dx = dx.to(x.dtype).reshape(x.shape)
            if ctx.needs_input_grad[1]:
                # wgrad: dW = dYᵀ · X, reduced over tokens: A = dYᵀ [out, tokens], B = Xᵀ [in, tokens].
                dw = _qmatmul(dy2.t(), x2.t(), cfg, recipe, layer._qcache, "bwd_dw")
                dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None, None


_ID_BITS = 29  # the SR stream of an operand is id·8 + pass·2 + operand, a uint32


def layer_id_of(name: str) -> int:
    """The SR layer key of the layer at qualified name ``name`` within the module ``convert`` was given: the top
    29 bits of SHA-256 of the UTF-8 name (big-endian), so the same model draws the same bits wherever and however
    often it is built, and two layers of one model differ unless their names collide."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "big") >> (32 - _ID_BITS)


_ROOT_ID = layer_id_of("")  # a layer on its own is the root of its model


def _in_backward() -> bool:
    # A forward run while the autograd engine executes a backward is an activation-checkpoint recomputation
    # (torch.utils.checkpoint, reentrant or not).
    return torch._C._current_graph_task_id() != -1


class Linear(nn.Linear):
    """``nn.Linear`` whose three training GEMMs run under an fp4lab recipe. Same parameters as ``nn.Linear``;
    the state dict adds ``_extra_state``, the SR step (a 0-d int64 tensor). ``recipe="bf16"`` is plain
    ``F.linear``. ``layer_id`` keys stochastic rounding: without one it is ``layer_id_of("")`` until ``convert``
    names the layer by its qualified name. ``step`` is the training step, advanced by every forward in training
    mode that records a graph (``set_step`` sets it for a whole model); a forward recomputed by activation
    checkpointing reuses the step of the forward it repeats."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: Any = "ufp4",
                 layer_id: Optional[int] = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = _as_recipe(recipe)
        self._id_given = layer_id is not None
        self.layer_id = _ROOT_ID if layer_id is None else int(layer_id)
        self.name: Optional[str] = None  # the qualified name convert found it at (error messages)
        self.step = 0
        # The step of the last forward outside a backward (a recomputation repeats it), and whether it advanced.
        self._last_step, self._last_advanced = 0, False
        self._qcache: dict = {}

    @classmethod
    def from_linear(cls, lin: nn.Linear, recipe: Any, layer_id: Optional[int] = None) -> "Linear":
        """A Linear sharing ``lin``'s parameters (the same Parameter objects, so optimizers see no change)."""
        new = cls(lin.in_features, lin.out_features, lin.bias is not None, recipe=recipe, layer_id=layer_id,
                  device="meta")
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.passthrough:
            return F.linear(x, self.weight, self.bias)
        records = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if _in_backward():
            # A recomputation repeats the last forward's step. Reentrant checkpointing ran that forward without a
            # graph, so this is the forward whose graph trains: the step advances now, once.
            step = self._last_step
            if records and self.training and not self._last_advanced:
                self.step, self._last_advanced = step + 1, True
        else:
            step = self._last_step = self.step
            self._last_advanced = records and self.training
            if records:
                self._check_backward_shapes(x.numel() // x.shape[-1], step)
                if self.training:
                    self.step += 1
        weight, bias, dev = self.weight, self.bias, x.device.type
        if torch.is_autocast_enabled(dev):
            # As F.linear under autocast: the operands are cast to the autocast dtype first (FP32 master weights
            # reach the quantiser as the BF16 copy autocast would give cuBLAS), and the output has that dtype.
            dt = torch.get_autocast_dtype(dev)
            x, weight = x.to(dt), weight.to(dt)
            bias = None if bias is None else bias.to(dt)
            with torch.autocast(dev, enabled=False):
                return _LinearFn.apply(x, weight, bias, self, step)
        return _LinearFn.apply(x, weight, bias, self, step)

    def _label(self) -> str:
        return self.name if self.name else f"Linear({self.in_features}, {self.out_features})"

    @contextlib.contextmanager
    def _naming_faults(self):
        try:
            yield
        except ValueError as e:
            raise ValueError(f"{self._label()}: {e}") from None

    def _check_backward_shapes(self, tokens: int, step: int) -> None:
        """The backward GEMMs reduce over out and tokens: a shape they cannot take is refused before the forward
        GEMM runs, not after it."""
        for p, o, rows, cols in (("bwd_dx", "a", tokens, self.out_features), ("bwd_dx", "b", self.in_features,
                                 self.out_features), ("bwd_dw", "a", self.out_features, tokens),
                                 ("bwd_dw", "b", self.in_features, tokens)):
            try:
                _core.validate(self.recipe.config(p, o, layer=self.layer_id, step=step), rows, cols)
            except ValueError as e:
                raise ValueError(f"{self._label()}: {p} operand {o} [{rows}, {cols}]: {e}") from None

    # The SR step travels in the state dict, so a resumed run continues with the keys it stopped at.
    def get_extra_state(self) -> torch.Tensor:
        return torch.tensor(self.step, dtype=torch.int64)

    def set_extra_state(self, state) -> None:
        self.step = self._last_step = int(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # A checkpoint of nn.Linear, or from before the step was saved, has no step: it loads (strict or not) and
        # leaves the step as it is.
        key = prefix + "_extra_state"
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)

    def __getstate__(self):
        state = super().__getstate__()
        state["_qcache"] = {}  # device buffers of the last step: scratch, not state
        return state

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}, mode={self.recipe.mode}, layer_id={self.layer_id}"


@dataclasses.dataclass(frozen=True)
class ConvertEntry:
    """One module ``convert`` considered: ``action`` is "converted", "recipe changed", "unchanged" (already an
    fp4lab Linear under this recipe) or "left" (it computes as before), and ``reason`` says why."""
    name: str
    kind: str
    action: str
    reason: str = ""


class ConvertReport(list):
    """What ``convert`` did, one ``ConvertEntry`` per linear module (and per ``nn.MultiheadAttention``), in module
    order. ``str()`` gives one line per entry."""

    @property
    def converted(self) -> list:
        return [e.name for e in self if e.action in ("converted", "recipe changed", "unchanged")]

    @property
    def left(self) -> list:
        return [e.name for e in self if e.action == "left"]

    def __str__(self) -> str:
        return "\n".join(f"{e.name or '(root)'} [{e.kind}]: {e.action}" + (f" ({e.reason})" if e.reason else "")
                         for e in self)


_log = logging.getLogger("fp4lab.torch")
_MHA_REASON = ("nn.MultiheadAttention computes with in_proj_weight and out_proj.weight directly "
               "(F.multi_head_attention_forward), so its projections stay in BF16")


_FAST_PATH_REASON = ("its fused inference path (eval mode, no grad) computes with the weights directly, past the "
                     "converted layers; turned off for this module")


def _no_fused_path(module, args):
    """A forward pre-hook that does nothing: nn.TransformerEncoderLayer takes its fused inference path only on a
    module without hooks."""
    return None


def _shape_fault(lin: nn.Linear, r: Recipe) -> Optional[str]:
    """Why the recipe cannot take this layer's weight and reduction dimensions in and out, or None. (The token count,
    the third reduction dimension, is checked at each forward.)"""
    t = 512  # a token count every block, tile and RHT size divides: only the weight's dimensions are on trial
    for p, o, rows, cols in (("fwd_y", "a", t, lin.in_features), ("fwd_y", "b", lin.out_features, lin.in_features),
                             ("bwd_dx", "a", t, lin.out_features), ("bwd_dx", "b", lin.in_features, lin.out_features)):
        try:
            _core.validate(r.config(p, o, layer=0, step=0), rows, cols)
        except ValueError as e:
            return f"{p} operand {o} [{'tokens' if rows == t else rows}, {cols}]: {e}"
    return None


def convert(model: nn.Module, recipe: Any, *, include: Optional[str] = None, exclude: Optional[str] = None) -> nn.Module:
    """Swaps, in place, every ``nn.Linear`` of ``model`` whose qualified name matches ``include`` (a regex searched
    in the name; default all) and not ``exclude`` for an fp4lab ``Linear`` under ``recipe``, sharing its parameters
    and keeping its state-dict keys; an fp4lab ``Linear`` already there takes the new recipe (its step and layer id
    stay). Each converted layer's SR key is ``layer_id_of(its qualified name in model)``.

    Left as they are, with the reason in the report: layers whose dimensions the recipe cannot quantise, a module
    reachable under two names, and the projections of ``nn.MultiheadAttention`` (it reads their weights directly).
    The fused inference path of ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder``, which would compute past
    the converted layers, is turned off for the modules that hold one.

    Returns ``model`` (or, for a lone ``nn.Linear``, the fp4lab Linear that replaces it) with the
    ``ConvertReport`` as its attribute ``fp4lab_report``; the report is also logged (logger "fp4lab.torch")."""
    r = _as_recipe(recipe)
    inc = re.compile(include) if include else None
    exc = re.compile(exclude) if exclude else None
    matches = lambda n: (inc is None or inc.search(n)) and not (exc is not None and exc.search(n))  # noqa: E731
    names: Dict[int, list] = {}
    mods: Dict[int, nn.Module] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        names.setdefault(id(mod), []).append(name)
        mods[id(mod)] = mod
    param_owners: Dict[int, list] = {}  # a parameter tied to another module (a tied head) is noted in the report
    for name, prm in model.named_parameters(remove_duplicate=False):
        param_owners.setdefault(id(prm), []).append(name)
    mha_children = set()
    for mod in mods.values():
        if isinstance(mod, nn.MultiheadAttention):
            mha_children.update(id(c) for c in mod.children())

    report = ConvertReport()
    fused = []  # modules with an inference path of their own that bypasses the layers inside them
    swaps = []  # (module names, new Linear)
    used_ids = {m.layer_id for m in mods.values() if isinstance(m, Linear) and m._id_given}
    for key, mod in mods.items():
        ns = names[key]
        kind = type(mod).__name__
        if isinstance(mod, nn.MultiheadAttention):
            if any(matches(n) for n in ns):
                report.append(ConvertEntry(ns[0], kind, "left", _MHA_REASON))
            continue
        if isinstance(mod, (nn.TransformerEncoderLayer, nn.TransformerEncoder)):
            fused.append((ns[0], mod))
            continue
        if not isinstance(mod, nn.Linear):
            continue
        if not any(matches(n) for n in ns):
            report.append(ConvertEntry(ns[0], kind, "left", "not matched by include/exclude"))
            continue
        if key in mha_children:
            report.append(ConvertEntry(ns[0], kind, "left", "a projection of nn.MultiheadAttention, which reads "
                                                            "its weight directly"))
            continue
        if len(ns) > 1:
            report.append(ConvertEntry(ns[0], kind, "left", f"one module under {len(ns)} names ({', '.join(ns)}): "
                                                            "convert a separate module per name"))
            continue
        fault = None if r.passthrough else _shape_fault(mod, r)
        if fault:
            report.append(ConvertEntry(ns[0], kind, "left", fault))
            continue
        if isinstance(mod, Linear):
            if mod.recipe == r:
                report.append(ConvertEntry(ns[0], kind, "unchanged", f"already under {r!r}"))
            else:
                report.append(ConvertEntry(ns[0], kind, "recipe changed", f"was {mod.recipe!r}, now {r!r}"))
                mod.recipe = r
                mod._qcache.clear()
            if mod._id_given:
                continue
            new = mod
        else:
            new = Linear.from_linear(mod, r)
            tied = [n for n in param_owners.get(id(mod.weight), []) if n != (f"{ns[0]}." if ns[0] else "") + "weight"]
            report.append(ConvertEntry(ns[0], kind, "converted",
                                       repr(r) + (f"; its weight is also {', '.join(tied)}" if tied else "")))
        swaps.append((ns[0], new))

    for name, new in swaps:
        # The name's hash, probed with "#k" suffixes past the (rare) ids another layer of this model holds.
        lid, k = layer_id_of(name), 0
        while lid in used_ids:
            k += 1
            lid = layer_id_of(f"{name}#{k}")
        used_ids.add(lid)
        new.layer_id, new._id_given, new.name = lid, True, name
        if name:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            if getattr(parent, child) is not new:
                setattr(parent, child, new)
        else:
            model = new

    for name, mod in fused:
        if any(isinstance(m, Linear) for m in mod.modules()):
            if isinstance(mod, nn.TransformerEncoder):
                mod.use_nested_tensor = False  # its layers run one by one, each as a module
            elif not any(h is _no_fused_path for h in mod._forward_pre_hooks.values()):
                mod.register_forward_pre_hook(_no_fused_path)
            report.append(ConvertEntry(name, type(mod).__name__, "fused path off", _FAST_PATH_REASON))
    for e in report:
        level = logging.WARNING if e.action == "left" and not e.reason.startswith("not matched") else logging.INFO
        _log.log(level, "convert: %s [%s]: %s%s", e.name or "(root)", e.kind, e.action,
                 f" ({e.reason})" if e.reason else "")
    model.fp4lab_report = report
    return model


def set_step(model: nn.Module, step: int) -> None:
    """Sets the training step (the SR step key) of every fp4lab Linear in ``model``."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.step = m._last_step = int(step)
