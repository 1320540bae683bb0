"""Recipe: the quantiser settings (``fp4lab.QuantConfig``) of each operand of each training GEMM of a linear layer,
with the GEMM mode and the SR seed."""
from __future__ import annotations

import ast
import dataclasses
import functools
import math
import operator
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

import fp4lab as _fp
from fp4lab import QuantConfig, _core

__all__ = ["Recipe", "RECIPES", "ABLATIONS", "OPERANDS", "recipe_of_key"]

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


# bf16 is the passthrough recipe (plain F.linear); the others are the presets of docs/spec.md §2. Recipe also takes
# the names of the ablations (fp4lab.ABLATIONS: a preset with RHT or rounding changed on some passes).
RECIPES = ("bf16",) + tuple(_core.recipe_names())
ABLATIONS = _fp.ABLATIONS
_PASSES = _core.PASSES
# The six operands of a layer's training GEMMs, (pass, "a" or "b"), in the order Recipe.configs lists them.
OPERANDS: Tuple[Tuple[str, str], ...] = tuple((p, o) for p in _PASSES for o in ("a", "b"))
_INDEX = {op: i for i, op in enumerate(OPERANDS)}
# An operand's SR stream in a layer is the model's rule (Recipe::operand: layer * 8 + pass * 2 + operand), read from
# it once here: the stream at layer 0, and the step from one layer to the next.
_STREAM0 = {op: _fp.config(pass_=op[0], operand=op[1]).stream for op in OPERANDS}
_LAYER_STREAMS = _fp.config(pass_=OPERANDS[0][0], operand=OPERANDS[0][1], stream=1).stream - _STREAM0[OPERANDS[0]]


@functools.lru_cache(maxsize=None)  # one entry per named recipe
def _named(name: str) -> Tuple[QuantConfig, ...]:
    """The six settings of a named recipe at seed 0 (bf16 and "custom": the knobs' defaults, e1m2 / block 16 / fp32
    scale / no RHT / RTNE), in OPERANDS' order."""
    base = None if name in ("bf16", "custom") else name
    return tuple(_fp.config(base, pass_=p, operand=o) for p, o in OPERANDS)


def _seedless(op: Tuple[str, str], c: QuantConfig) -> QuantConfig:
    """``c`` with seed 0 and its operand's layer-0 stream: the SR key is the training step's, not the config's."""
    return c if (c.seed, c.stream) == (0, _STREAM0[op]) else c.replace(seed=0, stream=_STREAM0[op])


def _same_rotation(pass_: str, a: QuantConfig, b: QuantConfig) -> None:
    """A pass whose operands are rotated differently has no product under the contract (docs/spec.md §5): refused
    when the recipe is made, with the GEMM's own reason, rather than at its first product."""
    ops = []
    for c in (a, b):
        d = c.to_dict()  # format and scale as the C++ parsers name them
        codes, scales = np.zeros((1, 128), np.uint8), np.ones((1, 128 // c.block), np.float32)
        ops.append(_core.make_qtensor(d["format"], d["scale"], c.block, False, codes, scales, 1.0, c.rht,
                                      [float(s) for s in c.rht_signs or ()]))
    try:
        _core.check_gemm_operands(*ops)
    except ValueError as e:
        raise ValueError(f"Recipe(): {pass_}: {e}") from None


def _operand_ok(k: Any) -> bool:
    return isinstance(k, tuple) and k in _INDEX


_OPERAND_WHAT = "a (pass, 'a' or 'b') tuple (pass: fwd_y, bwd_dx or bwd_dw)"


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


def _check_configs(value: Any) -> Dict[Tuple[str, str], QuantConfig]:
    """``configs`` (a dict, or pairs as ``Recipe.configs`` holds them) as a dict from operand to QuantConfig, or a
    one-line TypeError or ValueError naming the faulty entry."""
    what = f"a dict from {_OPERAND_WHAT} to an fp4lab.QuantConfig"
    if isinstance(value, (str, bytes)):
        raise TypeError(f"Recipe(): configs must be {what}, not {type(value).__name__}")
    try:
        given = dict(value)
    except (TypeError, ValueError):
        raise TypeError(f"Recipe(): configs must be {what}, not {type(value).__name__}") from None
    for k, v in given.items():
        if not _operand_ok(k):
            raise ValueError(f"Recipe(): configs key {k!r}"[:120] + f" is not {_OPERAND_WHAT}")
        if not isinstance(v, QuantConfig):
            raise TypeError(f"Recipe(): configs[{k!r}] must be an fp4lab.QuantConfig, not {type(v).__name__}")
    return given


@dataclasses.dataclass(init=False, repr=False, eq=True)
class Recipe:
    """A training recipe: the ``fp4lab.QuantConfig`` of each operand of each training GEMM of a linear layer, the
    GEMM mode and the SR seed.

    Typed: ``Recipe("ufp4", configs={("bwd_dw", "a"): fp4lab.QuantConfig(format="e1m2", rht=16, rounding="sr")})``
    (the named recipe's settings, with the operands given replaced; without a name, the defaults e1m2 / block 16 /
    fp32 scale / no RHT / RTNE). Knobs, as sugar: ``Recipe("ufp4")``, ``Recipe("e2m1-ref", mode="fast")``,
    ``Recipe(format="e1m2", rht=16)``, ``Recipe("ufp4-rht-wgrad")`` (an ablation: its settings, beneath any knob
    given here). Knobs apply to every operand of every pass, as on the command line; ``per_pass={"fwd_y": {"rht":
    0}}`` and ``per_operand={("bwd_dx", "a"): {...}}`` narrow them. Both make the same value: a recipe is its
    fields, ``name``, ``mode``, ``seed``, ``check_finite`` and ``configs``.

    Immutable, compared and hashed by value (``dataclasses.replace`` gives a changed copy); ``repr`` is ``key``, the
    call that builds it, spelled one way for each value (the named recipe, then ``configs`` for the operands whose
    settings differ from its); a pickle carries the fields (the QuantConfigs as their own checked state). The
    torch.library operators (``fp4lab.torch.ops``) name the recipe by ``key``, and ``recipe_of_key`` reads it back
    with no registry of recipes.

    Args:
        name: a preset (``RECIPES``), an ablation (``ABLATIONS``), "bf16" (plain BF16), or None or "custom" (the
            defaults and what is given here; its ``name`` is then "custom").
        mode: "exact" (the datapath contract's GEMM) or "fast" (on CUDA, torch's matmul on the dequantised BF16
            operands; on the CPU, the same as exact).
        seed: the SR seed, an int from 0 to 2**64 - 1.
        per_pass: {pass: {knob: value}} on top of the knobs, for fwd_y, bwd_dx or bwd_dw.
        per_operand: {(pass, "a" or "b"): {knob: value}} on top of those.
        check_finite: "deferred" (a device flag the layers read two or three steps later, without a
            synchronisation) or "sync" (a check at every CUDA operand).
        configs: {(pass, "a" or "b"): QuantConfig} replacing the named recipe's settings of those operands (not
            with knobs). A config's own seed and stream are not used: the SR key is (seed, step, layer).
        **knobs: the knobs of ``fp4lab.quantize`` (format, block, scale, rht, rounding, ...), for every operand.

    Raises:
        ValueError, TypeError: an unknown name, knob or value, or a pass whose operands are rotated differently,
        in one line.
    """

    name: str
    mode: str
    seed: int
    check_finite: str
    # ((pass, operand), QuantConfig) for each of OPERANDS, in its order, at seed 0 and the operand's layer-0 stream
    configs: Tuple[Tuple[Tuple[str, str], QuantConfig], ...]

    def __init__(self, name: Optional[str] = None, *, mode: str = "exact", seed: int = 0,
                 per_pass: Optional[Dict[str, Dict[str, Any]]] = None,
                 per_operand: Optional[Dict[Tuple[str, str], Dict[str, Any]]] = None,
                 check_finite: str = "deferred", configs: Any = None, **knobs):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Recipe(): name must be a str or None, not {type(name).__name__}")
        if mode not in ("exact", "fast"):
            raise ValueError(f"mode must be 'exact' or 'fast', not {mode!r}")
        if check_finite not in ("sync", "deferred"):
            raise ValueError(f"check_finite must be 'sync' or 'deferred', not {check_finite!r}")
        name = name or "custom"
        if name != "custom" and name not in RECIPES and name not in ABLATIONS:
            known = list(RECIPES) + [a for a in ABLATIONS if a not in RECIPES]
            raise ValueError(f"unknown recipe '{name}' (known: {', '.join(known)})")
        _check_per("per_pass", per_pass, lambda k: isinstance(k, str) and k in _PASSES,
                   "a pass name (fwd_y, bwd_dx or bwd_dw)")
        _check_per("per_operand", per_operand, _operand_ok, _OPERAND_WHAT)
        seed = whole("Recipe()", "seed", seed, 2**64)  # the Philox key of training_seed (docs/spec.md §12)
        passthrough = name == "bf16"
        base = _named(name)
        if configs is not None:
            if knobs or per_pass or per_operand:
                raise ValueError("Recipe(): give configs or knobs (per_pass, per_operand, format=...), not both")
            given = _check_configs(configs)
            cfgs = tuple(_seedless(op, given.get(op, b)) for op, b in zip(OPERANDS, base))
            if passthrough and cfgs != base:
                raise ValueError("the bf16 recipe is plain BF16 and takes no knobs")
        elif knobs or per_pass or per_operand:
            if passthrough:
                raise ValueError("the bf16 recipe is plain BF16 and takes no knobs")
            made = []
            for p, o in OPERANDS:
                k = dict(knobs)
                k.update((per_pass or {}).get(p, {}))
                k.update((per_operand or {}).get((p, o), {}))
                for bad in ("seed", "stream", "pass_", "role"):
                    if bad in k:
                        raise ValueError(f"{bad} is set by the training step, not by the recipe")
                k = _fp._knobs("Recipe", None if name == "custom" else name, None, None, k)
                k["pass_"] = p
                made.append(_core.operand_config(**k, operand=o))
            cfgs = tuple(made)
        else:
            cfgs = base
        # k_multiple[pass]: the multiple of the reduction dimension K the pass's operands are zero-padded to (the
        # blocks and RHT sizes of both operands; docs/spec.md, a partial last block). A plain dict, so a compiled
        # graph reads it as a constant.
        mult = {p: 1 for p in _PASSES}
        if not passthrough:
            for p in _PASSES:
                a, b = cfgs[_INDEX[(p, "a")]], cfgs[_INDEX[(p, "b")]]
                mult[p] = math.lcm(a.block, a.rht or 1, b.block, b.rht or 1)
                _same_rotation(p, a, b)
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "mode", mode)
        set_(self, "seed", int(seed))
        set_(self, "check_finite", check_finite)
        set_(self, "configs", tuple(zip(OPERANDS, cfgs)))
        set_(self, "passthrough", passthrough)
        set_(self, "k_multiple", mult)
        set_(self, "key", self._spelled(base))
        set_(self, "_hash", hash(self.key))
        set_(self, "_configs", {})
        set_(self, "_layer_configs", {})
        set_(self, "_step_seeds", {})

    def _spelled(self, base: Tuple[QuantConfig, ...]) -> str:
        """The key: the constructor call of the named recipe with configs for the operands that differ from it."""
        args = [] if self.name == "custom" else [repr(self.name)]
        args += [f"mode={self.mode!r}", f"seed={self.seed!r}"]
        if self.check_finite != "deferred":
            args.append(f"check_finite={self.check_finite!r}")
        changed = [f"{op!r}: {c!r}" for (op, c), b in zip(self.configs, base) if c != b]
        if changed:
            args.append("configs={" + ", ".join(changed) + "}")
        return f"fp4lab.torch.Recipe({', '.join(args)})"

    def __setattr__(self, name, value):
        raise AttributeError(f"fp4lab.torch.Recipe is immutable (make another Recipe rather than setting {name})")

    def __delattr__(self, name):
        raise AttributeError(f"fp4lab.torch.Recipe is immutable (cannot delete {name})")

    def config(self, pass_: str, operand: str, *, layer: int, step: int) -> QuantConfig:
        """The QuantConfig of one operand of one pass at a training step, SR keyed by (seed, step, layer).

        Args:
            pass_: fwd_y, bwd_dx or bwd_dw.
            operand: "a" or "b".
            layer: the layer's SR id.
            step: the training step.

        Returns:
            The operand's settings in ``configs`` with the seed of (seed, step) and the stream of (layer, operand).
        """
        key = (pass_, operand, layer, step)
        c = self._configs.get(key)
        if c is None:
            if len(self._configs) > 4096:  # one step's worth for a large model; older steps are not asked again
                self._configs.clear()
                self._step_seeds.clear()
            c = self._configs[key] = self._layer_config(pass_, operand, layer).with_seed(self._step_seed(step))
        return c

    def _layer_config(self, pass_: str, operand: str, layer: int) -> QuantConfig:
        """The operand's settings in a layer: a step changes only the SR seed."""
        key = (pass_, operand, layer)
        c = self._layer_configs.get(key)
        if c is None:
            i = _INDEX.get((pass_, operand))
            if i is None:
                raise ValueError(f"Recipe.config(): ({pass_!r}, {operand!r})"[:120] + f" is not {_OPERAND_WHAT}")
            layer = whole("Recipe.config()", "layer", layer, 2**32)
            stream = (_STREAM0[(pass_, operand)] + _LAYER_STREAMS * layer) % 2**32  # uint32, as the model wraps it
            c = self._layer_configs[key] = self.configs[i][1].replace(stream=stream)
        return c

    def _step_seed(self, step: int) -> int:
        s = self._step_seeds.get(step)
        if s is None:
            s = self._step_seeds[step] = _core.training_seed(self.seed, step)
        return s

    def __repr__(self) -> str:
        return self.key

    def __hash__(self) -> int:
        return self._hash

    # A pickle is the fields, the QuantConfigs as their own (checked) state; loading builds the recipe through the
    # constructor's rules, so a payload of settings it refuses does not load.
    def __getstate__(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict) -> None:
        names = [f.name for f in dataclasses.fields(Recipe)]
        if not isinstance(state, dict) or sorted(state) != sorted(names):
            raise ValueError(f"fp4lab.torch.Recipe pickle: its state is a dict of {', '.join(names)}")
        Recipe.__init__(self, state["name"], mode=state["mode"], seed=state["seed"],
                        check_finite=state["check_finite"], configs=state["configs"])

    # Immutable: a copy is the object itself (a model and its deep copy share their recipe).
    def __copy__(self) -> "Recipe":
        return self

    def __deepcopy__(self, memo) -> "Recipe":
        return self


# ---- the key ------------------------------------------------------------------------------------------------
# The torch.library operators take the recipe as its key, a string constant that torch.compile can put in a graph,
# and read the recipe back from it: the key alone determines the recipe, so nothing in the process has to hold one.
# The reader is a restricted one: the key's syntax tree must be the one call Recipe.key spells, with literals only
# (names of formats, scales and roundings are strings that QuantConfig checks against fp4lab's enums); nothing is
# evaluated.

_KEY_LIMIT = 1 << 16  # past any key a recipe spells (six configs of 128 signs, the largest RHT, are under 4 kB)
_KEY_WORDS = ("mode", "seed", "check_finite", "configs")


class _BadKey(Exception):
    pass


def _dotted(node: ast.AST) -> str:
    return f"{_dotted(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else \
        node.id if isinstance(node, ast.Name) else ""


def _literal(node: ast.AST, kinds, what: str) -> Any:
    try:
        v = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _BadKey(f"{what} is not a literal") from None
    if not isinstance(v, kinds) or isinstance(v, bool) and bool not in kinds:
        raise _BadKey(f"{what} is a {type(v).__name__}")
    return v


def _key_configs(node: ast.AST) -> Dict[Tuple[str, str], QuantConfig]:
    if not isinstance(node, ast.Dict) or None in node.keys:
        raise _BadKey("configs is not a dict")
    out = {}
    for k, v in zip(node.keys, node.values):
        op = _literal(k, (tuple,), "a configs key")
        if not (isinstance(v, ast.Call) and _dotted(v.func) == "fp4lab.QuantConfig" and not v.args
                and all(w.arg is not None for w in v.keywords)):
            raise _BadKey(f"configs[{op!r}] is not an fp4lab.QuantConfig(...) call"[:160])
        kw = {w.arg: _literal(w.value, (str, int, bool, list, tuple, type(None)), w.arg) for w in v.keywords}
        try:
            out[op] = QuantConfig(**kw)
        except (TypeError, ValueError, OverflowError) as e:
            raise _BadKey(f"configs[{op!r}]: {e}") from None
    return out


@functools.lru_cache(maxsize=256)  # the recently read keys, so that an operator call does not read its key again
def _read_key(key: str) -> Recipe:
    if len(key) > _KEY_LIMIT:
        raise _BadKey(f"it is longer than {_KEY_LIMIT} characters")
    try:
        call = ast.parse(key, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _BadKey("it is not a Recipe call") from None
    if not (isinstance(call, ast.Call) and _dotted(call.func) == "fp4lab.torch.Recipe"):
        raise _BadKey("it is not a Recipe call")
    if len(call.args) > 1:
        raise _BadKey("it gives more than a name")
    kw: Dict[str, Any] = {}
    for w in call.keywords:
        if w.arg not in _KEY_WORDS or w.arg in kw:
            raise _BadKey(f"it gives {w.arg or '**'}= (a key gives {', '.join(_KEY_WORDS)})")
        kw[w.arg] = (_key_configs(w.value) if w.arg == "configs" else
                     _literal(w.value, (int,) if w.arg == "seed" else (str,), w.arg))
    name = _literal(call.args[0], (str,), "the name") if call.args else None
    try:
        r = Recipe(name, **kw)
    except (TypeError, ValueError) as e:
        raise _BadKey(str(e)) from None
    if r.key != key:
        raise _BadKey(f"the recipe it builds spells its key {r.key!r}"[:300])
    return r


def recipe_of_key(key: str) -> Recipe:
    """The Recipe whose ``key`` is ``key``, read from the key alone.

    Args:
        key: a ``Recipe.key``, as the torch.library operators of fp4lab.torch.ops take it.

    Returns:
        The Recipe (equal to the one that spelled the key; the recently read ones are kept).

    Raises:
        ValueError: in one line, where the key is not a Recipe's key.
    """
    if not isinstance(key, str):
        raise ValueError(f"a fp4lab.torch.Recipe key is a str, not {type(key).__name__}")
    try:
        return _read_key(key)
    except _BadKey as e:
        shown = key if len(key) <= 120 else key[:120] + "..."
        raise ValueError(f"no fp4lab.torch.Recipe has the key {shown!r}: {e}".replace("\n", " ")) from None


def as_recipe(recipe: Any) -> Recipe:
    """``recipe`` itself if it is a Recipe, else ``Recipe(recipe)`` (a preset or ablation name)."""
    return recipe if isinstance(recipe, Recipe) else Recipe(recipe)
