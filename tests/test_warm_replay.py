"""Warm start in the search replay (benchmarks/warm_replay.py, issue 31 item 4): which of a
source recording's configs are proposed first and whether its results are told, decided
as the tool's --warm-start decides; and the warm search's schedule on a tiny grid."""

from __future__ import annotations

import json

import pytest

from benchmarks.concurrent_replay import replay_at
from benchmarks.search_efficiency import Policy, Table, main, make_searcher
from benchmarks.warm_replay import plan_warm
from accelsweep.trainables.errors import ConfigError

from tests.test_concurrent_replay import COSTS

TPE = Policy("tpe", "tpe")


def table_dict(costs=COSTS, machine=None, base=None) -> dict:
    rows = [{"point": {"x": x}, "batch_size": 8, "throughput_samples_per_s": value,
             "windows": [{"window": 1, "throughput_samples_per_s": value, "since_start_s": wall - 0.5,
                          "measured_s": 0.4}],
             "setup_s": 0.1, "first_step_s": 0.1, "warmup_step_s": 0.1, "wall_s": wall, "error": None}
            for x, (wall, value) in costs.items()]
    return {"space": {"x": list(costs)}, "baseline": {"x": 0}, "machine": machine or {"cpu_model": "EPYC"},
            "base_config": {"windows": 1, "warmup_steps": 1, "model": "vit-tiny", **(base or {})}, "rows": rows}


def test_a_recording_of_the_same_measurement_is_proposed_best_first_and_told():
    target = Table.from_dict(table_dict())
    plan = plan_warm(Table.from_dict(table_dict()), target)
    assert plan.points == [{"x": 4}, {"x": 3}, {"x": 2}]  # the three best, best first
    assert plan.differences == [] and plan.told == [({"x": x}, COSTS[x][1]) for x in (4, 3, 2, 1, 0)]


def test_a_recording_under_another_isa_limit_or_workload_is_proposed_but_not_told():
    target = Table.from_dict(table_dict(machine={"cpu_model": "EPYC", "onednn_max_cpu_isa": "AVX2"}))
    plan = plan_warm(Table.from_dict(table_dict()), target)
    assert plan.points == [{"x": 4}, {"x": 3}, {"x": 2}] and plan.told == []
    assert plan.differences == ["onednn_max_cpu_isa: None there, AVX2 here"]
    other_model = plan_warm(Table.from_dict(table_dict(base={"model": "vit-micro"})), Table.from_dict(table_dict()))
    assert other_model.told == [] and other_model.differences == ["workload: model vit-micro there, vit-tiny here"]


def test_a_source_config_outside_the_space_is_skipped_and_said():
    source = table_dict({**COSTS, 9: (1.0, 500.0)})  # its best has x=9, a value the target lacks
    plan = plan_warm(Table.from_dict(source), Table.from_dict(table_dict()))
    assert plan.points == [{"x": 4}, {"x": 3}, {"x": 2}]
    assert plan.skipped == ["x=9 is not in this space"]
    assert {"x": 9} not in [point for point, _ in plan.told]
    with pytest.raises(ConfigError, match="none fits"):
        plan_warm(Table.from_dict(table_dict({9: (1.0, 500.0)})), Table.from_dict(table_dict()))


def test_the_warm_configs_run_first_then_the_baseline_on_the_exact_schedule():
    """Two slots, the source's best first: x4 [0, 1] and x3 [0, 4] start together; when x4
    ends, its slot takes x2 [1, 3], then the baseline x0 [3, 6]. The grid's best (x4) is
    named from t=1: reached after 1 device-second, where a cold start spends the baseline's 3."""
    target = Table.from_dict(table_dict(machine={"onednn_max_cpu_isa": "AVX2"}))
    plan = plan_warm(Table.from_dict(table_dict()), target)
    searcher = make_searcher("tpe", target, seed=0, num_samples=5, warm_points=plan.points, told=plan.told)
    result = replay_at(target, TPE, seed=0, concurrency=2, until_reached=False, searcher=searcher)
    started = sorted(result.trials, key=lambda t: (t.start_s, t.slot))  # trials are listed as they end
    schedule = [(t.key[0], t.slot, t.start_s, t.end_s) for t in started[:4]]
    assert schedule == [(4, 0, 0.0, 1.0), (3, 1, 0.0, 4.0), (2, 0, 1.0, 3.0), (0, 0, 3.0, 6.0)]
    warm = replay_at(target, TPE, 0, 1, searcher=make_searcher("tpe", target, 0, 5, warm_points=plan.points))
    cold = replay_at(target, TPE, 0, 1)
    assert (warm.reach_device_s, warm.reach_trials) == (1.0, 1)
    assert cold.reach_device_s >= COSTS[0][0]  # the baseline runs first and is not the best


def test_told_results_reach_tpe_before_its_first_proposal():
    target = Table.from_dict(table_dict())
    plan = plan_warm(Table.from_dict(table_dict()), target)
    searcher = make_searcher("tpe", target, seed=0, num_samples=5, warm_points=plan.points, told=plan.told)
    finished = [t for t in searcher.study.trials if t.state.name == "COMPLETE"]
    assert sorted((t.params["x"], t.value) for t in finished) == sorted((x, v) for x, (_, v) in COSTS.items())
    with pytest.raises(ConfigError, match="a TPE searcher"):
        make_searcher("grid", target, 0, 5, warm_points=plan.points)


def test_the_command_line_writes_cold_and_warm_figures_per_concurrency(tmp_path, capsys):
    source, target = tmp_path / "source.json", tmp_path / "target.json"
    source.write_text(json.dumps(table_dict()))
    target.write_text(json.dumps(table_dict(machine={"onednn_max_cpu_isa": "AVX2"})))
    out = tmp_path / "warm.json"
    main(["replay", str(target), "--warm-start", str(source), "--concurrency", "1,2", "--seeds", "3",
          "--num-samples", "5", "--out", str(out)])
    figures = json.loads(out.read_text())
    assert figures["told"] == 0 and figures["points"] == [{"x": 4}, {"x": 3}, {"x": 2}]
    assert set(figures["by_concurrency"]) == {"1", "2"}
    # Warm, x4 (the best) starts first: reached when it ends, at t=1; on two slots x3 has
    # run beside it for that second.
    for concurrency, device_s in (("1", 1.0), ("2", 2.0)):
        starts = figures["by_concurrency"][concurrency]
        assert (starts["warm"]["device_median_s"], starts["warm"]["wall_median_s"]) == (device_s, 1.0)
        assert starts["cold"]["device_median_s"] > starts["warm"]["device_median_s"]
    assert "not told to TPE" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--warm-start"):
        main(["replay", str(target), "--warm-start", str(tmp_path / "absent.json")])
