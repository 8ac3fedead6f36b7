"""Why a trial failed, in the few words a sweep's summary counts by.

A failed trial is a result: its MLflow run ends FAILED with the error's class, its
message and one of these causes, and the sweep goes on.
"""

from __future__ import annotations

import traceback

from typing import Optional

from accelsweep.trainables.contention import trial_contention
from accelsweep.trainables.loop.rejection import trial_limits
from accelsweep.trainables.loop.watchdog import TrialAborted
from accelsweep.trainables.trial_progress import trial_progress
from accelsweep.trainables.turns import trial_turns

OOM, NAN, COMPILE, KILLED, CONFIG, ERROR = "oom", "nan", "compile", "killed", "config", "error"
# Stopped reporting past its deadline (--trial-timeout-s): the driver ended it (sweeps/driver/run/deadline.py).
TIMEOUT = "timeout"
CAUSES = (OOM, NAN, COMPILE, KILLED, TIMEOUT, CONFIG, ERROR)


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: the trial is a failure, not a data point."""


class NonFiniteGradient(NonFiniteLoss):
    """A gradient became NaN or infinite with ``nan_capture`` on. ``capture_path`` is the
    saved capture of the step that produced it (None when it could not be pinned to one
    step); ``step`` that step's index, 0 being the trial's first step."""

    def __init__(self, message: str, capture_path: Optional[str] = None, step: Optional[int] = None):
        super().__init__(message)
        self.capture_path, self.step = capture_path, step

_BY_CLASS = {
    # torch (CUDA and XPU share the class), Python, Ray's memory monitor
    "OutOfMemoryError": OOM, "MemoryError": OOM,
    "NonFiniteLoss": NAN, "NonFiniteGradient": NAN,
    # neuronx-cc (trainables.platforms.neuron_errors), torch.compile's backends
    "NeuronCompileError": COMPILE, "CompileTimeout": COMPILE, "BackendCompilerFailed": COMPILE, "InductorError": COMPILE,
    # the trial's process or its node went away
    "ActorDiedError": KILLED, "RayActorError": KILLED, "WorkerCrashedError": KILLED, "NodeDiedError": KILLED,
    "ActorUnavailableError": KILLED,
    # the driver ended it: no report within its deadline (sweeps/driver/run/deadline.py)
    "TrialTimeout": TIMEOUT,
    "ConfigError": CONFIG,
}
# What CPU allocators and runtimes say when memory runs out without a class of its own.
_OOM_MESSAGES = ("can't allocate memory", "out of memory", "cannot allocate memory", "resource_exhausted")


def failure_cause(error: BaseException) -> str:
    for klass in type(error).__mro__:
        if klass.__name__ in _BY_CLASS:
            return _BY_CLASS[klass.__name__]
    text = str(error).lower()
    if any(message in text for message in _OOM_MESSAGES):
        return OOM
    return ERROR


# Advice lines libraries append after the message (torch.compile's): not the reason.
_ADVICE = ("Set TORCHDYNAMO_VERBOSE", "For even more developer context", "You can suppress this exception",
           "Set TORCH_LOGS")


def one_line(error: BaseException) -> str:
    """The error's last line that is not advice: what an MLflow tag and a progress line
    can show (a Ray-wrapped error ends with the original message)."""
    lines = [line.strip() for line in str(error).strip().splitlines()
             if line.strip() and not line.strip().startswith(_ADVICE)]
    if lines:
        return lines[-1]
    # A bare `assert` (inductor's CUDA graph trees raise some) says nothing: where it
    # was raised is then the only reason there is.
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    if frames:
        where = frames[-1]
        return f"{type(error).__name__} (no message), raised at {where.filename}:{where.lineno} in {where.name}"
    return type(error).__name__


def run_isolated(searched, *, trainable, objective_metrics, limits=None, progress=None, turns=None,
                 **parameters) -> None:
    """Run a Tune trainable so that its own errors end the trial as a reported failure.

    An exception in the trial (an OOM, a non-finite loss, a compile failure, a bad
    value) would be retried by Tune like a lost node, and a retry of the same config
    fails the same way, after another compile. So the trial reports it instead: the
    objective as NaN (Optuna records the trial as failed and samples away from it), the
    error's class, message and cause. Tune's retries are left for what a retry can fix:
    a process or node that went away (the trial never gets to report that itself).

    ``limits``: the sweep's rejection rule and compile limit (trainables.rejection
    BoardLimits), made the trial's own (with the best so far) while it runs.
    ``progress``: the name of the sweep's TrialProgress actor (trainables/trial_progress.py),
    which gets the trial's phases and output; its output is sent there before a failure
    is reported, so the driver has it when it records the failure.
    ``turns``: the name of the confirmation's TurnBaton actor (trainables/turns.py) when
    this trial measures its windows in turn with others; None otherwise.
    Every report gets the contention of its window (trainables/contention.py), measured
    here for a trainable that does not measure its own.
    """
    from ray import tune

    try:
        with trial_progress(progress), trial_limits(limits.for_trial() if limits is not None else None), \
                trial_contention(), trial_turns(turns, searched):
            try:
                trainable(searched, **parameters)
            except Exception:
                traceback.print_exc()  # inside trial_progress: the trial's output log keeps the whole traceback
                raise
    except (Exception, TrialAborted) as error:  # noqa: BLE001 - every trial error is a result; Ctrl-C is not
        tune.report({**{metric: float("nan") for metric in objective_metrics}, "trial_failed": 1,
                     "error_class": type(error).__name__, "error": one_line(error),
                     "error_cause": failure_cause(error)})
