"""The data-parallel world a trial's worker runs in (one process per worker).

Ray Train's TorchTrainer starts the workers and the torch.distributed process group;
the loop asks this module who it is and, at window boundaries only, agrees with the
other workers on step counts and adds up what they measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> "World":
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def reduce(self, values: Sequence[float], op: str, device) -> list[float]:
        """Element-wise sum or max of ``values`` over all workers (every worker calls it)."""
        if self.size == 1:
            return list(values)
        import torch
        import torch.distributed as dist

        reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        tensor = torch.tensor(list(values), dtype=torch.float64 if device.type == "cpu" else torch.float32,
                              device=device)
        dist.all_reduce(tensor, op=reduce_op)
        return [float(v) for v in tensor.cpu()]

    def gather(self, value: Any) -> list:
        """Every worker's ``value``, by rank (every worker calls it at the same point)."""
        if self.size == 1:
            return [value]
        import torch.distributed as dist

        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, value)
        return gathered

    def placement_tags(self) -> dict[str, str]:
        """Where the workers ran, by rank: the address of each one's node (Ray's node
        address), so a trial across hosts says which hosts. Every worker calls it; none
        for a trial of one worker (its node is Tune's ``node_ip``)."""
        if self.size == 1:
            return {}
        return {"worker_nodes": ",".join(self.gather(node_address()))}


def node_address() -> str:
    """This process's node as Ray knows it (its address), else the machine's name."""
    import socket

    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostname()
