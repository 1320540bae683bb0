"""fp4lab.torch.Linear (and Hugging Face's Conv1D): nn.Linear with its three training GEMMs under a recipe. The SR
step, the layer key and the GEMMs' autograd function it shares with the other layers are in _layer.py."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._layer import ID_BITS, ROOT_ID, Stepped, apply_gemm, check_shapes, layer_id_of, shape_fault
from .recipe import whole

__all__ = ["Linear", "Conv1D", "layer_id_of"]


_ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the quantisers read


class Linear(Stepped, nn.Linear):
    """``nn.Linear`` whose three training GEMMs run under an fp4lab recipe. Same parameters as ``nn.Linear``;
    the state dict adds ``_extra_state``, the SR step (a 0-d int64 tensor). ``recipe="bf16"`` is plain
    ``F.linear``. ``layer_id`` keys stochastic rounding: without one it is ``layer_id_of("")`` until ``convert``
    names the layer by its qualified name. ``step`` is the training step, advanced by every forward in training
    mode that records a graph (``set_step`` sets it for a whole model); a forward recomputed by activation
    checkpointing reuses the step of the forward it repeats.

    Args:
        in_features, out_features, bias, device, dtype: as ``nn.Linear``'s.
        recipe: a ``Recipe``, or a preset or ablation name (``Recipe(name)``); "bf16" for plain ``F.linear``.
        layer_id: the SR layer key, an int from 0 to 2**29 - 1 (``layer_id_of(name)``); None for
            ``layer_id_of("")``.

    Raises:
        ValueError: the recipe cannot take in_features or out_features (a block or RHT size that does not divide
        them), named with the pass and operand.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: Any = "ufp4",
                 layer_id: Optional[int] = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_step(recipe)
        # The reduction dimensions in (fwd_y) and out (bwd_dx) are fixed by the layer: sizes the recipe cannot take
        # are refused here, not at the first forward (the token count, bwd_dw's, is checked at each forward).
        fault = None if self.recipe.passthrough else shape_fault(self, self.recipe)
        if fault:
            raise ValueError(f"Linear({in_features}, {out_features}) under {self.recipe!r}: {fault}")
        self._id_given = layer_id is not None
        # The SR stream of an operand is id·8 + pass·2 + operand, a uint32.
        self.layer_id = ROOT_ID if layer_id is None else whole("Linear()", "layer_id", layer_id, 2**ID_BITS)
        self._qcache: dict = {}

    @classmethod
    def from_linear(cls, lin: nn.Linear, recipe: Any, layer_id: Optional[int] = None) -> "Linear":
        """A Linear sharing ``lin``'s parameters (the same Parameter objects, so optimizers see no change).

        Args:
            lin: the ``nn.Linear``.
            recipe, layer_id: as the constructor's.

        Returns:
            The new Linear, in ``lin``'s training mode.
        """
        new = cls(lin.in_features, lin.out_features, lin.bias is not None, recipe=recipe, layer_id=layer_id,
                  device="meta")
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.passthrough:
            return F.linear(x, self.weight, self.bias)
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.in_features:
            return F.linear(x, self.weight, self.bias)  # nn.Linear's own error for an input it cannot take
        if x.is_meta or self.weight.is_meta:
            # Shapes only (a model traced or sized on the meta device): nothing is quantised and no step is taken.
            # The output has the activations' dtype, as on a device.
            return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if not x.is_floating_point():
            return F.linear(x, self.weight, self.bias)  # an integer, bool or complex input: nn.Linear's error
        if x.dtype not in _ACTIVATION_DTYPES and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"{self._label()}: a {x.dtype} input: the quantised GEMMs take float32, bfloat16 or "
                            "float16 activations")
        step, check = self._take_step(torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        if x.numel() == 0 or self.weight.numel() == 0:
            # No tokens, or in or out 0: each GEMM has an empty output or sums over nothing, +0.0 under any recipe
            # (the contract's accumulator starts at +0.0); the bias gradient is dY's column sums, unquantised.
            # F.linear gives all of them, as nn.Linear does.
            return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if check:
            check_shapes(self._label(), self.recipe, self.layer_id, int(step), x.numel() // x.shape[-1],
                          self.in_features, self.out_features)
        return apply_gemm(self, x, self.weight, self.bias, step)

    def _label(self) -> str:
        return self.name if self.name else f"Linear({self.in_features}, {self.out_features})"

    def __getstate__(self):
        state = super().__getstate__()
        state["_qcache"] = {}  # device buffers of the last step: scratch, not state
        return state

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}, mode={self.recipe.mode}, layer_id={self.layer_id}"


class Conv1D(Stepped, nn.Module):
    """Hugging Face's ``Conv1D`` (GPT-2's projections: ``x · weight + bias`` with ``weight`` stored [in, out]) with
    its three training GEMMs under an fp4lab recipe. It computes what an fp4lab ``Linear`` holding ``weight.t()``
    computes, bit for bit, and keeps ``weight`` [in, out] and the state-dict keys (``_extra_state`` added, as
    ``Linear``'s). ``convert`` makes it from a ``transformers.pytorch_utils.Conv1D``, sharing its parameters.

    Args:
        nf: the output features; nx: the input features (``Conv1D(nf, nx)``'s order).
        recipe, layer_id, device, dtype: as ``Linear``'s.
    """

    def __init__(self, nf: int, nx: int, *, recipe: Any = "ufp4", layer_id: Optional[int] = None, device=None,
                 dtype=None):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        self._init_step(recipe)
        fault = None if self.recipe.passthrough else shape_fault(self, self.recipe)
        if fault:
            raise ValueError(f"Conv1D(nf={nf}, nx={nx}) under {self.recipe!r}: {fault}")
        self._id_given = layer_id is not None
        self.layer_id = ROOT_ID if layer_id is None else whole("Conv1D()", "layer_id", layer_id, 2**ID_BITS)
        self._qcache: dict = {}

    # The names shape_fault and the reports read (a Linear's).
    in_features = property(lambda self: self.nx)
    out_features = property(lambda self: self.nf)

    @classmethod
    def from_conv1d(cls, conv: nn.Module, recipe: Any, layer_id: Optional[int] = None) -> "Conv1D":
        """A Conv1D sharing ``conv``'s parameters (the same Parameter objects, so optimizers see no change)."""
        new = cls(conv.nf, conv.nx, recipe=recipe, layer_id=layer_id, device="meta")
        new.weight = conv.weight
        new.bias = conv.bias
        new.train(conv.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x · weight + bias`` ([..., nx] -> [..., nf]) under the recipe: the GEMMs of ``Linear.forward`` with the
        weight ``weight.t()`` [nf, nx] (the same operands, so the same bits)."""
        w = self.weight.t()
        if self.recipe.passthrough or not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.nx \
                or x.is_meta or w.is_meta or not x.is_floating_point():
            # bf16, shapes only, or an input the quantisers cannot take: torch's own result or error, as F.linear
            return F.linear(x, w.to(x.dtype) if x.is_meta else w, self.bias)
        if x.dtype not in _ACTIVATION_DTYPES and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"{self._label()}: a {x.dtype} input: the quantised GEMMs take float32, bfloat16 or "
                            "float16 activations")
        step, check = self._take_step(torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        if x.numel() == 0 or w.numel() == 0:
            return F.linear(x, w.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if check:
            check_shapes(self._label(), self.recipe, self.layer_id, int(step), x.numel() // x.shape[-1], self.nx,
                          self.nf)
        return apply_gemm(self, x, w, self.bias, step)

    def _label(self) -> str:
        return self.name if self.name else f"Conv1D(nf={self.nf}, nx={self.nx})"

    def __getstate__(self):
        state = super().__getstate__()
        state["_qcache"] = {}
        return state

    def extra_repr(self) -> str:
        return (f"nf={self.nf}, nx={self.nx}, recipe={self.recipe.name}, mode={self.recipe.mode}, "
                f"layer_id={self.layer_id}")
