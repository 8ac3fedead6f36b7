"""What the training loop trains: a workload (model, data, loss, optimizer, own knobs).

The loop (trainables/loop/train_loop.py) owns everything measured: warm-up, windows, syncs,
compile time, memory, workers, cost. A workload owns what is trained: subclass ``Workload``,
override ``build_model`` and ``dataset``, and declare its knobs, which sit in the flat
config beside the generic and platform knobs and are checked before any trial:

    class TinyLM(Workload):
        class Knobs(WorkloadKnobs):  # a frozen dataclass
            seq_len: int = knob(64, choices=(32, 64, 128))

A config names its workload by import path (``import_path(TinyLM)``, "package.module:Name")
so a Ray worker on any node can load it; built-in ones have short names too. Importing this
module does not import torch.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Mapping, Optional

from accelsweep.trainables.errors import ConfigError, one_of
from accelsweep.trainables.importing import import_path, load_path
from accelsweep.trainables.metrics import Metric

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig

__all__ = ["BUILT_IN_WORKLOADS", "Workload", "WorkloadKnobs", "import_path", "knob", "load_workload"]

BUILT_IN_WORKLOADS = {
    # The seeds' vision classifiers: ViT-B/16 and ResNet-50 presets, random images.
    "image-classification": "accelsweep.trainables.workloads.image_classification:ImageClassification",
}
UNIT_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


def knob(default: Any, *, choices: Optional[Iterable[Any]] = None,
         check: Optional[Callable[[str, Any], None]] = None) -> Any:
    """A workload knob: its default, and what it may be (``choices``, or ``check(name,
    value)`` raising ConfigError, e.g. ``trainables.errors.positive_int``)."""
    metadata = {"choices": tuple(choices) if choices is not None else None, "check": check}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class WorkloadKnobs:
    """The knobs a workload adds to the config: a frozen subclass, one ``knob(...)`` field
    per knob; each value is checked against its choices or check when the config is made."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            choices, check = field.metadata.get("choices"), field.metadata.get("check")
            if choices is not None:
                one_of(field.name, value, choices)
            if check is not None:
                check(field.name, value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


class Workload(abc.ABC):
    """Subclass it and override ``build_model`` and ``dataset``; the rest has defaults.

    A batch is ``(inputs, targets)``; inputs may be a tensor or a tuple, list or dict of
    tensors (the model's ``forward`` gets it as it is). Methods run in the trial process,
    where torch is imported; they read the trial's
    ``TrialConfig`` (``config.workload_knobs`` holds this workload's ``Knobs``, and
    ``config.batch_size``, ``config.learning_rate``, ``config.seed`` the generic ones).
    Precision, placement, compilation, distribution and timing are the platform's and the
    loop's: a workload builds plain modules on the CPU and never syncs a device."""

    Knobs: ClassVar[type[WorkloadKnobs]] = WorkloadKnobs
    # What one dataset item is called, plural: throughput_samples_per_s counts items; with
    # another unit the loop also reports throughput_<unit>_per_s and usd_per_1m_<unit>,
    # counted by ``units`` per batch.
    unit: ClassVar[str] = "samples"
    # Modules the workload's methods import, imported before the trial's memory baseline
    # so that their code is not counted as the workload's memory.
    imports: ClassVar[tuple[str, ...]] = ()
    # Figures of its own the result carries (``figures``), declared like every metric so
    # that the summary, MLflow and objectives know them.
    metrics: ClassVar[tuple[Metric, ...]] = ()

    def validate(self, config: "TrialConfig") -> None:
        """Checks across knobs (each knob's own values are checked by its ``knob``):
        raise ConfigError naming the field, what is allowed and the value given."""

    @abc.abstractmethod
    def build_model(self, config: "TrialConfig") -> "torch.nn.Module":
        """The model, built on the CPU in fp32: the platform places and casts it."""

    @abc.abstractmethod
    def dataset(self, config: "TrialConfig", rank: int, world_size: int) -> "torch.utils.data.Dataset":
        """Items are ``(input, target)``; worker ``rank`` of ``world_size`` should see its
        own shard. The loop batches it with ``config.batch_size`` and ``config.num_workers``."""

    def collate_fn(self, config: "TrialConfig") -> Optional[Callable[[list], Any]]:
        """How the loader turns ``config.batch_size`` items into one ``(inputs, targets)``
        batch: a function of the list of items (variable-length sequences padded or
        packed, say), or None for torch's default collate, which stacks items of one shape.
        With ``num_workers`` > 0 it runs in the loader's processes: make it picklable (a
        module-level function, or a ``functools.partial`` of one)."""
        return None

    def loss(self, outputs: "torch.Tensor", targets: "torch.Tensor") -> "torch.Tensor":
        """Cross-entropy over the last dimension: (batch, classes) or (batch, tokens, vocab)."""
        import torch.nn.functional as F

        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())

    def optimizer(self, parameters: Iterable["torch.nn.Parameter"], config: "TrialConfig") -> "torch.optim.Optimizer":
        import torch

        return torch.optim.AdamW(parameters, lr=config.learning_rate)

    def units(self, inputs: "torch.Tensor", targets: "torch.Tensor") -> int:
        """How many ``unit`` one batch holds, read on the host before it moves to the
        device. Default: with unit "samples", the batch's items; with any other unit,
        the input's elements (a batch of token ids: its tokens). Override it where that
        is not so, e.g. ``int((targets != PAD).sum())`` for the real tokens of padded ones."""
        return len(inputs) if self.unit == "samples" else inputs.numel()

    def count(self, inputs: Any, targets: Any) -> Mapping[str, float]:
        """Counts of its own per batch, read on the host like ``units`` (the same names
        every batch), e.g. ``{"real_tokens": ..., "token_slots": ...}``. The loop sums them
        over the measured steps, and over every worker."""
        return {}

    def figures(self, totals: Mapping[str, float]) -> Mapping[str, float]:
        """The result's figures of its own (declared in ``metrics``) from the summed
        counts, after each window: e.g. the padding fraction, 1 - real / slots."""
        return {}

    def flops_per_item(self, config: "TrialConfig") -> Optional[float]:
        """Model FLOPs (forward + backward) of one dataset item, where the workload knows
        them better than torch's counter (trainables/flop_count.py), e.g. 6 x parameters x
        tokens for a language model. None (the default): counted from the model."""
        return None

    def on_step(self, outputs: "torch.Tensor", targets: Any, loss: "torch.Tensor") -> None:
        """Per-step work of its own, timed with the step (per-step metric collection).
        Not overridden: nothing is called."""

    def describe(self, config: "TrialConfig") -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(config.workload_knobs).items())
        return f"{type(self).__name__}({knobs})"


_LOADED: dict[str, Workload] = {}


def load_workload(name: str) -> Workload:
    """The workload a config names (one instance per name and process)."""
    if name in _LOADED:
        return _LOADED[name]
    allowed = (f"a built-in workload ({', '.join(BUILT_IN_WORKLOADS)}) or a Workload subclass")
    found = load_path(BUILT_IN_WORKLOADS.get(name, name), "workload", allowed)
    if isinstance(found, type) and issubclass(found, Workload):
        missing = sorted(getattr(found, "__abstractmethods__", ()))
        if missing:
            raise ConfigError("workload", allowed + " that overrides build_model and dataset", name,
                              f"{found.__name__} does not override {', '.join(missing)}.")
        found = found()
    workload = found
    if not isinstance(workload, Workload):
        raise ConfigError("workload", allowed, name, f"It names {found!r}, not a Workload.")
    _check_declaration(workload, name)
    _LOADED[name] = workload
    return workload


def _check_declaration(workload: Workload, name: str) -> None:
    if not UNIT_PATTERN.fullmatch(str(workload.unit)):
        raise ConfigError(f"unit of workload {name}", "a plural noun in lower case, e.g. 'tokens'", workload.unit)
    if not all(isinstance(metric, Metric) for metric in workload.metrics):
        raise ConfigError(f"metrics of workload {name}", "a tuple of Metric", workload.metrics)
    knobs = workload.Knobs
    if not (isinstance(knobs, type) and issubclass(knobs, WorkloadKnobs) and dataclasses.is_dataclass(knobs)):
        raise ConfigError(f"Knobs of workload {name}", "a frozen dataclass subclassing WorkloadKnobs", knobs)
    try:
        knobs()
    except TypeError as error:
        raise ConfigError(f"Knobs of workload {name}", "a default for every knob", knobs.__name__, str(error)) from None
