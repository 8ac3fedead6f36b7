"""Matrix multiplication C = A @ B, (m, k) x (k, n): seed 003's int8 Pallas matmul and
its block sizes (bm, bk, bn), against the library matmul.

dtypes: ``int8`` (int32 accumulation and output), ``bfloat16`` and ``float32`` (float32
accumulation and output). Every tolerance is 0: the inputs are small integers, exact in
every dtype and in every partial sum (kernels/matmul/reference.py says when and why).
items are output elements (m * n); flops are 2 * m * k * n (for int8, integer ops: the
``tflops`` metric is then TOP/s). Bytes moved: A and B read once in the trial's dtype, C
written once in its 4-byte accumulator dtype (int32 or float32), whatever the inputs'.

tests/test_matmul_kernels.py checks jax-dot, torch-matmul and the Pallas kernel (in
interpret mode) against the reference on a CPU. The Pallas kernel is native on TPU only
(``--platform tpu``: one chip per trial); its block rules (kernels/matmul/checks.py) come
from JAX's Pallas TPU docs and source, not from a run on a TPU.
"""

from accelsweep.kernels.matmul.checks import int32_cannot_overflow, pallas_blocks, torch_int_mm_shape
from accelsweep.kernels.matmul.reference import make_inputs, matmul
from accelsweep.kernels.registry import KernelImpl, OpSpec

JAX = "jax (pip install jax)"
OUTPUT_ITEMSIZE = 4  # int32 for int8 inputs, float32 for bfloat16 and float32 ones

SPEC = OpSpec(
    name="matmul",
    make_inputs=make_inputs,
    reference=matmul,
    shape={"m": 1024, "k": 1024, "n": 1024},
    items=lambda m, k, n: m * n,
    flops=lambda m, k, n: 2 * m * k * n,
    bytes_moved=lambda m, k, n, itemsize: (m * k + k * n) * itemsize + m * n * OUTPUT_ITEMSIZE,
    implementations=(
        KernelImpl("jax-dot", "accelsweep.kernels.matmul.jax_impl:matmul_jax", "jax", ("cpu", "cuda", "tpu"), JAX,
                   check=int32_cannot_overflow),
        KernelImpl("torch-matmul", "accelsweep.kernels.matmul.torch_impl:matmul_torch", "torch", ("cpu", "cuda"), "torch",
                   dtypes=("int8", "float32"), check=torch_int_mm_shape),
        # Block defaults: the seed's and JAX's guide's (128, 128, 128).
        KernelImpl("pallas", "accelsweep.kernels.matmul.pallas_impl:matmul_pallas", "jax", ("cpu", "tpu"), JAX,
                   interpreted_on=("cpu",), tuning={"bm": 128, "bk": 128, "bn": 128}, check=pallas_blocks),
    ),
    tolerance={"int8": 0.0, "bfloat16": 0.0, "float32": 0.0},
)
