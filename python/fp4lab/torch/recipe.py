"""Recipe: which quantiser settings each operand of each training GEMM of a linear layer takes."""
from __future__ import annotations

import ast
import functools
import math
import operator
import weakref
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

import fp4lab as _fp
from fp4lab import _core

__all__ = ["Recipe", "RECIPES", "ABLATIONS"]

def whole(func: str, name: str, value: Any, hi: int) -> int:
    """``value`` as an int from 0 to hi - 1, or a one-line TypeError (a float, a bool, a str) or ValueError (out of
    range) naming ``func`` and ``name``, rather than a silent truncation or the bindings' signature dump."""
    if isinstance(value, bool):
        raise TypeError(f"{func}: {name} must be an int, not bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {name} must be an int, not {type(value).__name__}") from None
    if not 0 <= v < hi:
        raise ValueError(f"{func}: {name} must be an integer from 0 to 2**{hi.bit_length() - 1} - 1, not {v}")
    return v


def _same_rotation(pass_: str, a: "_core.QuantConfig", b: "_core.QuantConfig") -> None:
    """A pass whose operands are rotated differently has no product under the contract (docs/spec.md §5): refused
    when the recipe is made, with the GEMM's own reason, rather than at its first product."""
    ops = []
    for c in (a, b):
        d = c.to_dict()
        signs = [1.0 if t == "+1" else -1.0 for t in d["rht_signs"].split(",")] if d["rht_signs"] else []
        codes, scales = np.zeros((1, 128), np.uint8), np.ones((1, 128 // d["block"]), np.float32)
        ops.append(_core.make_qtensor(d["format"], d["scale"], d["block"], False, codes, scales, 1.0, d["rht"], signs))
    try:
        _core.check_gemm_operands(*ops)
    except ValueError as e:
        raise ValueError(f"Recipe(): {pass_}: {e}") from None


def _check_per(arg: str, value: Any, key_ok, key_what: str) -> None:
    """``per_pass`` / ``per_operand`` as a dict from ``key_what`` to a dict of knobs (named by str), or a one-line
    TypeError or ValueError naming the argument, the faulty entry and what it takes."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"Recipe(): {arg} must be a dict from {key_what} to a dict of knobs, not "
                        f"{type(value).__name__}")
    for k, v in value.items():
        if not key_ok(k):
            raise ValueError(f"Recipe(): {arg} key {k!r}"[:120] + f" is not {key_what}")
        if not isinstance(v, Mapping):
            raise TypeError(f"Recipe(): {arg}[{k!r}] must be a dict of knobs ({{name: value}}), not {type(v).__name__}")
        bad = next((n for n in v if not isinstance(n, str)), None)
        if bad is not None:
            raise TypeError(f"Recipe(): {arg}[{k!r}] knob names are str, not {bad!r}"[:160])


# bf16 is the passthrough recipe (plain F.linear); the others are the presets of docs/spec.md §2. Recipe also takes
# the names of the ablations (fp4lab.ABLATIONS: a preset with RHT or rounding changed on some passes).
RECIPES = ("bf16",) + tuple(_core.recipe_names())
ABLATIONS = _fp.ABLATIONS
_PASSES = _core.PASSES


class Recipe:
    """A training recipe: a preset name (or "bf16") plus any knob set on top, a GEMM mode and an SR seed.

    ``Recipe("ufp4")``, ``Recipe("e2m1-ref", mode="fast")``, ``Recipe(format="e1m2", rht=16)`` (knobs alone, on
    the defaults e1m2 / block 16 / fp32 scale / no RHT / RTNE), ``Recipe("ufp4-rht-wgrad")`` (an ablation: its
    settings, beneath any knob given here). Knobs apply to every operand of every pass, as on
    the command line; ``per_pass={"fwd_y": {"rht": 0}}`` and ``per_operand={("bwd_dx", "a"): {...}}`` narrow them.

    Immutable, compared and hashed by value; ``repr`` is the call that builds it, and copies, pickles and
    ``torch.save`` carry only that call (the C++ settings are rebuilt on demand). ``key`` is that repr: the
    torch.library operators (``fp4lab.torch.ops``) name the recipe by it.

    Args:
        name: a preset (``RECIPES``), an ablation (``ABLATIONS``), "bf16" (plain BF16), or None (knobs alone).
        mode: "exact" (the datapath contract's GEMM) or "fast" (on CUDA, torch's matmul on the dequantised BF16
            operands; on the CPU, the same as exact).
        seed: the SR seed, an int from 0 to 2**64 - 1.
        per_pass: {pass: {knob: value}} on top of the knobs, for fwd_y, bwd_dx or bwd_dw.
        per_operand: {(pass, "a" or "b"): {knob: value}} on top of those.
        check_finite: "deferred" (a device flag read once a step) or "sync" (a check at every CUDA operand).
        **knobs: the knobs of ``fp4lab.quantize`` (format, block, scale, rht, rounding, ...), for every operand.

    Raises:
        ValueError, TypeError: an unknown name, knob or value, or a pass whose operands are rotated differently,
        in one line.
    """

    def __init__(self, name: Optional[str] = None, *, mode: str = "exact", seed: int = 0,
                 per_pass: Optional[Dict[str, Dict[str, Any]]] = None,
                 per_operand: Optional[Dict[Tuple[str, str], Dict[str, Any]]] = None,
                 check_finite: str = "deferred", **knobs):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Recipe(): name must be a str or None, not {type(name).__name__}")
        if mode not in ("exact", "fast"):
            raise ValueError(f"mode must be 'exact' or 'fast', not {mode!r}")
        if check_finite not in ("sync", "deferred"):
            raise ValueError(f"check_finite must be 'sync' or 'deferred', not {check_finite!r}")
        if name is not None and name not in RECIPES and name not in ABLATIONS:
            known = list(RECIPES) + [a for a in ABLATIONS if a not in RECIPES]
            raise ValueError(f"unknown recipe '{name}' (known: {', '.join(known)})")
        if name == "bf16" and (knobs or per_pass or per_operand):
            raise ValueError("the bf16 recipe is plain BF16 and takes no knobs")
        _check_per("per_pass", per_pass, lambda k: isinstance(k, str) and k in _PASSES,
                   "a pass name (fwd_y, bwd_dx or bwd_dw)")
        _check_per("per_operand", per_operand,
                   lambda k: isinstance(k, tuple) and len(k) == 2 and k[0] in _PASSES and k[1] in ("a", "b"),
                   "a (pass, 'a' or 'b') tuple (pass: fwd_y, bwd_dx or bwd_dw)")
        seed = whole("Recipe()", "seed", seed, 2**64)  # the Philox key of training_seed (docs/spec.md §12)
        # The arguments, as given: repr, equality, hashing and pickling all use them.
        args: Dict[str, Any] = {"mode": mode, "seed": seed}
        if per_pass:
            args["per_pass"] = {p: dict(v) for p, v in per_pass.items()}
        if per_operand:
            args["per_operand"] = {tuple(k): dict(v) for k, v in per_operand.items()}
        if check_finite != "deferred":
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
        set_(self, "_layer_configs", {})
        set_(self, "_step_seeds", {})
        set_(self, "key", repr(self))
        _by_key.setdefault(self.key, self)
        # k_multiple[pass]: the multiple of the reduction dimension K the pass's operands are zero-padded to (the
        # blocks and RHT sizes of both operands; docs/spec.md, a partial last block). A plain dict, so a compiled
        # graph reads it as a constant.
        mult = {p: 1 for p in _PASSES}
        if not self.passthrough:
            for p in _PASSES:  # resolve once now, so a bad knob fails here and not in the first backward
                for o in ("a", "b"):
                    d = self.config(p, o, layer=0, step=0).to_dict()
                    mult[p] = math.lcm(mult[p], d["block"], d["rht"] or 1)
                _same_rotation(p, self.config(p, "a", layer=0, step=0), self.config(p, "b", layer=0, step=0))
        set_(self, "k_multiple", mult)

    def __setattr__(self, name, value):
        raise AttributeError(f"fp4lab.torch.Recipe is immutable (make another Recipe rather than setting {name})")

    def config(self, pass_: str, operand: str, *, layer: int, step: int) -> "_core.QuantConfig":
        """The QuantConfig of one operand of one pass at a training step, SR keyed by (seed, step, layer)."""
        key = (pass_, operand, layer, step)
        c = self._configs.get(key)
        if c is None:
            if len(self._configs) > 4096:  # one step's worth for a large model; older steps are not asked again
                self._configs.clear()
                self._step_seeds.clear()
            c = self._configs[key] = self._layer_config(pass_, operand, layer).with_seed(self._step_seed(step))
        return c

    def _layer_config(self, pass_: str, operand: str, layer: int) -> "_core.QuantConfig":
        """The operand's settings in a layer from the knobs, at step 0: a step changes only the SR seed."""
        key = (pass_, operand, layer)
        c = self._layer_configs.get(key)
        if c is None:
            k = dict(self._knobs[(pass_, operand)])
            k["seed"] = str(_core.training_seed(self.seed, 0))
            k["stream"] = str(layer)
            c = self._layer_configs[key] = _core.operand_config(k, pass_, operand)
        return c

    def _step_seed(self, step: int) -> int:
        s = self._step_seeds.get(step)
        if s is None:
            s = self._step_seeds[step] = _core.training_seed(self.seed, step)
        return s

    def __repr__(self) -> str:
        if "key" in self.__dict__:
            return self.key
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


# The torch.library operators take the recipe as its key (its repr), a constant that torch.compile can put in a
# graph; they find the Recipe again here. Weak, so that a recipe nothing holds any more is forgotten (models made
# and dropped in a loop do not grow it); a key whose recipe is gone is rebuilt from the call its repr spells.
_by_key: "weakref.WeakValueDictionary[str, Recipe]" = weakref.WeakValueDictionary()


def recipe_of_key(key: str) -> Recipe:
    """The Recipe whose ``key`` (its repr) is ``key``.

    Args:
        key: a ``Recipe.key``, as the torch.library operators of fp4lab.torch.ops take it.

    Returns:
        The live Recipe of that key, else one rebuilt from the call the key spells (equal to the one that made it).

    Raises:
        ValueError: the key is not the repr of a Recipe whose arguments are literals (a knob given as an enum member,
        say) and no Recipe of that key is alive in this process.
    """
    r = _by_key.get(key)
    return r if r is not None else _rebuilt(key)


@functools.lru_cache(maxsize=64)  # the recently rebuilt ones, so that an operator call does not rebuild each time
def _rebuilt(key: str) -> Recipe:
    try:
        call = ast.parse(key, mode="eval").body
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "fp4lab.torch.Recipe"):
            raise ValueError
        r = Recipe(*[ast.literal_eval(a) for a in call.args],
                   **{k.arg: ast.literal_eval(k.value) for k in call.keywords})
    except (SyntaxError, ValueError, TypeError, AttributeError):
        r = None
    if r is None or r.key != key:
        raise ValueError(f"no fp4lab.torch.Recipe has the key {key!r} in this process")
    return r


def _recipe_from_args(name: Optional[str], args: Dict[str, Any]) -> Recipe:
    return Recipe(name, **args)


def as_recipe(recipe: Any) -> Recipe:
    """``recipe`` itself if it is a Recipe, else ``Recipe(recipe)`` (a preset or ablation name)."""
    return recipe if isinstance(recipe, Recipe) else Recipe(recipe)
