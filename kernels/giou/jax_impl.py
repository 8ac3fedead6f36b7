"""GIoU in JAX (jnp under jit): seed 003's TPU post's baseline."""

import jax
import jax.numpy as jnp

EPSILON = 1e-5


@jax.jit
def giou_jit(boxes1, boxes2):
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    wh = jnp.clip(jnp.minimum(boxes1[..., 2:], boxes2[..., 2:]) - jnp.maximum(boxes1[..., :2], boxes2[..., :2]), 0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1 + area2 - inter
    iou = inter / jnp.maximum(union, EPSILON)
    whi = jnp.clip(jnp.maximum(boxes1[..., 2:], boxes2[..., 2:]) - jnp.minimum(boxes1[..., :2], boxes2[..., :2]), 0)
    enclosing = jnp.maximum(whi[..., 0] * whi[..., 1], EPSILON)
    return iou - (enclosing - union) / enclosing
