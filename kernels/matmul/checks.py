"""What each matmul implementation can run, checked in the driver before any trial.

These run in the sweep's driver, which may have no JAX or torch: nothing here imports
them. Each check raises ConfigError naming the knob, what is allowed and the value given.
"""

from __future__ import annotations

from accelsweep.trainables.errors import ConfigError

INT32_MAX = 2**31 - 1
INT8_LARGEST_PRODUCT = 128 * 128  # (-128) * (-128)

# TPU vector memory is tiled in (sublanes, lanes) = (8, 128) 32-bit words; narrower
# types pack more rows per tile. A block's last two dims must be multiples of the tile
# or span the whole array dim (docs/pallas/tpu/details.rst, "BlockSpecs and grid
# iteration"). Rows per tile by dtype follow jax 0.10's TpuInfo.get_sublane_tiling
# (jax/_src/pallas/mosaic/tpu_info.py): int8 packs 32 rows on every generation;
# 16-bit types pack 8 rows before TPU7x and 16 from it, so 16 here holds on all.
TPU_LANES = 128
TPU_SUBLANES = {"float32": 8, "bfloat16": 16, "int8": 32}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "int8": 1}
ACCUMULATOR_ITEMSIZE = 4  # int32 for int8, float32 otherwise: the output is the accumulator

# The VMEM a Pallas TPU kernel may use by default. It is XLA's scoped VMEM limit
# (--xla_tpu_scoped_vmem_limit_kib; per kernel, pltpu.CompilerParams(vmem_limit_bytes=...)),
# not the chip's VMEM. JAX's docs give no per-generation default; 16 MiB is TPU v4's
# whole VMEM (tpu_info.py) and the default that public reports of VMEM-OOM compile
# errors give for v5e and v5p (for v6e: 32 MiB). Blocks within 16 MiB fit all four.
TPU_VMEM_BUDGET_BYTES = 16 * 2**20


def int32_cannot_overflow(shape, options, tuning, dtype, platform) -> None:
    """int8 accumulates in int32: k products of at most 2**14 must stay below 2**31."""
    largest_k = INT32_MAX // INT8_LARGEST_PRODUCT
    if dtype == "int8" and shape["k"] > largest_k:
        raise ConfigError("k", f"at most {largest_k} for int8 (k * 128 * 128 must fit the int32 accumulator)",
                          shape["k"])


def torch_int_mm_shape(shape, options, tuning, dtype, platform) -> None:
    """torch._int_mm (int8 -> int32) on CUDA refuses m <= 16 and k or n not multiples of 8
    (aten/src/ATen/native/cuda/Blas.cpp, _int_mm_out_cuda); on a CPU it takes any shape."""
    int32_cannot_overflow(shape, options, tuning, dtype, platform)
    if dtype != "int8" or platform != "cuda":
        return
    if shape["m"] <= 16:
        raise ConfigError("m", "greater than 16 for int8 on cuda (torch._int_mm, cuBLAS)", shape["m"])
    for name in ("k", "n"):
        if shape[name] % 8:
            raise ConfigError(name, "a multiple of 8 for int8 on cuda (torch._int_mm, cuBLAS)", shape[name])


def vmem_bytes(bm: int, bk: int, bn: int, dtype: str) -> int:
    """VMEM the blocks take: Pallas double-buffers every block it pipelines, the A
    (bm, bk) and B (bk, bn) input blocks and the (bm, bn) output block that the kernel
    accumulates into. A lower bound: Mosaic's internal scratch and spills come on top."""
    inputs = 2 * (bm * bk + bk * bn) * ITEMSIZE[dtype]
    output = 2 * bm * bn * ACCUMULATOR_ITEMSIZE
    return inputs + output


def pallas_blocks(shape, options, tuning, dtype, platform) -> None:
    """The block shape must tile the problem, obey TPU tiling and fit the VMEM budget.

    The TPU rules apply in interpret mode on a CPU too: the kernel is written for the
    TPU, and the CPU run stands in for it, so it must not accept a block shape that a
    TPU would refuse. Passing is necessary, not sufficient: a shape that fits the
    estimate can still fail to compile, and then its trial fails with the compiler's
    message."""
    int32_cannot_overflow(shape, options, tuning, dtype, platform)
    blocks = {"bm": ("m", tuning["bm"]), "bk": ("k", tuning["bk"]), "bn": ("n", tuning["bn"])}
    for knob, (dim, block) in blocks.items():
        if shape[dim] % block:
            raise ConfigError(knob, f"a divisor of {dim} ({shape[dim]})", block)
    # bm is the row (sublane) dim of the A block; bk the lane dim of A and the row dim
    # of B (a multiple of 128 is also one of every sublane count); bn the lane dim of
    # B and of the output.
    tiles = {"bm": TPU_SUBLANES[dtype], "bk": TPU_LANES, "bn": TPU_LANES}
    for knob, tile in tiles.items():
        dim, block = blocks[knob]
        if block % tile and block != shape[dim]:
            raise ConfigError(knob, f"a multiple of {tile} or all of {dim} ({shape[dim]}): TPU tiles {dtype} "
                                    f"blocks in {TPU_SUBLANES[dtype]} x {TPU_LANES}", block)
    needed = vmem_bytes(tuning["bm"], tuning["bk"], tuning["bn"], dtype)
    if needed > TPU_VMEM_BUDGET_BYTES:
        raise ConfigError(
            "bm, bk, bn", f"blocks within the {TPU_VMEM_BUDGET_BYTES / 2**20:g} MiB TPU VMEM budget "
                          f"(2 x (bm*bk + bk*bn) x {ITEMSIZE[dtype]} B inputs + 2 x bm*bn x "
                          f"{ACCUMULATOR_ITEMSIZE} B output, double-buffered)",
            (tuning["bm"], tuning["bk"], tuning["bn"]),
            f"Those blocks need {needed / 2**20:g} MiB: make one smaller.")
