"""GIoU as a Neuron custom C++ operator on the GpSimd engine (seed 004's fastest on inf2).

The sources are in kernels/giou/gpsimd/: ``giou.cpp``, the compute function that runs
on all eight GpSimd cores of a NeuronCore-v2, each staging its share of the box pairs
through TCM; and ``shape.cpp``, the shape function torch-neuronx calls while tracing,
which also registers the operator as ``torch.ops.accelsweep.giou``. The first call
builds and loads it (``_giou_operator``).

Needs a trn1/inf2 instance with torch-neuronx (the PyTorch 2.9 Neuron DLAMI, see the
README) and the GpSimd custom-op packages from the Neuron apt/yum repository,
aws-neuronx-gpsimd-tools and aws-neuronx-gpsimd-customop-lib (in maintenance from
Neuron 2.33 on). A model can load only one custom-op library. Not yet built or run: the
toolchain, its headers and torch-neuronx exist only in the Neuron repositories; elsewhere
this module's import fails and the registry reports KernelUnavailable.
"""

import functools
import os
from pathlib import Path

import torch
import torch_neuronx  # noqa: F401  (the Neuron XLA device; its absence is what makes this unavailable)
from torch_neuronx.xla_impl import custom_op

SOURCES = Path(__file__).with_name("gpsimd")
COMPUTE_SOURCES = [SOURCES / "giou.cpp"]
SHAPE_SOURCES = [SOURCES / "shape.cpp"]
LIBRARY = "accelsweep_giou"  # the file: lib<LIBRARY>.so; the ops' namespace is NEURON_LIBRARY's, "accelsweep"


def build_directory() -> Path:
    return Path(os.environ.get("ACCELSWEEP_GPSIMD_BUILD_DIR", Path.home() / ".cache" / "accelsweep" / "gpsimd"))


@functools.cache
def _giou_operator():
    """The operator: the first call builds ``libaccelsweep_giou.so`` with torch-neuronx's
    custom-op loader into ``$ACCELSWEEP_GPSIMD_BUILD_DIR`` (default
    ``~/.cache/accelsweep/gpsimd``) and loads it; later processes load the built library
    unless a source is newer."""
    build = build_directory()
    build.mkdir(parents=True, exist_ok=True)
    library = build / f"lib{LIBRARY}.so"
    sources = COMPUTE_SOURCES + SHAPE_SOURCES
    if library.exists() and library.stat().st_mtime >= max(source.stat().st_mtime for source in sources):
        custom_op.load_library(str(library))
    else:
        # Compiles for the GpSimd engine and loads the result into this process. multicore:
        # giou.cpp splits the pairs over get_cpu_count() cores and writes get_dst_tensor().
        custom_op.load(name=LIBRARY, compute_srcs=[str(s) for s in COMPUTE_SOURCES],
                       shape_srcs=[str(s) for s in SHAPE_SOURCES], build_directory=str(build), multicore=True)
    return torch.ops.accelsweep.giou


def giou_gpsimd(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """(batch, boxes, 4) float32 x 2, on the Neuron XLA device -> (batch, boxes)."""
    if boxes1.dim() != 3 or boxes1.shape != boxes2.shape or boxes1.shape[-1] != 4:
        raise ValueError(f"expected two (batch, boxes, 4) tensors of one shape; got {tuple(boxes1.shape)} "
                         f"and {tuple(boxes2.shape)}")
    # The C++ indexes the flattened tensors, so they must be dense.
    return _giou_operator()(boxes1.contiguous(), boxes2.contiguous())
