"""Non-maximum suppression (seed 003: numpy vs JAX while_loop vs a sequential Pallas
kernel on TPU), plus torchvision's operator. The Pallas kernel is checked against the
reference in interpret mode on a CPU and through Pallas's Triton backend on a GPU; it
has not yet run on a TPU (kernels/nms/pallas_impl.py)."""

from accelsweep.kernels.nms.reference import kept, make_inputs, nms
from accelsweep.kernels.registry import KernelImpl, OpSpec

SPEC = OpSpec(
    name="nms",
    make_inputs=make_inputs,
    reference=nms,
    shape={"boxes": 256},
    items=lambda boxes: boxes,
    implementations=(
        KernelImpl("numpy", "accelsweep.kernels.nms.reference:nms", "numpy", ("cpu",), "numpy"),
        KernelImpl("jax-while-loop", "accelsweep.kernels.nms.jax_impl:nms_while_loop", "jax", ("cpu", "cuda", "tpu"),
                   "jax (pip install jax)"),
        KernelImpl("pallas", "accelsweep.kernels.nms.pallas_impl:nms_pallas", "jax", ("cpu", "cuda", "tpu"),
                   "jax (pip install jax)", interpreted_on=("cpu",)),
        KernelImpl("torchvision", "accelsweep.kernels.nms.torchvision_impl:nms_torchvision", "torch", ("cpu", "cuda"),
                   "torchvision"),
    ),
    # No FLOP or byte count: what it writes depends on the boxes (how many are kept) and on
    # the implementation (a keep mask or an index list), and its loop is sequential, so
    # neither roof bounds it.
    canonical=kept,
    tolerance={"float32": 0.0},  # the same boxes must be kept
)
