"""Every use of Ray's private API, in one place.

Ray has no public way to do what these functions do. Its private names move between
releases without notice, so they are kept here, each behind a function that says what
we use it for, and tests/test_ray_adapter.py calls each one against the installed Ray:
an upgrade that renames or changes one fails there, by name, instead of deep inside a
sweep. Written against Ray 2.60. Imports are lazy: importing this module imports no Ray.

Used by the sweep driver (``accelsweep.sweeps.driver``) and by the Neuron training
backend (``accelsweep.trainables.platforms.neuron_backend``); a module of ``trainables``
so that the worker-side code need not import the driver.
"""

from __future__ import annotations

from typing import Any


def restored_callbacks(tuner) -> list:
    """The callbacks of a Tuner made by ``Tuner.restore``: the ones the sweep started
    with, unpickled from the experiment state. Ray keeps the original RunConfig on
    restore and has no public getter for it."""
    return list(tuner._local_tuner.get_run_config().callbacks or [])


def resolve_auto_address() -> str:
    """What ``ray.init(address="auto")`` would connect to: $RAY_ADDRESS, else the
    cluster the last ``ray start`` on this machine recorded. Raises ConnectionError
    when there is none."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    return canonicalize_bootstrap_address_or_die("auto")


def local_cpus() -> int:
    """The CPUs a local Ray instance started here gets (container CPU limits included)."""
    from ray._private.utils import get_num_cpus

    return get_num_cpus()


def local_accelerators(resource: str) -> int:
    """How many of ``resource`` ("GPU", "neuron_cores", "TPU") a local Ray instance
    started here detects; 0 for a resource Ray has no accelerator manager for."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    manager = get_accelerator_manager_for_resource(resource)
    return manager.get_current_node_num_accelerators() if manager else 0


def free_address_and_port() -> tuple[str, int]:
    """This node's IP and a port free on it now (Ray Train's own rendezvous helper)."""
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def neuron_xla_backend() -> Any:
    """Ray Train's Neuron XLA backend class (``_TorchAwsNeuronXLABackend``), to subclass.
    Imports torch: call it only where a Neuron trial runs."""
    from ray.train.torch.xla.config import _TorchAwsNeuronXLABackend

    return _TorchAwsNeuronXLABackend
