"""convert: an existing model's linear layers and attention under a recipe, with a report of what it did;
set_step: the SR step of a whole model."""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, Dict, Optional

from torch import nn
from torch.nn.utils import parametrize

from .attention import MultiheadAttention
from .moe import Experts, Router, experts_fault, router_fault
from fp4lab._files import DataError, UsageError, compile_regex

from ._layer import Stepped as _Stepped, layer_id_of, shape_fault as _shape_fault, step_of_state as _step_of_state
from .linear import Conv1D, Linear
from .recipe import Recipe, as_recipe as _as_recipe, whole as _whole

__all__ = ["convert", "ConvertReport", "ConvertEntry", "set_step", "export_state_dict"]


@dataclasses.dataclass(frozen=True)
class ConvertEntry:
    """One module ``convert`` considered: ``action`` is "converted", "recipe changed", "unchanged" (already an
    fp4lab module under this recipe), "left" (it computes as before, with a weight matrix a GEMM reads), "kept" (a
    MoE router kept in high precision by choice: ``convert(..., routers=True)`` converts it), "no matmul"
    (it holds a weight matrix that no GEMM of its own reads: an embedding table) or "fused path off", and ``reason``
    says why."""
    name: str
    kind: str
    action: str
    reason: str = ""


class ConvertReport(list):
    """What ``convert`` did, one ``ConvertEntry`` per linear module (``nn.Linear``, Hugging Face ``Conv1D``), per
    ``nn.MultiheadAttention``, per fused 3-D MoE experts module and per MoE router, in module order; then one per
    other module holding a parameter of two or more dimensions (embeddings, convolutions: each left or "no matmul",
    with the reason); then one per
    transformer module whose fused inference path it turned off. Every parameter of two or more dimensions belongs to
    a module of the report. ``str()`` gives one line per entry."""

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


# Transformer Engine (Megatron's MoE router) and torchao's MoE training keep the router in high precision.
_ROUTER_REASON = ("a MoE router, kept in high precision as Transformer Engine and torchao keep routers: 4-bit "
                  "logits move tokens between experts (a changed top-k choice, not a small error); "
                  "convert(..., routers=True) converts it")
_ROUTER_NAMES = ("gate", "router")


def _routers(mods: Dict[int, nn.Module]) -> set:
    """ids of the routers of the model's MoE blocks: a module holding an ``experts`` child, its children (other
    than the experts) named like a gate or router, or of a router class, that hold a 2-D ``weight``: Mixtral's and
    Qwen2-MoE's ``gate`` (a TopKRouter, or an nn.Linear in older models) and Qwen2-MoE's ``shared_expert_gate``."""
    out = set()
    for mod in mods.values():
        if "experts" not in mod._modules:
            continue
        for child_name, child in mod.named_children():
            w = getattr(child, "weight", None)
            if child_name == "experts" or not (isinstance(w, nn.Parameter) and w.dim() == 2):
                continue
            if any(k in child_name.lower() for k in _ROUTER_NAMES) or "router" in type(child).__name__.lower():
                out.add(id(child))
    return out


_FAST_PATH_REASON = ("its fused inference path (eval mode, no grad) computes with the weights directly, past the "
                     "converted layers; turned off for this module")


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _hf_conv1d():
    """transformers' Conv1D class where transformers is loaded (a model holding one has loaded it), else None."""
    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def _dropped_by_swap(mod: nn.Module, base: type) -> Optional[str]:
    """What a swap for an fp4lab module would silently drop from this ``base`` (nn.Linear or Conv1D) module, or None:
    a forward of its own (a subclass), a parametrized weight or bias (computed on access, not the parameters the swap
    shares), or hooks (they belong to the module object the swap replaces)."""
    if type(mod).forward is not base.forward:
        return f"{type(mod).__name__} has a forward of its own, which an fp4lab module would not compute"
    if parametrize.is_parametrized(mod):
        return "its weight or bias is parametrized (torch.nn.utils.parametrize), which an fp4lab module would drop"
    hooks = [h[1:] for h in _HOOKS if getattr(mod, h, None)]
    if hooks:
        return f"it has hooks ({', '.join(hooks)}) that would stay on the replaced module"
    return None


def _no_fused_path(module, args):
    """A forward pre-hook that does nothing: nn.TransformerEncoderLayer takes its fused inference path only on a
    module without hooks."""
    return None


def _set_recipe(report, name: str, kind: str, mod, r: Recipe) -> bool:
    """An already converted module under recipe ``r``: reported unchanged, or given ``r``; True when it changed."""
    if mod.recipe == r:
        report.append(ConvertEntry(name, kind, "unchanged", f"already under {r!r}"))
        return False
    report.append(ConvertEntry(name, kind, "recipe changed", f"was {mod.recipe!r}, now {r!r}"))
    mod.recipe = r
    return True


def convert(model: nn.Module, recipe: Any, *, include: Optional[str] = None, exclude: Optional[str] = None,
            routers: bool = False) -> nn.Module:
    """Swaps, in place, every ``nn.Linear`` of ``model`` whose qualified name matches ``include`` (a regex searched
    in the name; default all) and not ``exclude`` for an fp4lab ``Linear`` under ``recipe``, sharing its parameters
    and keeping its state-dict keys, every matching ``transformers`` ``Conv1D`` for an fp4lab ``Conv1D``, and every
    matching ``nn.MultiheadAttention`` for an fp4lab
    ``MultiheadAttention`` (it reads its projection weights directly, so its ``out_proj`` goes with it); an fp4lab
    module already there takes the new recipe (its step and layer id stay). Each converted layer's SR key is
    ``layer_id_of(its qualified name in model)``.

    Left as they are, with the reason in the report: modules whose dimensions the recipe cannot quantise, a module
    reachable under two names, an attention with ``add_bias_kv`` or ``add_zero_attn``, and an ``nn.Linear`` the swap
    would change: a subclass with a forward of its own, a parametrized weight or bias, or one with hooks. Hugging
    Face MoE experts stored as fused 3-D parameters (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) become an
    fp4lab ``Experts`` (each expert's GEMMs under the recipe), or are left with the reason. Every other module
    holding a parameter of two or more dimensions (embeddings, convolutions) is in the report too, with the reason
    it is not converted.

    MoE routers (the ``gate``/``router`` children of a module holding ``experts``: Mixtral's and Qwen2-MoE's
    TopKRouter, Qwen2-MoE's ``shared_expert_gate``) are kept in high precision by default, as Transformer Engine and
    torchao keep them (4-bit logits change which experts a token reaches), reported "kept" with that reason.
    ``routers=True`` converts them: an ``nn.Linear`` router as any ``nn.Linear``, a router with a forward of its own
    as an fp4lab ``Router`` (its logits GEMM ``F.linear(x, weight)`` under the recipe, the rest of its forward as it
    is), or left with the reason (a router whose forward is not one such GEMM, dimensions the recipe cannot take).
    A pattern that
    is no regular expression, or that matches no module name, raises a one-line ValueError (UsageError) naming
    ``include`` or ``exclude``, before anything changes. The fused inference path of
    ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder``, which would compute past the converted modules, is
    turned off for the modules that hold one.

    Returns ``model`` (or, for a lone ``nn.Linear`` or attention, the fp4lab module that replaces it) with the
    ``ConvertReport`` as its attribute ``fp4lab_report``; the report is also logged (logger "fp4lab.torch")."""
    r = _as_recipe(recipe)
    inc = compile_regex(include, "convert(): include") if include is not None else None
    exc = compile_regex(exclude, "convert(): exclude") if exclude is not None else None
    matches = lambda n: (inc is None or inc.search(n)) and not (exc is not None and exc.search(n))  # noqa: E731
    names: Dict[int, list] = {}
    mods: Dict[int, nn.Module] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        names.setdefault(id(mod), []).append(name)
        mods[id(mod)] = mod
    # A pattern that matches no module name is a typo or a stale name, not a request to convert nothing (or all).
    for opt, rx in (("include", inc), ("exclude", exc)):
        if rx is not None and not any(rx.search(n) for ns in names.values() for n in ns):
            raise UsageError(f"convert(): {opt} {rx.pattern!r} matches no module of the model")
    conv1d = _hf_conv1d()
    param_owners: Dict[int, list] = {}  # a parameter tied to another module (a tied head) is noted in the report
    for name, prm in model.named_parameters(remove_duplicate=False):
        param_owners.setdefault(id(prm), []).append(name)
    report = ConvertReport()
    fused = []  # modules with an inference path of their own that bypasses the layers inside them
    swaps = []  # (module name, new Linear)
    attention_swaps = []  # (module name, new MultiheadAttention)
    experts_swaps = []  # (module name, new Experts)
    ids_only = []  # (module name, Linear) in place already: an attention's out_proj
    attention: Dict[int, str] = {}  # id of an attention's out_proj -> why it is left, or "" (converted with it)
    used_ids = {m.layer_id for m in mods.values() if isinstance(m, (Linear, Router)) and m._id_given}
    router_ids = _routers(mods)
    for key, mod in mods.items():
        ns = names[key]
        kind = type(mod).__name__
        if key in router_ids and not isinstance(mod, (Linear, Conv1D, Router)):
            why = None
            if not routers:
                report.append(ConvertEntry(ns[0], kind, "kept", _ROUTER_REASON))
                continue
            if isinstance(mod, nn.Linear) or (conv1d and isinstance(mod, conv1d)):
                pass  # converted as any linear layer, below
            elif not any(matches(n) for n in ns):
                why = "not matched by include/exclude"
            elif len(ns) > 1:
                why = f"one module under {len(ns)} names ({', '.join(ns)}): convert a separate module per name"
            else:
                why = router_fault(mod) or _hooked(mod) or (None if r.passthrough else _shape_fault(
                    SimpleNamespace(in_features=mod.weight.shape[1], out_features=mod.weight.shape[0]), r))
                if why is None:
                    swaps.append((ns[0], Router(mod, r)))
                    report.append(ConvertEntry(ns[0], kind, "converted", f"the router's logits GEMM, {r!r}"))
                    continue
            if why:
                report.append(ConvertEntry(ns[0], kind, "left", f"a MoE router: {why}"))
                continue
        if isinstance(mod, Router):
            if any(matches(n) for n in ns) and len(ns) == 1:
                if _set_recipe(report, ns[0], kind, mod, r):
                    mod._qcache.clear()
                if not mod._id_given:
                    swaps.append((ns[0], mod))
            else:
                report.append(ConvertEntry(ns[0], kind, "left", "not matched by include/exclude" if len(ns) == 1
                                           else f"one module under {len(ns)} names ({', '.join(ns)})"))
            continue
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
                _set_recipe(report, ns[0], kind, mod, r)
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
        if isinstance(mod, Experts) or _fused_experts(mod):
            why = None
            if not any(matches(n) for n in ns):
                why = "not matched by include/exclude"
            elif len(ns) > 1:
                why = f"one module under {len(ns)} names ({', '.join(ns)}): convert a separate module per name"
            elif not isinstance(mod, Experts):
                why = experts_fault(mod) or _hooked(mod)
                E, I2, H = mod.gate_up_proj.shape
                why = why or (None if r.passthrough else next(
                    (f"{p}: {f}" for p, f in (("gate_up_proj", _shape_fault(SimpleNamespace(in_features=H,
                                                                                          out_features=I2), r)),
                                              ("down_proj", _shape_fault(SimpleNamespace(in_features=I2 // 2,
                                                                                         out_features=H), r)))
                     if f), None))
            if why:
                shapes = ", ".join(f"{n} {list(p.shape)}" for n, p in _matrices(mod))
                report.append(ConvertEntry(ns[0], kind, "left", f"fused 3-D MoE expert parameters ({shapes}): {why}"))
                continue
            if isinstance(mod, Experts):
                if _set_recipe(report, ns[0], kind, mod, r):
                    for pair in mod._gemms:
                        for g in pair:
                            g._qcache.clear()
                new = mod
            else:
                new = Experts(mod, r)
                report.append(ConvertEntry(ns[0], kind, "converted",
                                           f"{new.num_experts} experts, each one's GEMMs under {r!r}"))
            experts_swaps.append((ns[0], new))
            continue
        base = nn.Linear if isinstance(mod, nn.Linear) else conv1d if conv1d and isinstance(mod, conv1d) else None
        if base is None and not isinstance(mod, Conv1D):
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
        ours = isinstance(mod, (Linear, Conv1D))
        fault = None if ours else _dropped_by_swap(mod, base)
        fault = fault or (None if r.passthrough else _shape_fault(_features(mod), r))
        if fault:
            report.append(ConvertEntry(ns[0], kind, "left", fault))
            continue
        if ours:
            if _set_recipe(report, ns[0], kind, mod, r):
                mod._qcache.clear()
            if mod._id_given:
                continue
            new = mod
        else:
            new = Linear.from_linear(mod, r) if base is nn.Linear else Conv1D.from_conv1d(mod, r)
            tied = [n for n in param_owners.get(id(mod.weight), []) if n != (f"{ns[0]}." if ns[0] else "") + "weight"]
            report.append(ConvertEntry(ns[0], kind, "converted",
                                       repr(r) + (f"; its weight is also {', '.join(tied)}" if tied else "")))
        swaps.append((ns[0], new))

    _report_the_rest(report, mods, names, param_owners)

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

    for name, new in experts_swaps:
        if new.name is None:
            new.name = name
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


def _fused_experts(mod: nn.Module) -> bool:
    """A Hugging Face experts module with fused 3-D parameters (``gate_up_proj`` [E, 2I, H] and the like)."""
    p = getattr(mod, "gate_up_proj", None)
    return isinstance(p, nn.Parameter) and p.dim() == 3


def _hooked(mod: nn.Module) -> Optional[str]:
    """What a swap would drop from this module besides its forward: a parametrized parameter, or hooks."""
    if parametrize.is_parametrized(mod):
        return "a parameter is parametrized (torch.nn.utils.parametrize), which an fp4lab module would drop"
    hooks = [h[1:] for h in _HOOKS if getattr(mod, h, None)]
    return f"it has hooks ({', '.join(hooks)}) that would stay on the replaced module" if hooks else None


def _features(mod: nn.Module):
    """in_features and out_features of an nn.Linear, or of a transformers Conv1D (nx, nf)."""
    if isinstance(mod, (nn.Linear, Conv1D)):
        return mod
    return SimpleNamespace(in_features=mod.nx, out_features=mod.nf)


def _matrices(mod: nn.Module) -> list:
    """The module's own parameters of two or more dimensions: (name, parameter)."""
    return [(n, p) for n, p in mod.named_parameters(recurse=False) if p is not None and p.dim() >= 2]


def _why_left(mod: nn.Module, mats: list) -> tuple:
    """(action, reason) for a module holding weight matrices that convert has no fp4lab module for."""
    kind = type(mod).__name__
    shapes = ", ".join(f"{n} {list(p.shape)}" for n, p in mats)
    if isinstance(mod, nn.Embedding) or isinstance(mod, nn.EmbeddingBag):
        return "no matmul", f"an embedding table ({shapes}): looked up, not multiplied"
    if any(p.dim() == 3 for _, p in mats):
        return "left", (f"fused 3-D MoE expert parameters ({shapes}) are not supported: its forward slices one "
                        "expert's matrix at a time, which convert does not quantise")
    if "router" in kind.lower() or "gate" in kind.lower():
        return "left", (f"a router computing with its own weight ({shapes}) in a forward of its own, not an "
                        "nn.Linear convert can swap")
    if isinstance(mod, nn.modules.conv._ConvNd):
        return "left", f"a convolution ({shapes}): convert quantises linear layers"
    return "left", (f"{kind} holds {shapes}: convert swaps nn.Linear, transformers Conv1D and "
                    "nn.MultiheadAttention only")


def _report_the_rest(report: ConvertReport, mods: Dict[int, nn.Module], names: Dict[int, list],
                     param_owners: Dict[int, list]) -> None:
    """Appends an entry for every module holding a parameter of two or more dimensions that no entry of ``report``
    covers (an entry covers its module's parameters and its submodules'), so no weight matrix escapes the report."""
    reported = {e.name for e in report}
    under = lambda n: any(n == r or not r or n.startswith(r + ".") for r in reported)  # noqa: E731
    for key, mod in mods.items():
        mats = _matrices(mod)
        if not mats or any(under(n) for n in names[key]):
            continue
        name = names[key][0]
        action, why = _why_left(mod, mats)
        own = {(f"{name}." if name else "") + n for n, _ in mats}
        tied = [o for _, p in mats for o in param_owners.get(id(p), []) if o not in own]
        if tied:
            why += f"; {', '.join(tied)} {'is' if len(tied) == 1 else 'are'} the same parameter"
        report.append(ConvertEntry(name, type(mod).__name__, action, why))


def set_step(model: nn.Module, step: int) -> None:
    """Sets the training step (the SR step key) of every fp4lab Linear and MultiheadAttention in ``model``. Before
    each replay of a training step captured in a CUDA graph, this also writes the step's SR seed where the captured
    kernels read it on the device (the replay runs no Python, so nothing else advances the step)."""
    for m in model.modules():
        if isinstance(m, _Stepped):
            m.step = m._last_step = _whole("set_step()", "step", step, 2**63)
            m._write_device_seed()



def load_steps(model: nn.Module, source: Any) -> int:
    """Sets the SR step of every fp4lab module of ``model`` from a checkpoint that saved it (``<name>._extra_state``,
    as ``model.state_dict()`` and ``save_pretrained`` of a converted model write it), for a model loaded by
    ``from_pretrained`` (which leaves those keys unused) and then converted: its run goes on with the SR keys it
    stopped at instead of step 0.

    Args:
        model: the converted model (the fp4lab modules at the qualified names the checkpoint has).
        source: a state dict, a ``.safetensors`` file, or a folder of them (a ``save_pretrained`` folder, sharded
            or not).

    Returns:
        The number of modules whose step was set.

    A checkpoint without an fp4lab module's key (written by ``export_state_dict``, or of the unconverted model) is
    refused by a one-line ``DataError`` naming the first missing key, and so is a value that is no step; nothing is
    set then."""
    if isinstance(source, (str, os.PathLike)):
        source = _read_steps(os.fspath(source))
    elif not isinstance(source, Mapping):
        raise TypeError(f"load_steps(): source must be a state dict or a path, not {type(source).__name__}")
    steps = {}
    for n, m in model.named_modules():
        if isinstance(m, _Stepped):
            key = f"{n}._extra_state" if n else "_extra_state"
            if key not in source:
                raise DataError(f"load_steps(): {key}: not in the checkpoint (saved without the SR steps?)")
            steps[m] = _step_of_state(key, source[key])
    for m, step in steps.items():
        m.step = m._last_step = step
        m._write_device_seed()
    return len(steps)


def _read_steps(path: str) -> Dict[str, Any]:
    """The ``_extra_state`` tensors of a .safetensors file, or of every one in a folder."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise DataError("load_steps(): reading a .safetensors checkpoint needs the safetensors package") from None
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise DataError(f"{path}: no .safetensors file in the folder")
    out: Dict[str, Any] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as st:
                for k in st.keys():
                    if k.endswith("_extra_state"):
                        out[k] = st.get_tensor(k)
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0]
            raise DataError(f"{f}: not a readable .safetensors file ({why})") from None
    return out


def export_state_dict(model: nn.Module, *, prefix: str = "", keep_vars: bool = False) -> Dict[str, Any]:
    """``model.state_dict(prefix=prefix, keep_vars=keep_vars)`` without the SR steps the fp4lab modules add
    (``<name>._extra_state``): the state dict of the model before ``convert``, the same keys, shapes and tensors. It
    loads with ``strict=True`` into the unconverted model, and ``save_pretrained(dir,
    state_dict=export_state_dict(model))`` writes a checkpoint ``from_pretrained`` reads without unexpected keys.
    Another module's ``_extra_state`` stays. A converted model loads it strictly too, keeping its steps."""
    sd = model.state_dict(prefix=prefix, keep_vars=keep_vars)
    for n, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, _Stepped):
            sd.pop(f"{prefix}{n}._extra_state" if n else f"{prefix}_extra_state", None)
    return sd
