"""Seed 003's CPU post's workload: a torchvision ResNet (1000 classes) trained with SGD on
the seed's random images, bf16 only where the hardware does it natively (elsewhere torch
would emulate it, which is not the seed's experiment). sweeps/cpu_resnet.py is its study."""

from __future__ import annotations

from dataclasses import dataclass

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms import get_platform
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, knob

LABELS = 10  # the seed's FakeDataset: label index % 10


class CpuResNet(Workload):
    """A torchvision ResNet (1000 classes) trained with SGD at ``learning_rate``, as in the seed."""

    imports = ("torchvision",)

    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        model: str = knob("resnet50", choices=("resnet18", "resnet34", "resnet50"))
        image_size: int = knob(224, choices=(32, 64, 112, 224))

    def validate(self, config) -> None:
        if config.precision == "fp32":
            return
        emulated = get_platform(config.platform).capabilities(config).emulated.get("precision", {})
        if config.precision in emulated:
            raise ConfigError("precision", "fp32 on this hardware", config.precision,
                              f"{emulated[config.precision]}: torch would emulate bf16, not the seed's experiment "
                              "(its c7i has AMX-BF16). This study runs bf16 only where the hardware does it.")

    def build_model(self, config):
        import torchvision

        return getattr(torchvision.models, config.workload_knobs.model)()

    def dataset(self, config, rank: int, world_size: int):
        from accelsweep.trainables.workloads.random_images import RandomImageDataset

        return RandomImageDataset(config.workload_knobs.image_size, LABELS, seed=config.seed, rank=rank,
                                  world_size=world_size, learnable=False)

    def optimizer(self, parameters, config):
        import torch

        return torch.optim.SGD(parameters, lr=config.learning_rate)
