"""A tiny workload for the budget tests (tests/test_budget.py): a knob that makes every
step slow by a fixed sleep, so a config many times slower than the rest is known
without timing anything. Importable by Ray's workers as tests.budget_workload."""

from dataclasses import dataclass

import time

import torch
from torch import nn

from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, knob


class SleepyMLP(nn.Module):
    def __init__(self, width: int, sleep_s: float):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4))
        self.sleep_s = sleep_s

    def forward(self, inputs):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.layers(inputs)


class Sleepy(Workload):
    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        width: int = knob(8, choices=(8, 16))
        sleep_s: float = knob(0.0, choices=(0.0, 0.3))

    def build_model(self, config):
        return SleepyMLP(config.workload_knobs.width, config.workload_knobs.sleep_s)

    def dataset(self, config, rank, world_size):
        generator = torch.Generator().manual_seed(config.seed)
        return torch.utils.data.TensorDataset(torch.randn(256, 16, generator=generator),
                                              torch.randint(4, (256,), generator=generator))
