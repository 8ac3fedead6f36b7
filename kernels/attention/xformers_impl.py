"""xFormers ``memory_efficient_attention`` (the seed used 0.0.28), the source of SDPA's
memory-efficient backend. xFormers picks its own kernel among those it ships (its
dispatcher, as in the seed); causal is its ``LowerTriangularMask`` bias. Inputs are
transposed views to its (batch, seq, heads, head_dim) layout. Written from the xFormers
API and not yet run (no GPU it was tested on had xFormers installed)."""

import xformers.ops as xops

from accelsweep.kernels.attention.torch_impl import refuse_unsupported


def xformers_attention(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
    refuse_unsupported("xformers", soft_cap=soft_cap, window=window, neighborhood=neighborhood)
    bias = xops.LowerTriangularMask() if causal else None
    out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias)
    return out.transpose(1, 2)
