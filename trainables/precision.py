"""What each ``precision`` means, said once: the dtype of the weights, the dtype of the
inputs and whether the forward pass runs under ``torch.autocast`` (and in which dtype).

The training loop, the NaN replay, every platform's autocast and the Neuron compiler
flags read it from here; a platform only lists which precisions it allows. torch is
imported only when a dtype is asked for, so the driver can validate without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from accelsweep.trainables.errors import one_of

if TYPE_CHECKING:
    import torch


def _torch_dtype(name: str) -> "torch.dtype":
    import torch

    return getattr(torch, name)


_MATH_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}


@dataclass(frozen=True)
class Precision:
    name: str
    parameters: str  # torch dtype of the weights (and so of the optimizer state)
    inputs: str  # torch dtype the batch is cast to before the forward pass
    autocast: Optional[str] = None  # dtype torch.autocast computes in; None: no autocast
    # The loss scaled before backward and the gradients unscaled before the optimizer's
    # step (torch.amp.GradScaler): fp16's range is too narrow for small gradients.
    scales_loss: bool = False

    @property
    def parameter_dtype(self) -> "torch.dtype":
        return _torch_dtype(self.parameters)

    @property
    def input_dtype(self) -> "torch.dtype":
        return _torch_dtype(self.inputs)

    @property
    def compute(self) -> str:
        """The dtype the matmuls run in: autocast's, else the weights'."""
        return self.autocast or self.parameters

    @property
    def math_bits(self) -> int:
        """The width of the matmuls' dtype: a precision of fewer bits is a narrower one."""
        return _MATH_BITS[self.compute]

    @property
    def autocasts(self) -> bool:
        return self.autocast is not None

    def autocast_context(self, device_type: str):
        """The context the forward pass runs in on ``device_type`` ("cpu", "cuda", "xla")."""
        import contextlib

        import torch

        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=_torch_dtype(self.autocast))


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", parameters="float32", inputs="float32"),
    # Mixed precision: fp32 weights, matmuls and convolutions in bf16 under torch.autocast.
    Precision("bf16-autocast", parameters="float32", inputs="float32", autocast="bfloat16"),
    # Everything in bf16: weights, optimizer state and inputs (seed 000's XLA_USE_BF16).
    Precision("bf16", parameters="bfloat16", inputs="bfloat16"),
    # bf16-autocast's fp16 twin (CUDA's classic AMP), with a GradScaler.
    Precision("fp16-autocast", parameters="float32", inputs="float32", autocast="float16", scales_loss=True),
)}
PRECISION_NAMES = tuple(PRECISIONS)


def get_precision(name: str) -> Precision:
    one_of("precision", name, PRECISION_NAMES)
    return PRECISIONS[name]
