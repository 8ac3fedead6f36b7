"""GIoU of paired boxes: seed 004 (PyTorch vs NKI vs C++ on Inferentia) and seed 003
(jnp vs jit vs Pallas on TPU), plus a fused Triton kernel for GPUs.

What the tests check (see each module's docstring): the CPU implementations against the
reference; Pallas in interpret mode; Triton under its interpreter in a subprocess
(tests/test_kernels_gated.py); every cuda implementation (torch, torch.compile, JAX,
Pallas, Triton) through the harness on a GPU (tests/test_cuda_kernels.py). NKI and the
GpSimd C++ operator are written against the current Neuron APIs; their stacks come only
from the Neuron package repositories, so elsewhere they report KernelUnavailable. On
platform ``neuron`` a trial holds one NeuronCore and runs NKI, GpSimd and the PyTorch
baseline (torch-naive through torch-xla, seed 004's comparison); that path (torch-xla
placement, sync, compile counting) is tested on torch-xla's CPU client."""

from accelsweep.kernels.giou.reference import giou, make_inputs
from accelsweep.kernels.registry import KernelImpl, OpSpec
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms import TORCH_XLA_PLATFORMS

NEURON_PARTITIONS = 128  # SBUF partitions of a NeuronCore (nki.language.tile_size.pmax)


def _block_pairs_is_a_power_of_two(shape, options, tuning, dtype, platform):
    block = tuning["block_pairs"]
    if block & (block - 1):  # tl.arange spans a power of two
        raise ConfigError("block_pairs", "a power of two (Triton's tl.arange)", block)


def _pairs_fill_the_partitions(shape, options, tuning, dtype, platform):
    pairs = shape["batch"] * shape["boxes"]
    if pairs % NEURON_PARTITIONS:
        raise ConfigError("boxes", f"a value making batch * boxes a multiple of {NEURON_PARTITIONS} "
                                   f"(the NKI kernel spreads pairs over every SBUF partition; "
                                   f"batch is {shape['batch']})", shape["boxes"])


NEURON_INSTALL = "torch-neuronx 2.9 on a trn1/inf2 Neuron DLAMI (PyTorch 2.9, Neuron SDK 2.31; see the README)"

SPEC = OpSpec(
    name="giou",
    make_inputs=make_inputs,
    reference=giou,
    shape={"batch": 1, "boxes": 256},
    items=lambda batch, boxes: batch * boxes,
    # Two (batch, boxes, 4) inputs read, one (batch, boxes) output written. No FLOP count:
    # divisions, max and min are not multiply-adds, so it has GB/s but no roofline point.
    bytes_moved=lambda batch, boxes, itemsize: 9 * batch * boxes * itemsize,
    implementations=(
        # The seed's PyTorch baseline; on neuron it is what NKI and GpSimd are compared against.
        KernelImpl("torch-naive", "accelsweep.kernels.giou.torch_impl:giou_naive", "torch", ("cpu", "cuda") + TORCH_XLA_PLATFORMS, "torch"),
        KernelImpl("torch-compile", "accelsweep.kernels.giou.torch_impl:giou_compiled", "torch", ("cpu", "cuda"), "torch"),
        KernelImpl("jax-jit", "accelsweep.kernels.giou.jax_impl:giou_jit", "jax", ("cpu", "cuda", "tpu"), "jax (pip install jax)"),
        KernelImpl("pallas", "accelsweep.kernels.giou.pallas_impl:giou_pallas", "jax", ("cpu", "cuda", "tpu"),
                   "jax (pip install jax)", interpreted_on=("cpu",)),
        # Not "triton": tests/test_kernels.py uses that name as its example of an unknown impl.
        KernelImpl("triton-fused", "accelsweep.kernels.giou.triton_impl:giou_triton", "torch", ("cuda",),
                   "triton (bundled with CUDA builds of torch; else pip install triton)",
                   tuning={"block_pairs": 1024}, check=_block_pairs_is_a_power_of_two),
        KernelImpl("nki", "accelsweep.kernels.giou.nki_impl:giou_nki", "torch", ("neuron",),
                   f"the nki package from the Neuron pip repository (PyPI's 'nki' is an empty placeholder) "
                   f"and {NEURON_INSTALL}",
                   dtypes=("float32",), check=_pairs_fill_the_partitions),
        KernelImpl("gpsimd-cpp", "accelsweep.kernels.giou.gpsimd_impl:giou_gpsimd", "torch", ("neuron",),
                   f"{NEURON_INSTALL}, plus the apt/yum packages aws-neuronx-gpsimd-tools and "
                   "aws-neuronx-gpsimd-customop-lib", dtypes=("float32",)),
    ),
)
