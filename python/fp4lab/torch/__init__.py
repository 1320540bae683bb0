"""fp4lab on PyTorch tensors: the quantiser and the contract GEMM on CPU tensors (the golden model) and on CUDA
tensors (the CUDA kernels, without copies), and a drop-in ``Linear`` that trains under a recipe.

A recipe (docs/spec.md §2, §12) says, per training GEMM of a linear layer and per operand, which grid, block,
scale, 2-D weight tiles, RHT and rounding apply; both operands of every GEMM are quantised along that GEMM's
reduction dimension:

    fwd_y  = X · Wᵀ    A = X   [tokens, in]   B = W   [out, in]      K = in
    bwd_dx = dY · W    A = dY  [tokens, out]  B = Wᵀ  [in, out]      K = out
    bwd_dw = dYᵀ · X   A = dYᵀ [out, tokens]  B = Xᵀ  [in, tokens]   K = tokens

The GEMM's FP32 output is cast to the activation dtype; master weights, optimizer state and everything outside
the linear layers are untouched. Stochastic rounding draws its bits from (seed, step, layer, pass, operand)
(``fp4lab._core.training_seed``), so a run is reproducible bit for bit on any device and thread count.

Two GEMM modes: ``exact`` (the contract kernels, bit-identical to the golden model and the RTL) and ``fast``
(the same quantised operands, dequantised and multiplied by torch's matmul: cuBLAS in BF16 on CUDA; on the CPU,
where the golden GEMM is the faster one, exact's product).

    import fp4lab.torch as ft
    ft.convert(model, "ufp4", exclude=r"lm_head")     # every other nn.Linear now trains under UFP4
"""
from .recipe import ABLATIONS, RECIPES, Recipe
from .ops import QTensorCUDA, check_finite, dequantize, fake_quantize, fake_quantize_both, gemm, product, quantize
from .ops import dequantize_as as _dequantize
from .linear import Conv1D, Linear, layer_id_of
from .attention import MultiheadAttention
from .moe import Experts, Router
from .convert import ConvertEntry, ConvertReport, convert, export_state_dict, load_steps, set_step
from .monitor import monitor
from .distributed import reduce_amax, sr_shard

__all__ = ["Recipe", "Linear", "Conv1D", "MultiheadAttention", "Experts", "Router", "convert", "ConvertReport", "ConvertEntry", "layer_id_of",
           "set_step", "export_state_dict", "load_steps", "quantize", "fake_quantize", "fake_quantize_both", "gemm", "product", "dequantize", "QTensorCUDA", "check_finite", "RECIPES",
           "ABLATIONS", "monitor", "sr_shard", "reduce_amax"]
