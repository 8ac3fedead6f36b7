"""GIoU of paired boxes: seed 004 (PyTorch vs NKI vs C++ on Inferentia) and seed 003
(jnp vs jit vs Pallas on TPU). Implementations for the Neuron engines (NKI, the GpSimd
C++ operator) and Triton are not written yet; only what is listed here exists."""

from kernels.giou.reference import giou, make_inputs
from kernels.registry import KernelImpl, OpSpec

SPEC = OpSpec(
    name="giou",
    make_inputs=make_inputs,
    reference=giou,
    shape={"batch": 1, "boxes": 256},
    items=lambda batch, boxes: batch * boxes,
    implementations=(
        KernelImpl("torch-naive", "kernels.giou.torch_impl:giou_naive", "torch", ("cpu", "cuda"), "torch"),
        KernelImpl("torch-compile", "kernels.giou.torch_impl:giou_compiled", "torch", ("cpu", "cuda"), "torch"),
        KernelImpl("jax-jit", "kernels.giou.jax_impl:giou_jit", "jax", ("cpu", "cuda", "tpu"), "jax (pip install jax)"),
        KernelImpl("pallas", "kernels.giou.pallas_impl:giou_pallas", "jax", ("cpu", "cuda", "tpu"),
                   "jax (pip install jax)", interpreted_on=("cpu",)),
    ),
)
