"""A stand-in for the Neuron platform: Neuron's placement, the CPU's training loop.

    python sweeps/neuron_vit.py --platform neuron-standin-cpu --instance-type trn1.32xlarge \\
        --address 127.0.0.1:6379   # a Ray node started with --resources '{"neuron_cores": 32}'

Each worker asks Ray for NeuronCores with the Neuron platform's own request
(``neuron_device_resources``), so Ray's NeuronAcceleratorManager gives it core ids and
sets NEURON_RT_VISIBLE_CORES exactly as on a trn1/inf2 node; then it trains on the host
CPU. What it shows is placement: which cores each trial and each worker was given
(``neuron_cores_held``, ``neuron_cores_by_worker``), disjoint between concurrent trials.
What it does not show is anything about a NeuronCore's speed: every result says so
(``standin``), its device is the CPU, its peak the CPU's, and it is never priced. Ray hands
out ``neuron_cores`` that a node merely declares (``ray start --resources``), so it runs
anywhere.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional

from accelsweep.trainables.distributed import World
from accelsweep.trainables.platforms.base import SMOKE_STUDY_MODEL, Detection, TrainingStudy
from accelsweep.trainables.platforms.cpu import CpuPlatform
from accelsweep.trainables.platforms.neuron import (NeuronPlatform, check_neuron_instance_type, check_neuron_node_type,
                                                    neuron_device_resources, suggest_neuron_workers)

if TYPE_CHECKING:
    import torch

    from accelsweep.trainables.config import TrialConfig

STANDIN_NAME = "neuron-standin-cpu"
STANDIN_NOTE = "stand-in: CPU loop, not a Neuron figure"
NEURON_VISIBLE_CORES = "NEURON_RT_VISIBLE_CORES"  # what the Neuron runtime reads; Ray sets it per worker


class NeuronStandinPlatform(CpuPlatform):
    name = STANDIN_NAME
    description = ("stand-in: holds NeuronCores as platform 'neuron' asks for them, trains on the host CPU "
                   "(placement only; never a Neuron figure, never priced)")
    cost_unit = "neuron_cores"
    unpriced_because = (f"platform {STANDIN_NAME!r} is a {STANDIN_NOTE}: its throughput is the host CPU's, "
                        "not that of the NeuronCores it holds")
    # As platform neuron: a trial's NeuronCores are its process's for the process's life.
    reuses_processes = False
    jax_backend = None  # training trials only: a kernel timed here would be a CPU kernel under a Neuron name
    # Studies size its trials as Neuron's: one CPU per NeuronCore, the seed's batch per core.
    sized_for_cpu = False
    trial_owns_cpus = False
    max_study_batch = NeuronPlatform.max_study_batch
    study_batch_sizes = NeuronPlatform.study_batch_sizes

    def study_model(self, study: TrainingStudy) -> dict[str, Any]:
        return dict(SMOKE_STUDY_MODEL)  # it shows placement: its speed means nothing

    def study_space(self, trial: Any, precision: str, study: TrainingStudy) -> Optional[dict[str, Any]]:
        """Workers, as on Neuron: where each worker's NeuronCore is placed is what it shows."""
        suggest_neuron_workers(trial, study)
        return None

    def check_cluster_node_type(self, instance_type: Optional[str]) -> None:
        check_neuron_node_type(instance_type)

    def detect(self) -> Detection:
        return Detection(True, f"{STANDIN_NOTE}: trains on the host CPU ({super().detect().reason}); the "
                               "NeuronCores it holds are Ray resources its nodes must declare (ray start "
                               "--resources '{\"neuron_cores\": 32}' for a fake trn1.32xlarge)")

    def validate(self, config: "TrialConfig") -> None:
        super().validate(config)
        check_neuron_instance_type(config)  # pinned to a node type: a Neuron one, as platform neuron

    def device_resources(self, config: "TrialConfig") -> dict[str, float]:
        return neuron_device_resources(config)

    def trial_tags(self, device: "torch.device") -> dict[str, str]:
        """Which NeuronCores this trial's workers were given (Ray's accelerator ids, gathered
        from every worker), and what the variable says that the Neuron runtime would read."""
        by_worker = World.current().gather(held_neuron_cores())  # by rank
        held = sorted({core for cores in by_worker for core in cores}, key=int)
        return {"standin": STANDIN_NOTE,
                "neuron_cores_held": ",".join(held),
                "neuron_cores_by_worker": ";".join(",".join(cores) for cores in by_worker),
                "neuron_rt_visible_cores": os.environ.get(NEURON_VISIBLE_CORES, "unset"),
                # When they were seen held (Unix time): the measured windows follow, so a trial
                # holds them from here for at least its measured_s (when placements overlapped).
                "neuron_cores_seen_at": f"{time.time():.3f}"}

    def describe_device(self, device: "torch.device") -> str:
        # Starts as the CPU platform's does: the loop ran there (its peak is the CPU's).
        return f"{super().describe_device(device)}; {STANDIN_NOTE}"


def held_neuron_cores() -> list[str]:
    """The NeuronCore ids Ray assigned to this worker (empty outside Ray), from Ray's
    runtime context rather than NEURON_RT_VISIBLE_CORES: the variable is what a launcher
    may widen (Ray Train v1 gave each worker every core of its node's workers; Train V2
    in Ray 2.60 shares only CUDA_VISIBLE_DEVICES), the assignment is Ray's own record."""
    import ray

    if not ray.is_initialized():
        return []
    return sorted(ray.get_runtime_context().get_accelerator_ids().get("neuron_cores", []), key=int)
