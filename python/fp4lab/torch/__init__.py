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
import math
import re
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fp4lab as _fp
from fp4lab import _core

__all__ = ["Recipe", "Linear", "MultiheadAttention", "convert", "ConvertReport", "ConvertEntry", "layer_id_of",
           "set_step", "quantize", "gemm", "product", "dequantize", "QTensorCUDA", "check_finite", "RECIPES",
           "monitor", "sr_shard"]

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
    # The tensor itself (DLPack), not x.numpy(): that marks the storage, which may be a parameter's, as not
    # resizable, and FSDP2 frees an unsharded parameter by resizing its storage to 0.
    return _core.quantize_f32(x, cfg)


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


# Numerics monitors (fp4lab.torch.monitor): called with each GEMM's operands; empty, they cost one test per GEMM.
_observers: list = []


def _qmatmul(a: torch.Tensor, b: torch.Tensor, cfg, recipe: Recipe, cache: dict, pass_: str, layer=None,
             step: int = 0) -> torch.Tensor:
    """A [M, K] · B [N, K]ᵀ with both operands quantised along K under the pass's settings (``cfg(pass, operand)``),
    in the recipe's mode."""
    quant = _quantize_operand
    if getattr(layer, "_sr_shard", None) is not None:  # a micro-batch drawing the global batch's SR words
        quant = _sr_shard_quantizer(layer._sr_shard)
    qa = quant(a, cfg(pass_, "a"), pass_, "a", recipe, cache)
    qb = quant(b, cfg(pass_, "b"), pass_, "b", recipe, cache)
    y = product(qa, qb, recipe.mode)
    for obs in _observers:
        obs(layer, step, pass_, a, b, qa, qb, y, cfg)
    return y


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer: "Linear", step: int):
        recipe = layer.recipe
        x2 = x.reshape(-1, x.shape[-1])
        cfg = lambda p, o: recipe.config(p, o, layer=layer.layer_id, step=step)  # noqa: E731
        with layer._naming_faults():
            y = _qmatmul(x2, weight, cfg, recipe, layer._qcache, "fwd_y", layer, step)
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
                dx = _qmatmul(dy2, weight.t(), cfg, recipe, layer._qcache, "bwd_dx", layer, step)
                dx = dx.to(x.dtype).reshape(x.shape)
            if ctx.needs_input_grad[1]:
                # wgrad: dW = dYᵀ · X, reduced over tokens: A = dYᵀ [out, tokens], B = Xᵀ [in, tokens].
                dw = _qmatmul(dy2.t(), x2.t(), cfg, recipe, layer._qcache, "bwd_dw", layer, step)
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


def _check_shapes(label: str, recipe: Recipe, layer: int, step: int, tokens: int, in_f: int, out_f: int) -> None:
    """The backward GEMMs reduce over out and tokens: a shape they cannot take is refused before the forward GEMM
    runs, not after it."""
    for p, o, rows, cols in (("bwd_dx", "a", tokens, out_f), ("bwd_dx", "b", in_f, out_f),
                             ("bwd_dw", "a", out_f, tokens), ("bwd_dw", "b", in_f, tokens)):
        try:
            _core.validate(recipe.config(p, o, layer=layer, step=step), rows, cols)
        except ValueError as e:
            raise ValueError(f"{label}: {p} operand {o} [{rows}, {cols}]: {e}") from None


def _apply(gemm, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], step: int) -> torch.Tensor:
    """x · weightᵀ + bias under ``gemm``'s recipe and SR key (an fp4lab Linear, or an attention projection)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        # As F.linear under autocast: the operands are cast to the autocast dtype first (FP32 master weights
        # reach the quantiser as the BF16 copy autocast would give cuBLAS), and the output has that dtype.
        dt = torch.get_autocast_dtype(dev)
        x, weight = x.to(dt), weight.to(dt)
        bias = None if bias is None else bias.to(dt)
        with torch.autocast(dev, enabled=False):
            return _LinearFn.apply(x, weight, bias, gemm, step)
    return _LinearFn.apply(x, weight, bias, gemm, step)


class _Stepped(nn.Module):
    """The SR step of a module that runs GEMMs under a recipe: advanced by every forward in training mode that
    records a graph, repeated by an activation-checkpoint recomputation, and saved in the state dict."""

    def _init_step(self, recipe: Any) -> None:
        self.recipe = _as_recipe(recipe)
        self.name: Optional[str] = None  # the qualified name convert found it at (error messages)
        self.step = 0
        # The step of the last forward outside a backward (a recomputation repeats it), and whether it advanced.
        self._last_step, self._last_advanced = 0, False

    def _take_step(self, records: bool) -> Tuple[int, bool]:
        """The step this forward quantises with, and whether it is a forward outside a backward that records a
        graph (whose shapes are checked)."""
        if _in_backward():
            # A recomputation repeats the last forward's step. Reentrant checkpointing ran that forward without a
            # graph, so this is the forward whose graph trains: the step advances now, once.
            step = self._last_step
            if records and self.training and not self._last_advanced:
                self.step, self._last_advanced = step + 1, True
            return step, False
        step = self._last_step = self.step
        self._last_advanced = records and self.training
        if self._last_advanced:
            self.step += 1
        return step, records

    @contextlib.contextmanager
    def _naming_faults(self):
        try:
            yield
        except ValueError as e:
            raise ValueError(f"{self._label()}: {e}") from None

    # The SR step travels in the state dict, so a resumed run continues with the keys it stopped at.
    def get_extra_state(self) -> torch.Tensor:
        return torch.tensor(self.step, dtype=torch.int64)

    def set_extra_state(self, state) -> None:
        self.step = self._last_step = int(state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # A checkpoint of the torch module, or from before the step was saved, has no step: it loads (strict or
        # not) and leaves the step as it is.
        key = prefix + "_extra_state"
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)


class Linear(_Stepped, nn.Linear):
    """``nn.Linear`` whose three training GEMMs run under an fp4lab recipe. Same parameters as ``nn.Linear``;
    the state dict adds ``_extra_state``, the SR step (a 0-d int64 tensor). ``recipe="bf16"`` is plain
    ``F.linear``. ``layer_id`` keys stochastic rounding: without one it is ``layer_id_of("")`` until ``convert``
    names the layer by its qualified name. ``step`` is the training step, advanced by every forward in training
    mode that records a graph (``set_step`` sets it for a whole model); a forward recomputed by activation
    checkpointing reuses the step of the forward it repeats."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: Any = "ufp4",
                 layer_id: Optional[int] = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_step(recipe)
        self._id_given = layer_id is not None
        self.layer_id = _ROOT_ID if layer_id is None else int(layer_id)
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
        step, check = self._take_step(torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        if check:
            _check_shapes(self._label(), self.recipe, self.layer_id, step, x.numel() // x.shape[-1],
                          self.in_features, self.out_features)
        return _apply(self, x, self.weight, self.bias, step)

    def _label(self) -> str:
        return self.name if self.name else f"Linear({self.in_features}, {self.out_features})"

    def __getstate__(self):
        state = super().__getstate__()
        state["_qcache"] = {}  # device buffers of the last step: scratch, not state
        return state

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}, mode={self.recipe.mode}, layer_id={self.layer_id}"


class _Projection:
    """An in-projection GEMM of an fp4lab MultiheadAttention, as _LinearFn takes a layer: the attention's recipe,
    the SR id ``layer_id_of("<attention's name>.in_proj.<i>")`` (i counts the in-projection GEMMs of one forward:
    one for self-attention, two when key is value, else three) and its own device buffers."""

    def __init__(self, owner: "MultiheadAttention", index: int):
        self.owner, self.index, self._qcache = owner, index, {}

    @property
    def recipe(self) -> Recipe:
        return self.owner.recipe

    @property
    def layer_id(self) -> int:
        return layer_id_of(f"{self.owner.name}.in_proj.{self.index}" if self.owner.name else f"in_proj.{self.index}")

    def _label(self) -> str:
        return f"{self.owner._label()}.in_proj.{self.index}"

    def _naming_faults(self):
        return _Stepped._naming_faults(self)

    def __getstate__(self):
        return {"owner": self.owner, "index": self.index, "_qcache": {}}


class MultiheadAttention(_Stepped, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose in-projection GEMMs and output projection (an fp4lab ``Linear``) run under
    a recipe; between them the attention is ``F.multi_head_attention_forward``'s, step for step (scaled dot-product
    attention, or softmax(QKᵀ/√d)·V where the weights are asked for; the same masks, causal hint and dropout). Same
    parameters and state-dict keys, with ``_extra_state`` (the in-projection's SR step) and
    ``out_proj._extra_state``. ``add_bias_kv`` and ``add_zero_attn`` are not supported (``convert`` leaves such
    modules)."""

    def __init__(self, *args, recipe: Any = "ufp4", **kwargs):
        super().__init__(*args, **kwargs)
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError("fp4lab.torch.MultiheadAttention does not support add_bias_kv or add_zero_attn")
        self._init_step(recipe)
        self.out_proj = Linear.from_linear(self.out_proj, self.recipe)
        self._projections = [_Projection(self, i) for i in range(3)]

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention, recipe: Any) -> "MultiheadAttention":
        """One sharing ``mha``'s parameters (the same Parameter objects)."""
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
                  kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first, device="meta", recipe=recipe)
        for n in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            setattr(new, n, getattr(mha, n))
        new.out_proj = Linear.from_linear(mha.out_proj, recipe)
        new.train(mha.training)
        return new

    def _label(self) -> str:
        return self.name if self.name else f"MultiheadAttention({self.embed_dim}, {self.num_heads})"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if self.recipe.passthrough:
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        is_batched = query.dim() == 3
        if self.batch_first and is_batched:
            # as nn.MultiheadAttention: the transposes keep query, key and value the same object where they were
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        out, weights = self._attention(query, key, value, key_padding_mask, need_weights, attn_mask,
                                       average_attn_weights, is_causal)
        if self.batch_first and is_batched:
            return out.transpose(1, 0), weights
        return out, weights

    def _in_projection(self, q, k, v, step: int, check: bool):
        E = q.size(-1)

        def gemm(i, x, w, b):
            if check:
                _check_shapes(self._projections[i]._label(), self.recipe, self._projections[i].layer_id, step,
                              x.numel() // x.shape[-1], w.shape[1], w.shape[0])
            return _apply(self._projections[i], x, w, b, step)

        if not self._qkv_same_embed_dim:
            bq, bk, bv = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            return (gemm(0, q, self.q_proj_weight, bq), gemm(1, k, self.k_proj_weight, bk),
                    gemm(2, v, self.v_proj_weight, bv))
        # F._in_projection_packed, with these GEMMs
        w, b = self.in_proj_weight, self.in_proj_bias
        if k is v:
            if q is k:
                proj = gemm(0, q, w, b)
                proj = proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
                return proj[0], proj[1], proj[2]
            w_q, w_kv = w.split([E, E * 2])
            b_q, b_kv = (None, None) if b is None else b.split([E, E * 2])
            q_proj = gemm(0, q, w_q, b_q)
            kv = gemm(1, k, w_kv, b_kv)
            kv = kv.unflatten(-1, (2, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
            return q_proj, kv[0], kv[1]
        w_q, w_k, w_v = w.chunk(3)
        b_q, b_k, b_v = (None,) * 3 if b is None else b.chunk(3)
        return gemm(0, q, w_q, b_q), gemm(1, k, w_k, b_k), gemm(2, v, w_v, b_v)

    def _attention(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                   is_causal):
        # F.multi_head_attention_forward from its shape check on, without bias_k/bias_v and zero attention, with
        # the in- and out-projections under the recipe.
        num_heads = self.num_heads
        is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, embed_dim = query.shape
        src_len = key.shape[0]
        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                               "method `generate_square_subsequent_mask` to create this mask.")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # the hint goes to SDPA as is_causal
        else:
            attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                          target_type=query.dtype, check_other=False)
            if key_padding_mask is not None:
                is_causal = False
        head_dim = embed_dim // num_heads
        if head_dim * num_heads != embed_dim:
            raise ValueError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")

        params = [p for p in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
                  if p is not None]
        records = torch.is_grad_enabled() and any(t.requires_grad for t in [query, key, value] + params)
        step, check = self._take_step(records)
        q, k, v = self._in_projection(query, key, value, step, check)

        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if attn_mask.shape != (tgt_len, src_len):
                    raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be "
                                       f"{(tgt_len, src_len)}.")
                attn_mask = attn_mask.unsqueeze(0)
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (bsz * num_heads, tgt_len, src_len):
                    raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                                       f"{(bsz * num_heads, tgt_len, src_len)}.")
            else:
                raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")

        q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
        k = k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        v = v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        src_len = k.size(1)
        if key_padding_mask is not None:
            key_padding_mask = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
                                .reshape(bsz * num_heads, 1, src_len))
            attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
        dropout_p = self.dropout if self.training else 0.0

        if need_weights:
            _B, _Nt, E = q.shape
            q_scaled = q * math.sqrt(1.0 / float(E))
            if is_causal and attn_mask is None:
                raise RuntimeError("is_causal is not implemented for need_weights")
            if attn_mask is not None:
                w = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
            else:
                w = torch.bmm(q_scaled, k.transpose(-2, -1))
            w = F.softmax(w, dim=-1)
            if dropout_p > 0.0:
                w = F.dropout(w, p=dropout_p)
            out = torch.bmm(w, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
            out = self.out_proj(out).view(tgt_len, bsz, -1)
            w = w.view(bsz, num_heads, tgt_len, src_len)
            if average_attn_weights:
                w = w.mean(dim=1)
            if not is_batched:
                out, w = out.squeeze(1), w.squeeze(0)
            return out, w
        if attn_mask is not None:
            if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(0)
            else:
                attn_mask = attn_mask.view(bsz, num_heads, -1, src_len)
        q = q.view(bsz, num_heads, tgt_len, head_dim)
        k = k.view(bsz, num_heads, src_len, head_dim)
        v = v.view(bsz, num_heads, src_len, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
        out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
        out = self.out_proj(out).view(tgt_len, bsz, -1)
        if not is_batched:
            out = out.squeeze(1)
        return out, None


@dataclasses.dataclass(frozen=True)
class ConvertEntry:
    """One module ``convert`` considered: ``action`` is "converted", "recipe changed", "unchanged" (already an
    fp4lab module under this recipe), "left" (it computes as before) or "fused path off", and ``reason`` says
    why."""
    name: str
    kind: str
    action: str
    reason: str = ""


class ConvertReport(list):
    """What ``convert`` did, one ``ConvertEntry`` per linear module and per ``nn.MultiheadAttention``, in module
    order, then one per transformer module whose fused inference path it turned off. ``str()`` gives one line per
    entry."""

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
_MHA_OUT_REASON = "nn.MultiheadAttention computes with out_proj.weight directly (F.multi_head_attention_forward)"


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
    and keeping its state-dict keys, and every matching ``nn.MultiheadAttention`` for an fp4lab
    ``MultiheadAttention`` (it reads its projection weights directly, so its ``out_proj`` goes with it); an fp4lab
    module already there takes the new recipe (its step and layer id stay). Each converted layer's SR key is
    ``layer_id_of(its qualified name in model)``.

    Left as they are, with the reason in the report: modules whose dimensions the recipe cannot quantise, a module
    reachable under two names, an attention with ``add_bias_kv`` or ``add_zero_attn``. The fused inference path of
    ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder``, which would compute past the converted modules, is
    turned off for the modules that hold one.

    Returns ``model`` (or, for a lone ``nn.Linear`` or attention, the fp4lab module that replaces it) with the
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
    report = ConvertReport()
    fused = []  # modules with an inference path of their own that bypasses the layers inside them
    swaps = []  # (module name, new Linear)
    attention_swaps = []  # (module name, new MultiheadAttention)
    ids_only = []  # (module name, Linear) in place already: an attention's out_proj
    attention: Dict[int, str] = {}  # id of an attention's out_proj -> why it is left, or "" (converted with it)
    used_ids = {m.layer_id for m in mods.values() if isinstance(m, Linear) and m._id_given}
    for key, mod in mods.items():
        ns = names[key]
        kind = type(mod).__name__
        if isinstance(mod, nn.MultiheadAttention):
            why = None
            if not any(matches(n) for n in ns):
                why = "not matched by include/exclude"
            elif len(ns) > 1:
                why = f"one module under {len(ns)} names ({', '.join(ns)}): convert a separate module per name"
            elif mod.bias_k is not None or mod.add_zero_attn:
                why = "add_bias_kv and add_zero_attn are not supported"
            elif not r.passthrough:
                E = mod.embed_dim
                why = next((f for f in (_shape_fault(SimpleNamespace(in_features=i, out_features=E), r)
                                        for i in (E, mod.kdim, mod.vdim)) if f), None)
            if why:
                report.append(ConvertEntry(ns[0], kind, "left", why))
                attention[id(mod.out_proj)] = f"{_MHA_OUT_REASON}, and {ns[0] or '(root)'} is left"
                continue
            if isinstance(mod, MultiheadAttention):
                if mod.recipe == r:
                    report.append(ConvertEntry(ns[0], kind, "unchanged", f"already under {r!r}"))
                else:
                    report.append(ConvertEntry(ns[0], kind, "recipe changed", f"was {mod.recipe!r}, now {r!r}"))
                    mod.recipe = r
                new = mod
            else:
                new = MultiheadAttention.from_mha(mod, r)
                report.append(ConvertEntry(ns[0], kind, "converted", repr(r)))
            attention[id(mod.out_proj)] = ""
            attention_swaps.append((ns[0], new))
            continue
        if isinstance(mod, (nn.TransformerEncoderLayer, nn.TransformerEncoder)):
            fused.append((ns[0], mod))
            continue
        if not isinstance(mod, nn.Linear):
            continue
        if key in attention:  # an attention's output projection goes with its attention
            if attention[key]:
                report.append(ConvertEntry(ns[0], kind, "left", attention[key]))
            else:
                report.append(ConvertEntry(ns[0], kind, "converted", f"with its attention, {r!r}"))
            continue
        if not any(matches(n) for n in ns):
            report.append(ConvertEntry(ns[0], kind, "left", "not matched by include/exclude"))
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

    def place(name, new):
        if name:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            if getattr(parent, child) is not new:
                setattr(parent, child, new)
            return model
        return new

    for name, new in attention_swaps:
        if new.name is None:
            new.name = name
        new.out_proj.recipe = new.recipe
        new.out_proj._qcache.clear()
        if not new.out_proj._id_given:
            ids_only.append((f"{name}.out_proj" if name else "out_proj", new.out_proj))
        model = place(name, new)

    for name, new in swaps + ids_only:
        # The name's hash, probed with "#k" suffixes past the (rare) ids another layer of this model holds.
        lid, k = layer_id_of(name), 0
        while lid in used_ids:
            k += 1
            lid = layer_id_of(f"{name}#{k}")
        used_ids.add(lid)
        new.layer_id, new._id_given, new.name = lid, True, name
    for name, new in swaps:
        model = place(name, new)

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
    """Sets the training step (the SR step key) of every fp4lab Linear and MultiheadAttention in ``model``."""
    for m in model.modules():
        if isinstance(m, _Stepped):
            m.step = m._last_step = int(step)


from fp4lab.torch.monitor import monitor  # noqa: E402  (it reads this module's layers)
from fp4lab.torch.distributed import sr_shard, _quantizer as _sr_shard_quantizer  # noqa: E402
