"""Data-parallel trials: a TorchTrainer inside a Tune trial, DDP over gloo on the CPU."""

import pytest

from accelsweep import Sweep, run_sweep
from tests.test_sweep_e2e import mlflow_runs
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import get_platform


def test_resources_count_every_worker_once():
    cpu = get_platform("cpu")
    config = TrialConfig.make(workers=2, cpus_per_worker=1)
    assert cpu.worker_resources(config) == {"CPU": 1}
    assert cpu.resources(config) == {"CPU": 2}  # the cost share and the concurrency basis
    assert cpu.trial_actor_resources(config)["CPU"] == 0  # the workers hold the CPUs, not the driver
    neuron = get_platform("neuron")
    assert neuron.resources(TrialConfig.make(platform="neuron", workers=2)) == {"CPU": 2, "neuron_cores": 2}


@pytest.mark.slow
def test_two_worker_cpu_trial_reports_global_throughput(ray_session, tracking_uri):
    lines = []
    result = run_sweep(Sweep(
        name="two_workers", trainable=__import__("accelsweep.trainables.trainable", fromlist=["x"]).train_trainable,
        base=TrialConfig.make(model="vit-micro", workers=2, cpus_per_worker=1, batch_size=8, warmup_steps=2,
                              window_min_steps=3, window_min_s=0.3, windows=2),
        space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [8])},
        num_samples=1, scheduler="none", tracking_uri=tracking_uri, print_line=lines.append,
    ))
    (record,) = result.records
    assert record.status == "finished", record.error
    assert record.metric("workers") == 2 and record.metric("workers_reporting") == 2  # both ranks ran
    assert record.metric("throughput_samples_per_s") > 0
    # Global: both workers' samples over the slower worker's time, at least one worker's rate.
    assert record.metric("window_throughput_samples_per_s") > 0
    _, children = mlflow_runs(tracking_uri, "two_workers")
    assert children[0].data.metrics["workers_reporting"] == 2
    assert children[0].data.tags["resource.CPU"] == "2"


class FakeWorkerGroup:
    """Ray Train's worker group, run in this process for each of ``size`` workers."""

    def __init__(self, size):
        self.envs = [dict() for _ in range(size)]

    def _run(self, env, fn, *args, **kwargs):
        import os

        saved = dict(os.environ)
        os.environ.update(env)
        try:
            return fn(*args, **kwargs)
        finally:
            env.update({k: v for k, v in os.environ.items() if saved.get(k) != v})
            os.environ.clear()
            os.environ.update(saved)

    def execute(self, fn, *args, **kwargs):
        return [self._run(env, fn, *args, **kwargs) for env in self.envs]

    def execute_single(self, index, fn, *args, **kwargs):
        return self._run(self.envs[index], fn, *args, **kwargs)


def test_neuron_backend_sets_one_root_comm_endpoint_on_every_worker():
    """ray#65070: without NEURON_RT_ROOT_COMM_ID a multi-instance Neuron run cannot start."""
    config = get_platform("neuron").train_backend(TrialConfig.make(platform="neuron", workers=2))
    group = FakeWorkerGroup(2)
    config.backend_cls().on_start(group, config)
    endpoints = {env["NEURON_RT_ROOT_COMM_ID"] for env in group.envs}
    assert len(endpoints) == 1
    host, port = endpoints.pop().rsplit(":", 1)
    assert host and int(port) != int(group.envs[0]["MASTER_PORT"])


def test_generic_xla_refuses_several_workers():
    import pytest as _pytest

    from accelsweep.trainables.errors import ConfigError

    with _pytest.raises(ConfigError, match="workers must be 1 on platform 'xla'; got 2"):
        TrialConfig.make(platform="xla", workers=2)
