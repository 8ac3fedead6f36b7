"""Non-maximum suppression (seed 003: numpy vs JAX while_loop vs a sequential Pallas
kernel on TPU). The Pallas kernel is not written yet; only what is listed here exists."""

from kernels.nms.reference import kept, make_inputs, nms
from kernels.registry import KernelImpl, OpSpec

SPEC = OpSpec(
    name="nms",
    make_inputs=make_inputs,
    reference=nms,
    shape={"boxes": 256},
    items=lambda boxes: boxes,
    implementations=(
        KernelImpl("numpy", "kernels.nms.reference:nms", "numpy", ("cpu",), "numpy"),
        KernelImpl("jax-while-loop", "kernels.nms.jax_impl:nms_while_loop", "jax", ("cpu", "cuda", "tpu"),
                   "jax (pip install jax)"),
        KernelImpl("torchvision", "kernels.nms.torchvision_impl:nms_torchvision", "torch", ("cpu", "cuda"),
                   "torchvision"),
    ),
    canonical=kept,
    tolerance={"float32": 0.0},  # the same boxes must be kept
)
