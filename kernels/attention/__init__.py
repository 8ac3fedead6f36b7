"""Scaled dot-product attention, forward (seed 003's attention post: hand-written attention
vs SDPA's backends vs FlashAttention vs Transformer Engine vs xFormers, eager and compiled;
FlexAttention's soft-cap ``score_mod`` and block masks).

Options: ``causal``; ``soft_cap`` (> 0: scores -> soft_cap * tanh(score / soft_cap), the
seed's cap was 30); ``window`` (> 0: each query sees keys fewer than ``window`` positions
away, a sliding window); ``neighborhood`` (> 0: tokens on a square patch grid see those
fewer than ``neighborhood`` rows and columns away, the seed's FlexAttention mask_mod).
The reference (reference.py) defines them exactly; the FLOP and byte counts and the
tolerances are explained beside them in ``SPEC``.
"""

from accelsweep.kernels.attention.reference import attended_pairs, attention, grid_side, make_inputs
from accelsweep.kernels.registry import KernelImpl, OpSpec
from accelsweep.trainables.errors import ConfigError, non_negative_float, positive_int
from accelsweep.trainables.platforms import TORCH_XLA_PLATFORMS

ALL_OPTIONS = ("causal", "soft_cap", "window", "neighborhood")
MASKS = ("causal", "window", "neighborhood")  # options that hide keys (a mask) rather than change scores


def _boolean(name, value):
    if not isinstance(value, bool):
        raise ConfigError(name, "True or False", value)


def _square_grid_for_neighborhood(shape, options):
    if options["neighborhood"] and not grid_side(shape["seq"]):
        raise ConfigError("seq", "a square number of tokens (a patch grid, e.g. 196 = 14 x 14) with neighborhood > 0",
                          shape["seq"])


def _half_precision_on_cuda(shape, options, tuning, dtype, platform):
    """The CUDA flash and cuDNN kernels run 16-bit floats only (they would raise "No
    available kernel" at the first call; this says so before the sweep starts)."""
    if platform == "cuda" and dtype == "float32":
        raise ConfigError("dtype", "bfloat16 for this implementation on cuda (its CUDA kernel has no float32)",
                          dtype)


def _torch(name, function, platforms=("cpu", "cuda"), **fields):
    return KernelImpl(name, f"accelsweep.kernels.attention.torch_impl:{function}", "torch", platforms, "torch", **fields)


SPEC = OpSpec(
    name="attention",
    make_inputs=make_inputs,
    reference=attention,
    # ViT-B/16 at 224 without a class token (the seed's 196 patches): 12 heads of 64.
    shape={"batch": 8, "heads": 12, "seq": 196, "head_dim": 64},
    items=lambda batch, heads, seq, head_dim: batch * seq,  # tokens (all heads) per call
    options={"causal": False, "soft_cap": 0.0, "window": 0, "neighborhood": 0},
    option_values={"causal": _boolean, "soft_cap": non_negative_float,
                   "window": lambda name, value: positive_int(name, value, minimum=0),
                   "neighborhood": lambda name, value: positive_int(name, value, minimum=0)},
    check=_square_grid_for_neighborhood,
    # FLOPs count the visible (query, key) pairs: 4 * batch * heads * head_dim per pair (two
    # matmuls of 2 FLOPs per multiply-add), so an unmasked call is 4 * b * h * s^2 * d and a
    # causal one about half of it (exactly s(s+1)/2 pairs, the convention of FlashAttention's
    # benchmarks up to the diagonal). Kernels that compute the hidden scores anyway (naive,
    # sdpa-math) are credited only with the visible ones.
    flops=lambda batch, heads, seq, head_dim, causal, soft_cap, window, neighborhood:
        4.0 * batch * heads * head_dim * attended_pairs(seq, causal, window, neighborhood),
    # q, k and v read once and the output written once, 4 * b * h * s * d elements (a fused
    # kernel's least; the naive one also writes and reads the s x s scores, which the count
    # leaves out, as it is not needed).
    bytes_moved=lambda batch, heads, seq, head_dim, itemsize, **options: 4 * batch * heads * seq * head_dim * itemsize,
    # Max abs error against float64 on the same rounded inputs. Outputs are weighted means of
    # v, unit normal, so |out| stays below about 4. float32: 1e-4, far above float32's own
    # rounding, to leave room for other kernels' summation orders. bfloat16: 2^-5; one
    # bfloat16 rounding of an output near 4 alone is up to 2^-7, and scores and softmax
    # weights are rounded too.
    tolerance={"float32": 1e-4, "bfloat16": 2.0 ** -5},
    implementations=(
        _torch("naive", "naive", ("cpu", "cuda") + TORCH_XLA_PLATFORMS),
        _torch("naive-compile", "naive_compiled"),
        _torch("sdpa-math", "sdpa_math", supports=MASKS),
        # On a CPU this is ATen's CPU flash-attention kernel, not FlashAttention-2.
        _torch("sdpa-flash", "sdpa_flash", supports=("causal",), check=_half_precision_on_cuda),
        _torch("sdpa-efficient", "sdpa_efficient", ("cuda",), supports=MASKS),
        _torch("sdpa-cudnn", "sdpa_cudnn", ("cuda",), supports=("causal",), check=_half_precision_on_cuda),
        _torch("flex", "flex"),
        KernelImpl("flash-attn", "accelsweep.kernels.attention.flash_attn_impl:flash_attn", "torch", ("cuda",),
                   "flash-attn >= 2.6 (pip install flash-attn --no-build-isolation; an Ampere or newer GPU)",
                   dtypes=("bfloat16",), supports=("causal", "soft_cap", "window")),
        KernelImpl("xformers", "accelsweep.kernels.attention.xformers_impl:xformers_attention", "torch", ("cuda",),
                   "xformers (pip install xformers, the build matching this torch)", supports=("causal",)),
        KernelImpl("transformer-engine", "accelsweep.kernels.attention.transformer_engine_impl:transformer_engine_attention",
                   "torch", ("cuda",), "Transformer Engine (pip install --no-build-isolation "
                   "'transformer_engine[pytorch]')", dtypes=("bfloat16",), supports=("causal",)),
    ),
)
