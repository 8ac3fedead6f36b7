"""The confirmation in turns (trainables/turns.py, sweeps/driver/run/confirm.py): configs alive
at once, one measuring a window at a time, in rotated rounds; nobody measures before all
are ready; a trial that ends or goes silent gives up its turns; the rounds are read back
from the trials' records alone."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from accelsweep.sweeps.driver.run.confirm import (TURN_FIGURES, _turn_seconds, judge, measurements, round_orders,
                                                   turn_rounds, turns_refused)
from accelsweep.sweeps.driver.run.lifecycle import _shared_resources
from accelsweep.sweeps.driver.record.trial_record import FINISHED, TrialRecord
from accelsweep.sweeps.driver.reporting.verdict import SITTING_NOISE
from accelsweep.trainables.turns import TurnBaton, drain_steps, trial_turns, current_turns, turn_key


def test_the_baton_gives_no_turn_before_every_config_is_ready_then_follows_the_order():
    baton = TurnBaton(["a", "b", "b", "a"])
    baton.ready("a")
    assert baton.turn("a") == "wait"  # b still warms up: a's window would run beside it
    baton.ready("b")
    assert [baton.turn("a"), baton.turn("b")] == ["go", "wait"]
    baton.done("a")
    baton.done("a")  # not a's turn: it moves nothing
    assert [baton.turn("a"), baton.turn("b")] == ["wait", "go"]
    baton.done("b")
    baton.done("b")
    assert baton.turn("a") == "go"
    baton.done("a")
    assert [baton.turn("a"), baton.turn("b")] == ["over", "over"]
    assert baton.state()["measured"] == ["a", "b", "b", "a"]


def test_a_config_that_leaves_gives_up_its_turns_and_a_silent_one_is_passed_over():
    baton = TurnBaton(["a", "b", "c", "b", "c", "a"])
    for key in "abc":
        baton.ready(key)
    baton.done("a")
    baton.leave("b")  # its trial failed: the others go on without it
    assert baton.turn("c") == "go" and baton.turn("b") == "over"
    baton.done("c")
    assert baton.turn("c") == "go"
    silent = TurnBaton(["a", "b", "a", "b"], stall_s=0.05)
    silent.ready("a")  # b never starts (not placed, or died before a word)
    time.sleep(0.1)
    assert silent.turn("a") == "go" and silent.state()["passed_over"] == ["b"]


def test_a_waiting_trial_is_answered_when_the_baton_moves_without_asking_again():
    import asyncio

    baton = TurnBaton(["a", "b"])
    baton.ready("a")
    baton.ready("b")

    async def waits():
        b_waits = asyncio.ensure_future(baton.wait_turn("b", longest_s=10.0))
        await asyncio.sleep(0.05)
        assert not b_waits.done()  # a's window is on
        started = time.monotonic()
        baton.done("a")  # the baton moves: b is answered at once, not at a poll
        return await asyncio.wait_for(b_waits, timeout=1.0), time.monotonic() - started

    answer, after_s = asyncio.run(waits())
    assert answer == "go" and after_s < 0.5
    # Unanswered, the call returns 'wait' after its longest (the trial calls again)...
    assert asyncio.run(TurnBaton(["a", "b"]).wait_turn("b", longest_s=0.05)) == "wait"
    # ... and a holder silent past the stall is passed over while others wait.
    silent = TurnBaton(["a", "b"], stall_s=0.1)
    silent.ready("b")
    assert asyncio.run(silent.wait_turn("b", longest_s=1.0)) == "go" and silent.passed_over == ["a"]


def test_the_configs_turns_in_rounds_are_rotated_and_the_drain_covers_the_prefetch():
    assert round_orders(["base", "x", "y"], 3) == [["base", "x", "y"], ["x", "y", "base"], ["y", "base", "x"]]
    assert drain_steps(0) == 0 and drain_steps(2) == 4  # torch's DataLoader prefetches 2 batches a worker


def record(number, knob, value, *, baseline=False, figures=None, wall_s=20.0, measured_s=6.0, **config):
    result = {"score": value, "windows_done": 3, "measured_s": measured_s, "step_time_p50_s": 0.1}
    if figures is not None:
        result[TURN_FIGURES] = json.dumps(figures)
    return TrialRecord(number=number, trial_id=f"t{number}", searched={"knob": knob}, config={"knob": knob, **config},
                       resources={}, is_baseline=baseline, created_at=0.0, status=FINISHED, measured_by="score",
                       result=result, wall_s=wall_s)


def test_turn_figures_are_rounds_a_window_each_and_the_verdict_is_read_from_them():
    search = [record(1, 2, 100.0, baseline=True), record(2, 1, 190.0)]
    # Both drift together (the host's level), the candidate stays ~2x the baseline in each round.
    base = record(10, 2, 0.0, baseline=True, figures=[[100, False], [80, False], [120, False], [90, True]])
    fast = record(11, 1, 0.0, figures=[[200, False], [161, False], [238, False]])
    rounds = measurements([base, fast], "score")
    assert rounds == [{base_key(2): (100.0, False), base_key(1): (200.0, False)},
                      {base_key(2): (80.0, False), base_key(1): (161.0, False)},
                      {base_key(2): (120.0, False), base_key(1): (238.0, False)},
                      {base_key(2): (90.0, True)}]
    never = record(12, 3, float("nan"), figures=[])  # started, never got a turn: no round of its own
    assert measurements([base, fast, never], "score") == rounds
    judged = judge(search, [base, fast], "score", "max")
    assert judged.rounds == 4 and judged.verdict.beats_baseline and "trial 2's config" in judged.verdict.text
    assert 0.95 < judged.verdict.change < 1.05  # +100%: the drift of the baseline's level cancels in each round
    # Every round was taken in one sitting: the interval holds what that sitting cannot average
    # away (verdict.SITTING_NOISE); rounds of whole trials are as many sittings, and do not.
    [fast_judged] = judged.candidates
    assert math.log1p(fast_judged.high) - math.log1p(fast_judged.gain) >= 1.96 * SITTING_NOISE
    whole = []
    for index, (base_figure, fast_figure) in enumerate([(100, 200), (80, 161), (120, 238)]):
        for knob, value in ((2, base_figure), (1, fast_figure)):
            whole.append(record(20 + len(whole), knob, value, baseline=knob == 2))
            whole[-1].result["confirm_round"] = index + 1
    [whole_judged] = judge(search, whole, "score", "max").candidates
    assert math.log1p(whole_judged.high) - math.log1p(whole_judged.gain) < 1.96 * SITTING_NOISE


def base_key(knob):
    return turn_key({"knob": knob})


def test_turns_fill_the_time_left_after_the_configs_start_together():
    configs = [record(1, 2, 100.0, baseline=True, wall_s=14.0, measured_s=6.0),  # 8 s to start, 2 s windows
               record(2, 1, 190.0, wall_s=10.0, measured_s=6.0, num_workers=2)]  # 4 s; 2 s + 5 steps of 0.1 s
    # 60 s left: 12 s to start both, then rounds of 2.1 + 2.5 s: 10, less one as a margin.
    assert turn_rounds(configs, configs, windows=3, rounds=3, seconds_left=60.0) == 9
    assert turn_rounds(configs, configs, windows=3, rounds=3, seconds_left=600.0) == 30  # capped
    assert turn_rounds(configs, configs, windows=3, rounds=3, seconds_left=None) == 9  # as many windows as rounds


def test_a_turn_measures_to_the_time_floor_not_the_searchs_step_floor():
    """A batch of 256 on 2 cores steps in 1.1 s: the search's floor of 5 steps made each of
    its turns 5.5 s where the others' took 2 s. In turns the step floor is TURN_WINDOW_STEPS;
    the time floor stays, and the confirmation's plan counts turns the same way."""
    import types

    from accelsweep.trainables.loop.train_loop import _Trial
    from accelsweep.trainables.turns import TURN_WINDOW_STEPS

    trial = types.SimpleNamespace(config=types.SimpleNamespace(window_min_steps=5, window_min_s=2.0),
                                  world=types.SimpleNamespace(size=1))
    assert _Trial.window_bounds(trial, 1.1) == (5, 2.0)
    assert _Trial.window_bounds(trial, 1.1, in_turns=True) == (TURN_WINDOW_STEPS, 2.0) == (2, 2.0)
    trial.config.window_min_steps = 1
    assert _Trial.window_bounds(trial, 1.1, in_turns=True) == (1, 2.0)  # never more steps than asked

    floors = dict(window_min_s=2.0, window_min_steps=5)
    big = record(2, 1, 230.0, wall_s=40.0, measured_s=16.5, **floors)  # 3 windows of 5 steps of 1.1 s
    big.result["step_time_p50_s"] = 1.1
    small = record(3, 2, 236.0, measured_s=6.3, **floors)  # 0.1 s steps: 21 fill 2 s
    unknown = record(4, 3, 236.0, measured_s=6.3)  # floors not in its config: the search's mean window
    # A turn: 2 steps of 1.1 s (2.2 s >= 2 s); 20 steps of 0.1 s; no loader workers, no drain.
    assert _turn_seconds(big) == pytest.approx(2.2)
    assert _turn_seconds(small) == pytest.approx(2.0)
    assert _turn_seconds(unknown) == pytest.approx(2.1)
    fed = record(5, 4, 236.0, measured_s=6.3, num_workers=2, **floors)  # 4 prefetched batches drained first
    assert _turn_seconds(fed) == pytest.approx(2.4)


def test_a_configs_start_in_turns_leaves_out_the_limiters_profiled_steps():
    """The search's trial profiled a few steps after its windows (the limiter); a trial in
    turns profiles none, so its start is planned without them: at a batch of 512 on 2 cores
    they were several seconds of each start, and the reserve stopped the search that much
    earlier than the confirmation needed."""
    from accelsweep.sweeps.driver.run.confirm import _start_seconds

    profiled = record(2, 1, 230.0, wall_s=40.0, measured_s=18.0)
    profiled.result["limit_profile_s"] = 7.0
    unprofiled = record(3, 2, 230.0, wall_s=40.0, measured_s=18.0)
    assert _start_seconds(profiled, [profiled]) == pytest.approx(15.0)
    assert _start_seconds(unprofiled, [unprofiled]) == pytest.approx(22.0)


def test_a_third_candidate_takes_turns_while_every_candidate_gets_a_claims_rounds():
    """Each config: 14 s to start, 2.0 s a turn. A third candidate costs the others rounds:
    it is kept while they reach THIRD_ROUNDS (a claim's rounds, past which its sitting, not
    its rounds, limits it, and at least 2 x MIN_ROUNDS); one candidate alone (the simplest
    near the best) only when two would get fewer than four rounds."""
    from accelsweep.sweeps.driver.run.confirm import CLAIM_ROUNDS, THIRD_ROUNDS, turn_candidates

    base, leader, second, third = (record(1, 0, 100.0, baseline=True), record(2, 1, 190.0), record(3, 2, 185.0),
                                   record(4, 3, 180.0))
    everyone = [base, leader, second, third]
    assert CLAIM_ROUNDS == 3 and THIRD_ROUNDS == 4  # (0.055 / 0.033) ** 2 = 2.8, rounded up; 2 x 2
    # 110 s: 56 s to start four, then 8 s rounds: 6, less one as a margin: three candidates.
    assert turn_candidates(base, [leader, second, third], second, everyone, 3, 3, 110.0) == ([leader, second, third], 5)
    # 95 s: three would get 3 rounds, short of 4: two, with 7 (53 s of 6 s rounds, less one).
    assert turn_candidates(base, [leader, second, third], second, everyone, 3, 3, 95.0) == ([leader, second], 7)
    # 60 s: two would get 2; the simplest near the best alone gets 7.
    assert turn_candidates(base, [leader, second, third], second, everyone, 3, 3, 60.0) == ([second], 7)
    # No time budget: the rounds asked (3 x 3 windows) for all three.
    assert turn_candidates(base, [leader, second, third], None, everyone, 3, 3, None) == ([leader, second, third], 9)
    # One round of one window asked: the least a paired interval needs, for the leader alone.
    assert turn_candidates(base, [leader, second, third], None, everyone, 1, 1, None) == ([leader], 2)


def test_the_search_stops_early_when_its_best_configs_need_more_than_the_confirmations_share():
    """A stopped peer-benchmark run (benchmarks/results/budget_history.md), seed 0: the
    search's leader was a batch of 256 (6 s windows); in the confirmation's 35% two
    candidates got fewer than four rounds, and the simplest config within the run's 19%
    margin, 7% below it in the search, was confirmed alone. The search now stops once what
    is left is what its best configs need: their start and 2 x MIN_ROUNDS rounds, and one
    more (at most half of what was left)."""
    import math
    import time
    import types

    from accelsweep.sweeps.driver.run.confirm import ConfirmationReserve, confirmation_need_s
    from accelsweep.sweeps.driver.run.goal import register

    base = record(1, 0, 100.0, baseline=True)  # 20 s: 14 s to start, 2 s a turn
    slow = record(2, 1, 190.0, wall_s=41.0, measured_s=18.0)  # 23 s to start, 6 s a turn
    quick = record(3, 2, 180.0)
    records = [base, slow, quick]
    assert confirmation_need_s(records, "score", "max") == pytest.approx(14 + 23 + 14 + 5 * (2 + 6 + 2))
    assert math.isnan(confirmation_need_s([slow, quick], "score", "max"))  # no baseline measured yet

    said = []
    callback = types.SimpleNamespace(sweep_token="reserve-unit", records={r.trial_id: r for r in records},
                                     reserve_reached=None, _say=said.append)
    register(callback)
    reserve = ConfirmationReserve("reserve-unit", 200.0, "score", "max")  # need 101 s: capped at 100
    reserve.started = time.time() - 95
    assert not reserve.stop_all()
    reserve.started = time.time() - 101
    assert reserve.stop_all() and callback.reserve_reached and "stopped 100 s short" in said[0]
    # Quick configs: the search's own budget (65%) leaves them enough; nothing stops it early.
    callback.records, callback.reserve_reached = {r.trial_id: r for r in (base, quick)}, None
    assert not reserve.stop_all()
    assert not ConfirmationReserve("another-process", 200.0, "score", "max").stop_all()  # no callback here


def test_a_trials_cpus_are_split_as_ray_takes_them():
    whole = lambda searched: {"CPU": 2.0, "memory": 1.0}
    assert _shared_resources(whole, 2, {}) == {"CPU": 1.0, "memory": 1.0}
    assert _shared_resources(whole, 3, {}) == {"CPU": 0.6666, "memory": 1.0}
    assert _shared_resources(lambda s: {"CPU": 8.0}, 3, {}) == {"CPU": 2.0}  # Ray refuses 2.67


class _Plan:
    def __init__(self, trainable, workers=1, platform="cpu"):
        from accelsweep.trainables.config import TrialConfig

        from accelsweep.trainables.metrics import TRAINING_METRICS

        self.sweep = type("S", (), {"trainable": trainable})()
        self.config = TrialConfig.make(model="vit-micro", workers=workers, platform=platform)
        self.metrics = TRAINING_METRICS

    def config_for(self, searched):
        return self.config

    def resources_of(self, searched):
        from accelsweep.trainables.platforms import get_platform

        return get_platform(self.config.platform).resources(self.config)


def test_turns_are_refused_where_a_trial_cannot_share_or_does_not_measure_at_the_baton():
    from accelsweep.trainables.trainable import train_trainable

    configs = [record(1, 2, 100.0, baseline=True)]
    assert turns_refused(_Plan(train_trainable), configs, "throughput_samples_per_s") == ""
    assert "does not measure its windows in turns" in turns_refused(_Plan(lambda s: None), configs,
                                                                    "throughput_samples_per_s")
    assert "declares no per-window figure of usd_per_1m_samples" in turns_refused(_Plan(train_trainable), configs,
                                                                         "usd_per_1m_samples")
    assert "2 data-parallel workers" in turns_refused(_Plan(train_trainable, workers=2), configs,
                                                      "throughput_samples_per_s")


def _taker(name, key, windows, log, lock, warm_up_s):
    """A trial's side as the training loop takes it: warm up, say ready, then a window per turn."""
    with trial_turns(name, {"key": key}):
        turns = current_turns()
        assert turns is not None and turns.key == turn_key({"key": key})  # this thread's own
        time.sleep(warm_up_s)
        turns.ready()
        for _ in range(windows):
            if not turns.take():
                break
            with lock:
                log.append((key, "start", time.monotonic()))
            time.sleep(0.05)
            with lock:
                log.append((key, "end", time.monotonic()))
            turns.done()


@pytest.mark.slow
def test_trials_at_a_real_baton_measure_one_at_a_time_in_rotated_rounds(ray_session):
    keys = [turn_key({"key": k}) for k in ("base", "x", "y")]
    order = [key for round_ in round_orders(keys, 4) for key in round_]
    baton = TurnBaton.start("test-turns-baton", order)
    log, lock = [], threading.Lock()
    takers = [threading.Thread(target=_taker, args=("test-turns-baton", k, 4, log, lock, warm))
              for k, warm in (("base", 0.6), ("x", 0.0), ("y", 0.3))]  # the slowest to warm up holds all back
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join(timeout=60)
    starts = [entry for entry in log if entry[1] == "start"]
    assert [turn_key({"key": key}) for key, _, _ in starts] == order
    for (_, what, _), (_, next_what, _) in zip(log, log[1:]):  # never two windows at once
        assert (what, next_what) in {("start", "end"), ("end", "start")}
    state = ray_session.get(baton.state.remote())
    assert state["measured"] == order and state["left"] == [] and sorted(state["gone"]) == sorted(keys)
    assert current_turns() is None  # the takers' turns were theirs: nothing is left for a later trial here
    ray_session.kill(baton)
