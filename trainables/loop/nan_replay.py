"""Replay a NaN capture: the step a trial saved at its first non-finite gradient, run
again here, eager, on the device asked for.

    python -m accelsweep.trainables.loop.nan_replay path/to/nan_capture.pt   # exit 0: non-finite again, same step
    python -m accelsweep.trainables.loop.nan_replay --device cuda path/to/nan_capture.pt

The capture is written by ``accelsweep.trainables.loop.nan_capture`` (config knob
``nan_capture``); its format is checked before anything runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

import torch

from accelsweep.trainables.batches import map_tensors
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.loop.nan_capture import CAPTURE_FILE, load_capture, non_finite_gradients, set_rng_state
from accelsweep.trainables.precision import get_precision
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.workloads.base import load_workload

SHOWN_PARAMETERS = 10  # parameters listed by the replay; the rest are counted


def replay(capture: dict[str, Any], device: str = "cpu") -> tuple[float, list[dict[str, Any]]]:
    """Run the captured step's forward and backward again (eager, with the workload's model,
    loss and the loop's autocast for ``device``) and return its loss and non-finite gradients."""
    config = TrialConfig.from_dict(capture["config"])
    workload = load_workload(config.workload)
    target = torch.device(device)
    model = workload.build_model(config).to(get_precision(config.precision).parameter_dtype)
    memory_format = get_platform(config.platform).memory_format(config)  # the trial's layout
    model = model.to(device=target, memory_format=memory_format)
    model.load_state_dict(capture["model_state"])
    model.train()
    # The replay computes gradients only; the optimizer state is loaded so that a debugger
    # stepping on from here continues the trial's optimizer, not a fresh one.
    optimizer = workload.optimizer(model.parameters(), config)
    optimizer.load_state_dict(capture["optimizer_state"])
    set_rng_state(capture["rng_state"], target)
    inputs, targets = (map_tensors(lambda tensor: tensor.to(target), capture[key]) for key in ("inputs", "targets"))
    optimizer.zero_grad(set_to_none=True)
    with get_platform(target.type).autocast(config):
        loss = workload.loss(model(inputs), targets)
    loss.backward()
    return float(loss.detach().float()), non_finite_gradients(model.named_parameters())


def _describe(found: dict[str, Any]) -> str:
    index = ", ".join(str(i) for i in found["index"])
    return (f"{found['parameter']} = {found['value']} at index ({index}) "
            f"({found['non_finite']} of {found['elements']} elements non-finite)")


def show_replay(path: str, device: str = "cpu", out=sys.stdout) -> bool:
    """Print the capture and its replay; True when the replay is non-finite again."""
    capture = load_capture(path)
    config, step, captured = capture["config"], capture["step"], capture["non_finite_gradients"]
    print(f"capture: {os.path.abspath(path)}", file=out)
    trial_config = TrialConfig.from_dict(config)  # a capture from before workloads: the default one
    workload = load_workload(trial_config.workload).describe(trial_config)
    print(f"trial: {workload} on {config['platform']} ({capture['device']}, torch {capture['torch_version']}), "
          f"precision {config['precision']}, torch_compile {config['torch_compile']}, seed {config['seed']}", file=out)
    print(f"captured at step {step} (0 = the trial's first step): loss {capture['loss']}, "
          f"{len(captured)} parameters with non-finite gradients; first {_describe(captured[0])}", file=out)
    inputs = capture["inputs"]
    bad_inputs = (~torch.isfinite(inputs.float())).nonzero()
    where = f", first at index ({', '.join(str(int(i)) for i in bad_inputs[0])})" if len(bad_inputs) else ""
    print(f"batch: inputs {tuple(inputs.shape)} {inputs.dtype}, non-finite elements: {len(bad_inputs)}{where}",
          file=out)
    loss, found = replay(capture, device)
    print(f"replayed step {step} on {device} (eager): loss {loss}", file=out)
    if not found:
        print(f"not reproduced: every gradient of step {step} is finite on {device}", file=out)
        return False
    for item in found[:SHOWN_PARAMETERS]:
        print(f"  step {step}: {_describe(item)}", file=out)
    if len(found) > SHOWN_PARAMETERS:
        print(f"  ... and {len(found) - SHOWN_PARAMETERS} more parameters", file=out)
    same = [item["parameter"] for item in found] == [item["parameter"] for item in captured]
    print(f"reproduced: {len(found)} non-finite gradients at step {step} "
          f"({'the same parameters as' if same else 'not the same parameters as'} captured)", file=out)
    return True


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelsweep.trainables.loop.nan_replay",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", help=f"a {CAPTURE_FILE} to replay")
    parser.add_argument("--device", default="cpu", help="where to replay the step (default: cpu)")
    args = parser.parse_args(argv)
    return 0 if show_replay(args.capture, args.device) else 1


if __name__ == "__main__":
    sys.exit(main())
