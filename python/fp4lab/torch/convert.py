"""convert: an existing model's linear layers and attention under a recipe, with a report of what it did;
set_step: the SR step of a whole model."""
from __future__ import annotations

import dataclasses
import logging
import re
from types import SimpleNamespace
from typing import Any, Dict, Optional

from torch import nn
from torch.nn.utils import parametrize

from .attention import MultiheadAttention
from .linear import Linear, _shape_fault, _Stepped, layer_id_of
from .recipe import Recipe, _as_recipe, _whole

__all__ = ["convert", "ConvertReport", "ConvertEntry", "set_step"]


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


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _dropped_by_swap(mod: nn.Linear) -> Optional[str]:
    """What a swap for an fp4lab Linear would silently drop from this nn.Linear, or None: a forward of its own (a
    subclass), a parametrized weight or bias (computed on access, not the parameters the swap shares), or hooks (they
    belong to the module object the swap replaces)."""
    if type(mod).forward is not nn.Linear.forward:
        return f"{type(mod).__name__} has a forward of its own, which an fp4lab Linear would not compute"
    if parametrize.is_parametrized(mod):
        return "its weight or bias is parametrized (torch.nn.utils.parametrize), which an fp4lab Linear would drop"
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


def convert(model: nn.Module, recipe: Any, *, include: Optional[str] = None, exclude: Optional[str] = None) -> nn.Module:
    """Swaps, in place, every ``nn.Linear`` of ``model`` whose qualified name matches ``include`` (a regex searched
    in the name; default all) and not ``exclude`` for an fp4lab ``Linear`` under ``recipe``, sharing its parameters
    and keeping its state-dict keys, and every matching ``nn.MultiheadAttention`` for an fp4lab
    ``MultiheadAttention`` (it reads its projection weights directly, so its ``out_proj`` goes with it); an fp4lab
    module already there takes the new recipe (its step and layer id stay). Each converted layer's SR key is
    ``layer_id_of(its qualified name in model)``.

    Left as they are, with the reason in the report: modules whose dimensions the recipe cannot quantise, a module
    reachable under two names, an attention with ``add_bias_kv`` or ``add_zero_attn``, and an ``nn.Linear`` the swap
    would change: a subclass with a forward of its own, a parametrized weight or bias, or one with hooks. The fused inference path of
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
        fault = None if isinstance(mod, Linear) else _dropped_by_swap(mod)
        fault = fault or (None if r.passthrough else _shape_fault(mod, r))
        if fault:
            report.append(ConvertEntry(ns[0], kind, "left", fault))
            continue
        if isinstance(mod, Linear):
            if _set_recipe(report, ns[0], kind, mod, r):
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
    """Sets the training step (the SR step key) of every fp4lab Linear and MultiheadAttention in ``model``. Before
    each replay of a training step captured in a CUDA graph, this also writes the step's SR seed where the captured
    kernels read it on the device (the replay runs no Python, so nothing else advances the step)."""
    for m in model.modules():
        if isinstance(m, _Stepped):
            m.step = m._last_step = _whole("set_step()", "step", step, 2**63)
            m._write_device_seed()
