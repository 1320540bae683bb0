"""fp4lab.torch.MultiheadAttention: nn.MultiheadAttention with its projections under a recipe."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._layer import NamedParts, Stepped, apply_gemm, check_shapes, layer_id_of
from .linear import Linear
from .recipe import Recipe

__all__ = ["MultiheadAttention"]


class _Projection:
    """An in-projection GEMM of an fp4lab MultiheadAttention, as _LinearFn takes a layer: the attention's recipe,
    the SR id ``layer_id_of("<attention's name>.in_proj.<i>")`` (i counts the in-projection GEMMs of one forward:
    one for self-attention, two when key is value, else three) and its own device buffers."""

    def __init__(self, owner: "MultiheadAttention", index: int):
        self.owner, self.index, self._qcache = owner, index, {}
        self.named(owner.name)

    def named(self, owner_name: Optional[str]) -> None:
        # Hashed here, when the attention is named, rather than at each forward (torch.compile traces no hashlib).
        self.layer_id = layer_id_of(f"{owner_name}.in_proj.{self.index}" if owner_name else f"in_proj.{self.index}")

    @property
    def recipe(self) -> Recipe:
        return self.owner.recipe

    def _label(self) -> str:
        return f"{self.owner._label()}.in_proj.{self.index}"

    def __getstate__(self):
        return {"owner": self.owner, "index": self.index, "layer_id": self.layer_id, "_qcache": {}}


class MultiheadAttention(NamedParts, Stepped, nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose in-projection GEMMs and output projection (an fp4lab ``Linear``) run under
    a recipe; between them the attention is ``F.multi_head_attention_forward``'s, step for step (scaled dot-product
    attention, or softmax(QKᵀ/√d)·V where the weights are asked for; the same masks, causal hint and dropout). Same
    parameters and state-dict keys, with ``_extra_state`` (the in-projection's SR step) and
    ``out_proj._extra_state``. ``add_bias_kv`` and ``add_zero_attn`` are not supported (``convert`` leaves such
    modules)."""

    def __init__(self, *args, recipe: Any = "ufp4", **kwargs):
        super().__init__(*args, **kwargs)
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError("fp4lab.torch.MultiheadAttention does not support add_bias_kv or add_zero_attn")
        self._init_step(recipe)
        self.out_proj = Linear.from_linear(self.out_proj, self.recipe)
        self._projections = [_Projection(self, i) for i in range(3)]

    @classmethod
    def from_mha(cls, mha: nn.MultiheadAttention, recipe: Any) -> "MultiheadAttention":
        """One sharing ``mha``'s parameters (the same Parameter objects) and options (embed_dim, num_heads, dropout,
        bias, kdim, vdim, batch_first, training mode). ``add_bias_kv`` and ``add_zero_attn`` are refused, as by the
        constructor: dropping them would compute another attention."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"MultiheadAttention.from_mha(): mha must be an nn.MultiheadAttention, not "
                            f"{type(mha).__name__}")
        if mha.bias_k is not None or mha.bias_v is not None or mha.add_zero_attn:
            raise ValueError("MultiheadAttention.from_mha(): add_bias_kv and add_zero_attn are not supported "
                             "(fp4lab.torch.MultiheadAttention computes without them)")
        new = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
                  kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first, device="meta", recipe=recipe)
        for n in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            setattr(new, n, getattr(mha, n))
        new.out_proj = Linear.from_linear(mha.out_proj, recipe)
        new.train(mha.training)
        return new

    def _named_parts(self):
        return self.__dict__.get("_projections", ())

    def _label(self) -> str:
        return self.name if self.name else f"MultiheadAttention({self.embed_dim}, {self.num_heads})"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if self.recipe.passthrough or any(isinstance(t, torch.Tensor) and t.is_meta for t in (query, key, value)):
            # (On the meta device, shapes only: nothing is quantised and no step is taken, as in fp4lab's Linear.)
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        is_batched = query.dim() == 3
        if self.batch_first and is_batched:
            # as nn.MultiheadAttention: the transposes keep query, key and value the same object where they were
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        out, weights = self._attention(query, key, value, key_padding_mask, need_weights, attn_mask,
                                       average_attn_weights, is_causal)
        if self.batch_first and is_batched:
            return out.transpose(1, 0), weights
        return out, weights

    def _in_projection(self, q, k, v, step: int, check: bool):
        E = q.size(-1)

        def gemm(i, x, w, b):
            if check:
                check_shapes(self._projections[i]._label(), self.recipe, self._projections[i].layer_id, int(step),
                              x.numel() // x.shape[-1], w.shape[1], w.shape[0])
            return apply_gemm(self._projections[i], x, w, b, step)

        if not self._qkv_same_embed_dim:
            bq, bk, bv = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            return (gemm(0, q, self.q_proj_weight, bq), gemm(1, k, self.k_proj_weight, bk),
                    gemm(2, v, self.v_proj_weight, bv))
        # F._in_projection_packed, with these GEMMs
        w, b = self.in_proj_weight, self.in_proj_bias
        if k is v:
            if q is k:
                proj = gemm(0, q, w, b)
                proj = proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
                return proj[0], proj[1], proj[2]
            w_q, w_kv = w.split([E, E * 2])
            b_q, b_kv = (None, None) if b is None else b.split([E, E * 2])
            q_proj = gemm(0, q, w_q, b_q)
            kv = gemm(1, k, w_kv, b_kv)
            kv = kv.unflatten(-1, (2, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
            return q_proj, kv[0], kv[1]
        w_q, w_k, w_v = w.chunk(3)
        b_q, b_k, b_v = (None,) * 3 if b is None else b.chunk(3)
        return gemm(0, q, w_q, b_q), gemm(1, k, w_k, b_k), gemm(2, v, w_v, b_v)

    def _attention(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                   is_causal):
        # F.multi_head_attention_forward from its shape check on, without bias_k/bias_v and zero attention, with
        # the in- and out-projections under the recipe.
        num_heads = self.num_heads
        is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, embed_dim = query.shape
        src_len = key.shape[0]
        key_padding_mask = F._canonical_mask(mask=key_padding_mask, mask_name="key_padding_mask",
                                             other_type=F._none_or_dtype(attn_mask), other_name="attn_mask",
                                             target_type=query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                               "method `generate_square_subsequent_mask` to create this mask.")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # the hint goes to SDPA as is_causal
        else:
            attn_mask = F._canonical_mask(mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                                          target_type=query.dtype, check_other=False)
            if key_padding_mask is not None:
                is_causal = False
        head_dim = embed_dim // num_heads
        if head_dim * num_heads != embed_dim:
            raise ValueError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")

        params = [p for p in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
                  if p is not None]
        records = torch.is_grad_enabled() and any(t.requires_grad for t in [query, key, value] + params)
        step, check = self._take_step(records)
        q, k, v = self._in_projection(query, key, value, step, check)

        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if attn_mask.shape != (tgt_len, src_len):
                    raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be "
                                       f"{(tgt_len, src_len)}.")
                attn_mask = attn_mask.unsqueeze(0)
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (bsz * num_heads, tgt_len, src_len):
                    raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                                       f"{(bsz * num_heads, tgt_len, src_len)}.")
            else:
                raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")

        q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
        k = k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        v = v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        src_len = k.size(1)
        if key_padding_mask is not None:
            key_padding_mask = (key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
                                .reshape(bsz * num_heads, 1, src_len))
            attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
        dropout_p = self.dropout if self.training else 0.0

        if need_weights:
            _B, _Nt, E = q.shape
            q_scaled = q * math.sqrt(1.0 / float(E))
            if is_causal and attn_mask is None:
                raise RuntimeError("is_causal is not implemented for need_weights")
            if attn_mask is not None:
                w = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
            else:
                w = torch.bmm(q_scaled, k.transpose(-2, -1))
            w = F.softmax(w, dim=-1)
            if dropout_p > 0.0:
                w = F.dropout(w, p=dropout_p)
            out = torch.bmm(w, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
            out = self.out_proj(out).view(tgt_len, bsz, -1)
            w = w.view(bsz, num_heads, tgt_len, src_len)
            if average_attn_weights:
                w = w.mean(dim=1)
            if not is_batched:
                out, w = out.squeeze(1), w.squeeze(0)
            return out, w
        if attn_mask is not None:
            if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(0)
            else:
                attn_mask = attn_mask.view(bsz, num_heads, -1, src_len)
        q = q.view(bsz, num_heads, tgt_len, head_dim)
        k = k.view(bsz, num_heads, src_len, head_dim)
        v = v.view(bsz, num_heads, src_len, head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
        out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
        out = self.out_proj(out).view(tgt_len, bsz, -1)
        if not is_batched:
            out = out.squeeze(1)
        return out, None
