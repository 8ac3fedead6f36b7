"""GIoU as one fused Triton kernel (GPU): each program reads ``block_pairs`` box pairs
as one (pairs, 4) tile, 16 contiguous bytes per box, and writes their GIoU, so the
whole computation is one read of each input and one write of the output (the eager
PyTorch version launches a kernel per operation and round-trips every intermediate
through memory).

On a CPU it is checked against ``kernels.giou.reference`` under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors, numpy arithmetic): that checks the kernel's
indexing, masking and arithmetic, not its speed. The interpreter must be switched on
before ``triton.jit`` decorates the kernel, so it cannot be toggled inside a harness
process; that check runs in a subprocess (tests/test_kernels_gated.py) and the
implementation is registered for ``cuda`` only, where tests/test_cuda_kernels.py checks
it through the harness.
"""

import torch
import triton
import triton.language as tl

EPSILON = 1e-5
DEFAULT_BLOCK_PAIRS = 1024


@triton.jit
def _giou_kernel(boxes1_ptr, boxes2_ptr, out_ptr, pairs, epsilon, BLOCK_PAIRS: tl.constexpr):
    pair = tl.program_id(0) * BLOCK_PAIRS + tl.arange(0, BLOCK_PAIRS)
    in_range = pair < pairs
    # One (BLOCK_PAIRS, 4) load per input: a pair's four coordinates are contiguous,
    # so each thread reads whole boxes rather than four strided scalars.
    offsets = pair[:, None] * 4 + tl.arange(0, 4)[None, :]
    box1 = tl.load(boxes1_ptr + offsets, mask=in_range[:, None], other=0.0).to(tl.float32)
    box2 = tl.load(boxes2_ptr + offsets, mask=in_range[:, None], other=0.0).to(tl.float32)
    # (pairs, 4) -> (pairs, 2, 2) = [[x0, y0], [x1, y1]]; split peels off the last axis.
    xs1, ys1 = tl.split(tl.reshape(box1, (BLOCK_PAIRS, 2, 2)))
    xs2, ys2 = tl.split(tl.reshape(box2, (BLOCK_PAIRS, 2, 2)))
    x0a, x1a = tl.split(xs1)
    y0a, y1a = tl.split(ys1)
    x0b, x1b = tl.split(xs2)
    y0b, y1b = tl.split(ys2)

    area1 = (x1a - x0a) * (y1a - y0a)
    area2 = (x1b - x0b) * (y1b - y0b)
    inter = (tl.maximum(tl.minimum(x1a, x1b) - tl.maximum(x0a, x0b), 0.0)
             * tl.maximum(tl.minimum(y1a, y1b) - tl.maximum(y0a, y0b), 0.0))
    union = area1 + area2 - inter
    iou = inter / tl.maximum(union, epsilon)
    enclosing = tl.maximum(
        tl.maximum(tl.maximum(x1a, x1b) - tl.minimum(x0a, x0b), 0.0)
        * tl.maximum(tl.maximum(y1a, y1b) - tl.minimum(y0a, y0b), 0.0), epsilon)
    giou = iou - (enclosing - union) / enclosing
    tl.store(out_ptr + pair, giou.to(out_ptr.dtype.element_ty), mask=in_range)


def giou_triton(boxes1: torch.Tensor, boxes2: torch.Tensor, block_pairs: int = DEFAULT_BLOCK_PAIRS) -> torch.Tensor:
    """GIoU of paired boxes (..., 4) -> (...). ``block_pairs``: pairs per program, a
    power of two (``tl.arange``'s rule)."""
    if boxes1.shape != boxes2.shape or boxes1.shape[-1] != 4:
        raise ValueError(f"expected two (..., 4) tensors of one shape; got {tuple(boxes1.shape)} "
                         f"and {tuple(boxes2.shape)}")
    boxes1, boxes2 = boxes1.contiguous(), boxes2.contiguous()
    out = torch.empty(boxes1.shape[:-1], dtype=boxes1.dtype, device=boxes1.device)
    pairs = out.numel()
    if pairs:
        _giou_kernel[(triton.cdiv(pairs, block_pairs),)](boxes1, boxes2, out, pairs, EPSILON,
                                                         BLOCK_PAIRS=block_pairs)
    return out
