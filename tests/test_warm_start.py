"""--warm-start SWEEP (sweeps/driver/define/warm_start.py): an earlier sweep's best configs
proposed first, checked against the new space; its results told to the searcher only
where hardware, workload and versions match. Unit checks on hand-built records, then
the main job's real smoke sweep store (the session's shared run) as the earlier sweep."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from optuna.distributions import CategoricalDistribution

from tests.conftest import REPO
from accelsweep.sweeps.driver.record.trial_record import TrialRecord
from accelsweep.sweeps.driver.define.warm_start import _mismatches, _point, unique_points, warm_trials

DISTRIBUTIONS = {"batch_size": CategoricalDistribution([8, 16, 32]), "precision": CategoricalDistribution(["fp32"])}


def record(number, searched, config=None) -> TrialRecord:
    return TrialRecord(number=number, trial_id=str(number), searched=searched, config=config or dict(searched),
                       resources={}, is_baseline=False, created_at=0.0)


def holds(distribution, value) -> bool:
    return value in distribution.choices


def test_an_old_config_is_a_point_of_the_new_space_or_skipped_with_why():
    base = {"batch_size": 16, "precision": "fp32", "threads": 2}
    assert _point(record(1, {"batch_size": 32, "precision": "fp32"}), DISTRIBUTIONS, base, holds) == (
        {"batch_size": 32, "precision": "fp32"}, "")
    # A knob the old sweep fixed: its value comes from the trial's full config.
    assert _point(record(2, {"batch_size": 8}, {"batch_size": 8, "precision": "fp32"}), DISTRIBUTIONS, base,
                  holds)[0] == {"batch_size": 8, "precision": "fp32"}
    # bf16 removed from the new space (emulated on this CPU): skipped, said.
    assert _point(record(3, {"batch_size": 32, "precision": "bf16"}), DISTRIBUTIONS, base, holds) == (
        None, "trial 3's precision='bf16' is not in this space")
    # A knob the old sweep searched that the new one fixes at another value.
    assert _point(record(4, {"batch_size": 32, "precision": "fp32", "threads": 1}), DISTRIBUTIONS, base, holds) == (
        None, "trial 4 has threads=1; this sweep fixes threads at 2")


def test_hardware_workload_and_versions_are_each_named_when_they_differ():
    history = SimpleNamespace(
        tags={"platform": "cpu", "instance_type": "c7i.2xlarge", "hardware": "Intel Xeon", "host.machine": "x86_64",
              "host.cpus": "8", "version.torch": "2.13.0"},
        params={"base.model": "vit-tiny", "base.batch_size": "16", "base.seed": "0", "base.platform": "cpu"},
        knobs=["batch_size"])
    here = {"platform": "cpu", "instance_type": "c7i.2xlarge", "hardware": "Intel Xeon", "host.machine": "x86_64",
            "host.cpus": "8", "version.torch": "2.14.1"}
    same_base = {"base.model": "vit-tiny", "base.batch_size": "32", "base.seed": "1", "base.platform": "cpu"}
    # A searched knob's base value and the seed are not the workload; torch's version is.
    assert _mismatches(history, here, same_base, DISTRIBUTIONS) == ["versions: torch 2.13.0 there, 2.14.1 here"]
    found = _mismatches(history, {**here, "version.torch": "2.13.0", "hardware": "AMD EPYC"},
                        {**same_base, "base.model": "vit-small"}, DISTRIBUTIONS)
    assert found == ["hardware: hardware Intel Xeon there, AMD EPYC here",
                     "workload: model vit-tiny there, vit-small here"]
    # The same CPU with oneDNN held to AVX2 (bf16 emulated) measures other speeds.
    assert _mismatches(history, {**here, "version.torch": "2.13.0", "host.onednn_max_cpu_isa": "AVX2"}, same_base,
                       DISTRIBUTIONS) == ["hardware: host.onednn_max_cpu_isa unknown there, AVX2 here"]


def test_the_environment_tags_name_a_onednn_isa_limit_only_where_one_is_set(monkeypatch):
    from accelsweep.trainables.environment import environment_tags

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert not any("isa" in tag for tag in environment_tags())
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert environment_tags()["host.onednn_max_cpu_isa"] == "AVX2"


def test_warm_points_come_once_and_old_results_become_completed_trials():
    a, b = {"batch_size": 32, "precision": "fp32"}, {"batch_size": 16, "precision": "fp32"}
    assert unique_points([a, b, dict(a)]) == [a, b]
    trials = warm_trials([(a, 120.0), (b, 80.0)], DISTRIBUTIONS, objectives=1)
    assert [(t.params, t.value, t.state.name) for t in trials] == [(a, 120.0, "COMPLETE"), (b, 80.0, "COMPLETE")]


def test_the_searcher_told_old_results_models_from_them_at_once():
    """Told results count as TPE's start-up trials: with 4 told and 4 start-up trials, the
    first proposal is TPE's own, next to the told best (batch 32), not a random one."""
    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch, concurrency_aware_tpe

    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16, 32])
        trial.suggest_categorical("precision", ["fp32"])

    told = [({"batch_size": 8, "precision": "fp32"}, 10.0), ({"batch_size": 16, "precision": "fp32"}, 20.0),
            ({"batch_size": 32, "precision": "fp32"}, 90.0), ({"batch_size": 8, "precision": "fp32"}, 11.0)]
    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="warm-unit",
                                        sampler=concurrency_aware_tpe(0, 4),
                                        prior_trials=warm_trials(told, DISTRIBUTIONS, 1))
    assert len(searcher._ot_study.trials) == 4
    assert searcher.suggest("t0") == {"batch_size": 32, "precision": "fp32"}


# --- the main job's real smoke sweep as the earlier sweep ------------------------------------------------------

def _sweep_name(uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (parent,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                   filter_string="tags.kind = 'sweep'")
    return parent


def _best_first(uri: str, name: str) -> list[dict]:
    from accelsweep.sweeps.driver.record.history import load_sweep
    from accelsweep.sweeps.driver.reporting.summary import ranked

    history = load_sweep(uri, name)
    measured = sorted(ranked(history.records, "throughput_samples_per_s"),
                      key=lambda r: -r.metric("throughput_samples_per_s"))
    return [r.searched for r in measured]


def _neuron_vit(*args, timeout=300):
    return subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--smoke", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_dry_run_says_the_old_best_configs_come_first_and_the_results_are_told(main_job):
    name = _sweep_name(main_job.tracking_uri).info.run_name
    best = _best_first(main_job.tracking_uri, name)
    done = _neuron_vit("--dry-run", "--tracking-uri", main_job.tracking_uri, "--warm-start", name)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("warm start from"))
    first = [ast.literal_eval(point) for point in line.split("proposed first: ", 1)[1].split("; ")]
    assert first == best[:3]
    assert f"the searcher is told its {len(best)} measured result(s)" in done.stdout
    # Another workload (longer windows): the configs still come first, the results are not told.
    other = _neuron_vit("--dry-run", "--tracking-uri", main_job.tracking_uri, "--warm-start", name,
                        "--window-steps", "7")
    assert "its results are not told to the searcher" in other.stdout
    assert "workload: window_min_steps 3 there, 7 here" in other.stdout


@pytest.mark.slow
def test_a_warm_started_sweep_runs_the_old_best_first_and_records_it(second_sweep):
    """The session's second run of the main job (conftest.second_sweep: --warm-start from the
    main job's sweep, --confirm-rounds 0, 2 trials, in a copy of its store)."""
    from mlflow.tracking import MlflowClient

    uri, name = second_sweep.tracking_uri, second_sweep.warm_start
    best = _best_first(uri, name)
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name(second_sweep.experiment).experiment_id],
                                   filter_string="tags.kind = 'sweep'")
    assert parent.data.tags["warm_start"] == name
    assert parent.data.tags["warm_start_told"] == str(len(best))
    trials = client.search_runs([parent.info.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' "
                                              "and tags.trial_number = '1'")  # numbered from 1
    assert json.loads(trials[0].data.tags["searched"]) == best[0]  # the old best ran first


@pytest.mark.slow  # a fresh MLflow database: ~14-26 s on this shared machine
def test_an_unknown_sweep_ends_the_command_before_any_trial(tmp_path):
    done = _neuron_vit("--dry-run", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--warm-start", "nosuch",
                       timeout=120)
    assert done.returncode == 2
    assert "error: warm_start must be a sweep of the store" in done.stderr and "'nosuch'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_grid_refuses_a_warm_start(tmp_path):
    """Every grid study (here a kernel study) says so, naming the field, before any trial."""
    done = subprocess.run([sys.executable, "sweeps/giou_kernels.py", "--dry-run", "--tracking-uri",
                           f"sqlite:///{tmp_path}/m.db", "--warm-start", "anything"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "warm_start must be none with sampler 'grid'" in done.stderr
