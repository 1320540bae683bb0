"""What the layers of fp4lab.torch share (Linear and Conv1D, the attention's in-projections, MoE experts and
routers): the autograd function of the three training GEMMs, the SR layer key and step (``Stepped``), the shape and
CUDA-graph checks, and reading a step from a state dict. Below the layers, so that each imports it and none imports
another's internals."""
from __future__ import annotations

import hashlib
import itertools
import operator
import sys
from typing import Any, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from fp4lab import _core
from fp4lab._files import DataError

from .ops import INSTANCE_MARK, check_finite_once, column_sum, fast_pair, qmatmul, sum_columns, take_step
from .recipe import Recipe, as_recipe, whole

__all__ = ["ID_BITS", "ROOT_ID", "layer_id_of", "in_backward", "shape_fault", "check_shapes",
           "check_capture", "apply_gemm", "step_of_state", "Stepped"]


class _LinearFn(torch.autograd.Function):
    """x · weightᵀ + bias with the three training GEMMs under a recipe. Its arguments besides the tensors are
    constants (the recipe, the SR layer key, the label of faults) and the eager-mode CUDA buffers, so torch.compile
    traces it, forward and backward, into one graph."""

    @staticmethod
    def forward(ctx, x, weight, bias, step, recipe: Recipe, layer: int, label: str, cache: Optional[dict], owner,
                grad: bool):
        x2 = x.reshape(-1, x.shape[-1])
        # In fast mode each tensor two GEMMs take is read once for both (fast_pair): X now for the forward and,
        # kept in place of X, Xᵀ for the weight gradient; W and Wᵀ for the input gradient likewise. ``grad``: the
        # caller's grad mode (needs_input_grad says only what requires grad), so that no backward operand is
        # quantised under torch.no_grad().
        need_dx, need_dw = grad and ctx.needs_input_grad[0], grad and ctx.needs_input_grad[1]
        ctx.recipe, ctx.layer, ctx.label, ctx.cache, ctx.has_bias = recipe, layer, label, cache, bias is not None
        ctx.owner = owner
        px = pw = None
        if need_dw:
            px = fast_pair(x2, step, recipe, layer, ("fwd_y", "a"), ("bwd_dw", "b"), label, cache, owner)
        if need_dx:
            pw = fast_pair(weight, step, recipe, layer, ("fwd_y", "b"), ("bwd_dx", "b"), label, cache, owner)
        y = qmatmul(x2, weight, step, recipe, layer, "fwd_y", label, cache, owner, x.dtype,
                    pre=(px[0] if px else None, pw[0] if pw else None))
        y = y.to(x.dtype)
        if bias is not None:
            y = y + bias.to(x.dtype)
        # fast_pair's second operands, (values, bounds) each.
        ctx.save_for_backward(None if px else x, weight, step, *(px[1] if px else (None, None)),
                              *(pw[1] if pw else (None, None)))
        ctx.pre = (px is not None, pw is not None)
        ctx.x_meta = (x.shape, x.dtype) if px else None  # X itself is not kept then
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            # create_graph=True: the quantised GEMMs have no derivative of their own, and a graph through this
            # backward would silently lack the quantisers' part.
            raise RuntimeError(f"{ctx.label}: double backward (create_graph=True) through an fp4lab Linear "
                               "is not supported")
        x, weight, step, xt, bxt, wt, bwt = ctx.saved_tensors  # forward's fast_pair operands (x is then None)
        xt = (xt, bxt) if ctx.pre[0] else None
        wt = (wt, bwt) if ctx.pre[1] else None
        recipe, layer, label, cache, owner = ctx.recipe, ctx.layer, ctx.label, ctx.cache, ctx.owner
        x_shape, x_dtype = ctx.x_meta if x is None else (x.shape, x.dtype)
        x2 = None if x is None else x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        pdy = None
        if need_dx and need_dw:
            pdy = fast_pair(dy2, step, recipe, layer, ("bwd_dx", "a"), ("bwd_dw", "a"), label, cache, owner)
        dx = dw = db = None
        if need_dx:
            # dgrad: dX = dY · W, reduced over out: A = dY [tokens, out], B = Wᵀ [in, out].
            dx = qmatmul(dy2, weight.t(), step, recipe, layer, "bwd_dx", label, cache, owner, x_dtype,
                         pre=(pdy[0] if pdy else None, wt))
            dx = dx.to(x_dtype).reshape(x_shape)
        if need_dw:
            # wgrad: dW = dYᵀ · X, reduced over tokens: A = dYᵀ [out, tokens], B = Xᵀ [in, tokens].
            dw = qmatmul(dy2.t(), None if x2 is None else x2.t(), step, recipe, layer, "bwd_dw", label, cache, owner,
                         weight.dtype, pre=(pdy[1] if pdy else None, xt))
            dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # Eager layers (a cache) sum directly: the operator's dispatch alone costs more host time than the sum.
            db = sum_columns(dy2) if cache is not None else column_sum(dy2)
        return dx, dw, db, None, None, None, None, None, None, None


ID_BITS = 29  # the SR stream of an operand is id·8 + pass·2 + operand, a uint32


def layer_id_of(name: str) -> int:
    """The SR layer key of the layer at qualified name ``name`` within the module ``convert`` was given: the top
    29 bits of SHA-256 of the UTF-8 name (big-endian), so the same model draws the same bits wherever and however
    often it is built, and two layers of one model differ unless their names collide.

    Args:
        name: the layer's qualified name (``model.named_modules()``'s), "" for a layer on its own.

    Returns:
        The layer id, an int from 0 to 2**29 - 1 (``Linear(layer_id=...)`` takes it).
    """
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "big") >> (32 - ID_BITS)


ROOT_ID = layer_id_of("")  # a layer on its own is the root of its model


def in_backward() -> bool:
    # A forward run while the autograd engine executes a backward is an activation-checkpoint recomputation
    # (torch.utils.checkpoint, reentrant or not).
    return torch._C._current_graph_task_id() != -1


# torch.utils.checkpoint's machinery, by which a forward finds the checkpointed regions it runs in: the Python frames
# of its functions (the reentrant checkpoint's forward and backward, the non-reentrant checkpoint() call and its
# unpack hook, which recomputes) and the saved-tensor hooks on top (the non-reentrant checkpoint without a frame of
# its own: the composable API). Where this torch lays them out otherwise, a forward keys as if it were not
# checkpointed and a recomputation reuses the layer's last step.
try:
    import inspect as _inspect

    import torch.utils.checkpoint as _tc
    _REGION_CODES = {
        _tc.CheckpointFunction.forward.__code__: ("ctx", False),
        _tc.CheckpointFunction.backward.__code__: ("ctx", True),
        _inspect.unwrap(_tc.checkpoint).__code__: ("gen", False),
        next(c for c in _tc._checkpoint_hook.__init__.__code__.co_consts
             if getattr(c, "co_name", "") == "unpack_hook"): ("frame", True),
    }
    _top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
except (ImportError, AttributeError, StopIteration):  # pragma: no cover - another torch
    _REGION_CODES, _top_hooks = {}, None


def _free_var(fn, name: str):
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    if code is None or name not in code.co_freevars:
        return None
    return cells[code.co_freevars.index(name)].cell_contents


def _checkpoint_regions(training: bool) -> list:
    """The torch.utils.checkpoint regions this forward runs in, innermost first: (region, recomputing, trains) each.
    ``region`` lives as long as the region can be recomputed (the reentrant checkpoint's autograd node, the
    non-reentrant checkpoint's frame); ``recomputing``: this forward runs in the region's recomputation;
    ``trains``: a reentrant checkpoint's forward (run without a graph) whose region will be recomputed with one.
    Empty, at the cost of three calls, for a forward in no region."""
    if _top_hooks is None:
        return []
    hooks = _top_hooks(True)
    if hooks is None and torch._C._current_graph_task_id() == -1 and (torch.is_grad_enabled() or not training):
        return []  # no saved-tensor hooks (a non-reentrant region's), no backward, no reentrant forward to look for
    regions: list = []
    f = sys._getframe(1)
    while f is not None:
        what = _REGION_CODES.get(f.f_code)
        if what is not None:
            name, recomputing = what
            region = f.f_locals.get(name)
            if name == "gen":  # checkpoint(use_reentrant=False) runs the function while its generator waits
                frame = getattr(region, "gi_frame", None)
                region = frame.f_locals.get("new_frame") if frame is not None else None
            if region is not None:
                trains = name == "ctx" and not recomputing and any(region.needs_input_grad)
                regions.append((region, recomputing, trains))
        f = f.f_back
    if hooks is not None:  # a non-reentrant region with no frame on the stack (the composable checkpoint API)
        pack = _inspect.unwrap(hooks[0])
        qualname = getattr(pack, "__qualname__", "")
        if qualname.startswith("_checkpoint_hook."):
            region, recomputing = _free_var(pack, "frame"), False
        elif qualname.startswith("_recomputation_hook."):
            ref = _free_var(pack, "target_frame_ref")
            region, recomputing = (ref() if ref is not None else None), True
        else:
            region = None
        if region is not None and all(r is not region for r, _, _ in regions):
            regions.insert(0, (region, recomputing, False))
    return regions


def _log_of(region, layer) -> list:
    """The steps ``layer``'s calls took in ``region``'s forward, with the recomputation reading them (its graph task
    and how many it has read): kept on the region, so they go when it goes."""
    logs = getattr(region, "_fp4lab_steps", None)
    if logs is None:
        logs = region._fp4lab_steps = {}
    return logs.setdefault(layer, [[], None, 0])


def shape_fault(lin: nn.Linear, r: Recipe) -> Optional[str]:
    """Why the recipe cannot take this layer's weight and reduction dimensions in and out, or None. (The token count,
    the third reduction dimension, is checked at each forward.)

    Args:
        lin: the layer, or anything with its ``in_features`` and ``out_features``.
        r: the recipe it would run under.

    Returns:
        The fault, one line naming the pass, the operand and its shape; None where every GEMM can take the layer.
    """
    if lin.in_features == 0 or lin.out_features == 0:
        return None  # each GEMM is empty or sums over nothing, +0.0 under any recipe: forward gives F.linear's
    t = 512  # a token count every block, tile and RHT size divides: only the weight's dimensions are on trial
    for p, o, rows, cols in (("fwd_y", "a", t, lin.in_features), ("fwd_y", "b", lin.out_features, lin.in_features),
                             ("bwd_dx", "a", t, lin.out_features), ("bwd_dx", "b", lin.in_features, lin.out_features)):
        try:
            _core.validate(r.config(p, o, layer=0, step=0), rows, cols)
        except ValueError as e:
            return f"{p} operand {o} [{'tokens' if rows == t else rows}, {cols}]: {e}"
    return None


def check_shapes(label: str, recipe: Recipe, layer: int, step: int, tokens: int, in_f: int, out_f: int) -> None:
    """The backward GEMMs reduce over out and tokens: a shape they cannot take is refused before the forward GEMM
    runs, not after it. (bwd_dw takes any token count: the partial last block is zero-padded.)

    Args:
        label: the layer's name, which the error starts with.
        recipe, layer, step: the recipe, SR layer id and step of the forward.
        tokens, in_f, out_f: the forward's token rows and the layer's in and out features.

    Raises:
        ValueError: one line naming the layer, the pass, the operand and its shape.
    """
    kp = tokens + -tokens % recipe.k_multiple["bwd_dw"]
    for p, o, rows, cols in (("bwd_dx", "a", tokens, out_f), ("bwd_dx", "b", in_f, out_f),
                             ("bwd_dw", "a", out_f, kp), ("bwd_dw", "b", in_f, kp)):
        try:
            _core.validate(recipe.config(p, o, layer=layer, step=step), rows, cols)
        except ValueError as e:
            raise ValueError(f"{label}: {p} operand {o} [{rows}, {cols}]: {e}") from None


def check_capture(gemm, owner, device: torch.device, step: int) -> None:
    """What a forward captured in a CUDA graph needs: the SR key's device buffer, made by an eager step; a deferred
    finite check (a synchronising one cannot be captured); and one training step per layer in the graph, since a
    replay reads one key per layer (a recomputed forward repeats its step and is allowed)."""
    label = gemm._label()
    if owner.__dict__.get("_seed_dev") is None or owner._seed_dev.device != device:
        raise RuntimeError(f"{label}: run a step on {device} before capturing one in a CUDA graph (the captured "
                           "kernels read the SR key from a device buffer made then)")
    if gemm.recipe.check_finite != "deferred":
        raise RuntimeError(f"{label}: a recipe with check_finite='sync' synchronises at every operand and cannot be "
                           "captured in a CUDA graph (use the default, 'deferred')")
    first = owner.__dict__.get("_capture_step")
    if first is None:
        owner._capture_step = step
    elif first != step:
        raise RuntimeError(f"{label}: a second training step ({first}, then {step}) of this layer in one captured "
                           "CUDA graph: a replay reads one SR key per layer (capture one forward per layer per step; "
                           "call set_step before capturing again)")


def apply_gemm(gemm, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
           step: torch.Tensor) -> torch.Tensor:
    """x · weightᵀ + bias under ``gemm``'s recipe and SR key (an fp4lab Linear, or an attention projection).

    Args:
        gemm: the layer (its ``recipe``, ``layer_id``, ``_label()`` and device buffers; ``owner``, where it has one,
            is the module whose step this is).
        x: the input [..., in]; weight: [out, in]; bias: [out] or None.
        step: the SR step, a 0-d int64 tensor (``Stepped._take_step``'s).

    Returns:
        The output [..., out] in the activation dtype (the autocast dtype under autocast).
    """
    # Under torch.compile the CUDA operands go through the operators rather than the layer's device buffers.
    # In eager mode the GEMM's own object also goes along, for the numerics monitors and sr_shard.
    eager = not torch.compiler.is_compiling()
    if not eager and (getattr(getattr(gemm, "owner", gemm), "_amax_reduce", None) is not None
                      or getattr(gemm, "_sr_shard", None) is not None):
        # reduce_amax and sr_shard work on the operands in eager mode: the GEMM leaves the graph (a graph break;
        # fullgraph=True refuses it) rather than running without them.
        return _apply_eager(gemm, x, weight, bias, step)
    if eager and x.is_cuda:
        owner = getattr(gemm, "owner", gemm)  # the module whose step this is (an attention for its projections)
        if torch.cuda.is_current_stream_capturing():
            check_capture(gemm, owner, x.device, int(step))
        else:
            owner._device_seed(x.device)
            if gemm.recipe.check_finite == "deferred":
                check_finite_once(int(step), gemm)  # the flag as copied at an earlier step, read without waiting
    label = gemm._label()
    if not eager:
        # The module's instance number rides on the label (ops.py shows what precedes the mark): the operators tell
        # a step no forward of this module took (activation checkpointing in a compiled graph) from another
        # module's of the same name, such as a copy's.
        label = f"{label}{INSTANCE_MARK}{getattr(gemm, 'owner', gemm)._instance}"
    args = (step, gemm.recipe, gemm.layer_id, label, gemm._qcache if eager else None, gemm if eager else None,
            torch.is_grad_enabled())
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        # As F.linear under autocast: the operands are cast to the autocast dtype first (FP32 master weights
        # reach the quantiser as the BF16 copy autocast would give cuBLAS), and the output has that dtype.
        dt = torch.get_autocast_dtype(dev)
        x, weight = x.to(dt), weight.to(dt)
        bias = None if bias is None else bias.to(dt)
        with torch.autocast(dev, enabled=False):
            return _LinearFn.apply(x, weight, bias, *args)
    return _LinearFn.apply(x, weight, bias, *args)


_apply_eager = torch._dynamo.disable(apply_gemm, reason="fp4lab reduce_amax / sr_shard run in eager mode")


_instances = itertools.count()

# The 0-d int64 tensors forwards return as their step, one per value: every layer of a training step takes the same
# step, and the tensor is only read (saved for the backward, passed to the operators).
_step_tensors: dict = {}


def _step_tensor(step: int) -> torch.Tensor:
    if _current_dispatch_mode() is not None:  # a fake or traced tensor would be no tensor to keep
        return torch.tensor(step, dtype=torch.int64, device="cpu")
    t = _step_tensors.get(step)
    if t is None:
        if len(_step_tensors) > 256:
            _step_tensors.clear()
        # A normal tensor whatever mode the first forward at this step ran in: one made under inference_mode
        # could not be saved for a training forward's backward.
        with torch.inference_mode(False):
            t = _step_tensors[step] = torch.tensor(step, dtype=torch.int64, device="cpu")
    return t


def step_of_state(key: str, state: Any) -> int:
    """The SR step a state dict's ``key`` holds (what get_extra_state writes: a 0-d int64 tensor; any 0-d integer
    tensor or int from 0 to 2**63 - 1 is taken), or a one-line DataError naming the key: a float, a bool or a
    tensor of another shape is no step, and truncating it would key a resumed run by another step silently.

    Args:
        key: the state dict's key, which the error names.
        state: its value.

    Returns:
        The step, an int from 0 to 2**63 - 1.

    Raises:
        DataError: the value is no step.
    """
    what = f"{type(state).__name__} {state!r}"[:80]
    step = None
    if isinstance(state, torch.Tensor):
        what = "a meta tensor (no value)" if state.is_meta else f"a {tuple(state.shape)} {state.dtype} tensor"
        if state.dim() == 0 and not (state.is_floating_point() or state.is_complex() or state.dtype == torch.bool
                                     or state.is_meta):
            step = int(state)
    elif not isinstance(state, (bool, np.bool_)):
        try:
            step = operator.index(state)  # an int, or a numpy integer
        except TypeError:
            pass
    if step is not None and 0 <= step < 2**63:
        return step
    if step is not None:
        what = f"{step}, out of range"
    raise DataError(f"{key}: not an SR step (a 0-d integer tensor from 0 to 2**63 - 1), but {what}")


class NamedParts:
    """A module of several GEMMs whose SR keys follow its qualified name: naming it renames each part (the objects
    ``_named_parts()`` yields, each with a ``named(owner_name)``), which hashes its key then, not at each forward
    (torch.compile traces no hashlib)."""

    def _named_parts(self):
        raise NotImplementedError

    @property
    def name(self) -> Optional[str]:
        """The qualified name convert found it at (error messages, and its GEMMs' SR keys)."""
        return self.__dict__.get("_name")

    @name.setter
    def name(self, value: Optional[str]) -> None:
        self.__dict__["_name"] = value
        for part in self._named_parts():
            part.named(value)


class Stepped(nn.Module):
    """The SR step of a module that runs GEMMs under a recipe: advanced by every forward in training mode that
    records a graph, repeated by an activation-checkpoint recomputation, and saved in the state dict."""

    # Found by plain attribute lookup, as the launch path asks each GEMM (getattr(m, "owner", m), "_sr_shard",
    # "_amax_reduce"): a name nn.Module.__getattr__ has to refuse raises AttributeError, several µs of host time,
    # thirteen times a layer and step in fast mode. The module is its own owner (the module whose step its GEMMs
    # take); fp4lab.torch.sr_shard and reduce_amax set the other two on the instance.
    owner = property(lambda self: self)
    _sr_shard = None
    _amax_reduce = None

    def _init_step(self, recipe: Any) -> None:
        self.recipe = as_recipe(recipe)
        self.name: Optional[str] = None  # the qualified name convert found it at (error messages)
        # The step lives in a 0-d CPU tensor, which a compiled graph reads and advances in place: a Python int
        # would be a constant of the graph, and each new step a recompilation. Not a buffer, so it stays on the
        # CPU when the model moves (reading it costs no device synchronisation); the state dict carries it as
        # _extra_state.
        self._step = torch.zeros((), dtype=torch.int64)
        # The step of the last forward outside a backward (a recomputation repeats it), and whether it advanced.
        self._last_step, self._last_advanced = 0, False
        self._instance = next(_instances)  # a copy gets its own (__setstate__)

    @property
    def step(self) -> int:
        """The training step: the SR step key of the next forward."""
        return int(self._step)

    @step.setter
    def step(self, value: int) -> None:
        self._step.fill_(whole("step", "step", value, 2**63))  # an int64 tensor

    def _device_seed(self, device: torch.device) -> torch.Tensor:
        """The SR seed of the step on the device (made at the first CUDA forward, or again after the module moved):
        the seed kernels captured in a CUDA graph read at each replay. set_step() writes each step's there."""
        t = self.__dict__.get("_seed_dev")
        if t is None or t.device != device:
            t = self._seed_dev = torch.empty(1, dtype=torch.int64, device=device)
            self._write_device_seed()
        return t

    def _write_device_seed(self) -> None:
        self._capture_step = None  # a new capture may take any step
        t = self.__dict__.get("_seed_dev")
        if t is not None and not self.recipe.passthrough:
            s = _core.training_seed(self.recipe.seed, self.step)
            t.fill_(s - 2**64 if s >= 2**63 else s)  # the uint64's bits in an int64

    def _take_step(self, records: bool) -> Tuple[torch.Tensor, bool]:
        """The step this forward quantises with (a 0-d int64 tensor), and whether it is a forward outside a backward
        that records a graph (whose shapes are checked).

        Each forward that trains takes the step and advances it, so a layer called twice in a training step keys
        its two calls by two steps. Each call in a checkpointed region logs its step on the region (and on every
        region around it), and the region's recomputation takes them again in call order: a recomputed call draws
        its original's bits however often the layer runs in the region, in whatever order regions are recomputed,
        nested or not."""
        if torch.compiler.is_compiling():
            # In a compiled graph: no activation-checkpoint bookkeeping, and the backward GEMMs' shapes are
            # checked where they run.
            return take_step(self._step, records and self.training), False
        regions = _checkpoint_regions(self.training)
        replay = next((i for i, r in enumerate(regions) if r[1]), None)  # the innermost region being recomputed
        inside_backward = in_backward()
        if replay is not None:
            log = _log_of(regions[replay][0], self)
            if log[0]:
                task = torch._C._current_graph_task_id()
                if log[1] != task:  # a recomputation in another backward (a retained graph) starts at the first call
                    log[1], log[2] = task, 0
                step = log[0][log[2] % len(log[0])]
                log[2] += 1
            else:
                step = self._last_step  # a region whose forward logged nothing of this layer
        elif inside_backward:
            # A forward in a backward outside any region found: it repeats the last forward's step, and a reentrant
            # recomputation whose original ran without a graph advances the step now, once.
            step = self._last_step
            if records and self.training and not self._last_advanced:
                self.step, self._last_advanced = step + 1, True
        if replay is not None or inside_backward:
            for region, _, _ in regions[:replay]:  # regions the recomputation enters anew log what it takes
                _log_of(region, self)[0].append(step)
            return _step_tensor(step), False
        records = records or any(r[2] for r in regions)  # a reentrant forward runs without a graph, its recomputation
        step = int(self._step)
        advanced = records and self.training
        # Plain attributes, set past nn.Module.__setattr__'s checks (a forward's host time bounds eager steps).
        self.__dict__.update(_last_step=step, _last_advanced=advanced)
        if advanced:
            self.step = step + 1
        for region, _, _ in regions:
            _log_of(region, self)[0].append(step)
        return _step_tensor(step), records

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_seed_dev", None)  # made again on the device at the next CUDA forward
        state.pop("_capture_step", None)
        return state

    def __setstate__(self, state):
        state["_instance"] = next(_instances)
        if "_step" not in state:  # pickled when the step was a Python int
            state["_step"] = torch.tensor(state.pop("step", 0), dtype=torch.int64)
        super().__setstate__(state)

    # The SR step travels in the state dict, so a resumed run continues with the keys it stopped at.
    def get_extra_state(self) -> torch.Tensor:
        return torch.tensor(self.step, dtype=torch.int64)

    def set_extra_state(self, state) -> None:
        self.step = self._last_step = step_of_state("_extra_state", state)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if prefix + "_extra_state" in state_dict:  # a foreign value is refused by its key, before anything loads here
            step_of_state(prefix + "_extra_state", state_dict[prefix + "_extra_state"])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # A checkpoint of the torch module, or from before the step was saved, has no step: it loads (strict or
        # not) and leaves the step as it is.
        key = prefix + "_extra_state"
        if key not in state_dict and key in missing_keys:
            missing_keys.remove(key)
