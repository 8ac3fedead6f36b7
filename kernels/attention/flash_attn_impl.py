"""flash-attn (FlashAttention-2, Dao-AILab), the library behind SDPA's CUDA flash backend,
called directly: it takes the soft-cap and sliding window SDPA lacks.

``flash_attn_func`` wants (batch, seq, heads, head_dim); a transposed view of the op's
(batch, heads, seq, head_dim) inputs has a unit last stride, which is all it needs, so
no copy is timed. Its window (left, right) keeps keys in [i - left, i + right]; the op's
``window`` w keeps |i - j| < w, so left = right = w - 1 (and causal sets right to 0).
Softcap needs flash-attn >= 2.6. Written from flash_attn/flash_attn_interface.py and not
yet run (no GPU it was tested on had flash-attn installed). The seed's post used the
FlashAttention-3 beta (hopper/), a separate build and interface that is not registered.
"""

from flash_attn import flash_attn_func

from accelsweep.kernels.attention.torch_impl import refuse_unsupported


def flash_attn(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
    refuse_unsupported("flash-attn", neighborhood=neighborhood)  # a 2-D mask is not a band
    reach = window - 1 if window else -1  # -1: unbounded
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                          window_size=(reach, reach), softcap=soft_cap)
    return out.transpose(1, 2)
