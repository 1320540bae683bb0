"""The quantisers behind ``fp4lab.torch.sr_shard`` and ``fp4lab.torch.reduce_amax`` (fp4lab.torch.distributed
marks the layers; the training GEMMs of fp4lab.torch.ops wrap their quantiser with these for a marked layer). Each
takes ``inner(x, cfg, pass, operand)`` -> QTensor and returns a quantiser of the same signature. Below the layers,
so that ops, the layers and distributed import them one way."""
from __future__ import annotations

import numpy as np
import torch

from fp4lab import _core

__all__ = ["shard_quantizer", "expert_quantizer", "amax_quantizer", "reduces", "reduced_amax", "join_empty"]


def shard_quantizer(shard, inner):
    """``inner(x, cfg, pass, operand)`` with SR token operands placed at their place in the global batch.

    Args:
        shard: a layer's ``sr_shard`` mark: (rank, world_size) for a Linear, Conv1D or Router; an expert's token
            rows (``idx`` of ``total``) for Experts.
        inner: the quantiser, ``inner(x, cfg, pass, operand) -> QTensor``.

    Returns:
        A quantiser of the same signature.
    """
    if not isinstance(shard, tuple):
        return expert_quantizer(shard, inner)
    rank, world = shard

    def quantize(x, cfg, pass_, operand):
        token_rows = pass_ in ("fwd_y", "bwd_dx") and operand == "a"
        token_cols = pass_ == "bwd_dw"
        if not (token_rows or token_cols) or not cfg.label.endswith("_sr"):
            return inner(x, cfg, pass_, operand)
        if x.is_cuda:
            raise ValueError(f"{pass_} operand {operand}: sr_shard places operands on the CPU only")
        rows, cols = x.shape
        if token_rows:
            full = x.new_zeros((rows * world, cols))
            full[rank * rows:(rank + 1) * rows] = x
        else:
            full = x.new_zeros((rows, cols * world))
            full[:, rank * cols:(rank + 1) * cols] = x
        q = inner(full, cfg, pass_, operand)
        codes, scales = np.asarray(q.codes), np.asarray(q.scales)
        if token_rows:
            codes, scales = codes[rank * rows:(rank + 1) * rows], scales[rank * rows:(rank + 1) * rows]
        else:
            b = q.block  # the micro-batch's tokens come zero-padded to a multiple of the block
            codes = codes[:, rank * cols:(rank + 1) * cols]
            scales = scales[:, rank * cols // b:(rank + 1) * cols // b]
        return _core.make_qtensor(q.format, q.scale, q.block, q.tile2d, np.ascontiguousarray(codes),
                                  np.ascontiguousarray(scales), q.global_scale, q.rht, q.rht_signs or [])

    return quantize


def expert_quantizer(rows, inner):
    """An expert's SR token-row operands (fwd_y and bwd_dx operand a) placed at the expert's rows of the global
    batch (``rows.idx`` of ``rows.total``), quantised, and this rank's rows kept. The wgrad operands, tokens in
    columns, are quantised as they are: an expert's tokens of a rank are no whole blocks of the global batch's."""

    def quantize(x, cfg, pass_, operand):
        if not (pass_ in ("fwd_y", "bwd_dx") and operand == "a" and cfg.label.endswith("_sr")):
            return inner(x, cfg, pass_, operand)
        if x.is_cuda:
            raise ValueError(f"{pass_} operand {operand}: sr_shard places operands on the CPU only")
        full = x.new_zeros((rows.total, x.shape[1]))
        full[rows.idx] = x
        q = inner(full, cfg, pass_, operand)
        idx = rows.idx.numpy()
        codes, scales = np.asarray(q.codes)[idx], np.asarray(q.scales)[idx]
        return _core.make_qtensor(q.format, q.scale, q.block, q.tile2d, np.ascontiguousarray(codes),
                                  np.ascontiguousarray(scales), q.global_scale, q.rht, q.rht_signs or [])

    return quantize


TOKEN_OPERANDS = {("fwd_y", "a"), ("bwd_dx", "a"), ("bwd_dw", "a"), ("bwd_dw", "b")}


def amax_quantizer(group, inner):
    """``inner(x, cfg, pass, operand)`` with the token operands of a per-tensor scale quantised with the amax
    all-reduced (MAX) over ``group``. A rank whose operand cannot be quantised (NaN, Inf) still joins the
    all-reduce, with a flag, so that every rank raises instead of the others waiting for it.

    Args:
        group: the ``torch.distributed`` process group (``reduce_amax``'s), None for the default one.
        inner: the quantiser, ``inner(x, cfg, pass, operand) -> QTensor``.

    Returns:
        A quantiser of the same signature.
    """

    def quantize(x, cfg, pass_, operand):
        if not reduces(cfg, pass_, operand):
            return inner(x, cfg, pass_, operand)
        xf = x.detach().to(torch.float32).contiguous()
        amax = reduced_amax(group, xf, cfg, pass_, operand)
        try:
            return _core.quantize_f32_amax(xf, cfg, amax)
        except ValueError as e:
            raise ValueError(f"{pass_} operand {operand} {list(x.shape)}: {e}") from None

    return quantize


def reduces(cfg, pass_: str, operand: str) -> bool:
    """Whether reduce_amax all-reduces this operand's amax: a token operand with a per-tensor scale."""
    return (pass_, operand) in TOKEN_OPERANDS and cfg.to_dict()["scale"] == "ue4m3"


def reduced_amax(group, xf: torch.Tensor, cfg, pass_: str, operand: str) -> float:
    """The amax of ``xf`` all-reduced with MAX over ``group``; an empty operand (an expert this rank sends no tokens)
    joins with 0."""
    if xf.is_cuda:
        raise ValueError(f"{pass_} operand {operand}: reduce_amax reduces the amax of CPU operands only")
    fault, local = None, 0.0
    if xf.numel():
        try:
            local = _core.tensor_amax(xf, cfg)
        except ValueError as e:
            fault = e
    amax = torch.tensor([local, 1.0 if fault else 0.0], dtype=torch.float32)
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
