"""GIoU as an NKI kernel (seed 004's NeuronCore-v2 kernel, inf2/trn1), written against
the standalone ``nki`` package (``import nki``; NKI 0.5, Neuron SDK 2.31, and later)
rather than the seed's ``neuronxcc.nki``, which is gone.

The pairs are spread over all 128 SBUF partitions (``giou_kernel`` says how). The ``nki``
package comes only from the Neuron package repository (PyPI's ``nki`` is an empty
placeholder whose import fails): elsewhere this module's import fails and the registry
reports KernelUnavailable. tests/test_kernels_gated.py compares ``nki.simulate`` (the
package's CPU simulator, NeuronCore-v2 target) with the reference wherever ``nki`` imports;
the kernel has not yet run on a NeuronCore.

On a Neuron DLAMI (torch-neuronx), ``giou_nki`` takes XLA-device tensors: ``nki.jit``
sees ``torch.Tensor`` arguments and builds a PyTorch custom operator.
"""

import nki
import nki.language as nl

EPSILON = 1e-5
# 512 pairs x 4 coordinates x 4 bytes = 8 KiB per partition per input tile: a small
# share of a partition's SBUF, so two input tiles and the temporaries fit with room.
PAIRS_PER_PARTITION = 512


def _giou_tile(boxes1, boxes2, out, first, width):
    """GIoU of pairs [first, first + width) of every partition: (128, width). Division is a
    reciprocal and a multiply: ``nl.divide`` is not among the NKI ISA's arithmetic
    operators."""
    a = nl.load(boxes1[:, first:first + width, :])  # HBM -> SBUF, (128, width, 4)
    b = nl.load(boxes2[:, first:first + width, :])
    x0a, y0a, x1a, y1a = a[:, :, 0], a[:, :, 1], a[:, :, 2], a[:, :, 3]
    x0b, y0b, x1b, y1b = b[:, :, 0], b[:, :, 1], b[:, :, 2], b[:, :, 3]

    area1 = nl.multiply(nl.subtract(x1a, x0a), nl.subtract(y1a, y0a))
    area2 = nl.multiply(nl.subtract(x1b, x0b), nl.subtract(y1b, y0b))
    inter_w = nl.maximum(nl.subtract(nl.minimum(x1a, x1b), nl.maximum(x0a, x0b)), 0.0)
    inter_h = nl.maximum(nl.subtract(nl.minimum(y1a, y1b), nl.maximum(y0a, y0b)), 0.0)
    inter = nl.multiply(inter_w, inter_h)
    union = nl.subtract(nl.add(area1, area2), inter)
    iou = nl.multiply(inter, nl.reciprocal(nl.maximum(union, EPSILON)))

    enclosing_w = nl.maximum(nl.subtract(nl.maximum(x1a, x1b), nl.minimum(x0a, x0b)), 0.0)
    enclosing_h = nl.maximum(nl.subtract(nl.maximum(y1a, y1b), nl.minimum(y0a, y0b)), 0.0)
    enclosing = nl.maximum(nl.multiply(enclosing_w, enclosing_h), EPSILON)
    # giou = iou - (enclosing - union) / enclosing
    penalty = nl.multiply(nl.subtract(enclosing, union), nl.reciprocal(enclosing))
    nl.store(out[:, first:first + width], value=nl.subtract(iou, penalty))


@nki.jit
def giou_kernel(boxes1, boxes2):
    """(batch, boxes, 4) float32 x 2 in HBM -> (batch, boxes) GIoU in HBM.

    GIoU is element-wise over box pairs, so the (batch, boxes) pairs are spread over all
    128 SBUF partitions (``nl.tile_size.pmax``), each partition taking a contiguous run of
    pairs; the seed put the batch on the partitions, which leaves most of them idle for a
    small batch. One tile holds up to ``PAIRS_PER_PARTITION`` pairs per partition as
    (128, pairs, 4): each coordinate is a stride-4 view of it, so the four coordinates cost
    one DMA per input and the arithmetic runs on the Vector engine. The pair count must be
    a multiple of 128 (checked before any trial: kernels/giou/__init__.py)."""
    assert boxes1.shape == boxes2.shape and boxes1.shape[-1] == 4, "two (batch, boxes, 4) tensors of one shape"
    batch, count = boxes1.shape[0], boxes1.shape[1]
    partitions = nl.tile_size.pmax
    pairs = batch * count
    assert pairs % partitions == 0, "batch * boxes must be a multiple of 128 (one run of pairs per partition)"
    per_partition = pairs // partitions
    out = nl.ndarray((batch, count), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    # HBM views, no copy: pair p * per_partition + j sits at [p, j].
    boxes1_runs = boxes1.reshape((partitions, per_partition, 4))
    boxes2_runs = boxes2.reshape((partitions, per_partition, 4))
    out_runs = out.reshape((partitions, per_partition))
    # Plain Python loops and ifs are unrolled when the kernel is specialised.
    full_tiles = per_partition // PAIRS_PER_PARTITION
    for tile in range(full_tiles):
        _giou_tile(boxes1_runs, boxes2_runs, out_runs, tile * PAIRS_PER_PARTITION, PAIRS_PER_PARTITION)
    remainder = per_partition % PAIRS_PER_PARTITION
    if remainder > 0:
        _giou_tile(boxes1_runs, boxes2_runs, out_runs, full_tiles * PAIRS_PER_PARTITION, remainder)
    return out


def giou_nki(boxes1, boxes2):
    """The harness's entry point: Neuron XLA-device tensors in, the kernel's output out."""
    return giou_kernel(boxes1.contiguous(), boxes2.contiguous())
