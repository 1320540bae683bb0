"""fp4lab: bit-exact 4-bit block-scaled quantisation and GEMM (E2M1, E1M2, INT4), the training recipes of
docs/spec.md §2, and the analyses of §6, on numpy arrays.

Every function calls the C++ golden model the ``fp4lab`` command line calls (through the nanobind module
``fp4lab._core``), with the same knobs and the same one-line error messages, so results are bit-identical to
the CLI. ``fp4lab.torch`` (where PyTorch is installed) adds the same arithmetic on torch tensors, the CUDA
kernels, and a drop-in ``Linear`` that trains under a recipe.

    import numpy as np, fp4lab
    x = np.random.default_rng(0).standard_normal((64, 256), dtype=np.float32)
    q = fp4lab.quantize(x, "ufp4", pass_="fwd_y", role="fwd_x")   # codes, scales, dequantize()
    c = fp4lab.gemm(q, fp4lab.quantize(x, "ufp4", role="fwd_w"))  # [64, 64] FP32, datapath contract
"""
from __future__ import annotations

import json as json_module
import operator
import os
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np


def _import_core():
    """The C++ module, imported without libgomp's own warning about a thread variable the module refuses: libgomp's
    initialiser reads the variable when the module loads and warns on stderr, beside the module's one-line UsageError
    (the command line takes the value out before libgomp reads it, cli/main.cpp). Anything else said while it loads
    is passed on."""
    import importlib
    if "OMP_NUM_THREADS" not in os.environ and "OMP_THREAD_LIMIT" not in os.environ:
        return importlib.import_module("._core", __name__)
    import tempfile
    try:
        said, saved = tempfile.TemporaryFile(), os.dup(2)
    except OSError:
        return importlib.import_module("._core", __name__)
    with said:
        os.dup2(said.fileno(), 2)
        core = None
        try:
            core = importlib.import_module("._core", __name__)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if core is None or core.threads_fault() is None:
                said.seek(0)
                text = said.read()
                if text:
                    os.write(2, text)
    return core


_core = _import_core()
from ._core import Format, QTensor, QuantConfig, Rounding, Scale, SrDraw  # noqa: E402
from ._base import analyze, cli_path, recipes  # noqa: E402  (re-exported: fp4lab.analyze etc.)
from ._base import INT_RANGES as _INT_RANGES, check_signs as _signs, int_setting as _int_setting  # noqa: E402
from ._base import is_int as _is_int, one_line_errors as _one_line_errors, rht_size as _rht_size  # noqa: E402

__version__: str = _core.__version__
__all__ = ["ABLATIONS", "Ablation", "Format", "QTensor", "QuantConfig", "Rounding", "Scale", "SrDraw", "analyze", "config", "decide", "formats", "gemm",
           "model_shapes",
           "quantize", "recipes", "__version__"]

# The settings a keyword sets on top of a recipe (fp4lab/settings.hpp), in the command line's order.
_KNOBS = _core.SETTINGS
_NAMED = {"format": Format, "scale": Scale, "rounding": Rounding, "sr_draw": SrDraw}


def _setting(name: str, value: Any) -> dict:
    """One keyword as the typed setting ``_core.operand_config`` takes. A value of another type is a TypeError
    (numbers are not read from text: that is the command line's job); an integer out of range, the command line's
    one-line message for that option."""
    opt = name.replace("_", "-")
    if name in _NAMED:
        if isinstance(value, (str, _NAMED[name])):
            return {name: value}  # a name is looked up in its table (fp4lab/settings.hpp), with its message
        raise TypeError(f"knob {name}: an fp4lab.{_NAMED[name].__name__} or its name, not {type(value).__name__}")
    if name in _INT_RANGES:
        return {name: _int_setting(f"knob {name}", name, value)}
    if name in ("tile2d", "rht_bf16"):
        if isinstance(value, (bool, np.bool_)):
            return {name: bool(value)}
        if _is_int(value):
            raise ValueError(f"--{opt}: '{int(value)}' is not true or false")
        raise TypeError(f"knob {name}: a bool, not {type(value).__name__}")
    if name == "rht":
        return {"rht": _rht_size("knob rht", value)}  # None or 'none': no rotation, as --rht none
    if name == "rht_signs":
        if isinstance(value, str):
            if value == "te":
                return {"rht_signs_te": True}
            raise TypeError("knob rht_signs: a sequence of +1/-1 entries or 'te', not other text")
        if isinstance(value, (bool, np.bool_)):
            raise ValueError(f"--rht-signs: sign 1 is '{str(bool(value)).lower()}', not +1 or -1")
        return {"rht_signs": [float(value)] if _is_int(value) else _signs(value)}
    raise AssertionError(name)


def _check_str(func: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{func}(): {name} must be a str, not {type(value).__name__}")


def _knobs(func: str, recipe: Optional[str], pass_: Optional[str], role: Optional[str],
           knobs: Mapping[str, Any]) -> dict:
    """The keywords of ``_core.operand_config`` for a recipe and knobs (None: the recipe's, except rht=None: off)."""
    for name, value in (("recipe", recipe), ("pass_", pass_), ("role", role)):
        _check_str(func, name, value)
    k: dict = {"recipe": recipe, "pass_": pass_ or "", "role": role or ""}
    for name, value in knobs.items():
        if name not in _KNOBS:
            raise TypeError(f"{func}() got an unexpected keyword argument '{name}' "
                            f"(knobs: {', '.join(sorted(_KNOBS))})")
        if value is not None or name == "rht":
            k.update(_setting(name, value))
    return k


class Ablation(NamedTuple):
    """A recipe of the paper's ablation study: a preset with knobs set per pass on top of it."""
    base: str                                     # the preset it changes
    per_pass: Mapping[str, Mapping[str, Any]]     # pass -> knobs (as the Python API names them)
    what: str                                     # what changes, in words


_PASSES = _core.PASSES
# Settings a per-pass knob of the same name sets; the signs follow "rht" (Transformer Engine's for d = 16).
_PER_PASS_KNOBS = ("format", "block", "scale", "tile2d", "rht", "rht_bf16", "rounding")


def _per_pass(name: str, base: str) -> dict:
    """The knobs per pass that make ``name`` from ``base``: each setting the recipe changes in a pass. A change that
    differs between the two operands of a pass has no per-pass knob, and is refused here rather than described
    wrongly."""
    got, was = _core.recipe_table(name), _core.recipe_table(base)
    out = {}
    for p in _PASSES:
        k = {}
        for f in _PER_PASS_KNOBS:
            new = (got[p]["a"][f], got[p]["b"][f])
            if new != (was[p]["a"][f], was[p]["b"][f]):
                if new[0] != new[1]:
                    raise AssertionError(f"recipe {name}: {p} sets {f} differently on its two operands")
                k[f] = new[0]
        if k:
            out[p] = k
    return out


# The recipes of the paper's dense ablation study (docs/spec.md §8), in its order: RHT scope on the uniform grid
# growing to ufp4's all three GEMMs, SR, then E2M1 with RHT everywhere; `ufp4` itself is the arm that changes
# nothing. The C++ table of named recipes (models/include/fp4lab/recipe.hpp) defines them, so their names work
# wherever a preset's does: here (config, quantize, fp4lab.torch.Recipe) and on the command line. The training
# study, its paired comparisons and docs/training.md's table take them from here.
ABLATIONS = {r["name"]: Ablation(r["base"], _per_pass(r["name"], r["base"]), r["what"])
             for r in sorted((r for r in _core.recipe_rows() if r["study"]), key=lambda r: r["study"])}


@_one_line_errors
def config(recipe: Optional[str] = None, *, pass_: Optional[str] = None, role: Optional[str] = None,
           operand: Optional[str] = None, **knobs) -> QuantConfig:
    """The quantiser settings of one operand: the recipe's for that pass and operand, then the knobs on top.

    ``recipe`` is a preset or an ablation (``fp4lab.ABLATIONS``). Without ``pass_`` the pass is fwd_y (bwd_dx for
    ``role="bwd_dy"``), as on the command line; ``operand`` ("a" or "b") picks an operand where ``role`` does not.
    """
    k = _knobs("config", recipe, pass_, role, knobs)
    _check_str("config", "operand", operand)
    return _core.operand_config(**k, operand=operand or "")


def _as_matrix(x: Any, func: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{func}(): x must be a numpy array, not {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{func}(): x must be 2-D [rows, K] (quantised along its last dimension), got shape "
                         f"{list(x.shape)}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{func}(): x must be C-contiguous (np.ascontiguousarray makes a copy that is)")
    return x


def _is_bf16(dtype: np.dtype) -> bool:
    return dtype.name == "bfloat16"  # ml_dtypes.bfloat16, without importing ml_dtypes where it is absent


@_one_line_errors
def quantize(x: np.ndarray, recipe: Optional[str] = None, *, pass_: Optional[str] = None,
             role: Optional[str] = None, **knobs) -> QTensor:
    """Block-quantise a 2-D float32 or ml_dtypes.bfloat16 array along its last dimension.

    ``recipe`` is a preset (``fp4lab.recipes()``) or an ablation (``fp4lab.ABLATIONS``) whose settings for
    ``pass_`` and ``role`` apply; knobs named
    as the CLI's options (``format``, ``block``, ``scale``, ``tile2d``, ``rht`` (a size, or 0 or None: no
    rotation, as ``--rht none``), ``rht_signs`` (list or "te"),
    ``rht_seed``, ``rht_bf16``, ``rounding``, ``sr_draw`` ("philox4", "philox1" or "philox16", docs/spec.md §4),
    ``seed``, ``stream``) override it. Returns a QTensor with
    ``codes`` (uint8 [rows, K]), ``scales`` (float32 [rows, K/B]), ``scale_codes`` (uint8 or None),
    ``global_scale`` and ``dequantize()``.
    """
    x = _as_matrix(x, "quantize")
    cfg = config(recipe, pass_=pass_, role=role, **knobs)
    if x.dtype == np.float32:
        return _core.quantize_f32(x, cfg)
    if _is_bf16(x.dtype):
        return _core.quantize_bf16(x.view(np.uint16), cfg)
    raise TypeError(f"quantize(): x must be float32 or ml_dtypes.bfloat16, not {x.dtype}")


@_one_line_errors
def quantize_with(x: np.ndarray, cfg: QuantConfig) -> QTensor:
    """Quantise with a QuantConfig from ``config()`` (the knobs already resolved)."""
    x = _as_matrix(x, "quantize_with")
    if not isinstance(cfg, QuantConfig):
        raise TypeError(f"quantize_with(): cfg must be a QuantConfig (from fp4lab.config), not {type(cfg).__name__}")
    if x.dtype == np.float32:
        return _core.quantize_f32(x, cfg)
    if _is_bf16(x.dtype):
        return _core.quantize_bf16(x.view(np.uint16), cfg)
    raise TypeError(f"quantize_with(): x must be float32 or ml_dtypes.bfloat16, not {x.dtype}")


@_one_line_errors
def gemm(qa: QTensor, qb: QTensor) -> np.ndarray:
    """C = A · Bᵀ (float32 [M, N]) of two operands quantised along K, under the datapath contract
    (docs/datapath.md): exact int32 block dot products, FP32 scaling and accumulation in ascending block order.
    Raises ValueError, with the reason, for a pair the contract does not define (docs/spec.md §5): K or the block
    size differ, or the operands were not quantised under the same rotation (RHT size and signs, or none)."""
    if not isinstance(qa, QTensor) or not isinstance(qb, QTensor):
        raise TypeError("gemm(): both operands must be fp4lab.QTensor (from fp4lab.quantize)")
    return _core.gemm(qa, qb)


def formats() -> list:
    """The element grids: levels, integer view, gmax, emax (docs/spec.md §1)."""
    return _core.formats()


def _json_value(o: Any) -> Any:
    """json.dumps' fallback for a config dict: an integer type (numpy's) as its int, anything else as its text, which
    the reader then refuses by the field's name if the field is one it reads."""
    try:
        return operator.index(o)
    except TypeError:
        return str(o)


def model_shapes(config: Any, tokens: int, *, multiple: int = 1) -> list:
    """The linear-layer GEMMs of one training step of a Hugging Face model, derived from its config by the rule of
    docs/spec.md §13 (the C++ that ``fp4lab sim --model CONFIG --tokens N`` replays): one dict per row of a shape
    list (workloads/shapes/README.md), ``{"gemm", "tokens", "in", "out", "count"}``, in model order.

    ``config`` is the path of a config.json, its dict, or a ``transformers`` config object (its ``to_dict()``);
    ``tokens`` is the step's batch × sequence. Rows keep the model's own dimensions; ``multiple`` rounds each up to
    a multiple of it (the command line rounds each to the block and RHT sizes of the passes that reduce over it).
    An unsupported model_type or a missing or invalid field raises ValueError naming the file (or ``config``) and
    the field."""
    limit = _core.max_shape_dim  # the largest dimension of a layer (sim::kMaxShapeDim)
    for name, v in (("tokens", tokens), ("multiple", multiple)):
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"model_shapes(): {name} must be an integer, not bool")
        try:
            n = operator.index(v)
        except TypeError:
            raise TypeError(f"model_shapes(): {name} must be an integer, not {type(v).__name__}") from None
        if not 1 <= n <= limit:
            raise ValueError(f"model_shapes(): {name} = {n} is outside 1..{limit}")
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not isinstance(path, str):
            raise TypeError(f"model_shapes(): a config path must be a str or os.PathLike of str, not "
                            f"{type(path).__name__}")
        source, is_file = path, True
    else:
        if not isinstance(config, Mapping) and callable(getattr(config, "to_dict", None)):
            config = config.to_dict()
        if not isinstance(config, Mapping):
            raise TypeError(f"model_shapes(): config must be a path, a dict or a transformers config, not "
                            f"{type(config).__name__}")
        try:
            source = json_module.dumps(dict(config), allow_nan=False, default=_json_value)
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"config: not JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        is_file = False
    _, _, rows = _core.model_shapes(source, is_file, operator.index(tokens), operator.index(multiple))
    return [{"gemm": g, "tokens": t, "in": i, "out": o, "count": c} for g, t, i, o, c in rows]


def decide(model: Any, **kwargs: Any) -> dict:
    """From a model to a go/no-go on uniform-grid (E1M2/INT4) hardware: ``fp4lab decide`` in Python. The arguments,
    the document it returns and the report it writes with ``out=`` are fp4lab.decision.decide's (docs/decide.md)."""
    from .decision import decide as run
    return run(model, **kwargs)

