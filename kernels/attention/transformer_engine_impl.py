"""Transformer Engine's ``DotProductAttention`` with its fused (cuDNN) backend, as in the
seed (TE 1.11, ``NVTE_FUSED_ATTN``). The backend is forced through TE's environment
variables, read when TE first selects a backend, so they are set before TE is imported:
with flash and unfused attention off, inputs the fused backend cannot take make TE raise
instead of running another backend.

TE takes (batch, seq, heads, head_dim) with ``qkv_format="bshd"`` (transposed views here)
and returns (batch, seq, heads * head_dim). Written from TE's dot_product_attention.py and
not yet run (no GPU it was tested on had TE installed)."""

import functools
import os

os.environ["NVTE_FLASH_ATTN"] = "0"
os.environ["NVTE_FUSED_ATTN"] = "1"
os.environ["NVTE_UNFUSED_ATTN"] = "0"

from transformer_engine.pytorch import DotProductAttention  # noqa: E402  (after the backend choice)

from accelsweep.kernels.attention.torch_impl import refuse_unsupported  # noqa: E402


@functools.lru_cache(maxsize=8)
def _module(heads: int, head_dim: int, causal: bool) -> DotProductAttention:
    return DotProductAttention(heads, head_dim, qkv_format="bshd", attn_mask_type="causal" if causal else "no_mask")


def transformer_engine_attention(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
    refuse_unsupported("transformer-engine", soft_cap=soft_cap, window=window, neighborhood=neighborhood)
    batch, heads, seq, head_dim = q.shape
    out = _module(heads, head_dim, causal)(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.reshape(batch, seq, heads, head_dim).transpose(1, 2)
