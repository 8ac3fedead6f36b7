"""The search-efficiency benchmark's replay accounting (benchmarks/search_efficiency.py),
on small synthetic tables: no training but in the one slow test, which records a
two-config grid and replays it."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.search_efficiency import (POLICIES, TARGET_POLICY, Grid, Policy, Summary, Table, compare,
                                          main_job_grid, record, rejection, replay)
from accelsweep.sweeps.driver.run.searchers import MAX_REPEATED_PROPOSALS
from accelsweep.trainables.errors import ConfigError

BATCH = 16
RATIO = 3.0
WINDOWS = 3
WARMUP_STEPS = 3
SETUP_S, WINDOW_S = 1.0, 2.0


def row(point, throughput, windows=None, projection_error=1.0, first_step_s=None, error=None):
    """A recorded row: ``windows``, each window's cumulative throughput (default: steady
    at ``throughput``); the warm-up's projection is ``projection_error`` times the truth;
    the first step twice a steady one unless given."""
    windows = windows or [throughput] * WINDOWS
    first_step_s = 2 * BATCH / throughput if first_step_s is None else first_step_s
    warmup_step_s = BATCH / (throughput * projection_error)
    since = SETUP_S + first_step_s + (WARMUP_STEPS - 1) * warmup_step_s
    reports = []
    for index, cumulative in enumerate(windows, 1):
        since += WINDOW_S
        reports.append({"window": index, "throughput_samples_per_s": cumulative, "since_start_s": since,
                        "measured_s": index * WINDOW_S})
    return {"point": point, "batch_size": BATCH, "throughput_samples_per_s": None if error else windows[-1],
            "windows": reports, "setup_s": SETUP_S, "first_step_s": first_step_s, "warmup_step_s": warmup_step_s,
            "wall_s": since + 0.1, "error": error}


def table_of(rows, space, baseline) -> Table:
    return Table.from_dict({"space": space, "baseline": baseline,
                            "base_config": {"windows": WINDOWS, "warmup_steps": WARMUP_STEPS}, "rows": rows})


SPACE = {"x": [0, 1, 2, 3, 4, 5], "y": [0, 1]}


def throughput_at(x, y):
    """One clear best (x=4, y=1), a slow corner (x=0: 10x slower than the best)."""
    return 100.0 * (1 + x - (x == 5) * 3) * (1 + y)


def synthetic_table(projection_error=lambda x, y: 1.0) -> Table:
    rows = [row({"x": x, "y": y}, throughput_at(x, y), projection_error=projection_error(x, y))
            for x, y in itertools.product(SPACE["x"], SPACE["y"])]
    return table_of(rows, SPACE, {"x": 1, "y": 0})


class Scripted:
    """A searcher that proposes the given points, in order, then the last one forever."""

    def __init__(self, *points):
        self.points = list(points)
        self.told = []

    def ask(self):
        point = self.points.pop(0) if len(self.points) > 1 else self.points[0]
        return point, dict(point)

    def tell(self, handle, value):
        self.told.append((handle, value))


def policy(name: str) -> Policy:
    return next(p for p in POLICIES if p.name == name)


def test_costs_add_up_and_a_full_trial_costs_its_wall_time():
    table = synthetic_table()
    for name in ("tpe", "random", TARGET_POLICY):
        result = replay(table, policy(name), seed=1, reject_ratio=RATIO, until_reached=False)
        assert result.spent_s == pytest.approx(sum(t.cost_s for t in result.trials))
        for trial in result.trials:
            recorded = table.rows[trial.key]
            if trial.outcome == "completed":
                assert trial.cost_s == recorded.wall_s
                assert trial.told == recorded.throughput
            elif trial.outcome.startswith("asha@"):
                window = recorded.windows[int(trial.outcome.split("@")[1]) - 1]
                assert (trial.cost_s, trial.told) == (window.since_start_s, window.throughput)
            elif trial.outcome.startswith("rejected"):
                assert 0 < trial.cost_s < recorded.windows[-1].since_start_s
        assert result.trials_run <= table.size


def test_a_config_proposed_again_costs_nothing_and_is_told_its_value():
    table = synthetic_table()
    a, b = {"x": 1, "y": 0}, {"x": 2, "y": 0}
    searcher = Scripted(a, a, b)
    result = replay(table, policy("tpe"), seed=0, until_reached=False, searcher=searcher)
    first, again, other = result.trials[:3]
    assert (again.outcome, again.cost_s, again.told) == ("dedup", 0.0, first.told)
    assert searcher.told[1] == (a, table.rows[(1, 0)].throughput)
    assert other.key == (2, 0) and other.outcome == "completed"
    # Then b forever: the sweep ends once the searcher repeats itself MAX_REPEATED_PROPOSALS times in a row.
    assert result.trials_run == 2
    assert sum(t.outcome == "dedup" for t in result.trials) == 1 + MAX_REPEATED_PROPOSALS
    assert result.spent_s == pytest.approx(table.rows[(1, 0)].wall_s + table.rows[(2, 0)].wall_s)


def test_a_search_that_never_reaches_counts_as_the_grid_total():
    table = synthetic_table()
    result = replay(table, policy("tpe"), seed=0, searcher=Scripted({"x": 0, "y": 0}))
    assert not result.reached
    assert result.reach_s == table.total_s
    assert result.spent_s == table.rows[(0, 0)].wall_s


def test_asha_stops_a_trial_below_the_rung_median_at_that_window():
    space = {"x": [0, 1, 2]}
    rows = [row({"x": 0}, 100.0), row({"x": 1}, 300.0), row({"x": 2}, 150.0, windows=[150.0, 400.0, 400.0])]
    table = table_of(rows, space, {"x": 0})
    result = replay(table, policy("tpe+asha"), seed=0, until_reached=False,
                    searcher=Scripted({"x": 0}, {"x": 1}, {"x": 2}))
    outcomes = [t.outcome for t in result.trials[:3]]
    # x=1 is above the rung's only value; x=2's first window (150) is below the median of 100 and 300.
    assert outcomes == ["completed", "completed", "asha@1"]
    stopped = result.trials[2]
    assert stopped.cost_s == table.rows[(2,)].windows[0].since_start_s < table.rows[(2,)].wall_s
    assert stopped.told == 150.0


def test_the_rejection_rule_stops_a_projected_slow_config_at_its_early_cost():
    space = {"x": [0, 1]}
    table = table_of([row({"x": 0}, 1000.0), row({"x": 1}, 100.0, first_step_s=0.1)], space, {"x": 0})
    result = replay(table, policy("tpe+reject"), seed=0, reject_ratio=RATIO, until_reached=False,
                    searcher=Scripted({"x": 0}, {"x": 1}))
    rejected = result.trials[1]
    assert rejected.outcome == "rejected (warm-up)"
    deadline = BATCH * RATIO / 1000.0  # the step time that projects best / ratio
    assert rejected.cost_s == pytest.approx(SETUP_S + 0.1 + deadline)
    assert rejected.told == pytest.approx(1000.0 / RATIO)  # the abandoned step projects at best this


def test_rejection_stages():
    best = 1000.0
    deadline = BATCH * RATIO / best
    first = table_of([row({"x": 0}, 900.0, first_step_s=4 * deadline)], {"x": [0]}, {"x": 0}).rows[(0,)]
    stage, cost, told = rejection(first, best, RATIO, WARMUP_STEPS)
    assert stage == "first step" and cost == pytest.approx(SETUP_S + 3 * deadline)
    # Warm-up looked fine (projection 4x the truth), the first window is slow: it stops in that window.
    window = table_of([row({"x": 0}, 200.0, projection_error=4.0, first_step_s=0.1)], {"x": [0]},
                      {"x": 0}).rows[(0,)]
    stage, cost, told = rejection(window, best, RATIO, WARMUP_STEPS)
    assert stage == "first window"
    # Two window steps (0.08 s each) take the mean of the steps (0.02 s twice before) past 0.048 s.
    assert cost == pytest.approx(SETUP_S + 0.1 + 2 * 0.02 + 2 * 0.08)
    assert cost < window.windows[0].since_start_s
    assert told < best / RATIO
    # Nothing is rejected before a best is known, nor a config as fast as the best.
    assert rejection(first, None, RATIO, WARMUP_STEPS) is None
    assert rejection(table_of([row({"x": 0}, best)], {"x": [0]}, {"x": 0}).rows[(0,)], best, RATIO,
                     WARMUP_STEPS) is None


def test_the_best_config_is_never_rejected():
    # Projections 20% off either way; the best config is (4, 1).
    table = synthetic_table(projection_error=lambda x, y: 0.8 if (x + y) % 2 else 1.2)
    rejected_any = False
    for seed in range(6):
        result = replay(table, policy(TARGET_POLICY), seed=seed, reject_ratio=RATIO, until_reached=False)
        outcomes = {t.key: t.outcome for t in result.trials if t.outcome != "dedup"}
        assert not outcomes.get((4, 1), "").startswith("rejected")
        rejected_any |= any(o.startswith("rejected") for o in outcomes.values())
    assert rejected_any  # the slow corner is: the rule is on


def test_the_grid_reaches_within_its_total_and_costs_it_in_full():
    table = synthetic_table()
    for seed in range(5):
        reached = replay(table, policy("grid"), seed=seed)
        assert reached.reached and reached.reach_s <= table.total_s
        full = replay(table, policy("grid"), seed=seed, until_reached=False)
        assert full.trials_run == table.size
        assert full.spent_s == pytest.approx(table.total_s)


def test_a_replay_is_the_same_for_the_same_seed():
    table = synthetic_table()
    for name in (TARGET_POLICY, "random", "grid"):
        assert replay(table, policy(name), seed=4, reject_ratio=RATIO) == replay(table, policy(name), seed=4,
                                                                                   reject_ratio=RATIO)


def test_tpe_runs_the_baseline_first():
    table = synthetic_table()
    assert replay(table, policy("tpe"), seed=2).trials[0].key == (1, 0)


def test_position_runs_from_random_search_to_the_full_grid():
    summary = Summary("x", median_s=10.0, p25_s=0, p75_s=0, fraction=0.1, median_trials=1, not_reached=0, seeds=1,
                      early_stops=0)
    assert summary.position(random_median_s=10.0, grid_total_s=100.0) == 0.0
    assert Summary("x", 100.0, 0, 0, 1.0, 1, 0, 1, 0).position(10.0, 100.0) == 1.0
    assert Summary("x", 5.0, 0, 0, 0.05, 1, 0, 1, 0).position(10.0, 100.0) < 0


def test_a_table_missing_a_config_is_refused():
    rows = [row({"x": 0}, 100.0)]
    with pytest.raises(ConfigError, match="rows must be one per config"):
        table_of(rows, {"x": [0, 1]}, {"x": 0})


def test_the_large_grid_adds_loader_workers_and_channels_last_to_the_main_ones():
    main, large = main_job_grid(), main_job_grid(name="large")
    assert len(main.points()) == 48 and len(large.points()) == 192
    assert large.space["num_workers"] == (0, 2) and large.space["channels_last"] == (False, True)
    assert large.baseline() == {**main.baseline(), "num_workers": 0, "channels_last": False}  # the main job's
    assert len({tuple(sorted(p.items())) for p in large.points()}) == 192


@pytest.mark.slow
def test_record_two_configs_and_replay_them(tmp_path):
    tiny = main_job_grid(tiny=True)
    grid = Grid("test", tiny.base, {"batch_size": (8, 16)})
    out = tmp_path / "table.json"
    recorded = record(grid, str(out), progress=lambda line: None)
    assert [r["error"] for r in recorded["rows"]] == [None, None]
    assert recorded["machine"]["cpu_model"] and "torch" in recorded["machine"]["versions"]
    assert "hostname" not in str(recorded["machine"]).lower()
    table = Table.load(str(out))
    assert table.baseline == {"batch_size": 16}
    for recorded_row in table.rows.values():
        assert len(recorded_row.windows) == tiny.base.windows
        times = [w.since_start_s for w in recorded_row.windows]
        assert times == sorted(times) and times[-1] <= recorded_row.wall_s
        assert recorded_row.warmup_step_s > 0 and recorded_row.first_step_s > 0 and recorded_row.setup_s > 0
    summaries = compare(table, seeds=2, reject_ratio=RATIO)
    assert set(summaries) == {p.name for p in POLICIES}
    assert all(0 < s.median_s <= table.total_s for s in summaries.values())
