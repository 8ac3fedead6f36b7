"""NaN capture: catch the first non-finite gradient of a trial with what it takes to
replay that one step, then replay it here.

    python -m accelsweep.trainables.loop.nan_replay path/to/nan_capture.pt   # replay: exit 0 if the step is non-finite again
    python -m accelsweep.trainables.loop.nan_overhead                        # throughput with the capture off and on (CPU)

This module is the in-loop hook (``NanCapture``, config knob ``nan_capture``) and the
capture format; the replay command is ``nan_replay``, the overhead benchmark
``nan_overhead``. Seed 003's scheme ("Debugging the dreaded NaN", a Lightning callback
there): after backward, before the optimizer step, check the gradients; on a non-finite
one, save the step's starting model and optimizer state, batch and RNG state to
``nan_capture.pt`` in the trial's directory, report its path (``nan_capture_path``,
``nan_step``, ``nan_parameter``, ``nan_gradient_value``) and end the trial with
``NonFiniteGradient`` (cause ``nan``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any, Callable, Iterable, Optional

import torch

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.loop.failures import NonFiniteGradient

CAPTURE_FILE = "nan_capture.pt"
CAPTURE_FORMAT = "accelsweep-nan-capture-1"


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
    backend (not through max: XLA's max drops NaN), and it is far cheaper on the CPU
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
    that ends in a sync inside ``segment()``.

    Where the check is read depends on the device. On a synchronous device (the CPU) it is
    read every step: one pass over the gradients and no waiting. On an asynchronous one
    (CUDA, XLA, Neuron) reading it every step would be a host sync per step (on XLA also a
    graph cut, which breaks ``batches_per_execution``), the cost that per-step metric reads
    carry. There the check only updates a flag on the device, read at the sync that ends
    each run of steps (first step, warm-up, each window). To still capture the step that
    first went non-finite, each run of steps starts from a copy of the model and optimizer
    state kept on the device (one copy per window, outside its timer: one more model +
    optimizer state of device memory) and keeps a reference to every batch of the window
    (one batch of device memory per step). When the flag is set, the window is replayed
    from that copy one step at a time, checking each step, and the capture is taken at the
    first non-finite one. A device that is not deterministic may not go non-finite again in
    the replay: the trial then still ends as ``nan``, with no capture and a message that
    says so. The tests cover the CPU path and the XLA one on torch-xla's CPU client, not
    CUDA or Neuron."""

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
            f"replay: python -m accelsweep.trainables.loop.nan_replay {path}", capture_path=path, step=self.step_index)


def load_capture(path: str) -> dict[str, Any]:
    capture = torch.load(path, map_location="cpu", weights_only=True)
    if capture.get("format") != CAPTURE_FORMAT:
        raise ValueError(f"{path} is not a NaN capture of this version ({CAPTURE_FORMAT}); "
                         f"its format is {capture.get('format')!r}")
    return capture
