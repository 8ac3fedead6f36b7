"""Seed 003's NMS post as a sweep: numpy vs JAX while_loop vs a sequential Pallas kernel vs
torchvision, by box count (kernels/nms registers them; Pallas runs interpreted on a CPU).

    python sweeps/nms_kernels.py
    python sweeps/nms_kernels.py --smoke

The seed measured 2.99 ms (numpy) and 1.231 ms (JAX) on a CPU, 0.416 ms and 0.139 ms
(Pallas) on a TPU.
"""

from accelsweep.sweeps.driver.run.kernel_sweep import run

if __name__ == "__main__":
    run("nms", __doc__.split("\n\n")[0], shapes={"boxes": [256, 1024]}, smoke_shapes={"boxes": [128]})
