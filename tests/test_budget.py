"""The budget goes where it can pay: slow configs rejected in their first steps, a
compile cut at its limit, no config measured twice, and verdicts with noise bounds."""

import json
import math
import threading
import time

import pytest
import torch

from accelsweep.sweeps.driver.run.callbacks import REJECTED, REUSED, TrialRecord
from accelsweep.sweeps.driver.reporting.verdict import verdict
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.rejection import CompileTimeout, SlowTrial, StepGuard, TrialLimits
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.loop.watchdog import TrialAborted, Watchdog

SLEEPY = "tests.budget_workload:Sleepy"
QUICK = dict(workload=SLEEPY, batch_size=8, warmup_steps=3, window_min_steps=3, window_min_s=0.05, windows=2)


# ---- the rule ------------------------------------------------------------------------

def test_the_rule_rejects_a_projection_worse_than_the_best_by_more_than_the_ratio():
    limits = TrialLimits("throughput_samples_per_s", "max", best=90.0, ratio=3.0)
    assert limits.verdict({"throughput_samples_per_s": 29.0}) == (
        "projected 29 throughput_samples_per_s, best so far 90: more than 3x worse")
    assert limits.verdict({"throughput_samples_per_s": 31.0}) is None
    cheaper = TrialLimits("usd_per_1m_samples", "min", best=2.0, ratio=3.0)
    assert cheaper.verdict({"usd_per_1m_samples": 6.5}) and cheaper.verdict({"usd_per_1m_samples": 5.0}) is None
    # No best yet (the baseline), or an objective the loop does not project: nothing rejected.
    assert TrialLimits("throughput_samples_per_s").verdict({"throughput_samples_per_s": 0.001}) is None
    assert limits.verdict({"gflops": 1.0}) is None


def test_the_step_deadline_is_where_the_projection_turns_hopeless():
    limits = TrialLimits("throughput_samples_per_s", "max", best=100.0, ratio=4.0)
    deadline = limits.step_deadline_s(lambda step_s: {"throughput_samples_per_s": 16 / step_s})
    assert deadline == pytest.approx(16 * 4.0 / 100.0, rel=1e-6)  # batch 16 at 25 samples/s
    assert limits.step_deadline_s(lambda step_s: {"other": step_s}) is None


@pytest.mark.parametrize("field, value", [("ratio", 1.0), ("ratio", "3"), ("max_compile_s", 0.0)])
def test_bad_limits_are_refused_by_name(field, value):
    with pytest.raises(ConfigError) as error:
        TrialLimits("throughput_samples_per_s", **{field: value})
    assert error.value.field in ("reject_ratio", "max_compile_s") and repr(value) in str(error.value)


# ---- the watchdog ----------------------------------------------------------------------

def busy(seconds: float) -> int:
    """Pure Python for ``seconds``: where an asynchronous exception lands."""
    end, spins = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        spins += 1
    return spins


def test_the_watchdog_abandons_a_stretch_that_runs_past_its_deadline():
    finished = False
    with Watchdog() as dog:
        with pytest.raises(SlowTrial):
            dog.expect(0.2, SlowTrial, "too slow")
            busy(30.0)
            finished = True
        assert dog.reason == "too slow"
    assert not finished


def test_a_stretch_cleared_in_time_raises_nothing_later():
    with Watchdog() as dog:
        dog.expect(0.3, SlowTrial, "too slow")
        busy(0.01)
        dog.clear()
        busy(0.6)  # past the old deadline: nothing may arrive
    busy(0.3)


def test_the_watchdog_watches_only_its_own_thread():
    caught = []

    def other():
        try:
            busy(0.6)
        except TrialAborted as error:  # pragma: no cover - the failure this test looks for
            caught.append(error)

    thread = threading.Thread(target=other)
    with Watchdog() as dog:
        thread.start()
        with pytest.raises(SlowTrial):
            dog.expect(0.1, SlowTrial, "mine")
            busy(30.0)
    thread.join()
    assert caught == []


def test_a_stretch_that_ends_in_its_own_error_keeps_that_error():
    with Watchdog() as dog:
        with pytest.raises(ValueError):
            dog.expect(0.2, SlowTrial, "too slow")
            raise ValueError("out of memory, say")
        dog.disarm()
        busy(0.6)  # past the deadline: the ValueError stands, nothing else arrives


def test_a_trial_starting_on_a_loaded_host_is_not_judged():
    limits = TrialLimits("throughput_samples_per_s", "max", best=1e9, typical_probe_s=1e-9)  # the host: far slower
    guard = StepGuard(limits, samples_per_step=8, units_per_step=lambda: 8.0, unit="samples",
                      usd_per_hour=float("nan"), compiling=False)
    assert not guard.limits.rejects and "slower than the sweep's typical (a loaded host)" in guard.note
    quiet = StepGuard(limits.with_board(1e9, 10.0), samples_per_step=8, units_per_step=lambda: 8.0, unit="samples",
                      usd_per_hour=float("nan"), compiling=False)
    assert quiet.limits.rejects and quiet.note == ""


def test_a_compile_past_its_limit_ends_as_compile_timeout():
    limits = TrialLimits("throughput_samples_per_s", max_compile_s=0.2)
    guard = StepGuard(limits, samples_per_step=8, units_per_step=lambda: 8.0, unit="samples",
                      usd_per_hour=float("nan"), compiling=True)
    with guard, pytest.raises(CompileTimeout):
        with guard.first_step():
            busy(30.0)  # a compile that would not end
    assert "ran past the limit of 0.2 s (--max-compile-s)" in guard.reason_of(CompileTimeout())


# ---- the loop ------------------------------------------------------------------------

@pytest.mark.host_timing  # the guard stands down while other processes take the trial's CPUs
@pytest.mark.slow
def test_a_hopeless_config_is_rejected_in_its_first_steps_with_its_projection():
    free = run_training(TrialConfig.make(**QUICK))
    assert not free.get("rejected") and free["windows_done"] == 2
    assert free["throughput_cv"] >= 0 and free["host_probe_s"] > 0 and free["warmup_step_s"] > 0
    # The host's speed at the trial's math, on a CPU: an fp32 matmul on the trial's threads.
    assert free["speed_probe_gflops"] > 0
    assert free["speed_probe_kind"] == f"float32 matmul, {torch.get_num_threads()} threads"

    best = free["throughput_samples_per_s"]
    limits = TrialLimits("throughput_samples_per_s", "max", best=best)
    slow = run_training(TrialConfig.make(**QUICK, sleep_s=0.3), limits=limits)
    assert slow["rejected"] == 1 and slow["windows_done"] == 0 and slow["measured_steps"] == 0
    assert slow["throughput_samples_per_s"] < best / 3  # its projection, what the searcher is told
    assert "more than 3x worse" in slow["rejection"] and f"best so far {best:.4g}" in slow["rejection"]

    # The same config against a best it can reach runs to its end.
    reachable = run_training(TrialConfig.make(**QUICK), limits=limits.with_board(best * 1.2, None))
    assert not reachable.get("rejected") and reachable["windows_done"] == 2


def test_the_speed_probe_times_a_matmul_in_the_dtype_asked_for(monkeypatch):
    from accelsweep.trainables.timing import windows as measure

    seen = []
    monkeypatch.setattr(measure, "time_window", lambda step, sync, steps, seconds: seen.append(step()) or
                        measure.Window(steps=1, seconds=0.01, step_seconds=[0.01]))
    assert measure.matmul_probe_gflops("bfloat16", size=64) == pytest.approx(2 * 64 ** 3 / 0.01 / 1e9)
    assert seen[0].dtype == torch.bfloat16 and seen[0].shape == (64, 64)
    monkeypatch.undo()  # and for real: a finite speed from the real timer
    real = measure.matmul_probe_gflops("float32", seconds=0.005, size=64)
    assert math.isfinite(real) and real > 0 and real != pytest.approx(2 * 64 ** 3 / 0.01 / 1e9)


# ---- no config twice -------------------------------------------------------------------

def test_a_repeated_proposal_is_answered_from_its_first_result():
    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch, config_key, searched_out, take_reuses

    def space(trial):
        trial.suggest_categorical("a", [1, 2])

    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="unit",
                                        sampler=optuna.samplers.RandomSampler(seed=0))
    ran = []
    for number in range(4):
        config = searcher.suggest(f"t{number}")
        if config == "FINISHED":
            break
        ran.append(config_key(config))
        searcher.on_trial_result(f"t{number}", {"score": float(config["a"]), "training_iteration": 1})
        searcher.on_trial_complete(f"t{number}", {"score": float(config["a"])})
    assert sorted(ran) == sorted({config_key({"a": 1}), config_key({"a": 2})})  # each once, then searched out
    # The last call heard only repeats until the space was used up: those end the search
    # unrecorded; repeats on the way to a new config are recorded, once per config.
    assert searched_out("unit") and searcher.reused >= 1
    assert all(config in ({"a": 1}, {"a": 2}) for config, _ in take_reuses("unit"))
    told = [t for t in searcher._ot_study.trials if t.state.name == "COMPLETE"]
    assert len(told) == 2 + searcher.reused  # Optuna heard every repeat, with the first result's value
    assert {t.params["a"]: t.value for t in told} == {1: 1.0, 2: 2.0}


def test_a_used_up_grid_ends_the_search_instead_of_failing():
    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch, searched_out

    def space(trial):
        trial.suggest_categorical("a", [1, 2])

    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="grid-unit",
                                        sampler=optuna.samplers.GridSampler({"a": [1, 2]}, seed=0))
    proposals = []
    for number in range(4):
        config = searcher.suggest(f"t{number}")
        proposals.append(config)
        if config == "FINISHED":
            break
        searcher.on_trial_complete(f"t{number}", {"score": float(config["a"])})
    assert sorted(p["a"] for p in proposals[:2]) == [1, 2] and proposals[2] == "FINISHED"
    assert searched_out("grid-unit")


def test_a_proposal_of_a_config_still_running_waits_for_its_result():
    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    def space(trial):
        trial.suggest_categorical("a", [1])

    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="running-unit",
                                        sampler=optuna.samplers.RandomSampler(seed=0))
    assert searcher.suggest("t0") == {"a": 1}
    assert searcher.suggest("t1") is None  # t0 still runs: nothing to propose yet, nothing reused
    searcher.on_trial_complete("t0", {"score": 1.0})
    assert searcher.suggest("t1") == "FINISHED"  # now measured: answered from t0, and the space is used up


# ---- the local search around the leader ------------------------------------------------

def test_neighbours_are_one_choice_away_on_one_knob():
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from accelsweep.sweeps.driver.run.searchers import neighbours

    distributions = {"batch_size": CategoricalDistribution([8, 16, 32, 64]),
                     "num_workers": CategoricalDistribution([0, 1, 2]),
                     "channels_last": CategoricalDistribution([False, True]),
                     "lr": IntDistribution(1, 10)}  # not a list of choices: not stepped
    found = neighbours({"batch_size": 32, "num_workers": 0, "channels_last": True, "lr": 3}, distributions)
    assert [step for _, step in found] == ["batch_size 32 -> 64", "batch_size 32 -> 16", "num_workers 0 -> 1",
                                           "channels_last True -> False"]
    assert found[0][0] == {"batch_size": 64, "num_workers": 0, "channels_last": True, "lr": 3}


def test_the_last_proposals_step_from_the_leader_to_unmeasured_neighbours():
    """Three start points far from the best corner: the local search climbs there, one knob
    one choice at a time, from whichever config leads at its turn."""
    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch, config_key, local_proposals

    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16, 32, 64])
        trial.suggest_categorical("threads", [1, 2])

    def score(config):  # larger batches and two threads are better
        return config["batch_size"] * config["threads"] + config["threads"]

    start = [{"batch_size": 8, "threads": 1}, {"batch_size": 16, "threads": 1}, {"batch_size": 8, "threads": 2}]
    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="local-unit", budget=6,
                                        local_search=3, points_to_evaluate=start,
                                        sampler=optuna.samplers.RandomSampler(seed=3))
    ran = []
    for number in range(6):
        config = searcher.suggest(f"t{number}")
        if config is None or config == "FINISHED":
            break
        ran.append(config)
        searcher.on_trial_complete(f"t{number}", {"score": float(score(config))})
    assert len(ran) == 6 and len({config_key(c) for c in ran}) == 6  # nothing measured twice
    steps = local_proposals("local-unit")
    assert len(steps) == 3 and all(config_key(c) in steps for c in ran[3:])  # the last three were the local search
    assert ran[:3] == start
    assert ran[3:] == [{"batch_size": 16, "threads": 2}, {"batch_size": 32, "threads": 2},
                       {"batch_size": 64, "threads": 2}]  # each the first step up from the leader of its time
    assert list(steps.values()) == ["batch_size 8 -> 16", "batch_size 16 -> 32", "batch_size 32 -> 64"]


def test_the_local_search_steps_from_the_leader_at_the_hosts_typical_speed():
    """On a drifting VM a config measured in a fast moment leads by raw figure; its speed
    probe says so. The local search steps from the leader at the host's typical speed (the
    confirmation ranks so too), and from the raw one when a trial has no probe."""
    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16, 32])
        trial.suggest_categorical("threads", [1, 2])

    # (config, score, its probe in GFLOP/s): b8/t2 measured while the host ran 30% fast.
    start = [({"batch_size": 8, "threads": 2}, 110.0, 130.0), ({"batch_size": 16, "threads": 1}, 100.0, 100.0),
             ({"batch_size": 8, "threads": 1}, 60.0, 100.0)]

    def first_step(token, probes=True):
        searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token=token, budget=4,
                                            local_search=1, points_to_evaluate=[c for c, _, _ in start],
                                            sampler=optuna.samplers.RandomSampler(seed=0))
        for number, (config, score, probe) in enumerate(start):
            assert searcher.suggest(f"t{number}") == config
            result = {"score": score, **({"speed_probe_gflops": probe, "speed_probe_kind": "float32/2"} if probes else {})}
            searcher.on_trial_complete(f"t{number}", result)
        return searcher.suggest("t3")

    # At typical speed b8/t2 is 110 x 100/130 = 85 against b16/t1's 100: b16/t1 leads, b32/t1 is its step.
    assert first_step("typical-leader") == {"batch_size": 32, "threads": 1}
    assert first_step("raw-leader", probes=False) == {"batch_size": 16, "threads": 2}  # from b8/t2: batch 8 -> 16


def test_a_leader_on_the_batch_edge_makes_the_next_batch_tried_while_it_leads_and_memory_allows():
    """On a 2-core Sapphire Rapids both tools' winners sat on batch 64, the space's largest, and 256 measured
    10% faster in a plain loop. Past the edge: 128 while 64 leads, 256 while 128 does; a
    step that does not lead ends the climb; memory bounds it; the steps are labelled."""
    import math

    import optuna

    from accelsweep.sweeps.driver.define.edges import edge_lines, fits_memory
    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch, config_key, local_proposals

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        trial.suggest_categorical("precision", ["fp32", "bf16"])

    def run(token, best_batch, capacity_mb=math.inf, count=8, edge_steps=None):
        searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token=token, budget=count,
                                            points_to_evaluate=[{"batch_size": 64, "precision": "bf16"}],
                                            sampler=optuna.samplers.RandomSampler(seed=0),
                                            edges={"batch_size": ("x2", 1024)}, edge_steps=edge_steps)
        ran = []
        for number in range(count):
            config = searcher.suggest(f"t{number}")
            if not isinstance(config, dict):
                break
            ran.append(config)
            batch = config["batch_size"]  # faster up to best_batch, slower past it (clearly: halved per doubling)
            score = (batch if batch <= best_batch else best_batch ** 2 / batch / 2) * (
                2 if config["precision"] == "bf16" else 1)
            searcher.on_trial_result(f"t{number}", {"score": float(score), "training_iteration": 1})
            searcher.on_trial_complete(f"t{number}", {"score": float(score), "peak_memory_mb": 500.0 + batch,
                                                      "workload_memory_mb": float(batch),
                                                      "memory_capacity_mb": capacity_mb})
        return ran, searcher

    ran, searcher = run("edge-climb", best_batch=256)
    # 64 leads at once: 128, then 256 while each leads; 512 measures worse: no 1024, back to TPE.
    assert [c["batch_size"] for c in ran[:4]] == [64, 128, 256, 512]
    assert all(c["batch_size"] <= 64 for c in ran[4:])
    steps = local_proposals("edge-climb")
    assert steps[config_key({"batch_size": 128, "precision": "bf16"})] == "batch_size 64 -> 128 past the space's edge"
    assert searcher.budget == 8 and len(ran) == 8  # every step a trial of the budget
    # A quarter of the budget at most (plan.edge_trials): the rest is the search's.
    ran, _ = run("edge-share", best_batch=256, edge_steps=1)
    assert [c["batch_size"] for c in ran].count(128) == 1 and all(c["batch_size"] <= 128 for c in ran)
    # Inside the space, a leader off the edge steps nowhere past it.
    ran, _ = run("edge-inside", best_batch=32, count=4)
    assert all(c["batch_size"] <= 128 for c in ran) and [c["batch_size"] for c in ran].count(128) <= 1
    # Memory: 564 MB peak at 64 with 64 MB of workload; 128 predicts 628 MB, over 0.8 x 700.
    assert fits_memory((564.0, 64.0, 1000.0), 2.0) and not fits_memory((564.0, 64.0, 700.0), 2.0)
    ran, _ = run("edge-memory", best_batch=256, capacity_mb=700.0, count=4)
    assert all(c["batch_size"] <= 64 for c in ran)
    # The summary's line.
    moved = [TrialRecord(n, f"t{n}", {"batch_size": b}, {}, {}, False, 0.0, status="finished", measured_by="score",
                         result={"score": s, "local_step": f"batch_size {b // 2} -> {b} past the space's edge"})
             for n, b, s in ((2, 128, 150.0), (3, 256, 140.0))]
    assert edge_lines(moved, "score") == [
        "the space's edge moved (2 trial(s) past it, one step each while the leader sat on the edge or near it): "
        "batch_size 64 -> 128 (trial 2: 150); batch_size 128 -> 256 (trial 3: 140)"]


def test_the_climb_skips_a_step_that_cannot_measure_a_window_in_the_time_left():
    """A batch of 1024 (4.6 s a step on 2 cores) was proposed with 15 s of the search left
    and cut before its first figure. A step is proposed only while the base's setup, and
    its warm-up and one window scaled by the batch's ratio, fit what is left."""
    import time

    import optuna

    from accelsweep.sweeps.driver.define.edges import first_figure_s, fits_time
    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    # 2 s of setup, 9 s of loop of which 6 s measured in 3 windows: 3 s of warm-up and 2 s a window.
    result = {"setup_s": 2.0, "loop_s": 9.0, "measured_s": 6.0, "windows_done": 3}
    assert first_figure_s(result) == (2.0, 5.0)
    # Twice the batch: the setup as it was, the warm-up and window twice as long: 12 s.
    assert fits_time((2.0, 5.0), 2.0, 12.0) and not fits_time((2.0, 5.0), 2.0, 11.9)
    assert fits_time((2.0, float("nan")), 2.0, 1.0) and fits_time((2.0, 5.0), 2.0, None)  # unknown: tried

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])

    def climbs(token, seconds_left):
        searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token=token, budget=3,
                                            points_to_evaluate=[{"batch_size": 64}],
                                            sampler=optuna.samplers.RandomSampler(seed=0),
                                            edges={"batch_size": ("x2", 1024)}, ends_at=time.time() + seconds_left)
        assert searcher.suggest("t0") == {"batch_size": 64}
        searcher.on_trial_complete("t0", {"score": 200.0, **result})
        return searcher.suggest("t1")["batch_size"]

    assert climbs("time-enough", 60.0) == 128
    assert climbs("time-short", 10.0) != 128  # 12 s to its first window: TPE's proposal instead


def test_the_climb_goes_on_past_a_step_the_run_cannot_tell_from_the_leader():
    """On a plateau one trial per batch ranks 64, 128 and 256 by the host's noise: a step
    within the run's near-best margin of the leader (here the prior 10%: too few trials
    measured their noise) is climbed past, one clearly worse is not."""
    import optuna

    from accelsweep.sweeps.driver.define.edges import climb_base
    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])
        trial.suggest_categorical("precision", ["fp32", "bf16"])

    def batches(token, scores):
        searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token=token, budget=4,
                                            points_to_evaluate=[{"batch_size": 64, "precision": "bf16"}],
                                            sampler=optuna.samplers.RandomSampler(seed=0),
                                            edges={"batch_size": ("x2", 1024)})
        ran = []
        for number in range(4):
            config = searcher.suggest(f"t{number}")
            ran.append(config["batch_size"])
            score = scores.get(config["batch_size"], 10.0) if config["precision"] == "bf16" else 10.0
            searcher.on_trial_complete(f"t{number}", {"score": score})
        return ran

    # 128 measured 4% below 64, inside the margin: 256 next (and 512, 256 leading by 3%).
    assert batches("plateau", {64: 200.0, 128: 192.0, 256: 206.0, 512: 150.0})[:4] == [64, 128, 256, 512]
    # 128 measured 15% below 64: the climb ends there.
    assert 256 not in batches("cliff", {64: 200.0, 128: 170.0})
    # Only a config that differs from the leader in the knob alone carries the climb.
    leader = {"batch_size": 64, "precision": "bf16"}
    figures = [(leader, 200.0), ({"batch_size": 128, "precision": "fp32"}, 199.0),
               ({"batch_size": 128, "precision": "bf16"}, 185.0)]
    assert climb_base(leader, "batch_size", figures, 0.05, "max") == leader
    assert climb_base(leader, "batch_size", figures, 0.10, "max") == {"batch_size": 128, "precision": "bf16"}


def test_a_sweep_steps_past_its_edge_when_it_asks_and_the_main_job_asks_but_in_a_smoke_run():
    from accelsweep import Sweep, plan_sweep
    from accelsweep.sweeps.driver.run.lifecycle import _edges
    from accelsweep.sweeps.neuron_vit import build_sweep, parser
    from accelsweep.trainables.trainable import train_trainable

    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16])
        trial.suggest_categorical("threads", [1, 2])

    def sweep(**options):
        return Sweep(name="edges", trainable=train_trainable, space=space,
                     base=TrialConfig.make(model="vit-micro", cpus_per_worker=2, batch_size=8, threads=1),
                     tracking_uri="sqlite:///unused.db",
                     **options)

    assert _edges(plan_sweep(sweep())) == {}  # a user's own space, as written
    assert _edges(plan_sweep(sweep(past_edge=True))) == {"batch_size": ("x2", None), "threads": ("+1", 2)}
    assert _edges(plan_sweep(sweep(past_edge=True, repeats=True))) == {}
    assert build_sweep(parser().parse_args(["--platform", "cpu"])).past_edge
    assert not build_sweep(parser().parse_args(["--platform", "cpu", "--smoke"])).past_edge


def test_a_resumed_sweep_learns_and_reruns_its_steps_past_the_edge_without_asking_optuna_for_them():
    """A step past the edge is no Optuna trial: a resume that found one measured after
    Tune's save, and another cut off by the kill, must not enqueue them in Optuna (their
    batch is not among the space's choices: Optuna refuses the ask)."""
    import optuna

    from accelsweep.sweeps.driver.record.resumed_runs import MeasuredRun, ResumeNews, tell_resumed
    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch, config_key

    def space(trial):
        trial.suggest_categorical("batch_size", [16, 32, 64])

    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="edge-resume", budget=8,
                                        points_to_evaluate=[{"batch_size": 64}],
                                        sampler=optuna.samplers.RandomSampler(seed=0),
                                        edges={"batch_size": ("x2", 1024)})
    assert searcher.suggest("t0") == {"batch_size": 64}
    searcher.on_trial_complete("t0", {"score": 64.0})
    assert searcher.suggest("t1") == {"batch_size": 128}  # in flight when the driver was killed
    restored = searcher  # as Tune restored it (its state saved with t1 in flight)
    tell_resumed("edge-resume", ResumeNews(
        measured=[MeasuredRun("t1", {"batch_size": 128}, {"score": 128.0}, False),
                  MeasuredRun("t2", {"batch_size": 256}, {"score": 100.0}, False)],  # proposed after the save
        again=[{"batch_size": 512}], tune_trials={"t0", "t1"}))
    again = restored.suggest("t3")
    assert again == {"batch_size": 512}, again  # the cut-off step first, through the edge path
    restored.on_trial_complete("t3", {"score": 90.0})
    following = []
    for number in (4, 5):
        following.append(restored.suggest(f"t{number}"))
        restored.on_trial_complete(f"t{number}", {"score": 1.0})
    assert sorted(c["batch_size"] for c in following) == [16, 32], following  # Optuna's, inside the space
    assert config_key({"batch_size": 256}) in restored._outcomes  # known: not proposed again


def test_the_local_search_begins_early_when_its_time_comes():
    """A time budget ends a search before its last proposals: past ``local_after`` every
    proposal steps from the leader, however many proposals are left."""
    import time

    import optuna

    from accelsweep.sweeps.driver.run.searchers import FailureAwareOptunaSearch

    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16, 32, 64])

    searcher = FailureAwareOptunaSearch(space, metric="score", mode="max", sweep_token="local-time", budget=20,
                                        local_search=1, local_after=time.time() - 1,
                                        points_to_evaluate=[{"batch_size": 8}],
                                        sampler=optuna.samplers.RandomSampler(seed=0))
    ran = []
    for number in range(4):
        config = searcher.suggest(f"t{number}")
        ran.append(config["batch_size"])
        searcher.on_trial_complete(f"t{number}", {"score": float(config["batch_size"])})
    assert ran == [8, 16, 32, 64]  # a climb, one step at a time, with 16 proposals still left


# ---- verdicts -------------------------------------------------------------------------

def record(number, value, cv, probe=0.001, baseline=False):
    return TrialRecord(number, f"t{number}", {}, {}, {}, baseline, 0.0, status="finished",
                       result={"throughput_samples_per_s": value, "throughput_cv": cv, "host_probe_s": probe},
                       measured_by="throughput_samples_per_s")


def test_a_lead_beyond_the_noise_beats_the_baseline_and_one_within_it_does_not():
    base = record(1, 100.0, 0.02, baseline=True)
    clear_win = verdict(base, record(2, 120.0, 0.02), "throughput_samples_per_s", "max", [base])
    assert clear_win.beats_baseline and "beats it beyond the measured noise of +-5.7%" in clear_win.text
    within = verdict(base, record(2, 104.0, 0.02), "throughput_samples_per_s", "max", [base])
    assert not within.beats_baseline
    assert within.text.startswith("no config beat the baseline by more than the measured noise of +-5.7%")
    slower = record(2, 90.0, 0.02)
    itself = verdict(base, base, "throughput_samples_per_s", "max", [base, slower])
    assert not itself.beats_baseline and "measured best itself" in itself.text and itself.decided
    alone = verdict(base, base, "throughput_samples_per_s", "max", [base])  # seen on the H100: the budget ran out
    assert not alone.decided and alone.text.startswith("not decided: the baseline is the only config measured")


def test_a_figure_taken_on_a_loaded_host_is_not_trusted():
    base = record(1, 100.0, 0.01, probe=0.001, baseline=True)
    lucky = record(2, 150.0, 0.01, probe=0.002)  # the machine ran at half speed meanwhile
    others = [record(n, 90.0, 0.01, probe=0.001) for n in (3, 4)]
    judged = verdict(base, lucky, "throughput_samples_per_s", "max", [base, lucky, *others])
    assert not judged.beats_baseline and judged.text.startswith("not trusted: trial 2 ran while the host was loaded")


# ---- a tiny sweep ---------------------------------------------------------------------

@pytest.mark.host_timing
@pytest.mark.slow
def test_a_tiny_sweep_rejects_the_slow_config_and_runs_no_config_twice(tmp_path, ray_session):
    from accelsweep import Objective, Sweep, run_sweep
    from accelsweep.sweeps.driver.run.searchers import config_key
    from accelsweep.trainables.trainable import train_trainable
    from tests.test_sweep_e2e import mlflow_runs

    def space(trial):
        trial.suggest_categorical("width", [8, 16])
        trial.suggest_categorical("sleep_s", [0.0, 0.3])

    uri = f"sqlite:///{tmp_path}/m.db"
    lines = []
    result = run_sweep(Sweep(name="budget", trainable=train_trainable, base=TrialConfig.make(**QUICK), space=space,
                             objectives=[Objective("throughput_samples_per_s", "max")], num_samples=6,
                             max_concurrent_trials=1,  # the slow ones start after a best exists
                             tracking_uri=uri, storage_path=str(tmp_path / "ray"), print_line=lines.append))
    ran = [r for r in result.records if r.status != REUSED]
    keys = [config_key(r.searched) for r in ran]
    assert len(keys) == len(set(keys)) == 4  # the space's four configs, each run once
    reused = [r for r in result.records if r.status == REUSED]
    assert reused and all(r.reused_from in {o.number for o in ran} for r in reused)
    slow = [r for r in ran if r.searched["sleep_s"] == 0.3]
    # A trial on a loaded host is not judged (a good config would project slow there too)
    # and says so in its result: it is then ranked like any other, and only the judged ones
    # must have been rejected. CI's host is shared; if none could be judged, nothing was tested.
    unjudged = [r for r in slow if r.result.get("rejection_off")]
    judged = [r for r in slow if r not in unjudged]
    assert all(r.status != REJECTED for r in unjudged), [(r.number, r.status) for r in unjudged]
    if not judged:
        pytest.skip(f"the host was loaded through both slow trials: {[r.result['rejection_off'] for r in slow]}")
    assert all(r.status == REJECTED and r.result["windows_done"] == 0 for r in judged), \
        [(r.number, r.status, r.result.get("windows_done"), r.result.get("rejection")) for r in judged]
    assert all("more than 3x worse" in r.result["rejection"] for r in judged)
    assert result.best is not None and result.best.searched["sleep_s"] == 0.0
    assert "verdict: " in result.summary and f"rejected in their first steps: {len(judged)} trial(s)" in result.summary

    parents, children = mlflow_runs(uri, "budget")
    tags = {run.data.tags["trial_number"]: run.data.tags for run in children}
    for r in judged:
        assert tags[str(r.number)]["status"] == REJECTED and "more than 3x worse" in tags[str(r.number)]["rejection"]
    for r in reused:
        assert tags[str(r.number)]["reused_from_trial"] == str(r.reused_from)
    parent = parents[0].data
    assert parent.metrics["rejected_trials"] == len(judged) and parent.metrics["reused_proposals"] == len(reused)
    assert parent.tags["verdict"] and "verdict_change_pct" in parent.metrics
    assert json.loads(tags[str(slow[0].number)]["searched"])["sleep_s"] == 0.3
