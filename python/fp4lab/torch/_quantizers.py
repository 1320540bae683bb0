"""The quantisers behind ``fp4lab.torch.sr_shard`` and ``fp4lab.torch.reduce_amax`` (fp4lab.torch.distributed
marks the layers; the training GEMMs of fp4lab.torch.ops wrap their quantiser with these for a marked layer). Each
takes ``inner(x, cfg, pass, operand)`` -> QTensor and returns a quantiser of the same signature. Below the layers,
so that ops, the layers and distributed import them one way. A CUDA operand is quantised on its device (the
CUDA quantiser takes the global row indices and the amax), so no host round trip of it remains."""
from __future__ import annotations

import torch

from fp4lab import _core

__all__ = ["shard_quantizer", "amax_quantizer", "quantize_rows_of", "reduces",
           "reduced_amax", "collective_device", "join_empty"]


def shard_quantizer(shard, inner, amax_marks=None):
    """``inner(x, cfg, pass, operand)`` with SR token operands quantised at their place in the global batch.

    Each such operand's rows are quantised as rows of the global operand (``_core.quantize_f32_at``, or
    ``_core.cuda_quantize_at`` on the operand's GPU: the same bits, no host round trip): their SR
    words are the global tensor's at their element indices, and ue4m3's global scale takes the global operand's
    amax (all-reduced where ``reduce_amax`` is on, else this rank's, which is the zero-padded global operand's).
    A rank quantises its own rows only. Token rows (fwd_y and bwd_dx operand a) are rows rank·n.. of the global
    [world·n, K] operand; token columns (bwd_dw, the transposed operands [rows, n]) are columns rank·n.. of the
    global [rows, world·n] one, whose row i, column rank·n + j has the element index of row i·world + rank, column
    j of it seen as [rows·world, n] (n a multiple of the block: a block lies within a rank's columns).

    Args:
        shard: a layer's ``sr_shard`` mark: (rank, world_size) for a Linear, Conv1D or Router; an expert's token
            rows (``idx`` of ``total``) for Experts.
        inner: the quantiser, ``inner(x, cfg, pass, operand) -> QTensor``, for the other operands.
        amax_marks: the layer's ``reduce_amax`` mark ((group,)), or None.

    Returns:
        A quantiser of the same signature.
    """
    expert = not isinstance(shard, tuple)

    def quantize(x, cfg, pass_, operand):
        token_rows = pass_ in ("fwd_y", "bwd_dx") and operand == "a"
        token_cols = pass_ == "bwd_dw" and not expert  # an expert's tokens of a rank are no whole blocks
        if not (token_rows or token_cols) or cfg.rounding != _core.Rounding.sr:
            return inner(x, cfg, pass_, operand)
        if expert:
            index = shard.idx
        else:
            rank, world = shard
            n = x.shape[0]
            index = (torch.arange(rank * n, (rank + 1) * n) if token_rows
                     else torch.arange(n) * world + rank)
        reduce = amax_marks is not None and reduces(cfg, pass_, operand)
        return quantize_rows_of(x, cfg, pass_, operand, index, reduce, amax_marks[0] if reduce else None)

    return quantize


def quantize_rows_of(x: torch.Tensor, cfg, pass_: str, operand: str, index=None, reduce: bool = False, group=None):
    """``x`` quantised as rows ``index`` of a larger tensor (None: x whole), with the larger tensor's amax:
    all-reduced (MAX) over ``group`` when ``reduce``, else x's own.

    A CPU operand goes through the golden quantiser (``_core.quantize_f32_at`` / ``quantize_f32_amax``) and gives
    an ``fp4lab.QTensor``. A CUDA operand stays on its device: the CUDA quantiser takes the row indices (an int64
    tensor on the device) and the amax (``_core.cuda_quantize_at`` / ``cuda_quantize_amax``), with the golden
    quantiser's bits, and gives a ``_core.CudaQTensor`` (which ops wraps); its local amax for the all-reduce is
    taken on the device too, so no host round trip of the operand remains (one synchronisation reads the reduced
    amax, one the input check). Either way a rank quantises its own rows only.

    Args:
        x: the operand [rows, K] (CUDA: float32, bfloat16 or float16; a transposed view is read in place).
        cfg: its QuantConfig.
        pass_, operand: the GEMM's pass and operand, which errors name.
        index: the global row index of each row of x (int64, on any device), or None.
        reduce: all-reduce the amax over ``group``.
        group: the ``torch.distributed`` process group, None for the default one.

    Returns:
        An ``fp4lab.QTensor`` for a CPU operand, a ``_core.CudaQTensor`` for a CUDA one.
    """
    if x.is_cuda:
        return _quantize_rows_cuda(x.detach(), cfg, pass_, operand, index, reduce, group)
    xf = x.detach().to(torch.float32).contiguous()
    host = xf.cpu()
    amax = reduced_amax(group, host, cfg, pass_, operand, like=xf) if reduce else None
    try:
        if amax is None:
            amax = _core.tensor_amax(host, cfg) if cfg.to_dict()["scale"] == "ue4m3" else 0.0
        if index is None:
            q = _core.quantize_f32_amax(host, cfg, amax)
        else:
            q = _core.quantize_f32_at(host, cfg, index.to(torch.int64).cpu().contiguous().numpy(), amax)
    except ValueError as e:
        raise ValueError(f"{pass_} operand {operand} {list(x.shape)}: {e}") from None
    return q


def _quantize_rows_cuda(x: torch.Tensor, cfg, pass_: str, operand: str, index, reduce: bool, group):
    """quantize_rows_of on x's device (see there)."""
    if not _core.cuda_built:
        raise RuntimeError("this fp4lab was built without CUDA")
    amax = reduced_amax(group, x, cfg, pass_, operand) if reduce else None
    tr = not x.is_contiguous() and x.t().is_contiguous()  # Wᵀ, dYᵀ, Xᵀ: read in place, as ops.quantize does
    xs = x.t() if tr else x
    if xs.dtype != torch.bfloat16:  # BF16 is widened as it is loaded; FP16 widens exactly to FP32
        xs = xs.to(torch.float32)
    xs = xs.contiguous()
    stream = torch.cuda.current_stream(x.device).cuda_stream
    try:
        if index is None and amax is not None:
            return _core.cuda_quantize_amax(xs, cfg, amax, stream=stream, transposed=tr)
        if index is None:
            index = torch.arange(x.shape[0])
        index = index.to(device=x.device, dtype=torch.int64).contiguous()
        return _core.cuda_quantize_at(xs, cfg, index, amax, stream=stream, transposed=tr)
    except ValueError as e:
        raise ValueError(f"{pass_} operand {operand} {list(x.shape)}: {e}") from None


TOKEN_OPERANDS = {("fwd_y", "a"), ("bwd_dx", "a"), ("bwd_dw", "a"), ("bwd_dw", "b")}


def amax_quantizer(group, inner):
    """``inner(x, cfg, pass, operand)`` with the token operands of a per-tensor scale quantised with the amax
    all-reduced (MAX) over ``group`` (``quantize_rows_of``: the golden quantiser for a CPU operand, the CUDA one on
    its device for a CUDA operand). A rank whose operand cannot be quantised (NaN, Inf) still joins the all-reduce, with
    a flag, so that every rank raises instead of the others waiting for it.

    Args:
        group: the ``torch.distributed`` process group (``reduce_amax``'s), None for the default one.
        inner: the quantiser, ``inner(x, cfg, pass, operand) -> QTensor``.

    Returns:
        A quantiser of the same signature.
    """

    def quantize(x, cfg, pass_, operand):
        if not reduces(cfg, pass_, operand):
            return inner(x, cfg, pass_, operand)
        return quantize_rows_of(x, cfg, pass_, operand, reduce=True, group=group)

    return quantize


def collective_device(group, like: torch.Tensor) -> torch.device:
    """Where a small tensor of a collective over ``group`` lives: on the GPU for NCCL (which reduces device tensors
    only), on the CPU for gloo (and for a group with both, unless ``like`` is a CUDA tensor)."""
    backend = str(torch.distributed.get_backend(group))
    if "nccl" in backend and ("gloo" not in backend or like.is_cuda):
        return like.device if like.is_cuda else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduces(cfg, pass_: str, operand: str) -> bool:
    """Whether reduce_amax all-reduces this operand's amax: a token operand with a per-tensor scale."""
    return (pass_, operand) in TOKEN_OPERANDS and cfg.to_dict()["scale"] == "ue4m3"


def reduced_amax(group, xf: torch.Tensor, cfg, pass_: str, operand: str, like: torch.Tensor = None) -> float:
    """The amax of the operand ``xf`` (the golden quantiser's ``tensor_amax``; a CUDA tensor's taken on its device,
    the same value) all-reduced with MAX over ``group``; an empty operand (an expert this rank sends no tokens)
    joins with 0. ``like``: the operand on its own device, which picks the device of the all-reduce
    (``collective_device``)."""
    fault, local = None, 0.0
    if xf.numel():
        try:
            if xf.is_cuda:
                x32 = xf.detach().to(torch.float32).contiguous()
                local = _core.cuda_tensor_amax(x32, cfg, torch.cuda.current_stream(x32.device).cuda_stream)
            else:
                local = _core.tensor_amax(xf.detach().to(torch.float32).contiguous().cpu(), cfg)
        except ValueError as e:
            fault = e
    amax = torch.tensor([local, 1.0 if fault else 0.0], dtype=torch.float32,
                        device=collective_device(group, xf if like is None else like))
    torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=group)
    if fault is not None:
        raise ValueError(f"{pass_} operand {operand} {list(xf.shape)}: {fault}") from None
    if amax[1] > 0:
        raise ValueError(f"{pass_} operand {operand}: another rank's operand could not be quantised "
                         "(its own error names it)")
    return float(amax[0])


def join_empty(marks, a: torch.Tensor, b: torch.Tensor, cfg, pass_: str) -> torch.Tensor:
    """A GEMM with an empty operand on this rank (an expert it sends no tokens, or none to reduce over): the rank
    joins the amax all-reduces the other ranks run for it, and the product is +0.0 (an empty output, or a sum over
    nothing)."""
    for x, o in ((a, "a"), (b, "b")):
        if marks is not None and reduces(cfg(pass_, o), pass_, o):  # marks: reduce_amax's (group,)
            reduced_amax(marks[0], x.detach().to(torch.float32), cfg(pass_, o), pass_, o)
    return a.new_zeros((a.shape[0], b.shape[0]), dtype=torch.float32)
