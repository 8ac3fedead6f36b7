"""Seed 003's attention study as a sweep: attention implementations x sequence length,
for one computation at a time (--variant), each checked against the float64 reference.

    python sweeps/attention_kernels.py                      # plain attention, seq 196 and 3136
    python sweeps/attention_kernels.py --variant soft-cap   # the seed's tanh soft-cap at 30
    python sweeps/attention_kernels.py --smoke              # 2 x 4 x 64 x 32, seconds

The seed (an H100, its figures step times of a ViT's training, not kernel times) found
SDPA's backends apart eager and close compiled; flash-attn-3 ~5x the hand-written function
at 3136 tokens; FlexAttention ~3.5x the hand-written soft-cap eager. Shapes here are its
second ViT's (batch 8, 12 heads of 64). On a CPU: the hand-written attention (eager and
compiled), SDPA with its math or CPU flash backend forced, compiled FlexAttention; with
--platform cuda also SDPA's other backends and, where installed, flash-attn, xFormers and
Transformer Engine. Implementations that lack the variant or the dtype are skipped, with why.
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
