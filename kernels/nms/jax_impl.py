"""NMS in JAX with lax.while_loop (seed 003): shapes must be static, so the answer is a
keep mask in input order rather than a list of indices."""

import jax
import jax.numpy as jnp

from accelsweep.kernels.nms.reference import IOU_THRESHOLD


@jax.jit
def nms_while_loop(boxes, scores):
    order = jnp.argsort(-scores)
    sorted_boxes = boxes[order]
    lt = jnp.maximum(sorted_boxes[:, None, :2], sorted_boxes[None, :, :2])
    rb = jnp.minimum(sorted_boxes[:, None, 2:], sorted_boxes[None, :, 2:])
    wh = jnp.clip(rb - lt, 0)
    inter = wh[..., 0] * wh[..., 1]
    areas = (sorted_boxes[:, 2] - sorted_boxes[:, 0]) * (sorted_boxes[:, 3] - sorted_boxes[:, 1])
    overlaps = inter / (areas[:, None] + areas[None, :] - inter) > IOU_THRESHOLD
    count = boxes.shape[0]
    later = jnp.arange(count)

    def visit(state):
        position, keep = state
        # A kept box suppresses every later box it overlaps; a suppressed one nothing.
        suppress = overlaps[position] & (later > position) & keep[position]
        return position + 1, keep & ~suppress

    _, keep_sorted = jax.lax.while_loop(lambda s: s[0] < count, visit, (0, jnp.ones(count, dtype=bool)))
    return jnp.zeros(count, dtype=bool).at[order].set(keep_sorted)
