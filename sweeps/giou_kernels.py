"""Seeds 004 and 003 as a sweep: GIoU implementations x batch x boxes per image.

    python sweeps/giou_kernels.py                 # every implementation present, full grid
    python sweeps/giou_kernels.py --smoke         # small shapes, seconds
    python sweeps/giou_kernels.py --dry-run

Seed 004 (inf2.xlarge, 1024 x 256 boxes): PyTorch 0.293 ms, NKI 0.211 ms, C++ GpSimd
0.061 ms. This sweep runs what kernels/giou registers for the platform: on a CPU, PyTorch
eager and compiled, JAX jit, and Pallas in interpret mode (checked, never ranked); with
--platform cuda also the fused Triton kernel; with --platform neuron (one NeuronCore per
trial) the seed's three: PyTorch through torch-xla, NKI and the GpSimd C++ operator, never
compiled or run here. --platform xla runs the PyTorch baseline on torch-xla's CPU client (a
test of that path, not a speed figure).
"""

from accelsweep.sweeps.driver.run.kernel_sweep import run

if __name__ == "__main__":
    run("giou", __doc__.split("\n\n")[0], shapes={"batch": [64, 1024], "boxes": [256]},
        smoke_shapes={"batch": [8], "boxes": [64]})
