"""fp4lab.torch.Experts: a Hugging Face mixture-of-experts block's experts stored as fused 3-D parameters
(Mixtral's, Qwen2-MoE's: ``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) with each expert's GEMMs under a
recipe; fp4lab.torch.Router: a router module's logits GEMM under a recipe (``convert(..., routers=True)``)."""
from __future__ import annotations

import itertools
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ._layer import ROOT_ID as _ROOT_ID, NamedParts as _NamedParts, Stepped as _Stepped, apply_gemm as _apply, check_shapes as _check_shapes
from ._layer import layer_id_of
from ._quantizers import collective_device
from .recipe import Recipe

__all__ = ["Experts", "Router"]


class _ExpertGemm:
    """One expert's projection (``gate_up_proj`` or ``down_proj`` of expert ``index``), as _LinearFn takes a layer:
    the experts' recipe, the SR id ``layer_id_of("<experts' name>.<proj>.<index>")`` and its own device buffers."""

    def __init__(self, owner: "Experts", proj: str, index: int):
        self.owner, self.proj, self.index, self._qcache = owner, proj, index, {}
        self.named(owner.name)

    def named(self, owner_name: Optional[str]) -> None:
        # Hashed when the experts are named, not at each forward (torch.compile traces no hashlib).
        suffix = f"{self.proj}.{self.index}"
        self.layer_id = layer_id_of(f"{owner_name}.{suffix}" if owner_name else suffix)

    @property
    def recipe(self) -> Recipe:
        return self.owner.recipe

    def _label(self) -> str:
        return f"{self.owner._label()}.{self.proj}.{self.index}"

    def __getstate__(self):
        return {"owner": self.owner, "proj": self.proj, "index": self.index, "layer_id": self.layer_id,
                "_qcache": {}}


class _Rows:
    """sr_shard on an expert's GEMMs: this rank's token rows of the expert are rows ``idx`` of the ``total`` the
    expert gets from the global batch, in the single process's order."""

    def __init__(self, idx: torch.Tensor, total: int):
        self.idx, self.total = idx, total


class _ShardedGemm:
    """An expert's GEMM in one sharded forward: ``gemm`` with its token rows' places in the global batch (what
    sr_shard's quantiser reads as ``_sr_shard``); the backward reads the same object."""

    def __init__(self, gemm: _ExpertGemm, rows: _Rows):
        self.gemm, self._sr_shard = gemm, rows

    owner = property(lambda self: self.gemm.owner)
    recipe = property(lambda self: self.gemm.recipe)
    layer_id = property(lambda self: self.gemm.layer_id)
    _qcache = property(lambda self: self.gemm._qcache)

    def _label(self) -> str:
        return self.gemm._label()


def _global_rows(mask: torch.Tensor, shard) -> list:
    """For each expert, where this rank's token rows (``torch.where(mask[e])``: by top-k slot, then token) are in
    the expert's rows of the global batch, whose tokens are the ranks' in rank order (DDP, FSDP2): one all-gather
    of the [experts, top-k] counts of every rank."""
    rank, world = shard
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() != world:
        raise RuntimeError(f"sr_shard(rank={rank}, world_size={world}) on Experts: the experts' token places come "
                           "from every rank's counts, which needs torch.distributed initialised with that world size")
    local = mask[:-1].sum(dim=-1).to(torch.int64)  # [experts, top-k]: this rank's tokens per expert and slot
    dev = collective_device(None, local)
    counts = [torch.empty_like(local, device=dev) for _ in range(world)]
    torch.distributed.all_gather(counts, local.to(dev))
    # The places are worked out on the host, from counts brought there once (_quantizers.shard_quantizer hands each
    # expert's to its quantiser: the golden one, or the device's with the index copied over).
    counts, local = torch.stack(counts).cpu(), local.cpu()  # [world, experts, top-k]
    per_slot = counts.sum(0)
    slot_base = per_slot.flatten(1).cumsum(1) - per_slot  # rows of the earlier slots, all ranks
    before = counts[:rank].sum(0)  # rows of the earlier ranks in the same slot
    own_base = local.cumsum(1) - local  # this rank's rows of the earlier slots
    out = []
    for e in range(local.shape[0]):
        slot = torch.where(mask[e])[0].cpu()
        idx = torch.arange(slot.numel()) - own_base[e][slot] + slot_base[e][slot] + before[e][slot]
        out.append(_Rows(idx, int(per_slot[e].sum())))
    return out


def experts_fault(mod: nn.Module) -> Optional[str]:
    """Why ``mod`` is not a Hugging Face experts module whose computation ``Experts`` repeats, or None: fused
    ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I] (concatenated gate and up, not transposed, no bias, no
    norm after the experts), an activation ``act_fn`` and the default gate. (Whichever implementation the model's
    config selects, eager or grouped_mm, computes the same function; ``Experts`` computes the eager loop's.)"""
    gu, down = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    if not (isinstance(gu, nn.Parameter) and isinstance(down, nn.Parameter) and gu.dim() == 3 and down.dim() == 3):
        return "no gate_up_proj and down_proj 3-D parameters"
    E, I2, H = gu.shape
    if I2 % 2 or tuple(down.shape) != (E, H, I2 // 2) or getattr(mod, "num_experts", E) != E:
        return f"gate_up_proj {list(gu.shape)} and down_proj {list(down.shape)} are not [E, 2I, H] and [E, H, I]"
    layout = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
              "has_post_expert_norm": False}
    odd = [f"{k}={getattr(mod, k)}" for k, v in layout.items() if getattr(mod, k, v) != v]
    if odd:
        return f"a layout Experts does not compute ({', '.join(odd)})"
    if not callable(getattr(mod, "act_fn", None)):
        return "no act_fn"
    gate = getattr(type(mod), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        return f"{type(mod).__name__} gates with a function of its own"
    return None


class Experts(_NamedParts, _Stepped, nn.Module):
    """The experts of a Hugging Face MoE block (``MixtralExperts``, ``Qwen2MoeExperts``: ``gate_up_proj`` [E, 2I, H],
    ``down_proj`` [E, H, I], the same Parameter objects and state-dict keys, with ``_extra_state``, the SR step) whose
    forward is the transformers eager loop with each expert's two GEMMs under the recipe: expert e's tokens X_e
    give ``act(X_e · gate_eᵀ) * (X_e · up_eᵀ)`` from one GEMM with ``gate_up_proj[e]``, then a GEMM with
    ``down_proj[e]``, as an fp4lab ``Linear`` holding that matrix computes it (any token count: a partial last block
    of bwd_dw is zero-padded), SR keyed by ``layer_id_of("<name>.gate_up_proj.<e>")`` and
    ``layer_id_of("<name>.down_proj.<e>")`` and the module's step (one a training forward). ``convert`` makes it."""

    def __init__(self, experts: nn.Module, recipe: Any):
        super().__init__()
        fault = experts_fault(experts)
        if fault:
            raise ValueError(f"Experts(): {type(experts).__name__}: {fault}")
        self.gate_up_proj = experts.gate_up_proj
        self.down_proj = experts.down_proj
        self.num_experts = experts.gate_up_proj.shape[0]
        self.act_fn = experts.act_fn
        self.kind = type(experts).__name__
        self._init_step(recipe)
        self._id_given = False
        self.train(experts.training)
        self._gemms = [(_ExpertGemm(self, "gate_up_proj", e), _ExpertGemm(self, "down_proj", e))
                       for e in range(self.num_experts)]

    def _named_parts(self):
        return itertools.chain.from_iterable(self.__dict__.get("_gemms", ()))

    def _label(self) -> str:
        return self.name if self.name else f"Experts({self.kind})"

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        final = torch.zeros_like(hidden_states)
        if self.recipe.passthrough or hidden_states.is_meta:
            step, check = None, False
        else:
            step, check = self._take_step(torch.is_grad_enabled() and (
                hidden_states.requires_grad or self.gate_up_proj.requires_grad or self.down_proj.requires_grad))
        with torch.no_grad():
            # Each expert's (top-k slot, token) pairs in the eager loop's order (torch.where of its one-hot mask
            # [top-k, tokens]: slot-major): a stable sort of the positions slot·tokens + token by expert, and the
            # experts' counts read once, so that the loop slices them with no host synchronisation per expert.
            tokens = top_k_index.shape[0]
            flat = top_k_index.t().reshape(-1)
            order = torch.sort(flat, stable=True).indices
            # (index_add_ rather than bincount, which reads its input's maximum on the host first; an index past
            # the experts is counted in a last bin, and refused.)
            E = self.num_experts
            valid = torch.where((flat >= 0) & (flat <= E), flat, E + 1)
            counts = torch.zeros(E + 2, dtype=torch.int64, device=flat.device).index_add_(
                0, valid, torch.ones_like(valid)).tolist()  # the forward's one host read
            if counts.pop():
                raise ValueError(f"{self._label()}: top_k_index holds an expert index outside [0, {E}]")
            starts = [0] + list(itertools.accumulate(counts))
            hit = [e for e, n in enumerate(counts) if n]
        shard = self.__dict__.get("_sr_shard")
        rows = None
        if step is not None and shard is not None:
            with torch.no_grad():
                rows = _global_rows(torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1)
                                    .permute(2, 1, 0), shard)
        if step is not None and self.__dict__.get("_amax_reduce") is not None:
            # reduce_amax: every rank runs every expert's GEMMs in the same order, so that each joins the amax
            # all-reduces of an expert it sends no tokens (its GEMMs then have no rows and give +0.0).
            hit = range(self.num_experts)
        for e in hit:
            if e == self.num_experts:
                continue
            pos = order[starts[e]:starts[e + 1]]
            top_k_pos, token_idx = pos // tokens, pos % tokens
            x = hidden_states[token_idx]
            gu, down = self._gemms[e]
            if rows is not None:
                gu, down = _ShardedGemm(gu, rows[e]), _ShardedGemm(down, rows[e])
            w_gu, w_down = self.gate_up_proj[e], self.down_proj[e]
            if step is None:
                h = nn.functional.linear(x, w_gu)
            else:
                if check and x.shape[0]:  # no tokens (reduce_amax's empty expert): nothing to check
                    _check_shapes(gu._label(), self.recipe, gu.layer_id, int(step), x.shape[0], w_gu.shape[1],
                                  w_gu.shape[0])
                h = _apply(gu, x, w_gu, None, step)
            gate, up = h.chunk(2, dim=-1)
            h = self.act_fn(gate) * up
            if step is None:
                h = nn.functional.linear(h, w_down)
            else:
                if check and h.shape[0]:
                    _check_shapes(down._label(), self.recipe, down.layer_id, int(step), h.shape[0], w_down.shape[1],
                                  w_down.shape[0])
                h = _apply(down, h, w_down, None, step)
            h = h * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, h.to(final.dtype))
        return final

    def extra_repr(self) -> str:
        E, I2, H = self.gate_up_proj.shape
        return (f"{self.kind}: num_experts={E}, hidden={H}, intermediate={I2 // 2}, recipe={self.recipe.name}, "
                f"mode={self.recipe.mode}")


class _RouterGemm(TorchFunctionMode):
    """Inside a router's own forward: its ``F.linear(x, self.weight)`` (the logits) runs under the recipe, through
    ``router``'s GEMM; every other call computes as it did. ``router`` None only counts those calls."""

    def __init__(self, weight: torch.Tensor, router: Optional["Router"], step: Optional[torch.Tensor]):
        super().__init__()
        self.weight, self.router, self.step, self.calls = weight, router, step, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2 and args[1] is self.weight:
            self.calls += 1
            x, bias = args[0], (args[2] if len(args) > 2 else kwargs.get("bias"))
            if self.router is not None and x.numel():
                return _apply(self.router, x, args[1], bias, self.step)
        return func(*args, **kwargs)


def router_fault(mod: nn.Module) -> Optional[str]:
    """Why ``Router`` cannot take this router module, or None: it needs a 2-D ``weight`` [experts, hidden] and no
    submodules, and its forward must compute its logits as one ``F.linear`` with that weight (checked on a probe
    input of 16 tokens), the GEMM Router quantises."""
    w = getattr(mod, "weight", None)
    if not (isinstance(w, nn.Parameter) and w.dim() == 2):
        return "no 2-D weight parameter"
    if any(True for _ in mod.children()):
        return "it holds submodules"
    if w.is_meta:
        return None
    gemm = _RouterGemm(w, None, None)
    try:
        with torch.no_grad(), gemm:
            mod(torch.zeros(16, w.shape[1], dtype=w.dtype, device=w.device))
    except Exception as e:  # noqa: BLE001 - a router that cannot take a plain probe is left, with the reason
        return f"its forward refused a probe input [16, {w.shape[1]}] ({type(e).__name__})"
    if gemm.calls != 1:
        return (f"its forward computes {gemm.calls} F.linear calls with its weight, not one: Router quantises the "
                "logits GEMM F.linear(x, weight)")
    return None


class Router(_Stepped, nn.Module):
    """A Hugging Face MoE router with a forward of its own (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``: logits
    ``F.linear(x, weight)`` with ``weight`` [experts, hidden], then softmax and top-k) whose logits GEMM runs under
    the recipe, as an fp4lab ``Linear`` holding ``weight`` computes it (SR keyed by ``layer_id_of(<name>)`` and the
    step); everything else is the router's own forward, run as it is. The same ``weight`` Parameter (and the
    router's other parameters and buffers) under the same state-dict keys, with ``_extra_state``, the SR step.
    ``convert(..., routers=True)`` makes it; by default routers stay in high precision (docs/python.md)."""

    def __init__(self, router: nn.Module, recipe: Any):
        super().__init__()
        fault = router_fault(router)
        if fault:
            raise ValueError(f"Router(): {type(router).__name__}: {fault}")
        for n, p in router.named_parameters(recurse=False):
            self.register_parameter(n, p)
        for n, b in router.named_buffers(recurse=False):
            self.register_buffer(n, b, persistent=n not in router._non_persistent_buffers_set)
        # The attributes its forward reads (top_k, num_experts, hidden_dim, norm_topk_prob, ...).
        for k, v in vars(router).items():
            if not k.startswith("_") and k != "training":
                self.__dict__[k] = v
        self.router_class = type(router)
        self.kind = type(router).__name__
        self._init_step(recipe)
        self._id_given = False
        self.layer_id = _ROOT_ID
        self._qcache: dict = {}
        self.train(router.training)

    # The names _shape_fault and the reports read (a Linear's).
    in_features = property(lambda self: self.weight.shape[1])
    out_features = property(lambda self: self.weight.shape[0])

    def _label(self) -> str:
        return self.name if self.name else f"Router({self.kind})"

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        x = hidden_states
        if self.recipe.passthrough or x.is_meta or self.weight.is_meta:
            return self.router_class.forward(self, hidden_states, *args, **kwargs)
        step, check = self._take_step(torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        if check:
            _check_shapes(self._label(), self.recipe, self.layer_id, int(step), x.numel() // x.shape[-1],
                          self.in_features, self.out_features)
        gemm = _RouterGemm(self.weight, self, step)
        with gemm:
            out = self.router_class.forward(self, hidden_states, *args, **kwargs)
        if gemm.calls != 1:
            raise RuntimeError(f"{self._label()}: its forward computed {gemm.calls} F.linear calls with its weight, "
                               "not the one logits GEMM Router quantises")
        return out

    def __getstate__(self):
        state = super().__getstate__()
        state["_qcache"] = {}
        return state

    def extra_repr(self) -> str:
        return (f"{self.kind}: experts={self.out_features}, hidden={self.in_features}, recipe={self.recipe.name}, "
                f"mode={self.recipe.mode}, layer_id={self.layer_id}")
