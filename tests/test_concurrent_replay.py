"""The search-efficiency replay at concurrency (benchmarks/concurrent_replay.py): the
virtual clock's slot schedule, exactly, on a tiny synthetic grid; the dedup at
concurrency; and one slot replays exactly as the sequential replay does."""

from __future__ import annotations

import pytest

from benchmarks.concurrent_replay import grid_wall_s, replay_at
from benchmarks.search_efficiency import POLICIES, Policy, Table, replay
from accelsweep.trainables.errors import ConfigError

from tests.test_search_efficiency import RATIO, synthetic_table

# x -> (wall seconds, throughput): integer seconds, so the clock's sums are exact.
COSTS = {0: (3.0, 10.0), 1: (5.0, 20.0), 2: (2.0, 30.0), 3: (4.0, 40.0), 4: (1.0, 100.0)}
EVERY_TRIAL_TO_ITS_END = Policy("plain", "grid")


def tiny_table() -> Table:
    rows = [{"point": {"x": x}, "batch_size": 8, "throughput_samples_per_s": value,
             "windows": [{"window": 1, "throughput_samples_per_s": value, "since_start_s": wall - 0.5,
                          "measured_s": 0.4}],
             "setup_s": 0.1, "first_step_s": 0.1, "warmup_step_s": 0.1, "wall_s": wall, "error": None}
            for x, (wall, value) in COSTS.items()]
    return Table.from_dict({"space": {"x": list(COSTS)}, "baseline": {"x": 0},
                            "base_config": {"windows": 1, "warmup_steps": 1}, "rows": rows})


class Scripted:
    """Proposes the given x values in order; keeps what it was told, and what it had been
    told by each proposal (what a proposal could know)."""

    def __init__(self, *xs):
        self.xs = list(xs)
        self.told: list[tuple[int, object]] = []
        self.known_at_ask: list[int] = []

    def ask(self):
        self.known_at_ask.append(len(self.told))
        x = self.xs.pop(0)
        return x, {"x": x}

    def tell(self, handle, value):
        self.told.append((handle, value))


def test_two_slots_follow_the_exact_schedule_results_arriving_at_their_end():
    """Slot 0: x0 [0, 3], x2 [3, 5], x4 [5, 6]; slot 1: x1 [0, 5], x3 [5, 9]. At t=5 two
    trials end: x1 first (it started first), its slot takes x3, then x2's takes x4."""
    searcher = Scripted(0, 1, 2, 3, 4)
    result = replay_at(tiny_table(), EVERY_TRIAL_TO_ITS_END, seed=0, concurrency=2, until_reached=False,
                       searcher=searcher)
    schedule = [((t.key[0]), t.slot, t.start_s, t.end_s) for t in result.trials]
    assert schedule == [(0, 0, 0.0, 3.0), (1, 1, 0.0, 5.0), (2, 0, 3.0, 5.0), (4, 0, 5.0, 6.0), (3, 1, 5.0, 9.0)]
    # Results reach the searcher in the order trials end; a proposal knows only those ended.
    assert [handle for handle, _ in searcher.told] == [0, 1, 2, 4, 3]
    assert searcher.known_at_ask == [0, 0, 1, 2, 3]


def test_reached_when_the_best_ends_charging_busy_slots_and_the_clock():
    """x4 (the only config within 5% of the best) ends at t=6: the clock reads 6; the
    slots were busy 3 + 5 + 2 + 1 s (ended) + 1 s of x3 (running since 5)."""
    result = replay_at(tiny_table(), EVERY_TRIAL_TO_ITS_END, seed=0, concurrency=2, searcher=Scripted(0, 1, 2, 3, 4))
    assert result.reached
    assert (result.reach_wall_s, result.reach_device_s, result.reach_trials) == (6.0, 12.0, 5)
    assert [t.key[0] for t in result.trials][-1] == 4  # the search stopped there: x3 never reported


def test_a_proposal_of_a_running_config_is_withdrawn_and_the_searcher_asked_again():
    searcher = Scripted(0, 0, 1, 0, 2, 3, 4)
    result = replay_at(tiny_table(), EVERY_TRIAL_TO_ITS_END, seed=0, concurrency=2, until_reached=False,
                       searcher=searcher)
    assert searcher.told[0] == (0, None)  # the second x0 (x0 running): withdrawn, told a failure
    # At t=3 x0 has ended: proposed again, it is answered with its value, no trial.
    assert (0, 10.0) in searcher.told[2:]
    assert result.withdrawn == 1 and result.dedups == 1
    assert sorted(t.key[0] for t in result.trials) == [0, 1, 2, 3, 4]  # each config ran once


def test_one_slot_replays_as_the_sequential_replay():
    table = synthetic_table()
    for policy in POLICIES:
        for seed in range(3):
            one = replay(table, policy, seed, RATIO)
            clocked = replay_at(table, policy, seed, 1, RATIO)
            assert clocked.reach_device_s == pytest.approx(one.reach_s)
            assert clocked.reach_wall_s == pytest.approx(one.reach_s)  # one slot: the clock is the device time


def test_the_grid_wall_on_slots_is_greedy_list_scheduling():
    table = tiny_table()
    assert grid_wall_s(table, 1, seed=0) == pytest.approx(15.0)
    assert grid_wall_s(table, 5, seed=0) == pytest.approx(5.0)  # every config at once: the longest


def test_more_slots_never_cost_more_wall_time_for_the_grid():
    table = synthetic_table()
    walls = [grid_wall_s(table, n, seed=3) for n in (1, 2, 4, 8)]
    assert walls == sorted(walls, reverse=True)


def test_concurrency_must_be_a_positive_integer():
    with pytest.raises(ConfigError, match="concurrency"):
        replay_at(tiny_table(), EVERY_TRIAL_TO_ITS_END, seed=0, concurrency=0)


def test_the_command_line_refuses_a_bad_concurrency_before_reading_the_table(capsys):
    from benchmarks.search_efficiency import main

    with pytest.raises(ConfigError, match=r"--concurrency.*1,4,16,32.*'4,x'"):
        main(["replay", "/nonexistent.json", "--concurrency", "4,x"])
