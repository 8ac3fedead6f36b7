"""Neuron placement without Neuron hardware: the stand-in platform on a fake trn1.32xlarge.

A local Ray instance that declares 32 ``neuron_cores`` (and the node-type marker
cluster.yaml gives a trn1.32xlarge) hands out NeuronCore ids as a real node does. The
stand-in asks for them with the Neuron platform's own request and trains on the CPU: what
is checked is placement (disjoint cores, one per worker, the plan's count) and that none
of its figures passes for a Neuron one. Nothing here measures a NeuronCore.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
import re
import subprocess
import sys

import pytest

from accelsweep import Sweep, run_sweep
from accelsweep.sweeps.driver.define.plan import plan_sweep
from accelsweep.sweeps.driver.define.preflight import check_fits_locally
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.cost import resolve_cost_basis
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms import get_platform, resolve_platform
from accelsweep.trainables.platforms.neuron_standin import STANDIN_NAME, STANDIN_NOTE
from accelsweep.trainables.trainable import train_trainable
from tests import shared_ray as shared_ray_instance
from tests.conftest import REPO
from tests.test_sweep_e2e import mlflow_runs

INSTANCE = "trn1.32xlarge"
FAKE_TRN1_32XLARGE = {"neuron_cores": 32, f"instance_type:{INSTANCE}": 1}


def batch_space(trial):
    trial.suggest_categorical("batch_size", [8])


def standin_config(**changes) -> TrialConfig:
    values = dict(platform=STANDIN_NAME, model="vit-micro", instance_type=INSTANCE, batch_size=8, warmup_steps=1,
                  window_min_steps=2, window_min_s=0.1, windows=1)
    return TrialConfig.make(**{**values, **changes})


@pytest.fixture(scope="module")
def fake_trn1(shared_ray):
    """This process's Ray, as one fake trn1.32xlarge. Ray only allows one instance per
    process: a session instance already running is stopped, and started again after."""
    import ray

    had_session_ray = ray.is_initialized()
    if had_session_ray:
        ray.shutdown()
    # 8 logical CPUs on a 2-core machine: room for every trial and worker process at once
    # (they mostly wait on imports); the cores are what this module looks at. Plain worker
    # processes: with workers forked (tests/worker_zygote.py) the trials started one after
    # another and never held cores at the same time (benchmarks/results/test_suite.md, the seventh run).
    switch = os.environ.get("ACCELSWEEP_TEST_WORKER_ZYGOTE")
    os.environ["ACCELSWEEP_TEST_WORKER_ZYGOTE"] = "0"
    try:
        ray.init(address="local", num_cpus=8, resources=FAKE_TRN1_32XLARGE, include_dashboard=False,
                 log_to_driver=False)
    finally:
        if switch is None:
            del os.environ["ACCELSWEEP_TEST_WORKER_ZYGOTE"]
        else:
            os.environ["ACCELSWEEP_TEST_WORKER_ZYGOTE"] = switch
    try:
        yield ray
    finally:
        ray.shutdown()
        if had_session_ray:
            shared_ray_instance.connect(shared_ray)


@pytest.fixture(scope="module")
def standin_sweep(fake_trn1, tmp_path_factory):
    """Three trials at once: two of one worker, one of two data-parallel workers, priced
    on paper (a trn1.32xlarge basis is given) like a real Neuron sweep would be."""
    folder = tmp_path_factory.mktemp("standin")
    uri = f"sqlite:///{folder}/mlflow.db"
    cost, cost_note = resolve_cost_basis(instance_type=INSTANCE)
    lines: list[str] = []
    result = run_sweep(Sweep(
        # Windows of 2 s: trials started together hold their cores at the same time.
        name="standin", trainable=train_trainable, base=standin_config(window_min_s=2.0),
        space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [8, 16]),
                             "workers": trial.suggest_categorical("workers", [1, 2])},
        points=[{"batch_size": 8, "workers": 1}, {"batch_size": 16, "workers": 1}, {"batch_size": 8, "workers": 2}],
        num_samples=3, max_concurrent_trials=3, scheduler="none", tracking_uri=uri,
        storage_path=str(folder / "ray"), cost=cost, cost_note=cost_note, print_line=lines.append))
    return result, uri, lines


def cores_of(record) -> set[int]:
    return {int(core) for core in record.result["neuron_cores_held"].split(",")}


def test_the_standin_asks_for_neuron_cores_exactly_as_the_neuron_platform_does():
    standin, neuron = get_platform(STANDIN_NAME), get_platform("neuron")
    for workers in (1, 2, 4):
        config = standin_config(workers=workers)
        same = TrialConfig.make(platform="neuron", instance_type=INSTANCE, workers=workers)
        assert standin.worker_resources(config) == neuron.worker_resources(same)
        assert standin.resources(config) == neuron.resources(same)
        assert standin.trial_actor_resources(config) == neuron.trial_actor_resources(same)
    assert standin.reuses_processes is neuron.reuses_processes is False


def test_misuse_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"instance_type must be a Neuron instance type .*got 'c7i.2xlarge'"):
        standin_config(instance_type="c7i.2xlarge")
    with pytest.raises(ConfigError, match="neuron_optlevel .* it is a knob of neuron"):
        standin_config(neuron_optlevel=3)  # it runs no Neuron compiler: its knobs are the CPU's
    # A local run on a machine with no NeuronCores would wait forever for them.
    plan = plan_sweep(Sweep(name="local", trainable=train_trainable, base=standin_config(instance_type=None),
                            space=batch_space, num_samples=1))
    with pytest.raises(ConfigError, match="it has no NeuronCores; a local run.*pass --address"):
        check_fits_locally(plan, local={"CPU": 2})
    # auto never picks it: it would train on the CPU under a Neuron name.
    assert resolve_platform("auto")[0].name != STANDIN_NAME


def test_the_plan_is_never_priced_even_with_a_price_basis():
    cost, note = resolve_cost_basis(instance_type=INSTANCE)
    plan = plan_sweep(Sweep(name="priced", trainable=train_trainable, base=standin_config(), space=batch_space,
                            num_samples=1, cost=cost, cost_note=note))
    assert plan.sweep.cost is None
    assert plan.sweep.cost_note.startswith(f"not priced: platform '{STANDIN_NAME}' is a {STANDIN_NOTE}")
    assert math.isnan(get_platform(STANDIN_NAME).usd_per_hour(cost, standin_config()))
    assert "cost basis:" not in plan.describe()


@pytest.mark.slow
def test_concurrent_trials_get_disjoint_core_sets(standin_sweep):
    result, _, lines = standin_sweep
    assert len(result.records) == 3 and all(r.status == "finished" for r in result.records), lines
    # Within each trial's hold of its cores: from its setup (the process held them already)
    # through its measured windows, which follow the moment it saw them.
    seen = {r.number: float(r.result["neuron_cores_seen_at"]) for r in result.records}
    intervals = {r.number: (seen[r.number] - r.metric("setup_s"), seen[r.number] + r.metric("measured_s"))
                 for r in result.records}
    overlapped = 0
    for a, b in itertools.combinations(result.records, 2):
        (a_start, a_end), (b_start, b_end) = intervals[a.number], intervals[b.number]
        if a_start < b_end and b_start < a_end:  # they held their cores at the same time
            overlapped += 1
            assert not cores_of(a) & cores_of(b), (a.result["neuron_cores_held"], b.result["neuron_cores_held"])
    assert overlapped >= 1, intervals  # trials at once, not one after another
    assert all(cores <= set(range(32)) for cores in map(cores_of, result.records))


@pytest.mark.slow
def test_a_trial_of_two_data_parallel_workers_gets_one_core_per_worker(standin_sweep):
    result, _, _ = standin_sweep
    two = [r for r in result.records if r.searched["workers"] == 2]
    assert len(two) == 1
    for record in two:
        assert record.metric("workers_reporting") == 2  # both ranks trained
        by_worker = [set(cores.split(",")) for cores in record.result["neuron_cores_by_worker"].split(";")]
        assert [len(cores) for cores in by_worker] == [1, 1] and not by_worker[0] & by_worker[1]
        assert len(cores_of(record)) == 2
        # Rank 0's NEURON_RT_VISIBLE_CORES, as the Neuron runtime would read it: its own core.
        assert record.result["neuron_rt_visible_cores"] == ",".join(sorted(by_worker[0]))
    one = [r for r in result.records if r.searched["workers"] == 1]
    assert all(r.result["neuron_rt_visible_cores"] == r.result["neuron_cores_held"] for r in one)
    assert all(len(cores_of(r)) == 1 for r in one)


@pytest.mark.slow
def test_the_neuron_sweeps_plan_matches_what_the_cluster_gives(standin_sweep):
    """The plan `neuron_vit.py --dry-run --address` prints for platform neuron asks, per
    trial, for as many NeuronCores as the stand-in's trial of the same workers was given."""
    result, _, _ = standin_sweep
    done = subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--dry-run", "--platform", "neuron",
                           "--address", "127.0.0.1:1", "--instance-type", INSTANCE],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    planned = re.findall(r"^(?:baseline|sample \d+): (\{.*\})\n  resources per trial: (\{.*\})$", done.stdout,
                         flags=re.M)
    assert len(planned) == 4, done.stdout
    asked = {}
    for point, resources in planned:
        point, resources = ast.literal_eval(point), ast.literal_eval(resources)
        asked[point["workers"]] = resources["neuron_cores"]
        assert resources[f"instance_type:{INSTANCE}"] > 0  # pinned to the node type the cores came from
    assert asked[1] == 1  # the baseline
    for record in result.records:
        workers = record.searched["workers"]
        assert len(cores_of(record)) == asked.get(workers, workers) == workers
        assert record.resources["neuron_cores"] == workers  # what the driver recorded it held


@pytest.mark.slow
def test_its_runs_are_tagged_stand_in_and_never_priced(standin_sweep):
    result, uri, lines = standin_sweep
    for record in result.records:
        assert record.result["standin"] == STANDIN_NOTE
        assert record.result["device"].startswith("cpu: ") and record.result["device"].endswith(STANDIN_NOTE)
        assert "NeuronCore" not in record.result["device"]
        for metric in ("usd_per_hour", "usd_per_1m_samples", "trial_cost_usd"):
            assert math.isnan(record.metric(metric)), (metric, record.result.get(metric))
        assert record.result["peak_measured"] in (True, 1)  # the CPU's own peak, never a NeuronCore datasheet's
    assert any("not priced: platform" in line for line in lines)
    parents, children = mlflow_runs(uri, "standin")
    assert len(children) == 3
    for run in children:
        assert run.data.tags["standin"] == STANDIN_NOTE and run.data.tags["neuron_cores_held"]
        assert "cost_basis" not in run.data.tags
        assert all(math.isnan(run.data.metrics[m]) for m in ("usd_per_1m_samples", "trial_cost_usd")
                   if m in run.data.metrics)
    assert parents[0].data.tags["cost_basis"].startswith("not priced")
