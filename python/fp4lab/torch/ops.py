"""The quantiser, the contract GEMM and the dequantiser on torch tensors: the golden model on CPU tensors, the
CUDA kernels on CUDA tensors; and the same as torch.library operators (``torch.ops.fp4lab.quantize``, ``gemm``,
``dequantize``, ``qgemm``, ``fake_quantize``, ``fast_qmatmul``, ``fast_pair``, ``fast_mm``, with ``take_step`` and
``column_sum``), through which the training path runs so that torch.compile traces it."""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

import fp4lab as _fp
from fp4lab import _core
from fp4lab._base import one_line_errors

from ._quantizers import amax_quantizer, join_empty, shard_quantizer
from .recipe import Recipe, recipe_of_key

__all__ = ["quantize", "fake_quantize", "fake_quantize_both", "gemm", "product", "dequantize", "QTensorCUDA",
           "check_finite"]


# ---- operations on tensors ------------------------------------------------------------------------------------

_cuda_fault: Optional[str] = None  # why QTensorCUDA cannot be made here ("" where it can), found once a process


def _need_cuda() -> None:
    """A one-line RuntimeError where a GPU operand cannot be made: a build of fp4lab without CUDA, or no CUDA device
    that torch sees (whose views of the operand's buffers it needs)."""
    global _cuda_fault
    if _cuda_fault is None:
        _cuda_fault = ("" if _core.cuda_built and torch.cuda.is_available() else
                       "this fp4lab was built without CUDA" if not _core.cuda_built else "torch sees no CUDA device")
    if _cuda_fault:
        raise RuntimeError(f"fp4lab.torch.QTensorCUDA needs a CUDA build of fp4lab and a CUDA device: {_cuda_fault}")


class QTensorCUDA:
    """A quantised operand on the GPU: the kernels' device layout (two codes per byte, element 2i in the low
    nibble), with torch views of its buffers (``packed_codes``, ``scales``, ``global_scale``)."""

    def __init__(self, handle=None):
        if handle is None:
            _need_cuda()
        self._h = handle if handle is not None else _core.CudaQTensor()
        self.device = None  # the torch.device its buffers are on, set by whatever fills them

    @property
    def shape(self) -> Tuple[int, int]:
        return (self._h.rows, self._h.cols)

    def __getattr__(self, name):
        if name == "_h":  # not made (no CUDA): no recursion through this method
            raise AttributeError(name)
        return getattr(self._h, name)

    def to_host(self) -> "_core.QTensor":
        """The golden layout (one code per byte) on the host, for a bit-for-bit comparison."""
        torch.cuda.current_stream().synchronize()
        return self._h.to_host()


# The deferred check's flag on each device: one int the kernels OR bits into (1: an input held NaN or Inf; 2: an
# input's RHT overflowed FP32; 4: a GEMM output was NaN or Inf), read by check_finite(). The bits stay until a read
# finds one set; the layers read them through snapshots (below), check_finite() directly.
_flags: Dict[int, torch.Tensor] = {}
_flag_ptrs: Dict[int, int] = {}
_INPUT, _RHT, _OUTPUT = 1, 2, 4
# The layers' reads without a synchronisation: at each step's first forward the flag is copied, on the stream, into
# pinned host memory and an event recorded; a later step reads a copy once its event has passed. _pending[device]
# holds (event, host word, step of the copy), oldest first; _free the (event, host word) pairs not in use, made with
# the flag (a pinned allocation synchronises the device: none is made during training).
_SNAPSHOTS = 2  # copies in flight at most: a third waits for the oldest (the host then runs two steps ahead)
_pending: Dict[int, list] = {}
_free: Dict[int, list] = {}


def _flag_ptr(device: int) -> int:
    """The address of the device's flag (made at first use, which a CUDA graph capture cannot be: its zeroing would
    run at every replay instead of once)."""
    p = _flag_ptrs.get(device)
    if p is None:
        _refuse_capture("the first deferred finite check on this device")
        flag = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", device))
        free = [(torch.cuda.Event(), torch.zeros(1, dtype=torch.int32, pin_memory=True)) for _ in range(_SNAPSHOTS + 1)]
        _pending[device], _free[device], _flags[device] = [], free, flag  # all or nothing
        p = _flag_ptrs[device] = flag.data_ptr()
    return p


def _need_cuda_build() -> None:
    if not _core.cuda_built:
        raise RuntimeError("this fp4lab was built without CUDA")


def _refuse_capture(what: str) -> None:
    """A one-line error for what cannot run while a CUDA graph is captured (it would bake one step into the graph)."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what} cannot be captured in a CUDA graph: capture the eager model after an eager step "
                           "on the device (docs/python.md, CUDA graphs)")


# What follows it in an operator's label is the module's instance number (the layers add it under torch.compile).
INSTANCE_MARK = "\x1f"

# The current stream's handle on a device; None on a torch built without CUDA (whose tensors are never on a GPU).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def launch(t: torch.Tensor) -> Tuple[int, int]:
    """(device index, current stream handle) for kernels working on t: what the launch bindings take, at a fraction
    of the cost of torch.cuda.device() and torch.cuda.current_stream() (the training path launches hundreds of
    kernels a step).

    Args:
        t: a CUDA tensor.

    Returns:
        (device index, the handle of the device's current stream).
    """
    i = t.get_device()
    return i, _raw_stream(i)


def _raise_flag(device: int, v: int, where: str) -> None:
    """The ValueError of flag bits v on a device: the first fault by the order below, and the others it holds."""
    faults = [(_INPUT, "an input tensor of a quantised GEMM held NaN or Inf"),
              (_RHT, "the RHT of an input of a quantised GEMM overflowed FP32"),
              (_OUTPUT, "the output of a quantised GEMM overflowed")]
    said = [text for bit, text in faults if v & bit]
    why = " (4-bit grids have no such codes)" if v & (_INPUT | _RHT) else ""
    raise ValueError(f"cuda:{device}: {said[0]} {where}{why}" + "".join(f"; also, {t}" for t in said[1:]))


def _clear(device: int) -> None:
    """Zeroes the device's flag (on the stream) and drops its snapshots unread: the caller has read the flag, which
    holds every bit they hold (the bits stay until a clearing)."""
    _flags[device].zero_()
    for ev, word, _ in _pending[device]:
        ev.synchronize()  # its copy may still be writing the word (a fault's path: the wait is no cost)
        _free[device].append((ev, word))
    _pending[device].clear()


def check_finite() -> None:
    """Raises ValueError when a CUDA operand quantised with check_finite='deferred' held NaN or Inf, or a GEMM output
    overflowed, since the last call (one synchronisation), and clears the flag. The layers read the flag at each
    training step's first forward without a synchronisation (``check_finite_once``); a loop may call this at the end
    of a step to hear of a fault at once."""
    global _checked_step
    _checked_step = None
    for i in sorted(_flags):
        v = int(_flags[i].item())
        if v:
            _clear(i)
            _raise_flag(i, v, "since the last check")


def _check_output(y: torch.Tensor, check_finite: str = "sync", k: int = 0,
                  bounds: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None) -> torch.Tensor:
    """An output past FP32 (or BF16, fast mode's CUDA product) is a data fault, not a result: the golden GEMM refuses
    it, and so do the CUDA kernels and fast mode here. With check_finite='deferred' a CUDA output is only scanned on
    the device, which sets the flag check_finite() reads (one kernel, no synchronisation). ``bounds``: where y = A·Bᵀ
    (over ``k``) of two operands fake_quantize_both made, their magnitude bounds (_fake_both's): the kernel first
    reads them and leaves the scan out when they prove every element finite; None or empty for an operand without."""
    if y.is_cuda and check_finite == "deferred":
        if y.numel():
            z = y  # the kernel reads dense BF16 or FP32 (the products are one or the other)
            if z.dtype not in (torch.bfloat16, torch.float32) or not z.is_contiguous():
                z = z.contiguous().float()
            dev, stream = launch(z)
            found = _product_bounds(bounds)
            if found:
                _core.cuda_flag_nonfinite_product(dev, stream, z.data_ptr(), z.numel(), z.dtype == torch.bfloat16,
                                                  _flag_ptr(dev), _OUTPUT, *found, k)
            else:
                _core.cuda_flag_nonfinite(dev, stream, z.data_ptr(), z.numel(), z.dtype == torch.bfloat16,
                                          _flag_ptr(dev), _OUTPUT)
        return y
    bad = torch.isfinite(y).logical_not()
    if bool(bad.any()):
        r, c = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"GEMM output overflows {'BF16' if y.dtype == torch.bfloat16 else 'FP32'} at C[{r}, {c}]")
    return y


def _product_bounds(bounds) -> Optional[Tuple[int, int, int, int]]:
    """(address, words) of both operands' bounds for cuda_flag_nonfinite_product, or None where one has none."""
    if bounds is None or bounds[0] is None or bounds[1] is None or not bounds[0].numel() or not bounds[1].numel():
        return None
    return bounds[0].data_ptr(), bounds[0].numel(), bounds[1].data_ptr(), bounds[1].numel()


# The step and the layer of the last check_finite_once().
_checked_step: Optional[int] = None
_checked_by: Optional[int] = None


def _read_snapshots(step: int) -> None:
    """At a training step's first forward: reads each device's snapshots whose copies have finished, raises
    ValueError on a set bit, and takes the step's own snapshot where it is later than the newest one in flight (a
    recomputed or repeated forward, or a model behind another, takes none). Taking one where _SNAPSHOTS are in
    flight first waits for the oldest: no synchronisation while the GPU is less than two steps behind the host."""
    fault = None  # raised after every device is read and copied, so that a fault on one delays no other's
    for i in sorted(_flags):
        pending, v, seen = _pending[i], 0, None
        take = not pending or step > pending[-1][2]
        while pending and (pending[0][0].query() or (take and len(pending) >= _SNAPSHOTS)):
            ev, word, at = pending.pop(0)
            ev.synchronize()  # passed already, unless _SNAPSHOTS copies were in flight
            v, seen = v | int(word[0]), at
            _free[i].append((ev, word))
        if v:
            # A fault's path: the flag itself too (one synchronisation), so that a fault after the copy that showed
            # this one is reported with it rather than cleared unheard.
            v |= int(_flags[i].item())
            _clear(i)
            fault = fault or (i, v, f"before step {seen}")
        if take:
            ev, word = _free[i][-1]
            word.copy_(_flags[i], non_blocking=True)  # on the flag's device's current stream, as the kernels ran
            ev.record(torch.cuda.current_stream(i))
            pending.append(_free[i].pop() + (step,))
    if fault:
        _raise_flag(*fault)


def check_finite_once(step: int, layer: Any) -> None:
    """The layers' deferred check, once per training step (they call it at each forward on CUDA): at a forward whose
    step differs from the last check's, or by the layer that made it (the first layer of the model), it reads the flag
    as copied at an earlier step's first forward, without waiting for the GPU (``_read_snapshots``): a fault in step k
    raises ValueError at the first forward of step k + 2, or of step k + 3 where the GPU has not yet run what was
    queued before step k + 1's first forward (a model whose first layer runs twice a step takes two copies a step,
    and may wait at its second). Not while a CUDA graph is being captured; the last steps of a run are heard only
    through check_finite(), which a loop calls after its last step."""
    global _checked_step, _checked_by
    if (step != _checked_step or id(layer) == _checked_by) and not torch.cuda.is_current_stream_capturing():
        # Claimed by the step's first layer even before the flag exists, so that no later layer of that step copies
        # it in the middle of the step.
        _checked_step, _checked_by = step, id(layer)
        if _flags:
            _read_snapshots(step)


@one_line_errors
def quantize(x: torch.Tensor, cfg: Any = None, *, out: Optional[QTensorCUDA] = None, rht_path: str = "fused",
             check_finite: str = "sync", device_seed: Optional[torch.Tensor] = None, **knobs):
    """Quantise a 2-D tensor along its last dimension. ``cfg`` is a QuantConfig (``fp4lab.config``) or a recipe
    name with ``knobs`` as in ``fp4lab.quantize``. A CPU tensor goes through the golden model and gives an
    ``fp4lab.QTensor``; a CUDA tensor through the CUDA kernels (fused or unfused RHT) and gives a QTensorCUDA.
    ``device_seed`` (CUDA: an int64 tensor on x's device) holds the SR seed's bits, read by the kernel in place of
    cfg's: a launch captured in a CUDA graph reads the value there at each replay.

    Args:
        x: a 2-D [rows, K] float32, bfloat16 or float16 tensor on the CPU or a CUDA device.
        cfg: a QuantConfig, a recipe name, or None (the knobs alone).
        out: CUDA: a QTensorCUDA to quantise into (its device buffers are reused), else a new one.
        rht_path: CUDA: "fused" (the RHT in the quantiser's kernel) or "unfused" (a kernel of its own).
        check_finite: CUDA: "sync" raises at once on NaN/Inf; "deferred" sets the device flag ``check_finite()``
            reads.
        device_seed: CUDA: an int64 tensor on x's device holding the SR seed's bits, or None (cfg's seed).
        **knobs: the knobs of ``fp4lab.quantize`` (with a recipe name or None only).

    Returns:
        An ``fp4lab.QTensor`` for a CPU tensor, a QTensorCUDA (``out`` where given) for a CUDA one.
    """
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
    x, tr = _cuda_input(x.detach())
    if x.is_cuda:
        q = out if out is not None else QTensorCUDA()
        dev, stream = launch(x)
        q.device = x.device
        _core.cuda_quantize(dev, stream, x.data_ptr(), x.shape[0], x.shape[1], x.dtype == torch.bfloat16, tr, cfg,
                            q._h, rht_path, check_finite == "sync", _flag_ptr(dev) if check_finite == "deferred" else 0,
                            _seed_ptr(device_seed, x))
        return q
    if x.device.type != "cpu":
        raise ValueError(f"quantize(): tensors on {x.device.type} are not supported (CPU and CUDA are)")
    # The tensor itself (DLPack), not x.numpy(): that marks the storage, which may be a parameter's, as not
    # resizable, and FSDP2 frees an unsharded parameter by resizing its storage to 0.
    return _core.quantize_f32(x, cfg)


def _cuda_input(x: torch.Tensor) -> Tuple[torch.Tensor, bool]:
    """The tensor the quantiser reads, and whether it reads it transposed. On CUDA a transposed view (Wᵀ, dYᵀ,
    Xᵀ of the backward GEMMs) is read in place by the transposed kernels, and BF16 is widened as it is loaded (both
    exactly as quantising the FP32 row-major copy); otherwise one copy at most: FP16/BF16 widen exactly to FP32,
    and other strides are laid out row-major."""
    if x.is_cuda:
        if not _core.cuda_built:
            raise RuntimeError("this fp4lab was built without CUDA")
        tr = not x.is_contiguous() and x.t().is_contiguous()
        if tr:
            x = x.t()
        if x.dtype != torch.bfloat16:
            x = x.to(torch.float32)
        return x.contiguous(), tr
    return x.to(torch.float32, memory_format=torch.contiguous_format).contiguous(), False


def fake_quantize(x: torch.Tensor, cfg: "_core.QuantConfig", *, out: Optional[QTensorCUDA] = None,
                  rht_path: str = "fused", check_finite: str = "sync",
                  device_seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The BF16 values ``dequantize(quantize(x, cfg))`` rounded to BF16 gives, for a CUDA tensor, in one pass over
    x (the operands of ``fast`` GEMMs); ``out`` receives the quantised operand too when given. ``device_seed`` as
    in ``quantize``.

    Args:
        x: a 2-D CUDA tensor (float32, bfloat16 or float16).
        cfg: the QuantConfig.
        out, rht_path, check_finite, device_seed: as in ``quantize``.

    Returns:
        A bfloat16 tensor of x's shape on x's device.
    """
    x, tr = _cuda_input(x.detach())
    if not x.is_cuda:
        raise ValueError("fake_quantize(): x must be a CUDA tensor")
    rows, cols = x.shape
    if out is not None:
        out.device = x.device
    y = torch.empty((cols, rows) if tr else (rows, cols), dtype=torch.bfloat16, device=x.device)
    dev, stream = launch(x)
    _core.cuda_fake_quantize(dev, stream, x.data_ptr(), rows, cols, x.dtype == torch.bfloat16, tr, cfg, y.data_ptr(),
                             rht_path, check_finite == "sync", _flag_ptr(dev) if check_finite == "deferred" else 0,
                             None if out is None else out._h, _seed_ptr(device_seed, x))
    return y


def fake_quantize_both(x: torch.Tensor, cfg: "_core.QuantConfig", cfg_t: "_core.QuantConfig", *,
                       check_finite: str = "sync", device_seed: Optional[torch.Tensor] = None
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``fake_quantize(x, cfg)`` and ``fake_quantize(x.t(), cfg_t)`` together, for a 2-D CUDA tensor: the two operands
    a training step takes of one tensor (X for the forward GEMM and Xᵀ for the weight gradient; dY and dYᵀ for the
    two backward GEMMs). For BF16 x under blocks of 16 with RHT 0 or 16 (UFP4's and NVFP4's activations and
    gradients) one kernel reads x once for both; where the two outputs hold the same values (NVFP4's weights, in 16x16
    tiles, with RTNE and no RHT) one pass writes the first and a copy transposes it; otherwise the two passes run.
    The bits are the same in every case.

    Args:
        x: a 2-D CUDA tensor [rows, cols] (float32, bfloat16 or float16).
        cfg: the QuantConfig of x, quantised along cols.
        cfg_t: the QuantConfig of xᵀ, quantised along rows.
        check_finite, device_seed: as in ``quantize``.

    Returns:
        (x's BF16 values [rows, cols], xᵀ's BF16 values [cols, rows]).
    """
    y, yt, _, _ = _fake_both(x, cfg, cfg_t, check_finite, device_seed)
    return y, yt


def _bound_words(bf16: bool, cfg, cfg_t, check_finite: str, rows: Any, cols: Any) -> Any:
    """The FP32 words of each bound _fake_both gives: one per tile where the kernels bound the two outputs (one read
    of x for both, or NVFP4's tiled weights, one pass and a transposing copy) under the deferred check, else none.
    ``rows`` and ``cols`` may be symbolic sizes (a dynamic-shape graph's fake tensors): the count is then the same
    arithmetic on them, with the tile and the most rows read off the kernels' own functions (_bound_tile), and a
    guard on the rows."""
    if check_finite != "deferred":
        return 0
    if isinstance(rows, int) and isinstance(cols, int):
        bounded = _core.cuda_fake_quantize_both_bounded(bf16, cfg, cfg_t, rows)
        return _core.cuda_fake_quantize_both_bound_words(rows, cols) if bounded else 0
    if not _core.cuda_fake_quantize_both_bounded(bf16, cfg, cfg_t, 1):
        return 0
    tile_rows, tile_cols, most_rows = _bound_tile(cfg, cfg_t)
    if rows > most_rows:
        return 0
    return ((cols + tile_cols - 1) // tile_cols) * ((rows + tile_rows - 1) // tile_rows)


@functools.lru_cache(maxsize=None)
def _bound_tile(cfg, cfg_t) -> Tuple[int, int, int]:
    """(rows, cols) of x one bound word covers, and the most rows of x the kernels bound both outputs of under cfg and
    cfg_t (configurations they bound), found by asking cuda_fake_quantize_both_bound_words and
    cuda_fake_quantize_both_bounded themselves: no second statement of the kernel's tile here."""
    words = _core.cuda_fake_quantize_both_bound_words
    tile_rows = next(n for n in range(1, 1 << 20) if words(n + 1, 1) > 1)
    tile_cols = next(n for n in range(1, 1 << 20) if words(1, n + 1) > 1)
    lo, hi = 1, 1 << 40  # the fused kernel takes lo rows, not hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _core.cuda_fake_quantize_both_bounded(True, cfg, cfg_t, mid) else (lo, mid)
    return tile_rows, tile_cols, lo


def _fake_both(x: torch.Tensor, cfg, cfg_t, check_finite: str, device_seed: Optional[torch.Tensor]):
    """fake_quantize_both's work: (y, yt, bound of y, bound of yt). Where the kernels bound the two outputs under the
    deferred check (_bound_words), they also write the bounds on the outputs' magnitudes (one FP32 word per tile,
    FP32 tensors of their own), which a fast GEMM's output check reads instead of scanning the product
    (_check_output); elsewhere the bounds are empty."""
    if x.dim() != 2:
        raise ValueError(f"fake_quantize_both(): x must be 2-D, not {x.dim()}-D")
    if not x.is_cuda:
        raise ValueError("fake_quantize_both(): x must be a CUDA tensor")
    x = x.detach()
    x = x.contiguous() if x.dtype == torch.bfloat16 else x.to(torch.float32).contiguous()
    rows, cols = x.shape
    # Only the deferred check reads the bounds (a synchronous one scans the product on the host's request). The two
    # passes give none.
    bf16 = x.dtype == torch.bfloat16
    deferred = check_finite == "deferred"
    words = _bound_words(bf16, cfg, cfg_t, check_finite, rows, cols)
    # Four tensors of their own: an operator's outputs (fp4lab::fast_pair) may alias neither its inputs nor each other.
    y = torch.empty((rows, cols), dtype=torch.bfloat16, device=x.device)
    yt = torch.empty((cols, rows), dtype=torch.bfloat16, device=x.device)
    by, byt = (torch.empty(words, dtype=torch.float32, device=x.device) for _ in range(2))
    dev, stream = launch(x)
    _core.cuda_fake_quantize_both(dev, stream, x.data_ptr(), rows, cols, bf16, cfg, y.data_ptr(), cfg_t,
                                  yt.data_ptr(), check_finite == "sync", _flag_ptr(dev) if deferred else 0,
                                  _seed_ptr(device_seed, x), by.data_ptr() if words else 0,
                                  byt.data_ptr() if words else 0)
    return y, yt, by, byt


def _seed_ptr(seed: Optional[torch.Tensor], x: torch.Tensor) -> int:
    """The address of a device SR seed for a launch on x's device (0: none, the config's seed)."""
    if seed is None:
        return 0
    if not (isinstance(seed, torch.Tensor) and seed.dtype == torch.int64 and seed.numel() >= 1
            and seed.device == x.device):
        raise ValueError(f"device_seed must be an int64 tensor on {x.device}")
    return seed.data_ptr()


@one_line_errors
def dequantize(q) -> torch.Tensor:
    """FP32 values of a quantised operand: (grid value · block scale) · global scale, in that FP32 order.

    Args:
        q: a QTensorCUDA or an ``fp4lab.QTensor`` (from ``quantize``).

    Returns:
        A float32 tensor of q's shape, on q's device.
    """
    return dequantize_as(q, torch.float32)


def dequantize_as(q, dtype: torch.dtype) -> torch.Tensor:
    """The values of a quantised operand, as ``dequantize`` computes them, in ``dtype``.

    Args:
        q: a QTensorCUDA (dequantised on its device) or an fp4lab.QTensor (on the CPU).
        dtype: the output dtype; the FP32 values are rounded to it (on CUDA, by the dequantising kernel).

    Returns:
        A tensor of ``q``'s shape.
    """
    if isinstance(q, QTensorCUDA):
        out = torch.empty(q.shape, dtype=dtype, device=q.device or q.packed_codes.device)
        with torch.cuda.device(out.device):
            _core.cuda_dequantize(q._h, out, launch(out)[1])
        return out
    return torch.from_numpy(q.dequantize()).to(dtype)


@one_line_errors
def gemm(qa, qb, *, kernel: str = "fast", check_finite: str = "sync", out_dtype: torch.dtype = torch.float32
         ) -> torch.Tensor:
    """C = A · Bᵀ, FP32 [M, N], under the datapath contract: the golden model for host operands, the CUDA
    kernels for device operands (``kernel`` "fast": tensor cores, int8 ``mma.sync`` by default; "reference": one
    thread per output). An output past FP32 raises ValueError (on CUDA with ``check_finite="deferred"``, at the
    next ``check_finite()``). Another ``out_dtype`` gives C converted to it, as ``.to(out_dtype)`` of the FP32 C. The
    fast kernel with the deferred check checks the FP32 values in its epilogue, and writes ``torch.bfloat16`` (round
    to nearest even) there too.

    Args:
        qa, qb: the operands A [M, K] and B [N, K], both from ``quantize`` on the same kind of device.
        kernel: CUDA: "fast" or "reference".
        check_finite: CUDA: "sync" or "deferred", as in ``quantize``.
        out_dtype: the dtype of the result.

    Returns:
        C [M, N] in ``out_dtype``, on the operands' device.
    """
    if isinstance(qa, QTensorCUDA) and isinstance(qb, QTensorCUDA):
        dev = qa.device or qa.packed_codes.device
        if kernel == "fast" and check_finite == "deferred":  # the output check in the kernel's epilogue
            bf16 = out_dtype == torch.bfloat16
            c = torch.empty((qa.rows, qb.rows), dtype=torch.bfloat16 if bf16 else torch.float32, device=dev)
            i, stream = launch(c)
            _core.cuda_gemm(i, stream, qa._h, qb._h, c.data_ptr(), kernel, bf16, _flag_ptr(i), _OUTPUT)
            return c.to(out_dtype)
        c = torch.empty((qa.rows, qb.rows), dtype=torch.float32, device=dev)
        _core.cuda_gemm(*launch(c), qa._h, qb._h, c.data_ptr(), kernel)
        return _check_output(c, check_finite).to(out_dtype)
    if isinstance(qa, _core.QTensor) and isinstance(qb, _core.QTensor):
        return torch.from_numpy(_core.gemm(qa, qb)).to(out_dtype)
    raise TypeError("gemm(): both operands must come from fp4lab.torch.quantize on the same kind of device")


# ---- the training layer -------------------------------------------------------------------------------------

@one_line_errors
def product(qa, qb, mode: str = "exact", check_finite: str = "sync",
            out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A · Bᵀ of two quantised operands in a GEMM mode: "exact" is ``gemm`` (the datapath contract, FP32, or its
    values rounded to ``out_dtype`` BF16); "fast" multiplies the dequantised operands with torch's matmul on CUDA
    (cuBLAS on BF16 values with FP32 accumulation, a BF16 product; ``out_dtype`` does not apply) and is ``gemm``'s
    FP32 product on the CPU, where the golden GEMM takes less time than dequantising and torch's FP32 matmul (so
    fast equals exact there). Either mode raises ValueError on an output that overflows.

    Args:
        qa, qb: the operands A [M, K] and B [N, K], as ``gemm`` takes them.
        mode: "exact" or "fast".
        check_finite: CUDA: "sync" or "deferred", as in ``quantize``.
        out_dtype: exact mode: the dtype of the result.

    Returns:
        A · Bᵀ [M, N]: FP32 or ``out_dtype`` in exact mode; BF16 in fast mode on CUDA, FP32 on the CPU.
    """
    if mode not in ("exact", "fast"):
        raise ValueError(f"mode must be 'exact' or 'fast', not {mode!r}")
    if mode == "exact":
        return gemm(qa, qb, check_finite=check_finite, out_dtype=out_dtype)
    if isinstance(qa, _core.QTensor) and isinstance(qb, _core.QTensor):
        # On the CPU the golden GEMM takes 2-4x less time than dequantising, torch's FP32 matmul and a finiteness
        # scan, and refuses an overflow (and operands under different rotations) itself.
        return gemm(qa, qb, check_finite=check_finite)
    if not (isinstance(qa, QTensorCUDA) and isinstance(qb, QTensorCUDA)):
        raise TypeError("product(): both operands must come from fp4lab.torch.quantize on the same kind of device")
    # The same pairs as the contract GEMM: operands quantised under different rotations have no product.
    _core.cuda_check_gemm_operands(qa._h, qb._h)
    return _fast_matmul(dequantize_as(qa, torch.bfloat16), dequantize_as(qb, torch.bfloat16), check_finite)


# ---- torch.library operators ----------------------------------------------------------------------------------
# The training path runs through these, so torch.compile traces a converted model's step without a graph break. A
# quantised operand is three tensors in the golden layout: codes [rows, K] uint8 (one per byte), decoded block
# scales [rows, K / block] float32 and the global scale, a 0-d float32. The recipe travels as its key (a string
# constant of the graph) and the SR step as a 0-d int64 tensor, read inside the operator, so a new step is new
# data for the same graph rather than a new graph.

def _config(recipe: str, step: torch.Tensor, layer: int, pass_: str, operand: str) -> "_core.QuantConfig":
    return recipe_of_key(recipe).config(pass_, operand, layer=layer, step=int(step))


def _qtensor(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, recipe: str, pass_: str,
             operand: str) -> "_core.QTensor":
    """The golden QTensor of an operand's three tensors; its grid, scale and block are the recipe's (the same at
    every step and layer)."""
    c = recipe_of_key(recipe).config(pass_, operand, layer=0, step=0).to_dict()
    return _core.make_qtensor(c["format"], c["scale"], c["block"], c["tile2d"], codes.cpu().numpy(),
                              scales.cpu().numpy(), float(global_scale), c["rht"], _signs(c["rht_signs"]))


def _signs(text: str) -> list:
    """A QuantConfig's signs as to_dict() spells them ("+1,-1,..."; "" without RHT) -> floats."""
    return [1.0 if t == "+1" else -1.0 for t in text.split(",")] if text else []


def _operand_tensors(q, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(np.array(q.codes)).to(device), torch.from_numpy(np.array(q.scales)).to(device),
            torch.tensor(q.global_scale, dtype=torch.float32, device=device))


# The highest SR step a forward outside a backward took, per (recipe, layer, label), read by _check_recompute.
_forward_steps: Dict[Tuple[str, int, str], int] = {}


def _check_recompute(step: int, recipe: str, layer: int, pass_: str, label: str) -> None:
    """A GEMM in a backward keyed by a step no forward took is refused. Activation checkpointing inside a compiled
    graph (torch.compile of a model with torch.utils.checkpoint regions, HF gradient_checkpointing_enable) recomputes
    the region's forward reading the step counter after the forward advanced it: its bits would differ from eager's
    without a word. Eager checkpointing repeats the original step (_layer.Stepped._take_step) and passes."""
    key = (recipe, layer, label)  # the label of a compiled graph's operator names the module instance too
    label = label.split(INSTANCE_MARK)[0]
    if torch._C._current_graph_task_id() == -1:
        if pass_ == "fwd_y" and step > _forward_steps.get(key, -1):
            _forward_steps[key] = step
    elif step > _forward_steps.get(key, step):
        raise RuntimeError(f"{label}: activation checkpointing inside a torch.compile'd graph recomputes the forward "
                           f"with SR step {step}, which no forward took: checkpoint in eager mode, or compile without "
                           "activation checkpointing (docs/python.md, torch.compile)")


def _quantize_labelled(x, step, recipe, layer, pass_, operand, label, fake=False, **kw):
    """quantize (``fake``: fake_quantize) of an operator's operand; a fault names the label, pass, operand and shape."""
    if operand == "a":
        _check_recompute(int(step), recipe, layer, pass_, label)
    label = label.split(INSTANCE_MARK)[0]  # the layer's name before it
    try:
        return (fake_quantize if fake else quantize)(x, _config(recipe, step, layer, pass_, operand), **kw)
    except ValueError as e:
        raise ValueError(f"{label}: {pass_} operand {operand} {list(x.shape)}: {e}") from None


@torch.library.custom_op("fp4lab::quantize", mutates_args=(), device_types="cpu")
def quantize_op(x: torch.Tensor, step: torch.Tensor, recipe: str, layer: int, pass_: str, operand: str,
                label: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Operand ``operand`` of pass ``pass_`` of a training GEMM, quantised along its last dimension under
    ``recipe`` with the SR key (seed, ``step``, ``layer``): (codes, scales, global scale). A fault names ``label``,
    the pass, the operand and its shape."""
    return _operand_tensors(_quantize_labelled(x, step, recipe, layer, pass_, operand, label), x.device)


# Device buffers the CUDA kernels of the operators quantise into and multiply from, one set per device (they
# only grow; the stream orders their reuse). The operators' results are fresh torch tensors.
_scratch: Dict[Tuple[int, str], QTensorCUDA] = {}


def _scratch_of(device: torch.device, what: str) -> QTensorCUDA:
    key = (device.index if device.index is not None else torch.cuda.current_device(), what)
    if key not in _scratch:
        _scratch[key] = QTensorCUDA()
    return _scratch[key]


@quantize_op.register_kernel("cuda")
def _quantize_cuda(x, step, recipe, layer, pass_, operand, label):
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    # The CUDA kernels quantise on the device; the packed codes are unpacked there into the golden layout the
    # operators carry (element 2i in the low nibble), with no host round trip.
    q = _quantize_labelled(x, step, recipe, layer, pass_, operand, label, out=_scratch_of(x.device, "q"),
                           check_finite=recipe_of_key(recipe).check_finite)
    p = q.packed_codes
    codes = torch.stack((p & 15, p >> 4), dim=-1).reshape(q.rows, q.cols)
    return codes, q.scales.clone(), q.global_scale.reshape(()).clone()


def _device_operand(codes, scales, global_scale, recipe: str, pass_: str, operand: str, what: str) -> QTensorCUDA:
    """The kernels' operand of the operators' three CUDA tensors (codes packed two per byte on the device)."""
    c = recipe_of_key(recipe).config(pass_, operand, layer=0, step=0).to_dict()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    q = _scratch_of(codes.device, what)
    _core.cuda_make_qtensor(c["format"], c["scale"], c["block"], c["tile2d"], packed, scales.contiguous(),
                            global_scale.reshape(1).contiguous(), q._h, launch(codes)[1], c["rht"],
                            _signs(c["rht_signs"]))
    q.device = codes.device
    return q


def _to_device(q: "_core.QTensor", device: torch.device) -> QTensorCUDA:
    """A golden operand copied to a CUDA device as the kernels' operand (codes packed two per byte there)."""
    codes = torch.from_numpy(np.asarray(q.codes)).to(device)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    out = QTensorCUDA()
    # Copies on the current stream, which orders them before these tensors' memory is reused.
    _core.cuda_make_qtensor(q.format, q.scale, q.block, q.tile2d, packed,
                            torch.from_numpy(np.ascontiguousarray(q.scales)).to(device),
                            torch.tensor([q.global_scale], dtype=torch.float32, device=device), out._h,
                            launch(packed)[1], q.rht, q.rht_signs or [])
    out.device = device
    return out


def _as_device_operand(q, device: torch.device):
    """A quantiser's result as the kernels' operand on ``device``: a QTensorCUDA as it is, a bare CudaQTensor
    (``_quantizers.quantize_rows_of`` on a CUDA operand) wrapped, a golden QTensor copied there."""
    if isinstance(q, _core.QTensor):
        return _to_device(q, device)
    if not isinstance(q, QTensorCUDA):
        q = QTensorCUDA(q)
        q.device = device
    return q


@quantize_op.register_fake
def _(x, step, recipe, layer, pass_, operand, label):
    block = recipe_of_key(recipe).config(pass_, operand, layer=0, step=0).to_dict()["block"]
    return (x.new_empty(x.shape, dtype=torch.uint8), x.new_empty((x.shape[0], x.shape[1] // block),
            dtype=torch.float32), x.new_empty((), dtype=torch.float32))


@torch.library.custom_op("fp4lab::gemm", mutates_args=(), device_types="cpu")
def gemm_op(codes_a: torch.Tensor, scales_a: torch.Tensor, global_a: torch.Tensor, codes_b: torch.Tensor,
            scales_b: torch.Tensor, global_b: torch.Tensor, recipe: str, pass_: str) -> torch.Tensor:
    """C = A · Bᵀ, FP32 [M, N], of two operands of pass ``pass_`` from ``fp4lab::quantize``, under the datapath
    contract: the golden model on CPU tensors, the CUDA kernels' fast GEMM on CUDA tensors."""
    qa = _qtensor(codes_a, scales_a, global_a, recipe, pass_, "a")
    qb = _qtensor(codes_b, scales_b, global_b, recipe, pass_, "b")
    return torch.from_numpy(_core.gemm(qa, qb)).to(codes_a.device)


@gemm_op.register_kernel("cuda")
def _gemm_cuda(codes_a, scales_a, global_a, codes_b, scales_b, global_b, recipe, pass_):
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    qa = _device_operand(codes_a, scales_a, global_a, recipe, pass_, "a", "a")
    qb = _device_operand(codes_b, scales_b, global_b, recipe, pass_, "b", "b")
    return gemm(qa, qb, check_finite=recipe_of_key(recipe).check_finite)


@gemm_op.register_fake
def _(codes_a, scales_a, global_a, codes_b, scales_b, global_b, recipe, pass_):
    return codes_a.new_empty((codes_a.shape[0], codes_b.shape[0]), dtype=torch.float32)


@torch.library.custom_op("fp4lab::dequantize", mutates_args=(), device_types="cpu")
def dequantize_op(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, recipe: str, pass_: str,
                  operand: str) -> torch.Tensor:
    """FP32 values of an operand from ``fp4lab::quantize``: (grid value · block scale) · global scale."""
    q = _qtensor(codes, scales, global_scale, recipe, pass_, operand)
    return torch.from_numpy(q.dequantize()).to(codes.device)


@dequantize_op.register_kernel("cuda")
def _dequantize_cuda(codes, scales, global_scale, recipe, pass_, operand):
    # The dequantiser's FP32 products, in its order, on the device (two correctly rounded multiplications; there is
    # no addition for a fused multiply-add to contract).
    q = _device_operand(codes, scales, global_scale, recipe, pass_, operand, "d")
    return dequantize_as(q, torch.float32)


@dequantize_op.register_fake
def _(codes, scales, global_scale, recipe, pass_, operand):
    return codes.new_empty(codes.shape, dtype=torch.float32)


def _fast_matmul(da: torch.Tensor, db: torch.Tensor, check_finite: str,
                 bounds: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None) -> torch.Tensor:
    return _check_output(torch.matmul(da, db.t()), check_finite, da.shape[1], bounds)


@torch.library.custom_op("fp4lab::qgemm", mutates_args=(), device_types="cpu")
def qgemm_op(a: torch.Tensor, b: torch.Tensor, step: torch.Tensor, recipe: str, layer: int, pass_: str,
             label: str) -> torch.Tensor:
    """A [M, K] · B [N, K]ᵀ, FP32 [M, N], both operands quantised as ``fp4lab::quantize`` does, under the datapath
    contract: what ``fp4lab::gemm`` gives of the two ``fp4lab::quantize`` results, in one operator (on CUDA the
    operands stay in the kernels' layout, in device buffers reused from call to call)."""
    qa = _quantize_labelled(a, step, recipe, layer, pass_, "a", label)
    qb = _quantize_labelled(b, step, recipe, layer, pass_, "b", label)
    return torch.from_numpy(_core.gemm(qa, qb))


@qgemm_op.register_kernel("cuda")
def _qgemm_cuda(a, b, step, recipe, layer, pass_, label):
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    check = recipe_of_key(recipe).check_finite
    qa = _quantize_labelled(a, step, recipe, layer, pass_, "a", label, out=_scratch_of(a.device, "ga"),
                            check_finite=check)
    qb = _quantize_labelled(b, step, recipe, layer, pass_, "b", label, out=_scratch_of(b.device, "gb"),
                            check_finite=check)
    return gemm(qa, qb, check_finite=check)


@qgemm_op.register_fake
def _(a, b, step, recipe, layer, pass_, label):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.float32)


@torch.library.custom_op("fp4lab::fake_quantize", mutates_args=(), device_types="cpu")
def fake_quantize_op(x: torch.Tensor, step: torch.Tensor, recipe: str, layer: int, pass_: str, operand: str,
                     label: str) -> torch.Tensor:
    """Operand ``operand`` of pass ``pass_`` quantised as ``fp4lab::quantize`` does and dequantised, for a ``fast``
    GEMM: FP32 values on the CPU (the golden model); on CUDA the BF16 values of one fused pass."""
    q = _quantize_labelled(x, step, recipe, layer, pass_, operand, label)
    return torch.from_numpy(q.dequantize()).reshape(x.shape)


@fake_quantize_op.register_kernel("cuda")
def _fake_quantize_cuda(x, step, recipe, layer, pass_, operand, label):
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    return _quantize_labelled(x, step, recipe, layer, pass_, operand, label, fake=True,
                              check_finite=recipe_of_key(recipe).check_finite)


@fake_quantize_op.register_fake
def _(x, step, recipe, layer, pass_, operand, label):
    return x.new_empty(x.shape, dtype=torch.bfloat16 if x.is_cuda else torch.float32)


@torch.library.custom_op("fp4lab::fast_qmatmul", mutates_args=(), device_types="cpu")
def fast_qmatmul_op(a: torch.Tensor, b: torch.Tensor, step: torch.Tensor, recipe: str, layer: int, pass_: str,
                    label: str) -> torch.Tensor:
    """What fast mode computes: A [M, K] · B [N, K]ᵀ of the two operands quantised as ``fp4lab::quantize`` does:
    on CUDA their BF16 dequantised values of one fused pass each, multiplied by cuBLAS into BF16; on the CPU the
    golden GEMM's FP32 product (``product(qa, qb, "fast")``), refused when it overflows as the contract GEMM's
    output is. One operator per GEMM: a
    compiled step pays an operator's host cost once a GEMM, not once per operand and product."""
    check = recipe_of_key(recipe).check_finite
    qa = _quantize_labelled(a, step, recipe, layer, pass_, "a", label)
    qb = _quantize_labelled(b, step, recipe, layer, pass_, "b", label)
    return product(qa, qb, "fast", check)


@fast_qmatmul_op.register_kernel("cuda")
def _fast_qmatmul_cuda(a, b, step, recipe, layer, pass_, label):
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    check = recipe_of_key(recipe).check_finite
    da = _quantize_labelled(a, step, recipe, layer, pass_, "a", label, fake=True, check_finite=check)
    db = _quantize_labelled(b, step, recipe, layer, pass_, "b", label, fake=True, check_finite=check)
    return _fast_matmul(da, db, check)


@fast_qmatmul_op.register_fake
def _(a, b, step, recipe, layer, pass_, label):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16 if a.is_cuda else torch.float32)


def _pair_of(operands: str) -> Tuple[Tuple[str, str], Tuple[str, str]]:
    """fast_pair's ``operands`` ("fwd_y.a,bwd_dw.b") -> (("fwd_y", "a"), ("bwd_dw", "b"))."""
    first, second = (tuple(t.split(".")) for t in operands.split(","))
    return first, second  # type: ignore[return-value]


# The two operators a compiled fast step calls most (three of each a layer and step) are defined through
# torch.library.Library rather than custom_op, whose dispatch costs more: on an H100's host, fast_pair took 28.3 µs
# a call against 39.7, and a compiled ufp4 step 28.1 ms against 29.9 (kernels/README.md, "Compiled steps").
_lib = torch.library.Library("fp4lab", "FRAGMENT")
_lib.define("fast_pair(Tensor x, Tensor step, str recipe, int layer, str operands, str label) "
            "-> (Tensor, Tensor, Tensor, Tensor)")
_lib.define("fast_mm(Tensor a, Tensor b, Tensor bound_a, Tensor bound_b, str recipe) -> Tensor")


def fast_pair_op(x: torch.Tensor, step: torch.Tensor, recipe: str, layer: int, operands: str, label: str
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fp4lab::fast_pair`` (CUDA): the two ``fast`` operands a step takes of one BF16 tensor x [rows, cols], from one
    read of x (``fake_quantize_both``): x along cols as the GEMM operand named first in ``operands`` ("pass.operand,
    pass.operand") and xᵀ along rows as the second, each the BF16 values ``fp4lab::fake_quantize`` gives; then their
    magnitude bounds as FP32 tensors, which ``fp4lab::fast_mm`` reads to check its output (empty where the two passes
    ran, and under the synchronous check). torch.compile's form of the eager layers' fast_pair: one operator a
    tensor, not one an operand."""
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    r, s = recipe_of_key(recipe), int(step)
    pair = _pair_of(operands)
    for p, o in pair:
        if o == "a":
            _check_recompute(s, recipe, layer, p, label)
    cfg, cfg_t = (r.config(p, o, layer=layer, step=s) for p, o in pair)
    try:
        return _fake_both(x, cfg, cfg_t, r.check_finite, None)
    except ValueError as e:
        raise ValueError(f"{label.split(INSTANCE_MARK)[0]}: {pair[0][0]} operand {pair[0][1]} and {pair[1][0]} "
                         f"operand {pair[1][1]} {list(x.shape)}: {e}") from None


_lib.impl("fast_pair", fast_pair_op, "CUDA")


@torch.library.register_fake("fp4lab::fast_pair", lib=_lib)
def _(x, step, recipe, layer, operands, label):
    _need_cuda_build()
    rows, cols = x.shape
    r = recipe_of_key(recipe)
    # Whether the kernels bound the outputs, and so the bounds' size, follows the grid, block, tiles, rounding and RHT
    # of the two configs, the same at every step and layer; with symbolic sizes the words are an expression of them, never a size of their
    # own (an unbacked size that only the backward reads stops a whole-graph compile).
    cfg, cfg_t = (r.config(p, o, layer=0, step=0) for p, o in _pair_of(operands))
    words = _bound_words(x.dtype == torch.bfloat16, cfg, cfg_t, r.check_finite, rows, cols)
    return (x.new_empty((rows, cols), dtype=torch.bfloat16), x.new_empty((cols, rows), dtype=torch.bfloat16),
            x.new_empty((words,), dtype=torch.float32), x.new_empty((words,), dtype=torch.float32))


def fast_mm_op(a: torch.Tensor, b: torch.Tensor, bound_a: torch.Tensor, bound_b: torch.Tensor, recipe: str
               ) -> torch.Tensor:
    """``fp4lab::fast_mm`` (CUDA): A [M, K] · B [N, K]ᵀ of two BF16 ``fast`` operands (``fp4lab::fast_pair``'s or
    ``fp4lab::fake_quantize``'s) by cuBLAS into BF16, the output checked under the recipe's check: from the operands'
    bounds where both are given (non-empty) and prove it finite, else by a scan. What ``fp4lab::fast_qmatmul``
    multiplies, bit for bit."""
    _refuse_capture("the fp4lab operators (torch.compile's path; they read the SR step on the host)")
    return _fast_matmul(a, b, recipe_of_key(recipe).check_finite, (bound_a, bound_b))


_lib.impl("fast_mm", fast_mm_op, "CUDA")


@torch.library.register_fake("fp4lab::fast_mm", lib=_lib)
def _(a, b, bound_a, bound_b, recipe):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


@torch.library.custom_op("fp4lab::take_step", mutates_args=("counter",))
def take_step(counter: torch.Tensor, advance: bool) -> torch.Tensor:
    """The SR step a forward quantises with (a copy of the 0-d ``counter``), the counter advanced past it when
    ``advance``. An operator rather than clone() and add_(): a compiled graph may otherwise hand the backward the
    counter itself, already advanced, in place of the copy."""
    step = counter.clone()
    if advance:
        counter.add_(1)
    return step


@take_step.register_fake
def _(counter, advance):
    return torch.empty_like(counter)


def sum_columns(dy: torch.Tensor) -> torch.Tensor:
    """dy.sum(0), the bias gradient, as eager torch adds it up (row-major first: the order of torch's own sum
    follows the layout). Eager layers call it directly; a compiled graph calls it through ``fp4lab::column_sum``,
    which keeps the graph from choosing its own order of additions, and the gradient the same bits."""
    return dy.contiguous().sum(0)


@torch.library.custom_op("fp4lab::column_sum", mutates_args=())
def column_sum(dy: torch.Tensor) -> torch.Tensor:
    """``sum_columns`` as an operator a compiled graph keeps whole (its own order of additions would differ from
    eager's in the last bits)."""
    return sum_columns(dy)


@column_sum.register_fake
def _(dy):
    return dy.new_empty(dy.shape[1:])


def _quantize_operand(x: torch.Tensor, cfg, pass_: str, operand: str, recipe: Recipe, cache: dict,
                      fake: bool = False, seed: Optional[torch.Tensor] = None):
    """One operand of a training GEMM on CUDA in eager mode, through the kernels' device buffers of the layer, reused
    from step to step (``fake``: its BF16 dequantised values instead, for a ``fast`` GEMM); ``seed``: the device SR
    seed of a step being captured in a CUDA graph. A fault names the pass, the operand and its shape."""
    try:
        if fake:
            return fake_quantize(x, cfg, check_finite=recipe.check_finite, device_seed=seed)
        out = cache.get(f"{pass_}.{operand}")
        if out is None:
            out = cache[f"{pass_}.{operand}"] = QTensorCUDA()
        return quantize(x, cfg, out=out, check_finite=recipe.check_finite, device_seed=seed)
    except ValueError as e:
        raise ValueError(f"{pass_} operand {operand} {list(x.shape)}: {e}") from None


# Numerics monitors (fp4lab.torch.monitor), called in eager mode with each GEMM's module and operands; empty, they
# cost one test per GEMM. An observer with a ``wants(owner, step)`` method is called only at the steps it wants, so
# the other steps keep the unobserved path (fused fake quantisation in fast mode).
observers: list = []


def _observed(owner, step: torch.Tensor) -> bool:
    for obs in observers:
        wants = getattr(obs, "wants", None)
        if wants is None or wants(owner, int(step)):
            return True
    return False


def _qmatmul_observed(a, b, step, recipe: Recipe, layer: int, pass_: str, label: str, cache, owner, shard):
    """qmatmul in eager mode with the operands in hand: for the monitors, and for a sharded layer's operands."""
    if a.is_cuda:
        _refuse_capture(f"{label}: a numerics monitor's or sr_shard's GEMM")
    cfg = lambda p, o: recipe.config(p, o, layer=layer, step=int(step))  # noqa: E731

    def quant(x, c, p, o):
        if cache is not None and x.is_cuda:
            return _quantize_operand(x, c, p, o, recipe, cache)  # names the pass, operand and shape
        try:
            return quantize(x, c)
        except ValueError as e:
            raise ValueError(f"{p} operand {o} {list(x.shape)}: {e}") from None

    amax = getattr(getattr(owner, "owner", owner), "_amax_reduce", None)  # fp4lab.torch.reduce_amax
    if a.numel() == 0 or b.numel() == 0:  # an expert this rank sends no tokens: it joins the others' all-reduces
        return join_empty(amax, a, b, cfg, pass_)
    if amax is not None:
        quant = amax_quantizer(amax[0], quant)
    if shard is not None:
        quant = shard_quantizer(shard, quant, amax)  # its SR operands take reduce_amax's amax too
    try:
        qa, qb = quant(a, cfg(pass_, "a"), pass_, "a"), quant(b, cfg(pass_, "b"), pass_, "b")
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from None
    if a.is_cuda:  # sr_shard's and reduce_amax's operands: the CUDA quantiser's handles (quantize_rows_of)
        qa, qb = (_as_device_operand(q, a.device) for q in (qa, qb))
    y = product(qa, qb, recipe.mode, recipe.check_finite)
    for obs in observers:
        wants = getattr(obs, "wants", None)
        if wants is None or wants(owner, int(step)):
            obs(owner, int(step), pass_, a, b, qa, qb, y, cfg)
    return y


def qmatmul(a: torch.Tensor, b: torch.Tensor, step: torch.Tensor, recipe: Recipe, layer: int, pass_: str,
            label: str, cache: Optional[dict] = None, owner: Any = None,
            out_dtype: torch.dtype = torch.float32, pre: Tuple[Any, Any] = (None, None)) -> torch.Tensor:
    """A [M, K] · B [N, K]ᵀ, both operands quantised along K under the recipe's settings for ``pass_`` with the SR
    key (seed, ``step``, ``layer``), in the recipe's mode, through the fp4lab operators; a K that is not a multiple
    of ``recipe.k_multiple[pass_]`` is zero-padded to one first. ``cache`` (eager mode) lets
    CUDA operands go through the kernels' device buffers instead; there an ``exact`` product the caller keeps in
    BF16 (``out_dtype``) comes out of the GEMM's epilogue as BF16, without an FP32 pass and a conversion. Other
    paths may return FP32 whatever ``out_dtype`` says: the caller converts. ``pre``: operands already in hand as
    ``fast_pair`` gave them ((values, bounds) of the BF16 fake-quantised A and B, or None for one this call
    quantises)."""
    given = pre[0] is not None or pre[1] is not None  # fast_pair's operands: no K to pad, no monitor, no shard
    # A K the blocks (or RHT) do not divide ends in a partial block: defined as zero-padded to the next multiple
    # (docs/spec.md, the block-scaled GEMM), which the quantisers and GEMMs below then take whole.
    pad = 0 if given else -a.shape[-1] % recipe.k_multiple[pass_]
    if pad:
        a, b = torch.nn.functional.pad(a, (0, pad)), torch.nn.functional.pad(b, (0, pad))
    shard = getattr(owner, "_sr_shard", None)  # fp4lab.torch.sr_shard: a micro-batch of a global batch
    if not given and owner is not None and (shard is not None or (observers and _observed(owner, step))
                                            or getattr(getattr(owner, "owner", owner), "_amax_reduce", None)
                                            is not None):
        return _qmatmul_observed(a, b, step, recipe, layer, pass_, label, cache, owner, shard)
    if given and cache is None:  # a compiled graph: fast_pair's operators, the other operand quantised alone
        (qa, ba), (qb, bb) = (p if p is not None else
                              (torch.ops.fp4lab.fake_quantize(x, step, recipe.key, layer, pass_, o, label), None)
                              for p, x, o in ((pre[0], a, "a"), (pre[1], b, "b")))
        none = qa.new_empty((0,), dtype=torch.float32)
        return torch.ops.fp4lab.fast_mm(qa, qb, none if ba is None else ba, none if bb is None else bb, recipe.key)
    if cache is not None and a.is_cuda:
        cfg = lambda o: recipe.config(pass_, o, layer=layer, step=int(step))  # noqa: E731
        # fast: one pass per operand writes its BF16 dequantised values, and cuBLAS multiplies them (what product()
        # computes from the quantised operands, bit for bit, without writing and re-reading them).
        fake = recipe.mode == "fast"
        # While a step is captured in a CUDA graph the kernels read the SR seed from the module's device buffer,
        # which set_step() writes before each replay.
        seed = _capture_seed(owner, label)
        try:
            (qa, ba), (qb, bb) = (p if p is not None else
                                  (_quantize_operand(x, cfg(o), pass_, o, recipe, cache, fake, seed), None)
                                  for p, x, o in ((pre[0], a, "a"), (pre[1], b, "b")))
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        if fake:
            return _fast_matmul(qa, qb, recipe.check_finite, (ba, bb))
        return product(qa, qb, recipe.mode, recipe.check_finite, out_dtype)
    if given:  # fast_pair gives operands only where the branches above take them (CUDA, fast mode)
        raise RuntimeError(f"{label}: qmatmul was given fast_pair's operands outside CUDA fast mode")
    op = torch.ops.fp4lab.qgemm if recipe.mode == "exact" else torch.ops.fp4lab.fast_qmatmul
    return op(a, b, step, recipe.key, layer, pass_, label)


def _capture_seed(owner: Any, label: str) -> Optional[torch.Tensor]:
    """The device SR seed a CUDA-graph capture reads (set_step() writes it before each replay); None outside one."""
    if not torch.cuda.is_current_stream_capturing():
        return None
    if owner is None:
        raise RuntimeError(f"{label}: qmatmul captured in a CUDA graph needs the layer (owner) whose device SR key it "
                           "reads")
    return getattr(owner, "owner", owner)._seed_dev


def fast_pair(x: torch.Tensor, step: torch.Tensor, recipe: Recipe, layer: int, first: Tuple[str, str],
              second: Tuple[str, str], label: str, cache: Optional[dict], owner: Any
              ) -> Optional[Tuple[Tuple[torch.Tensor, Optional[torch.Tensor]], Tuple[torch.Tensor, Optional[torch.Tensor]]]]:
    """The two ``fast`` operands a step takes of one tensor x [rows, cols]: x along cols as GEMM operand ``first``
    (pass, operand) and xᵀ along rows as ``second``, each what qmatmul would make of it, from one read of x
    (``fake_quantize_both``), as (values, bounds) each; pass them to qmatmul as ``pre``. In eager mode (``cache``
    given) they come from _fake_both, in a compiled graph (no ``cache``) from the operator ``fp4lab::fast_pair``.
    None where qmatmul takes another path for these operands (``exact`` mode, the CPU, a numerics monitor, sr_shard,
    reduce_amax, a K to pad, an input that is not contiguous BF16): the caller then leaves both to qmatmul."""
    if (not x.is_cuda or recipe.mode != "fast" or x.dtype != torch.bfloat16 or x.dim() != 2
            or x.numel() == 0 or not x.is_contiguous()):
        return None
    if x.shape[1] % recipe.k_multiple[first[0]] or x.shape[0] % recipe.k_multiple[second[0]]:
        return None
    if cache is None:
        if not torch.compiler.is_compiling():
            return None  # the operators' eager callers (no layer buffers) take qmatmul's own path
        y, yt, by, byt = torch.ops.fp4lab.fast_pair(x, step, recipe.key, layer, f"{'.'.join(first)},"
                                                    f"{'.'.join(second)}", label)
        return (y, by), (yt, byt)
    if owner is not None and (getattr(owner, "_sr_shard", None) is not None or (observers and _observed(owner, step))
                              or getattr(getattr(owner, "owner", owner), "_amax_reduce", None) is not None):
        return None
    seed = _capture_seed(owner, label)
    s = int(step)
    cfg, cfg_t = (recipe.config(p, o, layer=layer, step=s) for p, o in (first, second))
    try:
        y, yt, by, byt = _fake_both(x, cfg, cfg_t, recipe.check_finite, seed)
    except ValueError as e:
        raise ValueError(f"{label}: {first[0]} operand {first[1]} and {second[0]} operand {second[1]} "
                         f"{list(x.shape)}: {e}") from None
    return (y, by), (yt, byt)
