"""NaN capture: catch the first non-finite gradient of a trial with what it takes to
replay that one step, then replay it here.

    python -m accelsweep.trainables.nan_capture path/to/nan_capture.pt    # replay: exit 0 if the step is non-finite again
    python -m accelsweep.trainables.nan_capture --measure-overhead         # throughput with the capture off and on (CPU)

Seed 003's scheme ("Debugging the dreaded NaN", a Lightning callback there), in the
training loop (config knob ``nan_capture``): before each step keep a reference to the
step's batch and the RNG state; after backward, before the optimizer step, check the
gradients. On a non-finite one, save the model and optimizer state (still those the
step started from), the batch, the RNG state, the step index, the trial config and which
gradients were non-finite to ``nan_capture.pt`` in the trial's directory, report the
path (result keys ``nan_capture_path``, ``nan_step``, ``nan_parameter``,
``nan_gradient_value``) and end the trial with ``NonFiniteGradient`` (cause ``nan``).

Where the check is read depends on the device. On a synchronous device (the CPU) the
check is read every step: it costs one pass over the gradients and no waiting. On an
asynchronous one (CUDA, XLA, Neuron) reading it every step would be a host sync per step
(on XLA also a graph cut, which breaks ``batches_per_execution``), the cost the seeds
measured at ~10% for per-step metric reads. There the check only updates a flag on the
device, read at the sync that ends each run of steps (first step, warm-up, each window).
To still capture the step that first went non-finite, each run of steps starts from a
copy of the model and optimizer state kept on the device (one copy per window, outside
its timer; it holds one more model + optimizer state of device memory) and keeps a
reference to every batch of the window (device memory for one batch per step of the
window). When the flag is set, the window is replayed from that copy one step at a
time, checking each step, and the capture is taken at the first non-finite one. A device
that is not deterministic may not go non-finite again in the replay: the trial then
still ends as ``nan``, with no capture and a message that says so. Only the CPU path has
run here (and the XLA one on torch-xla's CPU client); CUDA and Neuron have not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import warnings
from typing import Any, Callable, Iterable, Optional

import torch

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.train_loop import NonFiniteGradient

CAPTURE_FILE = "nan_capture.pt"
CAPTURE_FORMAT = "accelsweep-nan-capture-1"
SHOWN_PARAMETERS = 10  # parameters listed by the replay; the rest are counted


# ---- RNG state ---------------------------------------------------------------------
# The platforms have no RNG hooks, so the device type decides: torch-neuronx 2.9 is an
# XLA device too. Each state is held on the host, so reading it waits for no device.

def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)  # seed and Philox offset
    elif device.type == "xla":
        import torch_xla.core.xla_model as xm

        state["xla"] = xm.get_rng_state(device)  # an int: the device's running seed
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    elif device.type == "xla" and "xla" in state:
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(state["xla"], device)


# ---- checks ------------------------------------------------------------------------

def gradients_look_finite(gradients: list[torch.Tensor]) -> torch.Tensor:
    """A device-side bool: False when a gradient has a NaN or infinite element. One fused
    norm per tensor list: NaN and inf propagate through the sums of squares on every
    backend (not through max: XLA's max drops NaN), and it is ~10x cheaper on the CPU
    than isfinite per tensor. It also says False when finite gradients are so large
    (~1e19) that their squares overflow, so a False is confirmed with
    ``non_finite_gradients`` before anything is captured."""
    return torch.stack(torch._foreach_norm(gradients)).isfinite().all()


def non_finite_gradients(named_parameters: Iterable[tuple[str, torch.Tensor]]) -> list[dict[str, Any]]:
    """Each parameter whose gradient has a NaN or infinite element: its name, the first
    such element's index and value, and how many of its elements are non-finite."""
    found = []
    for name, parameter in named_parameters:
        if parameter.grad is None:
            continue
        gradient = parameter.grad.detach().cpu()
        non_finite = ~torch.isfinite(gradient)
        count = int(non_finite.sum())
        if count:
            index = tuple(int(i) for i in non_finite.nonzero()[0])
            found.append({"parameter": name, "index": index, "value": float(gradient[index]),
                          "non_finite": count, "elements": gradient.numel()})
    return found


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clone(item) for item in value]
    return value


def default_capture_dir() -> str:
    """The Tune trial's directory inside a Tune trial, else the working directory."""
    if "ray" in sys.modules:  # only a Tune trial has a trial directory: no need to import Ray to ask
        from ray import tune

        with warnings.catch_warnings():  # outside a trial Ray warns, and returns None
            warnings.simplefilter("ignore")
            trial_dir = tune.get_context().get_trial_dir()
        if trial_dir:
            return trial_dir
    return os.getcwd()


# ---- the loop's side ---------------------------------------------------------------

class NanCapture:
    """The training loop's NaN capture (see the module docstring). The loop calls
    ``before_step`` and ``after_backward`` in every step, and runs each group of steps
    that ends in a sync inside ``segment()``."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 platform, config: TrialConfig, train_step: Callable[[Any, Any], None],
                 report: Callable[[dict], None], capture_dir: Optional[str] = None):
        self.model, self.optimizer, self.device = model, optimizer, device
        self.platform, self.config = platform, config
        self.train_step = train_step  # replays one step from a kept batch (async devices)
        self.report = report
        self.capture_dir = capture_dir
        self.parameters = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        # Synchronous devices: read the check every step (free there). Else: at syncs.
        self.check_every_step = platform.host_clock_times_steps
        self.step_index = -1  # the step under way; 0 is the trial's first
        self.inputs = self.targets = self.rng_before_step = None  # the step under way's
        # Asynchronous devices: the flag, and the current segment's start and batches.
        self.saw_non_finite: Optional[torch.Tensor] = None
        self.segment_batches: list[tuple[Any, Any]] = []
        self.segment_start: Optional[dict[str, Any]] = None
        self.replaying = False

    def before_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.step_index += 1
        if self.check_every_step:
            # References, not copies: the step never writes to its batch.
            self.inputs, self.targets = inputs, targets
            self.rng_before_step = rng_state(self.device)
        else:
            self.segment_batches.append((inputs, targets))

    def after_backward(self, loss: torch.Tensor) -> None:
        gradients = [p.grad for _, p in self.parameters if p.grad is not None]
        looks_finite = gradients_look_finite(gradients)
        if self.check_every_step:
            if self.replaying:
                # Materialise the whole step first: else each read below (the flag, then
                # every gradient) runs the step's graph again on its own.
                self.platform.sync(self.device)
            if not bool(looks_finite):
                self._capture_if_non_finite(loss)
            return
        if self.saw_non_finite is None:
            self.saw_non_finite = torch.zeros((), dtype=torch.bool, device=self.device)
        self.saw_non_finite.logical_or_(~looks_finite)  # stays on the device: no sync

    @contextlib.contextmanager
    def segment(self):
        """Steps that end in a sync. On an asynchronous device: keep the state they start
        from, and after them read the flag (the sync has already waited for it)."""
        if self.check_every_step:
            yield
            return
        self.segment_start = {"step_index": self.step_index, "rng": rng_state(self.device),
                              "model": _clone(self.model.state_dict()),
                              "optimizer": _clone(self.optimizer.state_dict())}
        self.segment_batches = []
        self.platform.sync(self.device)  # the copy is made here, not in the timed steps after
        yield
        if self.saw_non_finite is not None and bool(self.saw_non_finite):
            self._replay_segment()
        self.segment_start, self.segment_batches = None, []

    def _replay_segment(self) -> None:
        """Run the segment's steps again from its start, checking every step, so the
        capture is of the first step that went non-finite, before its optimizer step."""
        start, batches = self.segment_start, self.segment_batches
        first, last = start["step_index"] + 1, self.step_index
        self.model.load_state_dict(start["model"])
        self.optimizer.load_state_dict(start["optimizer"])
        set_rng_state(start["rng"], self.device)
        self.step_index, self.check_every_step, self.replaying = start["step_index"], True, True
        for inputs, targets in batches:
            self.train_step(inputs, targets)  # raises NonFiniteGradient at the first non-finite step
        raise NonFiniteGradient(
            f"a gradient was non-finite in steps {first}-{last}, but none was when they were replayed one at "
            f"a time from their start on {self.platform.describe_device(self.device)} (a device that is not "
            "deterministic, or finite gradients whose squares overflow the norm): no capture saved")

    def _capture_if_non_finite(self, loss: torch.Tensor) -> None:
        found = non_finite_gradients(self.parameters)
        if not found:
            return  # the norm overflowed, but every element is finite: not a NaN
        directory = self.capture_dir or default_capture_dir()
        os.makedirs(directory, exist_ok=True)
        path = os.path.abspath(os.path.join(directory, CAPTURE_FILE))
        capture = {
            "format": CAPTURE_FORMAT,
            "step": self.step_index,
            "config": self.config.to_dict(),
            "device": self.platform.describe_device(self.device),
            "torch_version": str(torch.__version__),
            "loss": float(loss.detach().float()),
            "non_finite_gradients": found,
            "model_state": _to_cpu(self.model.state_dict()),
            "optimizer_state": _to_cpu(self.optimizer.state_dict()),
            "inputs": _to_cpu(self.inputs),
            "targets": _to_cpu(self.targets),
            "rng_state": _to_cpu(self.rng_before_step),
        }
        partial = path + ".partial"
        torch.save(capture, partial)
        os.replace(partial, path)  # the driver never sees a half-written capture
        first = found[0]
        self.report({"nan_capture_path": path, "nan_step": self.step_index, "nan_parameter": first["parameter"],
                     "nan_gradient_value": str(first["value"])})
        raise NonFiniteGradient(
            f"non-finite gradient at step {self.step_index}: {first['parameter']} = {first['value']} "
            f"({len(found)} of {len(self.parameters)} parameters non-finite); captured in {path}; "
            f"replay: python -m accelsweep.trainables.nan_capture {path}", capture_path=path, step=self.step_index)


# ---- the replay --------------------------------------------------------------------

def load_capture(path: str) -> dict[str, Any]:
    capture = torch.load(path, map_location="cpu", weights_only=True)
    if capture.get("format") != CAPTURE_FORMAT:
        raise ValueError(f"{path} is not a NaN capture of this version ({CAPTURE_FORMAT}); "
                         f"its format is {capture.get('format')!r}")
    return capture


def replay(capture: dict[str, Any], device: str = "cpu") -> tuple[float, list[dict[str, Any]]]:
    """Run the captured step's forward and backward again (eager, with the loop's model,
    loss and autocast for ``device``) and return its loss and non-finite gradients."""
    from accelsweep.trainables.models import build_model
    from accelsweep.trainables.platforms import get_platform

    config = TrialConfig.from_dict(capture["config"])
    target = torch.device(device)
    model = build_model(config.model, config.patch_embed)
    if config.precision == "bf16":
        model = model.to(torch.bfloat16)
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    model = model.to(device=target, memory_format=memory_format)
    model.load_state_dict(capture["model_state"])
    model.train()
    # The replay computes gradients only; the optimizer state is loaded so that a debugger
    # stepping on from here continues the trial's optimizer, not a fresh one.
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    optimizer.load_state_dict(capture["optimizer_state"])
    set_rng_state(capture["rng_state"], target)
    inputs, targets = capture["inputs"].to(target), capture["targets"].to(target)
    optimizer.zero_grad(set_to_none=True)
    with get_platform(target.type).autocast(config):
        loss = torch.nn.CrossEntropyLoss()(model(inputs), targets)
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
    print(f"trial: {config['model']} on {config['platform']} ({capture['device']}, torch {capture['torch_version']}), "
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


# ---- the overhead measurement ------------------------------------------------------

def overhead_config(model: str = "vit-tiny", windows: int = 3, window_min_s: float = 2.0) -> TrialConfig:
    """The CPU sweep's baseline (sweeps/neuron_vit.py): batch 16, fp32, every core."""
    cpus = os.cpu_count() or 1
    return TrialConfig(platform="cpu", model=model, batch_size=16, cpus_per_worker=cpus, threads=cpus,
                       warmup_steps=3, window_min_steps=5, window_min_s=window_min_s, windows=windows)


def measure_overhead(config: TrialConfig, rounds: int, out=sys.stdout) -> dict[str, Any]:
    """Throughput with the capture off and on, the same config, alternating the order
    each round so that drift in the machine's speed falls on both alike."""
    from accelsweep.trainables.train_loop import run_training

    throughputs: dict[bool, list[float]] = {False: [], True: []}
    print(f"NaN capture overhead: {config.model}, batch {config.batch_size}, {config.precision}, "
          f"{config.platform} ({config.effective_threads} threads), {config.windows} windows of >= "
          f"{config.window_min_steps} steps and >= {config.window_min_s} s per run, {rounds} rounds", file=out)
    with tempfile.TemporaryDirectory() as capture_dir:
        for round_number in range(rounds):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for capture_on in order:
                result = run_training(config.replace(nan_capture=capture_on), capture_dir=capture_dir)
                throughputs[capture_on].append(result["throughput_samples_per_s"])
            off, on = throughputs[False][-1], throughputs[True][-1]
            print(f"round {round_number + 1}: off {off:.2f}, on {on:.2f} samples/s (on/off {on / off:.3f})", file=out)
    # Paired ratios: each pair ran back to back, so a slow spell of the machine (other
    # work on it) falls on both runs of a pair; the median ignores a pair it split.
    ratios = [on / off for off, on in zip(throughputs[False], throughputs[True])]
    summary = {"model": config.model, "rounds": rounds,
               "off_samples_per_s": statistics.median(throughputs[False]),
               "on_samples_per_s": statistics.median(throughputs[True]),
               "relative_cost": 1 - statistics.median(ratios),
               "on_off_ratio_min": min(ratios), "on_off_ratio_max": max(ratios)}
    print(f"capture off: {summary['off_samples_per_s']:.2f} samples/s (median of {rounds} runs)", file=out)
    print(f"capture on:  {summary['on_samples_per_s']:.2f} samples/s (median of {rounds} runs)", file=out)
    print(f"relative cost: {summary['relative_cost']:.1%} (1 - the median of the per-round on/off ratios, which "
          f"range from {min(ratios):.3f} to {max(ratios):.3f}; the seed measured 1.5% on an L40S GPU)", file=out)
    print(json.dumps(summary), file=out)
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelsweep.trainables.nan_capture", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", nargs="?", help=f"a {CAPTURE_FILE} to replay")
    parser.add_argument("--device", default="cpu", help="where to replay the step (default: cpu)")
    parser.add_argument("--measure-overhead", action="store_true",
                        help="time training with the capture off and on, alternating, and print both")
    parser.add_argument("--model", default="vit-tiny", help="--measure-overhead: the model (default: vit-tiny)")
    parser.add_argument("--rounds", type=int, default=4, help="--measure-overhead: off/on pairs (default: 4)")
    parser.add_argument("--windows", type=int, default=3, help="--measure-overhead: windows per run (default: 3)")
    parser.add_argument("--window-min-s", type=float, default=2.0,
                        help="--measure-overhead: seconds per window at least (default: 2.0)")
    args = parser.parse_args(argv)
    if args.measure_overhead == (args.capture is not None):
        parser.error("give either a capture file to replay or --measure-overhead")
    if args.measure_overhead:
        measure_overhead(overhead_config(args.model, args.windows, args.window_min_s), args.rounds)
        return 0
    return 0 if show_replay(args.capture, args.device) else 1


if __name__ == "__main__":
    sys.exit(main())
