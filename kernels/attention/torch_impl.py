"""Attention in PyTorch: the seed's hand-written version (eager and compiled), SDPA with one
backend forced per implementation, and FlexAttention compiled.

Each function takes q, k, v as (batch, heads, seq, head_dim) and the op's options
(causal, soft_cap, window, neighborhood) and returns the same layout. An option a function cannot
honour raises instead of being dropped: the harness already refuses such configs, this
guards direct calls. Every torch implementation's mask comes from one ``mask_mod``.

SDPA backends are forced with ``sdpa_kernel(<one backend>)``: a backend that cannot run
the inputs raises "No viable backend" (CPU) or "No available kernel" (CUDA) instead of
quietly running another one. On a CPU, sdpa-flash is ATen's CPU flash-attention kernel
(``_scaled_dot_product_flash_attention_for_cpu``) and sdpa-efficient and sdpa-cudnn raise;
tests/test_attention_kernels.py (CPU) and tests/test_cuda_kernels.py (GPU) check each
against the float64 reference.
"""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask, flex_attention


def refuse_unsupported(impl: str, **options) -> None:
    """Raise for any option set away from its default (0 / False) that ``impl`` lacks."""
    given = {name: value for name, value in options.items() if value}
    if given:
        raise NotImplementedError(f"{impl} does not implement {', '.join(given)} (given {given}); "
                                  "the harness refuses this config before calling it")


def masked(causal: bool, window: int, neighborhood: int) -> bool:
    return bool(causal or window or neighborhood)


@functools.lru_cache(maxsize=8)
def mask_mod(seq: int, causal: bool, window: int, neighborhood: int):
    """FlexAttention mask_mod: True where query ``q_idx`` may attend to key ``kv_idx``. Every
    torch implementation's mask comes from it (``create_mask`` for a dense mask,
    ``create_block_mask`` for flex), so they all hide the same keys. Masks are built once
    per (seq, causal, window, neighborhood, device) and reused, as the seed materialised
    its mask outside the training step."""
    side = round(seq ** 0.5)

    def causal_mask(batch, head, q_idx, kv_idx):
        return kv_idx <= q_idx

    def window_mask(batch, head, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < window

    def neighborhood_mask(batch, head, q_idx, kv_idx):
        # The seed's mask_mod: token index -> (row, column) on the patch grid.
        near_rows = (q_idx // side - kv_idx // side).abs() < neighborhood
        return near_rows & ((q_idx % side - kv_idx % side).abs() < neighborhood)

    masks = [mask for mask, on in ((causal_mask, causal), (window_mask, window),
                                   (neighborhood_mask, neighborhood)) if on]
    return and_masks(*masks) if len(masks) > 1 else masks[0]


@functools.lru_cache(maxsize=8)
def dense_mask(seq: int, causal: bool, window: int, neighborhood: int, device: torch.device) -> torch.Tensor:
    """(1, 1, seq, seq) boolean, True = attend: SDPA's ``attn_mask`` convention."""
    return create_mask(mask_mod(seq, causal, window, neighborhood), 1, 1, seq, seq, device=device)


def _attend(q, k, v, soft_cap: float, mask):
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # the seed scales q before the product
    if soft_cap:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))
    return scores.softmax(dim=-1) @ v


# Compiled once per process and option set; the harness's warm-up absorbs the compile.
_attend_compiled = torch.compile(_attend)


def _dense_mask_if_any(q, causal, window, neighborhood):
    return dense_mask(q.shape[-2], causal, window, neighborhood, q.device) if masked(causal, window, neighborhood) \
        else None


def naive(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
    """The seed's ``attn_fn`` (matmul, softmax, matmul), plus soft-cap and masks."""
    return _attend(q, k, v, soft_cap, _dense_mask_if_any(q, causal, window, neighborhood))


def naive_compiled(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
    """``naive`` under torch.compile (inductor): the seed's "compiled default attention"."""
    return _attend_compiled(q, k, v, soft_cap, _dense_mask_if_any(q, causal, window, neighborhood))


def _forced_sdpa(backend: SDPBackend, impl: str, takes_mask: bool):
    """SDPA restricted to ``backend``. A sliding window or neighbourhood goes in as a dense
    ``attn_mask`` (as the seed's masked-SDPA run did) for backends that take one."""

    def attention(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
        refuse_unsupported(impl, soft_cap=soft_cap,
                           **({} if takes_mask else {"window": window, "neighborhood": neighborhood}))
        # SDPA refuses attn_mask together with is_causal, so a masked causal call is one mask.
        mask = dense_mask(q.shape[-2], causal, window, neighborhood, q.device) if window or neighborhood else None
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)

    attention.__name__ = attention.__qualname__ = impl.replace("-", "_")
    return attention


sdpa_math = _forced_sdpa(SDPBackend.MATH, "sdpa-math", takes_mask=True)
# The CUDA flash kernel takes no attn_mask; ATen's CPU flash kernel does, but one
# implementation should mean the same options on every platform.
sdpa_flash = _forced_sdpa(SDPBackend.FLASH_ATTENTION, "sdpa-flash", takes_mask=False)
# Memory-efficient attention takes an arbitrary mask (PyTorch's SDPA documentation).
sdpa_efficient = _forced_sdpa(SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient", takes_mask=True)
sdpa_cudnn = _forced_sdpa(SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn", takes_mask=False)


@functools.lru_cache(maxsize=8)
def _soft_cap_score_mod(soft_cap: float):
    # One function object per cap: a new closure each call would make torch.compile recompile.
    def soft_cap_score(score, batch, head, q_idx, kv_idx):
        return soft_cap * torch.tanh(score / soft_cap)

    return soft_cap_score


@functools.lru_cache(maxsize=8)
def _block_mask(seq: int, causal: bool, window: int, neighborhood: int, device: torch.device):
    return create_block_mask(mask_mod(seq, causal, window, neighborhood), None, None, seq, seq, device=device)


# FlexAttention is only fast compiled (uncompiled it materialises the scores); the seed
# compiled it the same way.
_flex_compiled = torch.compile(flex_attention)


def flex(q, k, v, causal=False, soft_cap=0.0, window=0, neighborhood=0):
    """FlexAttention: soft-cap as a ``score_mod``; causal, window and neighbourhood as a
    block mask, so blocks wholly hidden (beyond the window, above the diagonal) are skipped."""
    score_mod = _soft_cap_score_mod(soft_cap) if soft_cap else None
    block_mask = _block_mask(q.shape[-2], causal, window, neighborhood, q.device) \
        if masked(causal, window, neighborhood) else None
    return _flex_compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)
