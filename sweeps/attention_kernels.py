"""Seed 003's attention study as a sweep: attention implementations x sequence length,
for one computation at a time (--variant), each checked against the float64 reference.

    python sweeps/attention_kernels.py                      # plain attention, seq 196 and 3136
    python sweeps/attention_kernels.py --variant soft-cap   # the seed's tanh soft-cap at 30
    python sweeps/attention_kernels.py --variant neighborhood --dtype bfloat16
    python sweeps/attention_kernels.py --smoke              # 2 x 4 x 64 x 32, seconds
    python sweeps/attention_kernels.py --dry-run

The seed (an H100, a ViT's attention inside full training steps, so its figures are step
times, not kernel times) found SDPA's backends apart in eager mode and close once
compiled; at 3136 tokens flash-attn-3 ~5x the hand-written function; FlexAttention ~3.5x
the hand-written soft-cap in eager mode. Shapes here are the seed's second ViT (batch 8,
12 heads of 64; 196 and 3136 tokens).

On a CPU this sweep runs the hand-written attention (eager and compiled), SDPA with its
math or ATen's CPU flash backend forced (never the dispatcher's choice), and compiled
FlexAttention. With --platform cuda it adds SDPA's memory-efficient and cuDNN backends
and, where installed, flash-attn, xFormers and Transformer Engine, registered and
checked for options before any trial. On a lent H100 (2026-11-26, docs/gpu.md) every
SDPA backend, naive and flex ran through the harness within 0.2% window-to-window CV at
the default shape, and this sweep ran a trial through Ray; flash-attn, xFormers and
Transformer Engine were not installed there. Implementations that
lack the variant's options or the dtype are listed as skipped, with the reason.
"""

from accelsweep.sweeps.driver.run.kernel_sweep import run

SHAPES = {"batch": [8], "heads": [12], "seq": [196, 3136], "head_dim": [64]}
SMOKE_SHAPES = {"batch": [2], "heads": [4], "seq": [64], "head_dim": [32]}
VARIANTS = {
    "plain": {},
    "causal": {"causal": True},
    "soft-cap": {"soft_cap": 30.0},  # the seed's 30 * tanh(score / 30)
    "neighborhood": {"neighborhood": 5},  # the seed's mask_mod on the 14 x 14 (56 x 56) patch grid
    "window": {"window": 64},  # a 1-D sliding window (Mistral-style): 63 keys either side
}

if __name__ == "__main__":
    run("attention", __doc__.split("\n\n")[0], shapes=SHAPES, smoke_shapes=SMOKE_SHAPES, variants=VARIANTS)
