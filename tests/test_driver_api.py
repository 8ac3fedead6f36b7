"""The driver's public API as a user meets it: a trainable and config of one's own, its
declared metrics, several objectives and their Pareto set, early stopping that does not
rank by one objective alone, and run_sweep called again and again in one process (Ray
and the process-wide settings left as they were found)."""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import optuna
import pytest

from accelsweep import Objective, Sweep, SweepConfig, declare_metrics, plan_sweep
from accelsweep.sweeps.driver.run.callbacks import TrialRecord
from accelsweep.sweeps.driver.reporting.summary import best_record, pareto_set, summary
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import Metric, MetricSet
from tests.conftest import REPO


@dataclass(frozen=True)
class TinyConfig(SweepConfig):
    knob: int = 1
    windows: int = 2


TINY_METRICS = MetricSet(
    metrics=(Metric("score", "points", "max", label="score", fmt="{:.1f}", curve=True, progress="score {:.1f}"),
             Metric("spend", "units", "min", progress="spend {:.1f}")),  # no label: still a row, as an objective
    headline=("score", "spend"),
)


@declare_metrics(TINY_METRICS)
def tiny_trainable(searched, base, cost=None):
    """A user's own trainable: more knob scores more and spends more."""
    from ray import tune

    config = TinyConfig.from_dict({**base, **searched})
    for window in range(config.windows):
        tune.report({"score": float(config.knob * (window + 1)), "spend": float(config.knob ** 2)})


def knob_space(trial):
    trial.suggest_categorical("knob", [1, 2, 3])


def tiny_sweep(name, tracking_uri, storage_path, **options):
    options = {"objectives": [Objective("score", "max")], "num_samples": 2, **options}
    return Sweep(name=name, trainable=tiny_trainable, base=TinyConfig(), space=knob_space,
                 tracking_uri=tracking_uri, storage_path=storage_path, **options)


class BareConfig:
    """The protocol and nothing more: no cpus_per_worker, no workers, no dataclass."""

    def __init__(self, platform="cpu", knob=1):
        self.platform, self.knob = platform, knob

    def to_dict(self):
        return {"platform": self.platform, "knob": self.knob}

    @classmethod
    def from_dict(cls, values):
        if values.get("knob") not in (1, 2, 3):
            raise ConfigError("knob", "one of 1, 2, 3", values.get("knob"))
        return cls(**values)


def plan(trainable=tiny_trainable, base=None, **options):
    options.setdefault("objectives", [Objective("score", "max")])
    return plan_sweep(Sweep(name="api", trainable=trainable, base=base or TinyConfig(), space=knob_space, **options))


# ---- checked before anything starts -------------------------------------------------

def test_the_local_search_takes_a_quarter_of_a_tpe_search_by_default():
    from accelsweep.sweeps.driver.define.plan import LOCAL_SEARCH_MAX, local_search_trials

    def sweep(**options):
        options.setdefault("objectives", [Objective("score", "max")])
        return Sweep(name="api", trainable=tiny_trainable, base=TinyConfig(), space=knob_space, **options)

    assert LOCAL_SEARCH_MAX == 4
    assert local_search_trials(sweep(num_samples=24)) == 4 and local_search_trials(sweep(num_samples=6)) == 1
    assert local_search_trials(sweep(num_samples=24, sampler="grid")) == 0
    assert local_search_trials(sweep(num_samples=24, objectives=[Objective("score", "max"),
                                                                 Objective("spend", "min")])) == 0
    assert local_search_trials(sweep(num_samples=24, local_search=0)) == 0
    assert "local search: the last 4 proposals" in plan(num_samples=16).describe()
    with pytest.raises(ConfigError, match="local_search.*fewer than num_samples"):
        plan(num_samples=4, local_search=4)
    with pytest.raises(ConfigError, match="local_search"):
        plan(num_samples=4, local_search=-1)


def test_a_trainable_that_cannot_be_called_as_trials_call_it_is_refused():
    def takes_a_config(config):
        pass

    with pytest.raises(ConfigError, match=re.escape(
            "trainable must be a function trainable(searched, base=..., cost=...) that reports through "
            "ray.tune.report; got 'takes_a_config(config)'. It cannot be called as")):
        plan(declare_metrics(TINY_METRICS)(takes_a_config))
    with pytest.raises(ConfigError, match="^trainable must be"):
        plan(trainable="tiny_trainable")
    plan(declare_metrics(TINY_METRICS)(lambda searched, **parameters: None))  # anything that binds


def test_a_trainable_must_declare_its_metrics():
    def undeclared(searched, base, cost=None):
        pass

    with pytest.raises(ConfigError, match=r"^metrics must be the MetricSet of what the trainable reports; got None\. "
                                          r"Trainable undeclared declares none: decorate it with declare_metrics"):
        plan(undeclared)
    plan(undeclared, metrics=TINY_METRICS)  # or the sweep says it
    by_base = declare_metrics(lambda base: TINY_METRICS.replace("score", label=f"score on {base.platform}"))
    assert plan(by_base(undeclared)).metrics["score"].label == "score on cpu"  # a function of the base config


def test_an_objective_is_checked_against_the_declared_metrics():
    with pytest.raises(ConfigError, match=r"^objective metric must be one of score, spend; got 'scor'\."):
        plan(objectives=[Objective("scor", "max")])
    with pytest.raises(ConfigError, match=r"^objective mode for spend must be 'min'; got 'max'"):
        plan(objectives=[Objective("score", "max"), Objective("spend", "max")])
    with pytest.raises(ConfigError, match=r"^objectives must be one per metric; got \['score'\]"):
        plan(objectives=[Objective("score", "max"), Objective("score", "max")])


def test_a_config_without_resource_fields_is_planned_and_sized():
    from accelsweep.sweeps.driver.run.lifecycle import _trial_resources
    from accelsweep.sweeps.driver.define.preflight import check_fits_locally

    bare = plan(base=BareConfig())
    assert bare.resources_of(bare.baseline_point) == {"CPU": 1}
    assert _trial_resources(bare.config_for, {}, {"knob": 2}) == {"CPU": 1}
    check_fits_locally(bare, local={"CPU": 1})
    assert "resources per trial: {'CPU': 1}" in bare.describe()
    # The platforms read their own knobs too (a GPU's accelerator type): their defaults.
    on_gpu = plan(base=BareConfig(platform="cuda"))
    assert on_gpu.resources_of(on_gpu.baseline_point) == {"CPU": 1, "GPU": 1}
    assert on_gpu.trial_env(on_gpu.baseline_point) == {}
    tpu = plan(base=BareConfig(platform="tpu"))
    assert tpu.trial_env(tpu.baseline_point) == {"PJRT_DEVICE": "TPU"}  # what any TPU process needs


def test_a_config_that_breaks_the_protocol_is_refused_by_name():
    protocol = ("base must be a config with .platform (a platform name), .to_dict() (a flat dict) and a classmethod "
                "from_dict(dict) that validates it (e.g. a SweepConfig subclass)")
    with pytest.raises(ConfigError, match=re.escape(f"{protocol}; got 'dict'. It has no platform, to_dict(), "
                                                    "from_dict().")):
        plan(base={"platform": "cpu", "knob": 1})

    class Nested(BareConfig):
        def to_dict(self):
            return {"platform": self.platform, "knob": self.knob, "extra": {"a": 1}}

    with pytest.raises(ConfigError, match=re.escape("Its to_dict() is not flat: extra hold dicts")):
        plan(base=Nested())

    class NoRoundTrip(BareConfig):
        def to_dict(self):  # a field its from_dict cannot take back
            return {**super().to_dict(), "label": "x"}

    with pytest.raises(ConfigError, match=re.escape(
            "got 'NoRoundTrip'. NoRoundTrip.from_dict(base.to_dict()) raised TypeError: ")):
        plan(base=NoRoundTrip())
    with pytest.raises(ConfigError, match=r"^platform must be one of cpu, .*; got 'gpu'"):
        plan(base=BareConfig(platform="gpu"))
    with pytest.raises(ConfigError, match=r"^cpus_per_worker must be an integer >= 1; got 0"):
        TinyConfig(cpus_per_worker=0)
    with pytest.raises(ConfigError, match=r"^config key must be one of cpus_per_worker, knob, platform, windows, "
                                          r"workers; got 'knbo'"):
        TinyConfig.from_dict({"knbo": 2})


# ---- ranking: the declared metrics and the objectives, whatever they are called ----

def record(number, score, spend, status="finished", **result):
    return TrialRecord(number, f"t{number}", {"knob": number}, {"knob": number}, {}, number == 1, 0.0,
                       status=status, result={"score": score, "spend": spend, **result}, measured_by="score")


BOTH = [("score", "max"), ("spend", "min")]


def test_a_users_own_metric_ranks_trials():
    records = [record(1, 1.0, 1.0), record(2, 4.0, 4.0), record(3, float("nan"), 0.0)]
    assert best_record(records, "score", "max").number == 2
    assert records[0].has_measurement and not records[2].has_measurement  # NaN: not measured
    failed = record(4, 9.0, 0.1, status="failed")
    assert not failed.has_measurement and best_record([*records, failed], "score", "max").number == 2
    text = summary("s", records, "score", "max", ["knob"], "", "", 1.0, metrics=TINY_METRICS, objectives=BOTH)
    assert re.search(r"^score +1\.0 +4\.0 +\+300\.0%$", text, re.M)
    assert re.search(r"^spend +1 +4 +\+300\.0%$", text, re.M)  # an objective is a row though not summarised
    assert "No trial produced" not in text and "best device" not in text and "mean overhead" not in text


def test_the_pareto_set_is_every_measured_trial_none_beats_on_all_objectives():
    records = [record(1, 1.0, 1.0), record(2, 4.0, 4.0), record(3, 3.0, 5.0),  # 3: 2 beats it on both
               record(4, 0.5, 0.5), record(5, 2.0, 1.0), record(6, 2.0, 1.0),  # 5 and 6 tie: neither beats the other
               record(7, 9.0, 0.1, status="failed"), record(8, 8.0, float("nan")),
               record(9, 9.0, 0.1, interpreted=1)]  # checked, not ranked
    assert [r.number for r in pareto_set(records, BOTH)] == [2, 5, 6, 4]  # best first by the first objective
    assert [r.number for r in pareto_set(records, [("score", "max")])] == [8]  # measured on score alone
    text = summary("s", records, "score", "max", ["knob"], "", "", 1.0, metrics=TINY_METRICS, objectives=BOTH)
    assert "Pareto set (max score, min spend): 4 trial(s) no other trial dominates" in text
    assert re.search(r"^trial +knob +score +spend$", text, re.M) and re.search(r"^4 +4 +0\.5 +0\.5$", text, re.M)
    alone = summary("s", records, "score", "max", ["knob"], "", "", 1.0, metrics=TINY_METRICS)
    assert "Pareto" not in alone


def test_pareto_stopping_stops_a_trial_only_when_most_beat_it_on_every_objective():
    from ray.tune.schedulers import TrialScheduler

    from accelsweep.sweeps.driver.run.schedulers import ParetoStoppingRule

    rule = ParetoStoppingRule(BOTH, max_t=4)
    assert rule.rungs == [1, 2]

    def at(trial, t, score, spend):
        return rule.decide(trial, {"training_iteration": t, "score": score, "spend": spend})

    assert at("a", 1, 2.0, 2.0) == TrialScheduler.CONTINUE  # too few to compare with
    assert at("b", 1, 3.0, 1.0) == TrialScheduler.CONTINUE
    assert at("c", 1, 1.0, 3.0) == TrialScheduler.STOP  # a and b both beat it on score and spend
    # Worst on the first objective, best on the second: ASHA on score would stop it.
    assert at("d", 1, 0.1, 0.1) == TrialScheduler.CONTINUE
    assert at("e", 1, 2.5, 2.5) == TrialScheduler.CONTINUE  # b beats it, a and d do not: not a majority
    assert at("f", 3, 0.0, 9.0) == TrialScheduler.CONTINUE  # not a rung
    assert at("g", 1, float("nan"), 1.0) == TrialScheduler.CONTINUE  # its failure ends it, not the rule
    assert at("h", 2, 0.0, 9.0) == TrialScheduler.CONTINUE  # alone at rung 2
    restored = pickle.loads(pickle.dumps(rule))  # Tune saves it with the experiment
    assert restored.decide("c2", {"training_iteration": 1, "score": 0.0, "spend": 9.0}) == TrialScheduler.STOP


def test_several_objectives_get_the_pareto_rule_one_gets_asha():
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from accelsweep.sweeps.driver.run.lifecycle import _scheduler
    from accelsweep.sweeps.driver.run.schedulers import ParetoStoppingRule

    assert isinstance(_scheduler(plan()).scheduler, ASHAScheduler)
    both = plan(objectives=[Objective(*o) for o in BOTH])
    assert isinstance(_scheduler(both).scheduler, ParetoStoppingRule) and "Pareto rule" in both.describe()
    assert type(_scheduler(plan(base=TinyConfig(windows=1), objectives=[Objective(*o) for o in BOTH]))) is \
        FIFOScheduler  # one report: nothing to stop early


def test_a_contended_window_stops_no_trial_the_next_trustworthy_one_is_judged():
    """Real ASHA behind TrustedWindowsOnly: a good trial whose first window was contended
    (its figure a third of its real one) is not stopped at rung 1; its next window,
    quiet, is what ASHA records there. Without the wrapper, ASHA stops it."""
    import pickle

    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    from accelsweep.sweeps.driver.run.schedulers import TrustedWindowsOnly

    class Trial:
        def __init__(self, trial_id):
            self.trial_id = trial_id

    def asha():
        return ASHAScheduler(time_attr="training_iteration", metric="score", mode="max", max_t=8, grace_period=1,
                             reduction_factor=2)

    def run(scheduler):
        trials = [Trial(name) for name in ("a", "b", "c", "good")]
        for trial in trials:
            scheduler.on_trial_add(None, trial)
        for trial in trials[:3]:  # three trials recorded at rung 1, at 100
            scheduler.on_trial_result(None, trial, {"training_iteration": 1, "score": 100.0})
        first = scheduler.on_trial_result(None, trials[3], {"training_iteration": 1, "score": 40.0,
                                                            "window_contended": 1.0})
        if first == TrialScheduler.STOP:
            return first, None
        return first, scheduler.on_trial_result(None, trials[3], {"training_iteration": 2, "score": 120.0,
                                                                  "window_contended": 0.0})

    assert run(asha()) == (TrialScheduler.STOP, None)
    wrapped = TrustedWindowsOnly(asha())
    assert run(wrapped) == (TrialScheduler.CONTINUE, TrialScheduler.CONTINUE)
    assert wrapped.skipped == 1 and "contended windows skipped: 1" in wrapped.debug_string()
    # The quiet window was judged at rung 2 (the highest it reached); rung 1 still stops a slow trial.
    slow = Trial("slow")
    wrapped.on_trial_add(None, slow)
    assert wrapped.on_trial_result(None, slow, {"training_iteration": 1, "score": 10.0}) == TrialScheduler.STOP
    assert pickle.loads(pickle.dumps(wrapped)).skipped == 1  # Tune saves it with the experiment


def test_asha_stops_no_trial_within_the_noise_of_the_best():
    """Real ASHA at reduction factor 2 stops the lower half at rung 1: a trial 5% below
    the best is in that half, yet a contender; one 30% below is not spared. Minimising
    works the other way round."""
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    from accelsweep.sweeps.driver.run.schedulers import NEAR_BEST, TrustedWindowsOnly

    class Trial:
        def __init__(self, trial_id):
            self.trial_id = trial_id

    def judged(mode, figures, near=(True,)):
        asha = ASHAScheduler(time_attr="training_iteration", metric="score", mode=mode, max_t=3, grace_period=1,
                             reduction_factor=2)
        wrapped = TrustedWindowsOnly(asha, ("score", mode)) if near[0] else TrustedWindowsOnly(asha)
        decisions = []
        for index, figure in enumerate(figures):
            trial = Trial(str(index))
            wrapped.on_trial_add(None, trial)
            decisions.append(wrapped.on_trial_result(None, trial, {"training_iteration": 1, "score": figure}))
        return decisions, wrapped

    stop, go = TrialScheduler.STOP, TrialScheduler.CONTINUE
    assert NEAR_BEST == 0.10
    assert judged("max", [100.0, 95.0, 70.0], near=(False,))[0] == [go, stop, stop]  # plain ASHA
    decisions, wrapped = judged("max", [100.0, 95.0, 70.0])
    assert decisions == [go, go, stop] and wrapped.spared == 1 and "spared near the best: 1" in wrapped.debug_string()
    assert judged("min", [1.0, 1.05, 1.5])[0] == [go, go, stop]
    assert judged("max", [100.0, float("nan"), 95.0])[0][2] == go  # a NaN figure neither leads nor is compared


def test_the_spared_margin_is_the_windows_own_noise_once_three_trials_reported_it():
    """Until three trials reported a window cv and a host probe the recorded NEAR_BEST
    spares; then two standard deviations of a difference of two windows: a quiet run spares
    a trial 5% below the best no longer, a noisy one spares a trial 20% below."""
    import math

    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    from accelsweep.sweeps.driver.run.schedulers import NEAR_BEST, TrustedWindowsOnly

    class Trial:
        def __init__(self, trial_id):
            self.trial_id = trial_id

    def spared(window_cv, figures, probes=None):
        asha = ASHAScheduler(time_attr="training_iteration", metric="score", mode="max", max_t=3, grace_period=1,
                             reduction_factor=2)
        wrapped = TrustedWindowsOnly(asha, ("score", "max"))
        assert wrapped.margin == NEAR_BEST
        for index, (figure, probe) in enumerate(zip(figures, probes or [0.01] * len(figures))):
            trial = Trial(str(index))
            wrapped.on_trial_add(None, trial)
            decision = wrapped.on_trial_result(None, trial, {"training_iteration": 1, "score": figure,
                                                             "throughput_cv": window_cv, "host_probe_s": probe})
        return decision, wrapped

    decision, wrapped = spared(0.01, [100.0, 99.0, 98.0, 95.0])
    assert wrapped.margin == pytest.approx(2 * math.sqrt(2) * 0.01) and decision == TrialScheduler.STOP
    decision, wrapped = spared(0.10, [100.0, 99.0, 98.0, 80.0])
    assert wrapped.margin > 0.2 and decision == TrialScheduler.CONTINUE
    assert TrustedWindowsOnly(wrapped.scheduler, ("score", "max"), near_best=0.05).margin == 0.05
    # One window on a loaded host (its probe 60% slow) is not the host's drift between trials.
    decision, wrapped = spared(0.01, [100.0, 99.0, 98.0, 95.0], probes=[0.01, 0.01, 0.016, 0.01])
    assert wrapped.margin == pytest.approx(2 * math.sqrt(2) * 0.01) and decision == TrialScheduler.STOP


def test_a_trial_ending_on_a_contended_window_leaves_that_window_out_of_the_rungs():
    """Tune hands the scheduler a trial's last result again as it ends: a contended one is
    no more a figure to judge by then than when it was reported."""
    from ray.tune.schedulers import ASHAScheduler

    from accelsweep.sweeps.driver.run.schedulers import TrustedWindowsOnly

    class Trial:
        def __init__(self, trial_id):
            self.trial_id = trial_id

    wrapped = TrustedWindowsOnly(ASHAScheduler(time_attr="training_iteration", metric="score", mode="max", max_t=4,
                                               grace_period=1, reduction_factor=2))
    quiet, disturbed = Trial("quiet"), Trial("disturbed")
    for trial in (quiet, disturbed):
        wrapped.on_trial_add(None, trial)
    wrapped.on_trial_result(None, quiet, {"training_iteration": 1, "score": 100.0})
    last = {"training_iteration": 1, "score": 10.0, "window_contended": 1.0}
    wrapped.on_trial_result(None, disturbed, last)
    wrapped.on_trial_complete(None, disturbed, last)  # e.g. cut by the time budget after it
    assert dict(wrapped.scheduler._brackets[0]._rungs)[1] == {"quiet": 100.0}
    assert "disturbed" not in wrapped.scheduler._trial_info  # forgotten, as a completed trial is


def test_a_resumed_scheduler_is_fed_the_ended_trials_windows_and_stops_as_before():
    """Tune restores the scheduler as it was built: without the saved windows, ASHA's
    rungs and the best window start empty and the first trial after a resume is stopped
    by nothing. Replayed, a slow trial is stopped as it would have been without the
    resume; a trial that runs again is not fed its old windows; a contended window stays
    skipped."""
    from ray.tune.experiment import Trial as TuneTrial
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    from accelsweep.sweeps.driver.run.schedulers import TrustedWindowsOnly

    class Trial:
        def __init__(self, trial_id, status=TuneTrial.TERMINATED):
            self.trial_id, self.status = trial_id, status

        def is_finished(self):
            return self.status in (TuneTrial.TERMINATED, TuneTrial.ERROR)

    def wrapped():
        return TrustedWindowsOnly(ASHAScheduler(time_attr="training_iteration", metric="score", mode="max", max_t=4,
                                                grace_period=1, reduction_factor=2), ("score", "max"))

    def window(step, score, contended=0.0):
        return {"training_iteration": step, "score": score, "window_contended": contended,
                "throughput_cv": 0.01, "host_probe_s": 0.01}

    saved = {"a": {1: window(1, 100.0), 2: window(2, 101.0)}, "b": {1: window(1, 98.0), 2: window(2, 99.0)},
             "c": {1: window(1, 20.0, contended=1.0), 2: window(2, 97.0)},
             "again": {1: window(1, 5.0)}}  # was running at the kill: Tune runs it again from its start

    def slow_trial_after(scheduler):
        for trial in (Trial("a"), Trial("b"), Trial("c", TuneTrial.ERROR), Trial("again", TuneTrial.PENDING)):
            scheduler.on_trial_add(None, trial)
        slow = Trial("slow", TuneTrial.RUNNING)
        scheduler.on_trial_add(None, slow)
        return scheduler.on_trial_result(None, slow, window(1, 50.0))

    assert slow_trial_after(wrapped()) == TrialScheduler.CONTINUE  # nothing recorded at rung 1: nothing stops it
    resumed = wrapped()
    resumed.replay(saved)
    assert slow_trial_after(resumed) == TrialScheduler.STOP
    assert resumed.best == 101.0 and set(resumed.noise_seen) == {"a", "b", "c", "slow"}
    assert resumed.skipped == 1 and resumed.spared == 0  # c's contended window; the replay overrules nothing
    rungs = dict(resumed.scheduler._brackets[0]._rungs)
    assert set(rungs[1]) == {"a", "b", "slow"} and set(rungs[2]) == {"a", "b", "c"}  # c's quiet window at rung 2
    assert "again" not in rungs[1]  # it reports its windows anew
    again = Trial("again", TuneTrial.RUNNING)
    assert resumed.on_trial_result(None, again, window(1, 99.5)) == TrialScheduler.CONTINUE
    # A scheduler pickled by a sweep started before it kept windows is resumed as it was.
    old = wrapped()
    del old._replay
    assert slow_trial_after(old) == TrialScheduler.CONTINUE


# ---- process-wide settings and Ray ---------------------------------------------------

def test_sweep_settings_are_put_back(monkeypatch):
    from accelsweep.sweeps.driver.run.lifecycle import sweep_settings

    monkeypatch.delenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", raising=False)
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "60")  # the caller's own
    analysis = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level, verbosity = analysis.level, optuna.logging.get_verbosity()
    with pytest.raises(RuntimeError):
        with sweep_settings():
            assert os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1"
            assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "60"
            assert analysis.level == logging.ERROR and optuna.logging.get_verbosity() == optuna.logging.WARNING
            raise RuntimeError("a sweep that fails puts them back too")
    assert "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS" not in os.environ
    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "60"
    assert analysis.level == level and optuna.logging.get_verbosity() == verbosity


def test_an_address_other_than_the_running_instances_is_refused():
    from accelsweep.sweeps.driver.define.preflight import check_running_ray

    running = "10.1.2.3:6379"
    for same in (None, "local", "auto", "10.1.2.3:6379", "ray://10.1.2.3:10001"):
        check_running_ray(same, running)
    with pytest.raises(ConfigError, match=re.escape(
            "address must be the address of the Ray instance this process is connected to (10.1.2.3:6379), or "
            "auto; got '10.1.2.3:6380'. Ray is initialised already in this process, at 10.1.2.3:6379")):
        check_running_ray("10.1.2.3:6380", running)
    with pytest.raises(ConfigError, match="got '10.9.9.9:6379'"):
        check_running_ray("10.9.9.9:6379", running)
    # A local instance reports this machine's address; 127.0.0.1 and localhost name it too.
    import ray.util

    here = f"{ray.util.get_node_ip_address()}:6379"
    for same in ("127.0.0.1:6379", "localhost:6379"):
        check_running_ray(same, here)


def test_preflight_refuses_a_mismatched_address_before_anything_starts(monkeypatch, tmp_path):
    import ray

    from accelsweep import run_sweep

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address="10.1.2.3:6379"))
    store = tmp_path / "mlflow.db"
    with pytest.raises(ConfigError, match=r"^address must be the address of the Ray instance"):
        run_sweep(tiny_sweep("api", f"sqlite:///{store}", str(tmp_path / "ray"), address="10.1.2.4:6379"))
    assert not store.exists() and not (tmp_path / "ray").exists()


# ---- run_sweep again and again in one process -----------------------------------------

NOTEBOOK = """
import json, os, sys
import ray, ray.cloudpickle
import tests.test_driver_api as here
from accelsweep import Objective, run_sweep
from accelsweep.trainables.errors import ConfigError

ray.cloudpickle.register_pickle_by_value(here)  # Ray's workers cannot import tests/
os.environ.pop("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", None)  # as a user's process has it (conftest sets it)
tmp, seen = sys.argv[1], {}
figures = {"given_before": 1.0}
first = here.tiny_sweep("first", f"sqlite:///{tmp}/first.db", f"{tmp}/ray", parent_metrics=figures,
                        before_trials=lambda plan: {"measured_before": 2.0}, print_line=lambda line: None)
result = run_sweep(first)
seen["first"] = [result.parent_run_id, [r.run_id for r in result.records], result.best.number, result.tracking_uri]
seen["ray_after_first"] = ray.is_initialized()
seen["env_after_first"] = os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")
seen["parent_metrics_after"] = first.parent_metrics
result = run_sweep(here.tiny_sweep("second", f"sqlite:///{tmp}/second.db", f"{tmp}/ray",
                                   objectives=[Objective("score", "max"), Objective("spend", "min")]))
seen["second"] = [result.parent_run_id, [r.run_id for r in result.records], result.best.number, result.tracking_uri]
seen["second_pareto"] = [r.number for r in result.pareto]
seen["ray_after_second"] = ray.is_initialized()
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # the caller's own
try:
    run_sweep(here.tiny_sweep("third", f"sqlite:///{tmp}/third.db", f"{tmp}/ray", address="127.0.0.1:1"))
except ConfigError as error:
    seen["mismatch"] = str(error)
# The same store and experiment as the first sweep: its own parent run, its own trial.
result = run_sweep(here.tiny_sweep("first", f"sqlite:///{tmp}/first.db", f"{tmp}/ray", num_samples=1))
seen["third"] = [result.parent_run_id, [r.run_id for r in result.records]]
seen["ray_after_callers"] = ray.is_initialized()
print("SEEN " + json.dumps(seen))
"""


def mlflow_runs(tracking_uri, experiment):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


@pytest.mark.slow
def test_run_sweep_twice_in_one_process_leaves_two_sweeps_and_no_ray_of_its_own(tmp_path):
    done = subprocess.run([sys.executable, "-c", NOTEBOOK, str(tmp_path)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SEEN "))[5:])
    # The third sweep shares the first's store and experiment: each parent run must still
    # hold exactly its own trials.
    sweeps = {"first": seen["first"][:2], "second": seen["second"][:2], "third": seen["third"]}
    for name, store in (("first", "first"), ("second", "second"), ("third", "first")):
        parent_run_id, trial_run_ids = sweeps[name]
        parents, children = mlflow_runs(f"sqlite:///{tmp_path}/{store}.db", store)
        assert parent_run_id in [p.info.run_id for p in parents]
        own = [c for c in children if c.data.tags["mlflow.parentRunId"] == parent_run_id]
        assert sorted(c.info.run_id for c in own) == sorted(trial_run_ids)
        assert len(own) == (1 if name == "third" else 2)
        assert all(c.data.metrics["score"] > 0 for c in own)  # the user's own metric, logged
    assert len(mlflow_runs(f"sqlite:///{tmp_path}/first.db", "first")[0]) == 2  # two sweeps, one experiment
    for name in ("first", "second"):
        assert seen[name][3] == f"sqlite:///{tmp_path}/{name}.db" and seen[name][2] in (1, 2)
    first_parent = next(p for p in mlflow_runs(seen["first"][3], "first")[0] if p.info.run_id == seen["first"][0])
    assert math.isfinite(first_parent.data.metrics["best_score"])
    assert first_parent.data.metrics["given_before"] == 1.0 and first_parent.data.metrics["measured_before"] == 2.0
    assert seen["parent_metrics_after"] == {"given_before": 1.0}  # the caller's Sweep is not changed
    second_parent = mlflow_runs(seen["second"][3], "second")[0][0]
    assert {"best_score", "best_spend", "pareto_trials"} <= set(second_parent.data.metrics)
    assert seen["second_pareto"]
    # Ray started by a sweep is gone when it returns; the settings it needed too (Tune's
    # own loggers are on again for the user's own Tune runs).
    assert seen["ray_after_first"] is False and seen["ray_after_second"] is False
    assert seen["env_after_first"] is None
    # The caller's own Ray: an address that is not its own is refused, and it is left running.
    assert "address must be the address of the Ray instance this process is connected to" in seen["mismatch"]
    assert "got '127.0.0.1:1'" in seen["mismatch"]
    assert seen["ray_after_callers"] is True


def test_remeasure_runs_each_config_the_times_asked_interleaved_and_checks_them():
    from accelsweep import plan_sweep, remeasure

    sweep = tiny_sweep("r", "sqlite:///unused.db", None)
    again = remeasure(sweep, [{"knob": 3}, {"knob": 1}], times=3)
    assert [p["knob"] for p in again.points] == [3, 1, 3, 1, 3, 1] and again.num_samples == 6
    assert again.repeats and again.scheduler == "none" and again.reject_ratio is None and again.name == "r-remeasure"
    plan_sweep(again)  # valid points
    with pytest.raises(ConfigError, match=r"points\[0\]\.knob must be .*; got 7"):
        plan_sweep(remeasure(sweep, [{"knob": 7}], times=1))
    with pytest.raises(ConfigError, match=r"points\[0\] must be a mapping of the space's knobs \['knob'\]"):
        plan_sweep(remeasure(sweep, [{"b": 1}], times=1))
    with pytest.raises(ConfigError, match="times must be"):
        remeasure(sweep, [{"knob": 1}], times=0)


@pytest.mark.slow
def test_what_a_sweep_sets_in_the_environment_does_not_outlive_it(tmp_path, ray_session, monkeypatch):
    """Libraries imported during a sweep set variables (scikit-learn KMP_DUPLICATE_LIB_OK,
    torch's inductor TORCHINDUCTOR_CACHE_DIR, Ray PYTHONBREAKPOINT): after run_sweep the
    process's environment is as it was, whatever set what in between."""
    import os

    from accelsweep import run_sweep

    monkeypatch.delenv("KMP_DUPLICATE_LIB_OK", raising=False)
    monkeypatch.setenv("ACCELSWEEP_TEST_VARIABLE", "as the caller set it")
    before = dict(os.environ)

    def like_a_library(plan):  # in the driver, between the checks and the first trial
        os.environ["KMP_DUPLICATE_LIB_OK"] = "True"
        os.environ["ACCELSWEEP_TEST_VARIABLE"] = "changed"
        return {}

    run_sweep(tiny_sweep("environment", f"sqlite:///{tmp_path}/m.db", str(tmp_path / "ray"),
                         before_trials=like_a_library, print_line=lambda line: None, report=False))
    assert dict(os.environ) == before



@pytest.mark.slow
def test_a_sweep_starts_one_actor_of_its_own_for_its_board_and_its_trials_progress(tmp_path, ray_session):
    """Each actor is a Ray worker process (seconds of CPU to start): the sweep's board and
    its trials' progress share one (trainables/sweep_actor.py), and one name reaches both."""
    import ray
    import ray._private.state as state

    from accelsweep import run_sweep
    from accelsweep.trainables.loop.rejection import BoardLimits, TrialLimits
    from accelsweep.trainables.sweep_actor import start_sweep_actor

    before = set(state.actors())  # by actor id: the table is not in the order they started
    run_sweep(tiny_sweep("one-actor", f"sqlite:///{tmp_path}/m.db", str(tmp_path / "ray"),
                         print_line=lambda line: None, report=False))
    started = [entry["ActorClassName"] for actor_id, entry in state.actors().items() if actor_id not in before]
    others = {name for name in started if not name.endswith("ImplicitFunc")}  # the trials'
    assert others == {"SweepActor"} and started.count("SweepActor") == 1, started

    actor = start_sweep_actor("accelsweep-sweep-test", "max")
    try:
        ray.get([actor.offer.remote(2.0, 0.5), actor.offer.remote(3.0, 0.7), actor.offer.remote(1.0, 0.6)])
        limits = BoardLimits("accelsweep-sweep-test", TrialLimits("score")).for_trial()
        assert (limits.best, limits.typical_probe_s) == (3.0, 0.6)
        ray.get(actor.set_phase.remote("t1", "compiling", 1.0))
        ray.get(actor.append_output.remote("t1", b"a line\n"))
        assert ray.get(actor.phases.remote()) == {"t1": ("compiling", 1.0)}
        assert ray.get(actor.take_output.remote("t1")) == "a line\n" and ray.get(actor.phases.remote()) == {}
    finally:
        ray.kill(actor)
