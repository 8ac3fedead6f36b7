"""NMS as one sequential Pallas kernel (seed 003's TPU post): a single program walks
the boxes in falling score order with a ``fori_loop`` and, for each box still kept,
computes its IoU row against every box in-kernel and drops the later ones it overlaps.
The answer is a keep mask in input order, like ``kernels/nms/jax_impl.py``.

Pallas has no sort, so the ``argsort`` by score and the scatter of the mask back to
input order run as plain JAX around the ``pallas_call``, in the same ``jit`` (the seed
worked around the same gap by packing the rank into the score's low bits).

The tests check it against ``kernels.nms.reference`` in interpret mode on a CPU
(tests/test_kernels_gated.py) and on a GPU through Pallas's Triton backend
(tests/test_cuda_kernels.py). For TPU only the lowering is checked
(``jax.export(platforms=["tpu"])``: every operation has a Pallas-to-Mosaic rule); libtpu's
compiler, which enforces layouts and memory spaces, has not run it. Interpret mode says
nothing about speed (the harness marks it ``interpreted``)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from accelsweep.kernels.nms.reference import IOU_THRESHOLD

MIN_LANES = 128


def _lanes(count: int) -> int:
    """A power of two, at least 128 (a full TPU lane row, a legal Triton block); padded
    lanes come after every real box and the loop never visits them, so they cannot
    suppress anything."""
    return max(MIN_LANES, 1 << (count - 1).bit_length())


def _nms_kernel(x0_ref, y0_ref, x1_ref, y1_ref, keep_ref, *, count: int, iou_threshold: float):
    """Kept to operations every Pallas backend has: the box coordinates arrive as four
    (1, lanes) rows, and the current box's coordinates and keep flag are read with a
    one-hot reduction over the row instead of a scalar load at a dynamic index (on TPU,
    dynamically indexed scalars belong in SMEM, a memory space GPUs do not have)."""
    x0, y0, x1, y1 = x0_ref[...], y0_ref[...], x1_ref[...], y1_ref[...]  # (1, lanes), in score order
    areas = (x1 - x0) * (y1 - y0)
    lane = jax.lax.broadcasted_iota(jnp.int32, x0.shape, 1)

    def visit(position, keep):
        current = lane == position
        # Exact: one term is the box's own value, every other term adds zero.
        cx0, cy0 = jnp.sum(jnp.where(current, x0, 0.0)), jnp.sum(jnp.where(current, y0, 0.0))
        cx1, cy1 = jnp.sum(jnp.where(current, x1, 0.0)), jnp.sum(jnp.where(current, y1, 0.0))
        is_kept = jnp.max(jnp.where(current, keep, 0.0)) > 0.0
        # Same arithmetic, in the same order, as the reference's one-to-many IoU.
        inter = (jnp.maximum(jnp.minimum(cx1, x1) - jnp.maximum(cx0, x0), 0.0)
                 * jnp.maximum(jnp.minimum(cy1, y1) - jnp.maximum(cy0, y0), 0.0))
        iou = inter / ((cx1 - cx0) * (cy1 - cy0) + areas - inter)
        # A kept box suppresses every later box it overlaps; a suppressed box, nothing.
        suppress = (iou > iou_threshold) & (lane > position) & is_kept
        return jnp.where(suppress, 0.0, keep)

    # float32 flags rather than bool: TPU reductions and stores are simplest on 32-bit floats.
    keep_ref[...] = jax.lax.fori_loop(0, count, visit, jnp.ones(x0.shape, jnp.float32))


@functools.partial(jax.jit, static_argnames="interpret")
def _nms(boxes, scores, interpret: bool):
    count = boxes.shape[0]
    lanes = _lanes(count)
    order = jnp.argsort(-scores, stable=True)  # stable, like the reference: same tie-break
    # Padded lanes sit after every real box: never visited, their flags dropped below.
    rows = jnp.pad(boxes[order].astype(jnp.float32).T, ((0, 0), (0, lanes - count)))
    row_spec = pl.BlockSpec((1, lanes), lambda: (0, 0))
    keep_sorted = pl.pallas_call(
        functools.partial(_nms_kernel, count=count, iou_threshold=IOU_THRESHOLD),
        out_shape=jax.ShapeDtypeStruct((1, lanes), jnp.float32),
        in_specs=[row_spec] * 4,
        out_specs=row_spec,
        interpret=interpret,
    )(*(row[None, :] for row in rows))
    return jnp.zeros(count, dtype=bool).at[order].set(keep_sorted[0, :count] > 0.0)


def nms_pallas(boxes, scores):
    """Keep mask (bool, input order) of greedy NMS at the reference's IoU threshold."""
    return _nms(boxes, scores, interpret=jax.default_backend() == "cpu")
