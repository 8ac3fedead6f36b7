"""A blocked matmul as a Pallas TPU kernel (seed 003's int8 matmul, after JAX's Pallas
matmul guide, docs/pallas/tpu/matmul.md).

The grid walks (m / bm, n / bn, k / bk) blocks, the reduction last; the output block
is itself the accumulator (``_matmul_kernel`` says why).

Native on TPU only. On a GPU, Pallas runs the grid's programs in parallel, so k steps
accumulating into one output block would race: a GPU version needs the k loop inside
the kernel, and is not written. On a CPU it runs in interpret mode, which checks the
result and says nothing about speed (the harness marks it). Which block shapes are
allowed is decided in kernels/matmul/checks.py, before anything runs.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from accelsweep.kernels.matmul.jax_impl import accumulator_dtype


def _matmul_kernel(a_ref, b_ref, out_ref):
    """The output is in the accumulator's dtype (int32 for int8, float32 otherwise), and its
    block's index does not depend on the k step, so it stays in VMEM across the k steps and
    is itself the accumulator: zeroed at the first k step, written back to HBM after the
    last (docs/pallas/tpu/details.rst: "The output reference can be then used as an
    accumulator for partial results"). No scratch buffer is needed, which leaves more VMEM
    for blocks."""
    @pl.when(pl.program_id(2) == 0)
    def _start():
        out_ref[...] = jnp.zeros_like(out_ref)

    out_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("bm", "bk", "bn", "interpret"))
def _matmul(a, b, *, bm: int, bk: int, bn: int, interpret: bool):
    m, k = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), accumulator_dtype(a.dtype)),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, step: (i, step)),
                  pl.BlockSpec((bk, bn), lambda i, j, step: (step, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, step: (i, j)),
        # Output blocks are independent, so a two-core chip (v4, v5p) may split the
        # first two grid axes; the k axis revisits one output block and stays in order.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(a, b)


def matmul_pallas(a, b, *, bm: int, bk: int, bn: int):
    return _matmul(a, b, bm=bm, bk=bk, bn=bn, interpret=jax.default_backend() == "cpu")
