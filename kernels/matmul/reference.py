"""A @ B, the plain numpy reference in float64, and its inputs.

The inputs are small integers, exact in every dtype and in every partial sum
(``make_inputs`` says when and why). Hence every dtype's tolerance is 0, which also makes
the comparison sharp: a kernel that accumulates in int8 or bfloat16, or rounds its output
to bfloat16, is caught. (Integer-valued inputs do not test float32 precision modes: on a
TPU, float32 dots at default precision pass through bfloat16, which integers this small
survive.)
"""

import numpy as np

INT8_MIN, INT8_MAX = -128, 127


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def make_inputs(seed: int, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A (m, k) and B (k, n): integers in [-128, 127], as float32 arrays.

    The harness casts floating inputs to the trial's dtype (trainables/harness/microbench.py:
    _rounded), and every such integer is exact in int8, bfloat16 (8 significant bits hold
    integers up to 256) and float32. So all dtypes see the same matrices, and the reference
    needs no rounding allowance:

    - int8 with int32 accumulation is exact while k * 128 * 128 < 2**31 (k <= 131071;
      kernels/matmul/checks.py refuses more).
    - bfloat16 and float32 with float32 accumulation: each product (at most 2**14) is
      exact, and so is every partial sum below 2**24, which holds for any summation order
      when k * 2**14 <= 2**24, i.e. k <= 1024. For larger k a partial sum could in
      principle pass 2**24 and round; with these inputs a sum of k products has a standard
      deviation of about 5461 * sqrt(k) (494,000 at the seed's k = 8192, 34 standard
      deviations below 2**24), so in practice it stays exact. If it ever did not, the
      harness would raise KernelMismatch: a loud failed trial, never a silent pass."""
    rng = np.random.default_rng(seed)
    a = rng.integers(INT8_MIN, INT8_MAX, size=(m, k), endpoint=True).astype(np.float32)
    b = rng.integers(INT8_MIN, INT8_MAX, size=(k, n), endpoint=True).astype(np.float32)
    return a, b
