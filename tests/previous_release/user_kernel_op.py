"""A kernel op of one's own, swept like the built-in ones: row softmax, torch vs numpy.

    python examples/user_kernel_op.py --smoke --platform cpu   # 2 trials, seconds each
    python examples/user_kernel_op.py                          # 2 implementations x 2 shapes

The op (spec, float64 reference, implementations) lives in this file; trials name it
by import path ("user_kernel_op:SPEC"), so Ray's workers import it from here. An op in
one's own package: "package.module:SPEC", or a name under entry point group accelsweep.ops.
"""

import numpy as np

from accelsweep.kernels.registry import KernelImpl, OpSpec, importable_module
from accelsweep.sweeps.driver.api import plan_sweep, run_sweep
from accelsweep.sweeps.driver.cli import common_parser, main_guard, sweep_options
from accelsweep.sweeps.driver.kernel_sweep import build_kernel_sweep

HERE = importable_module(__name__)  # "user_kernel_op", also when run as a script


def make_inputs(seed, rows, cols):
    return (np.random.default_rng(seed).normal(scale=4.0, size=(rows, cols)),)


def softmax_reference(x):  # float64 numpy: the ground truth every implementation is checked against
    exp = np.exp(x - x.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def softmax_torch(x):  # torch's fused kernel; x is a torch tensor on the trial's device
    return x.softmax(dim=-1)


def softmax_numpy(x):  # the reference's formula, in the trial's dtype (float32)
    return softmax_reference(x)


SPEC = OpSpec(name="row_softmax", make_inputs=make_inputs, reference=softmax_reference,
              shape={"rows": 512, "cols": 1024}, items=lambda rows, cols: rows,
              implementations=(KernelImpl("torch", f"{HERE}:softmax_torch", "torch", ("cpu", "cuda"), "torch"),
                               KernelImpl("numpy", f"{HERE}:softmax_numpy", "numpy", ("cpu",), "numpy")),
              tolerance={"float32": 1e-6})


def main():
    args = common_parser(__doc__.split("\n\n")[0], default_samples=0).parse_args()
    shapes = {"rows": [64], "cols": [256]} if args.smoke else {"rows": [512, 4096], "cols": [1024]}
    # default_samples None: every point of the grid once; a grid has no early stopping.
    sweep = build_kernel_sweep(f"{HERE}:SPEC", shapes, platform=args.platform, smoke=args.smoke, dry_run=args.dry_run,
                               **sweep_options(args, default_samples=None, scheduler="none"))
    if args.dry_run:
        return print(plan_sweep(sweep).describe())
    result = run_sweep(sweep)
    print("row_softmax latency p50:", ", ".join(f"{r.config['impl']} {r.metric('latency_p50_s') * 1e3:.4f} ms"
                                                for r in result.records))


if __name__ == "__main__":
    main_guard(main)
