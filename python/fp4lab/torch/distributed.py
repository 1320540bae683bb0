"""Data parallelism (DDP, FSDP2) with the single-process run's stochastic rounding.

The SR key of an operand is (seed, step, layer, pass, operand), the same on every rank: the layer id comes from
the layer's qualified name and the step from the number of training forwards. The Philox counter of each element,
though, is its index in the tensor quantised (row · columns + column, docs/spec.md §12), and a rank quantises
its micro-batch's tokens, not the global batch's: rank r's element would draw the word of another element of the
global batch. ``sr_shard(model, rank, world_size)`` makes each SR operand with a tokens dimension draw the words
of its place in the global batch: the golden quantiser quantises the micro-batch's rows (fwd_y and bwd_dx operand
a, tokens in rows) or columns (bwd_dw operands, tokens in columns) as those of the global operand, element indices
and all, and nothing else: a rank's quantiser work is its micro-batch's. A CUDA operand is quantised so on the host
and copied back (the CUDA kernels take no first element index); RTNE operands are quantised as they are (their
codes depend on their own block only).

A per-tensor scale (nvfp4's global scale, from the amax of the tensor quantised) is the micro-batch's amax, not the
global batch's, unless ``reduce_amax(model)`` is on: as Transformer Engine's amax reduction, each rank takes the
amax of its token operand (activations X, gradients dY; in the rotated domain where RHT is on) and the ranks
all-reduce it with MAX before quantising, so every rank scales by the global batch's amax, as one process does."""
from __future__ import annotations

import torch
from torch import nn

from .attention import MultiheadAttention
from .linear import Conv1D, Linear
from .moe import Experts, Router

__all__ = ["sr_shard", "reduce_amax"]


def sr_shard(model: nn.Module, rank: int, world_size: int) -> nn.Module:
    """Marks every fp4lab ``Linear``, ``Conv1D`` and ``Router`` of ``model`` as computing rows [rank·n, (rank+1)·n) of a
    global batch of world_size·n token rows (n: the rows of each call; the batch split evenly along its first
    dimension, with tokens batch-major, as DDP and FSDP2 feed it), so its SR operands draw the global batch's random
    words. ``world_size`` 1 (or ``sr_shard(model, 0, 1)``) turns it off. Returns ``model``. The attention's
    in-projections are not covered (``nn.MultiheadAttention`` lays tokens out sequence-major).

    Every ``Experts`` too: an expert's tokens on a rank are scattered rows of its global rows, so each forward
    all-gathers every rank's [experts, top-k] token counts (torch.distributed initialised with ``world_size``
    ranks, on the GPU under NCCL) and quantises each expert's SR token-row operands (dgrad's dY) as their rows of
    the expert's global operand; its wgrad operands are quantised as they are (a rank holds no whole token blocks
    of an expert)."""
    if not (0 <= rank < world_size):
        raise ValueError(f"sr_shard(): rank {rank} is not in [0, {world_size})")
    for m in model.modules():
        if isinstance(m, (Linear, Conv1D, Router, Experts)):
            m._sr_shard = None if world_size == 1 else (int(rank), int(world_size))
    return model


def reduce_amax(model: nn.Module, group=None, enabled: bool = True) -> nn.Module:
    """Transformer Engine's amax reduction for per-tensor scales under data parallelism (DDP, FSDP2).

    Marks every fp4lab ``Linear``, ``Conv1D``, ``MultiheadAttention``, ``Router`` and ``Experts`` of ``model`` so
    that each token operand
    with a per-tensor (ue4m3) scale, the activations X and the gradients dY of nvfp4's three GEMMs, takes the
    global batch's amax: each rank's amax (the golden quantiser's, after RHT where it is on) is all-reduced with MAX
    over ``group`` (None: the default process group), one 2-float all-reduce per such operand, before the operand is
    quantised. Weights are whole on every rank (DDP; FSDP2 gathers them before the GEMMs) and are left alone, and
    so are operands without a per-tensor scale.

    Args:
        model: the converted model (each rank's replica, before or after wrapping it in DDP / ``fully_shard``).
        group: the ``torch.distributed`` process group of the data-parallel ranks; None for the default group.
        enabled: False turns the reduction off again.

    Returns:
        ``model``.

    Every rank must run the same GEMMs in the same order (the data-parallel contract), each with tokens; eager
    mode (a compiled model's marked GEMMs leave the graph). CUDA operands are reduced on the device under NCCL and
    quantised with the reduced amax by the golden quantiser on the host (the CUDA kernels take no given amax).
    ``Experts`` and ``Router`` are marked too: marked ``Experts`` run every expert's GEMMs on every rank, in expert
    order, an expert without tokens on a rank joining its all-reduces with amax 0 (its GEMMs give +0.0). Combine
    with ``sr_shard`` for the SR operands."""
    if enabled and not torch.distributed.is_initialized():
        raise RuntimeError("reduce_amax(): torch.distributed is not initialised (init_process_group first)")
    for m in model.modules():
        if isinstance(m, (Linear, Conv1D, MultiheadAttention, Experts, Router)):
            m._amax_reduce = (group,) if enabled else None
    return model
