"""Data parallelism (DDP, FSDP2) with the single-process run's stochastic rounding.

The SR key of an operand is (seed, step, layer, pass, operand), the same on every rank: the layer id comes from
the layer's qualified name and the step from the number of training forwards. The Philox counter of each element,
though, is its index in the tensor quantised (row · columns + column, docs/spec.md §12), and a rank quantises
its micro-batch's tokens, not the global batch's: rank r's element would draw the word of another element of the
global batch. ``sr_shard(model, rank, world_size)`` makes each SR operand with a tokens dimension draw the words
of its place in the global batch: the micro-batch is placed at its rows (fwd_y and bwd_dx operand a, tokens in
rows) or columns (bwd_dw operands, tokens in columns) of a global-sized zero tensor, that is quantised, and the
micro-batch's part is kept (zero blocks do not change the micro-batch's blocks). It costs world_size× the
quantiser work on the SR operands, on CPU tensors; RTNE operands are quantised as they are (their codes depend
on their own block only).

What stays per rank: a per-tensor scale (nvfp4's global scale, from the amax of the tensor quantised) is the
micro-batch's amax, not the global batch's."""
from __future__ import annotations

import numpy as np
from torch import nn

from fp4lab import _core

from .linear import Conv1D, Linear

__all__ = ["sr_shard"]


def sr_shard(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """Marks every fp4lab ``Linear`` and ``Conv1D`` of ``model`` as computing rows [rank·n, (rank+1)·n) of a global batch of
    world_size·n token rows (n: the rows of each call; the batch split evenly along its first dimension, with
    tokens batch-major, as DDP and FSDP2 feed it), so its SR operands draw the global batch's random words.
    ``world_size`` 1 (or ``sr_shard(model, 0, 1)``) turns it off. Returns ``model``. The attention's
    in-projections are not covered (``nn.MultiheadAttention`` lays tokens out sequence-major)."""
    if not (0 <= rank < world_size):
        raise ValueError(f"sr_shard(): rank {rank} is not in [0, {world_size})")
    for m in model.modules():
        if isinstance(m, (Linear, Conv1D)):
            m._sr_shard = None if world_size == 1 else (int(rank), int(world_size))
    return model


def _quantizer(shard, inner):
    """``inner(x, cfg, pass, operand)`` with SR token operands placed at their place in the global batch."""
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
