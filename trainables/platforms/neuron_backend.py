"""Ray Train's Neuron XLA backend, with the rendezvous Ray's own leaves out.

The Neuron runtime builds a communicator that spans instances by having every rank
meet at NEURON_RT_ROOT_COMM_ID (host:port). Ray's ``_TorchAwsNeuronXLABackend`` sets
MASTER_ADDR/MASTER_PORT but never that variable, so a multi-instance trn1 run fails in
``Nrt::BuildGlobalComm``. On one instance there is nothing to meet, which is why it
only shows up across hosts. Imported only for Neuron trials with several workers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ray.train.torch.xla.config import TorchXLAConfig

from accelsweep.trainables.ray_adapter import free_address_and_port, neuron_xla_backend

ROOT_COMM_ID = "NEURON_RT_ROOT_COMM_ID"


def _set_root_comm_id(endpoint: str) -> None:
    os.environ[ROOT_COMM_ID] = endpoint


class NeuronRendezvousBackend(neuron_xla_backend()):
    def on_start(self, worker_group, backend_config) -> None:
        super().on_start(worker_group, backend_config)
        # A port of its own, checked free on rank 0's host now; MASTER_PORT is taken
        # by the torch.distributed store.
        address, port = worker_group.execute_single(0, free_address_and_port)
        worker_group.execute(_set_root_comm_id, f"{address}:{port}")


@dataclass
class NeuronXLAConfig(TorchXLAConfig):
    @property
    def backend_cls(self):
        return NeuronRendezvousBackend
