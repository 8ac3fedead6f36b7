"""Each private Ray name we use (trainables/ray_adapter.py) still exists and behaves as
used. A Ray upgrade that moves or changes one fails here, by name, not mid-sweep."""

from __future__ import annotations

import os

import pytest

from accelsweep.trainables import ray_adapter


class Marker:
    """Stands for SweepCallback: state that must come back from Tune's saved experiment."""

    def __init__(self, label: str):
        self.label = label


def no_trial(config):
    raise AssertionError("the experiment is saved and restored, never run")


def test_a_restored_tuner_gives_back_the_callbacks_it_was_started_with(tmp_path):
    from ray import tune

    class MarkerCallback(tune.Callback, Marker):
        pass

    tune.Tuner(no_trial, run_config=tune.RunConfig(name="saved", storage_path=str(tmp_path),
                                                   callbacks=[MarkerCallback("the sweep's")]))
    restored = tune.Tuner.restore(str(tmp_path / "saved"), no_trial)
    callbacks = ray_adapter.restored_callbacks(restored)
    assert [type(c).__name__ for c in callbacks] == ["MarkerCallback"]
    assert callbacks[0].label == "the sweep's"


def test_auto_address_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "203.0.113.7:6390")  # not this host: kept as given
    assert ray_adapter.resolve_auto_address() == "203.0.113.7:6390"


def test_auto_address_without_a_cluster_is_a_connection_error(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where `ray start` records its cluster: empty here
    try:
        address = ray_adapter.resolve_auto_address()
    except ConnectionError:
        return  # check_ray_address turns this into its refusal
    assert isinstance(address, str) and ":" in address  # a cluster this machine started is running


def test_local_resources_are_counted_as_ray_init_would():
    cpus = ray_adapter.local_cpus()
    assert isinstance(cpus, int) and 1 <= cpus <= (os.cpu_count() or cpus)
    for resource in ("GPU", "neuron_cores", "TPU"):
        count = ray_adapter.local_accelerators(resource)
        assert isinstance(count, int) and count >= 0, resource
    assert ray_adapter.local_accelerators("no_such_accelerator") == 0


def test_a_free_port_on_this_node():
    address, port = ray_adapter.free_address_and_port()
    assert isinstance(address, str) and address and isinstance(port, int) and 0 < port < 65536


def test_the_neuron_backend_base_class_is_a_ray_train_backend():
    pytest.importorskip("torch")
    from ray.train.backend import Backend

    base = ray_adapter.neuron_xla_backend()
    assert issubclass(base, Backend) and callable(base.on_start)
