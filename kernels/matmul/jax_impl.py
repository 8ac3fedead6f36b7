"""The library matmul in JAX: jnp.dot under jit, accumulating in int32 (int8 inputs) or
float32 (bfloat16, float32). Seed 003 compares its Pallas kernels with this call
(``jnp.matmul(..., preferred_element_type=jnp.int32)``, "XLA int8 matmul")."""

import jax
import jax.numpy as jnp


def accumulator_dtype(dtype) -> jnp.dtype:
    return jnp.int32 if jnp.issubdtype(dtype, jnp.integer) else jnp.float32


@jax.jit
def matmul_jax(a, b):
    return jnp.dot(a, b, preferred_element_type=accumulator_dtype(a.dtype))
