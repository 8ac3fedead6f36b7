"""Scaled dot-product attention, the plain numpy reference in float64 (seed 003's
attention post: its hand-written ``attn_fn``, soft-capping and masked variants).

For each query position i and key position j, with d the head dimension:

    score[i, j] = q[i] . k[j] / sqrt(d)
    score[i, j] = soft_cap * tanh(score[i, j] / soft_cap)      if soft_cap > 0
    score[i, j] = -inf   where key j is hidden from query i    (causal, window)
    out[i] = sum_j softmax_j(score[i, :]) * v[j]

Which keys are hidden: ``visible``. Written on its own, not shared with the torch
implementations, so a masking bug there cannot hide in the ground truth.
"""

import numpy as np


def grid_side(seq: int) -> int:
    """The side of the square token grid ``neighborhood`` needs; 0 when seq is not square."""
    side = int(round(seq ** 0.5))
    return side if side * side == seq else 0


def visible(seq: int, causal: bool = False, window: int = 0, neighborhood: int = 0) -> np.ndarray:
    """(seq, seq) boolean: which keys (columns) each query (row) may attend to.

    Key j is hidden when ``causal`` and j > i; when ``window`` > 0 and |i - j| >= window
    (a sliding window of ``window`` positions on each side, the query's own included); or
    when ``neighborhood`` > 0 and, with the tokens laid out row by row on a square grid of
    side sqrt(seq) (a ViT's patches), j's row or column is ``neighborhood`` or more away
    from i's (the seed's "5x5 window" mask, whose code keeps |row difference| < 5 and
    |column difference| < 5, is ``neighborhood=5``). Every query sees at least itself, so
    no row is empty."""
    query = np.arange(seq)[:, None]
    key = np.arange(seq)[None, :]
    seen = np.ones((seq, seq), dtype=bool)
    if causal:
        seen &= key <= query
    if window:
        seen &= np.abs(query - key) < window
    if neighborhood:
        side = grid_side(seq)
        if not side:
            raise ValueError(f"neighborhood needs a square number of tokens; seq is {seq}")
        seen &= (np.abs(query // side - key // side) < neighborhood) & (np.abs(query % side - key % side) < neighborhood)
    return seen


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False, soft_cap: float = 0.0,
              window: int = 0, neighborhood: int = 0) -> np.ndarray:
    """q, k, v: (batch, heads, seq, head_dim) -> (batch, heads, seq, head_dim), float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    batch, heads, seq, head_dim = q.shape
    seen = visible(seq, causal, window, neighborhood)
    out = np.empty_like(q)
    # One (seq, seq) score matrix at a time: at the seed's 3136 tokens, all heads at once
    # would be 8 x 12 x 3136^2 float64 = 7.5 GB.
    for b in range(batch):
        for h in range(heads):
            scores = q[b, h] @ k[b, h].T / np.sqrt(head_dim)
            if soft_cap:
                scores = soft_cap * np.tanh(scores / soft_cap)
            scores = np.where(seen, scores, -np.inf)
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[b, h] = (weights / weights.sum(axis=-1, keepdims=True)) @ v[b, h]
    return out


def attended_pairs(seq: int, causal: bool = False, window: int = 0, neighborhood: int = 0) -> int:
    """How many (query, key) pairs are visible: the work an attention kernel must do."""
    if neighborhood:
        return int(visible(seq, causal, window, neighborhood).sum())
    positions = np.arange(seq)
    before = positions if not window else np.minimum(positions, window - 1)  # keys left of each query
    after = 0 if causal else (seq - 1 - positions if not window else np.minimum(seq - 1 - positions, window - 1))
    return int(np.sum(before + after + 1))


def make_inputs(seed: int, batch: int, heads: int, seq: int, head_dim: int) -> tuple[np.ndarray, ...]:
    """q, k, v: (batch, heads, seq, head_dim) float32 standard normal, the layout SDPA takes.
    Unit-normal q and k give scores q.k/sqrt(d) of unit variance: the scale's intent."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((batch, heads, seq, head_dim), dtype=np.float32) for _ in range(3))
