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

import itertools
import re
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import fp4lab as _fp
from fp4lab import _core

__all__ = ["Recipe", "Linear", "convert", "set_step", "quantize", "gemm", "product", "dequantize", "QTensorCUDA",
           "check_finite", "RECIPES"]

# bf16 is the passthrough recipe (plain F.linear); the others are the presets of docs/spec.md §2.
RECIPES = ("bf16",) + tuple(_core.recipe_names())
_PASSES = ("fwd_y", "bwd_dx", "bwd_dw")


class Recipe:
    """A training recipe: a preset name (or "bf16") plus any knob set on top, a GEMM mode and an SR seed.

    ``Recipe("ufp4")``, ``Recipe("e2m1-ref", mode="fast")``, ``Recipe(format="e1m2", rht=16)`` (knobs alone, on
    the defaults e1m2 / block 16 / fp32 scale / no RHT / RTNE). Knobs apply to every operand of every pass, as on
    the command line; ``per_pass={"fwd_y": {"rht": 0}}`` and ``per_operand={("bwd_dx", "a"): {...}}`` narrow them.
    """

    def __init__(self, name: Optional[str] = None, *, mode: str = "exact", seed: int = 0,
                 per_pass: Optional[Dict[str, Dict[str, Any]]] = None,
                 per_operand: Optional[Dict[Tuple[str, str], Dict[str, Any]]] = None,
                 check_finite: str = "sync", **knobs):
        if mode not in ("exact", "fast"):
            raise ValueError(f"mode must be 'exact' or 'fast', not {mode!r}")
        if check_finite not in ("sync", "deferred"):
            raise ValueError(f"check_finite must be 'sync' or 'deferred', not {check_finite!r}")
        if name is not None and name not in RECIPES:
            raise ValueError(f"unknown recipe '{name}' (known: {', '.join(RECIPES)})")
        if name == "bf16" and (knobs or per_pass or per_operand):
            raise ValueError("the bf16 recipe is plain BF16 and takes no knobs")
        self.name = name or "custom"
        self.mode = mode
        self.seed = int(seed)
        self.check_finite = check_finite
        self.passthrough = name == "bf16"
        for p in (per_pass or {}):
            if p not in _PASSES:
                raise ValueError(f"unknown pass '{p}' (known: {', '.join(_PASSES)})")
        for p, o in (per_operand or {}):
            if p not in _PASSES or o not in ("a", "b"):
                raise ValueError(f"per_operand keys are (pass, 'a'|'b'), not {(p, o)!r}")
        self._knobs: Dict[Tuple[str, str], dict] = {}
        self._configs: Dict[tuple, "_core.QuantConfig"] = {}
        for p in _PASSES:
            for o in ("a", "b"):
                k = dict(knobs)
                k.update((per_pass or {}).get(p, {}))
                k.update((per_operand or {}).get((p, o), {}))
                for bad in ("seed", "stream", "pass_", "role"):
                    if bad in k:
                        raise ValueError(f"{bad} is set by the training step, not by the recipe")
                self._knobs[(p, o)] = _fp._knobs("Recipe", None if self.passthrough else name, None, None, k)
        if not self.passthrough:
            for p in _PASSES:  # resolve once now, so a bad knob fails here and not in the first backward
                for o in ("a", "b"):
                    self.config(p, o, layer=0, step=0)

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
        return f"fp4lab.torch.Recipe({self.name!r}, mode={self.mode!r}, seed={self.seed})"


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


def quantize(x: torch.Tensor, cfg: Any = None, *, out: Optional[QTensorCUDA] = None, rht_path: str = "fused",
             check_finite: str = "sync", **knobs):
    """Quantise a 2-D tensor along its last dimension. ``cfg`` is a QuantConfig (``fp4lab.config``) or a recipe
    name with ``knobs`` as in ``fp4lab.quantize``. A CPU tensor goes through the golden model and gives an
    ``fp4lab.QTensor``; a CUDA tensor through the CUDA kernels (fused or unfused RHT) and gives a QTensorCUDA."""
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


def _qmatmul(a: torch.Tensor, b: torch.Tensor, cfg_a, cfg_b, recipe: Recipe, cache: dict, key: str) -> torch.Tensor:
    """A [M, K] · B [N, K]ᵀ with both operands quantised along K under the given settings, in the recipe's mode.
    CUDA operands reuse the layer's device buffers from step to step."""
    if a.is_cuda:
        qa = quantize(a, cfg_a, out=cache.setdefault(key + ".a", QTensorCUDA()), check_finite=recipe.check_finite)
        qb = quantize(b, cfg_b, out=cache.setdefault(key + ".b", QTensorCUDA()), check_finite=recipe.check_finite)
    else:
        qa, qb = quantize(a, cfg_a), quantize(b, cfg_b)
    return product(qa, qb, recipe.mode)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer: "Linear", step: int):
        recipe = layer.recipe
        x2 = x.reshape(-1, x.shape[-1])
        cfg = lambda p, o: recipe.config(p, o, layer=layer.layer_id, step=step)  # noqa: E731
        y = _qmatmul(x2, weight, cfg("fwd_y", "a"), cfg("fwd_y", "b"), recipe, layer._qcache, "fwd_y")
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias.to(x.dtype)
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.step, ctx.has_bias = layer, step, bias is not None
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        layer, step = ctx.layer, ctx.step
        recipe = layer.recipe
        cfg = lambda p, o: recipe.config(p, o, layer=layer.layer_id, step=step)  # noqa: E731
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            # dgrad: dX = dY · W, reduced over out: A = dY [tokens, out], B = Wᵀ [in, out].
            dx = _qmatmul(dy2, weight.t(), cfg("bwd_dx", "a"), cfg("bwd_dx", "b"), recipe, layer._qcache, "bwd_dx")
            dx = dx.to(x.dtype).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            # wgrad: dW = dYᵀ · X, reduced over tokens: A = dYᵀ [out, tokens], B = Xᵀ [in, tokens].
            dw = _qmatmul(dy2.t(), x2.t(), cfg("bwd_dw", "a"), cfg("bwd_dw", "b"), recipe, layer._qcache, "bwd_dw")
            dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None, None


_ids = itertools.count()


class Linear(nn.Linear):
    """``nn.Linear`` whose three training GEMMs run under an fp4lab recipe. Same parameters and state-dict keys
    as ``nn.Linear``; ``recipe="bf16"`` is plain ``F.linear``. ``layer_id`` keys stochastic rounding (``convert``
    numbers the layers of a model in order); ``step`` is the training step, advanced by every forward in
    training mode (``set_step`` sets it for a whole model)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: Any = "ufp4",
                 layer_id: Optional[int] = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = _as_recipe(recipe)
        self.layer_id = next(_ids) if layer_id is None else int(layer_id)
        self.step = 0
        self._qcache: dict = {}

    @classmethod
    def from_linear(cls, lin: nn.Linear, recipe: Any, layer_id: Optional[int] = None) -> "Linear":
        """A Linear sharing ``lin``'s parameters (the same Parameter objects, so optimizers and checkpoints see no
        change)."""
        new = cls(lin.in_features, lin.out_features, lin.bias is not None, recipe=recipe, layer_id=layer_id,
                  device="meta")
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.passthrough:
            return F.linear(x, self.weight, self.bias)
        step = self.step
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
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

    def _check_backward_shapes(self, tokens: int, step: int) -> None:
        """The backward GEMMs reduce over out and tokens: a shape they cannot take is refused before the forward
        GEMM runs, not after it."""
        for p, o, rows, cols in (("bwd_dx", "a", tokens, self.out_features), ("bwd_dx", "b", self.in_features,
                                 self.out_features), ("bwd_dw", "a", self.out_features, tokens),
                                 ("bwd_dw", "b", self.in_features, tokens)):
            try:
                _core.validate(self.recipe.config(p, o, layer=self.layer_id, step=step), rows, cols)
            except ValueError as e:
                raise ValueError(f"{p} operand {o} [{rows}, {cols}]: {e}") from None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}, mode={self.recipe.mode}, layer_id={self.layer_id}"


def convert(model: nn.Module, recipe: Any, *, include: Optional[str] = None, exclude: Optional[str] = None) -> nn.Module:
    """Swaps, in place, every ``nn.Linear`` of ``model`` whose qualified name matches ``include`` (a regex searched
    in the name; default all) and not ``exclude`` for an fp4lab ``Linear`` under ``recipe``, keeping parameters and
    state-dict keys. Layers are numbered 0, 1, 2, … in module order (the SR layer key). Returns the model."""
    r = _as_recipe(recipe)
    inc = re.compile(include) if include else None
    exc = re.compile(exclude) if exclude else None
    targets = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and not isinstance(mod, Linear):
            if (inc is None or inc.search(name)) and not (exc is not None and exc.search(name)):
                targets.append(name)
    if not targets and isinstance(model, nn.Linear):
        raise ValueError("convert() swaps the Linear layers inside a model; wrap a lone Linear with "
                         "Linear.from_linear")
    for i, name in enumerate(targets):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Linear.from_linear(getattr(parent, child), r, layer_id=i))
    return model


def set_step(model: nn.Module, step: int) -> None:
    """Sets the training step (the SR step key) of every fp4lab Linear in ``model``."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.step = int(step)
