"""benchmarks/host_rules.py: each rule checked against a record, the record's CPU named."""

from __future__ import annotations

import json

from benchmarks.host_rules import contention, near_best_and_budget, quiet_sweep
from accelsweep.trainables.contention import CONTENDED_CPUS


def write(tmp_path, name, record):
    path = tmp_path / name
    path.write_text(json.dumps(record))
    return str(path)


def contention_record(slowing_reads):
    rows = [{"competitor_cpus": 0.0, "other_cpus_median": 0.004, "slowdown_median": 0.0, "slowdown_min": -0.01},
            {"competitor_cpus": 0.05, "other_cpus_median": 0.05, "slowdown_median": 0.3, "slowdown_min": 0.05},
            {"competitor_cpus": 0.5, "other_cpus_median": slowing_reads, "slowdown_median": 0.4, "slowdown_min": 0.3}]
    return {"machine": "AMD EPYC, 2 cores, 1 NUMA node(s); avx2", "date": "2026-11-30 09:00", "rows": rows}


def test_contended_cpus_is_checked_between_a_quiet_reading_and_a_competitor_that_slows_a_step(tmp_path):
    held = contention(write(tmp_path, "a.json", contention_record(CONTENDED_CPUS + 0.05)))
    assert any("AMD EPYC, 2 cores" in line for line in held)
    assert f"CONTENDED_CPUS = {CONTENDED_CPUS} lies between" in held[-2]
    missed = contention(write(tmp_path, "b.json", contention_record(CONTENDED_CPUS - 0.05)))
    assert "does NOT lie between" in missed[-2]


def test_a_quiet_sweeps_windows_above_the_threshold_are_counted(tmp_path):
    record = {"machine": "AMD EPYC", "date": "2026-11-30 09:00", "contention_cpus": [0.01, 0.02, 0.5, 0.03]}
    line = quiet_sweep(write(tmp_path, "q.json", record))[0]
    assert "4 windows read median 0.025" in line and "most 0.500" in line and "1 above CONTENDED_CPUS" in line


def test_the_peer_benchmark_says_whether_its_checks_held_and_each_runs_own_margin(tmp_path):
    run = {"wall_s": 150.0, "of_best": 0.99}
    pair = {"seed": 0, "accelsweep": {**run, "near_best_margin": 0.083}, "plain": {**run, "wall_s": 300.0},
            "checks": {"winner_within_3pct_of_best": True, "wall_at_most_75pct": True,
                       "claim_inside_confirmed_interval": True}}
    record = {"machine": "AMD EPYC, 2 CPUs (avx512_bf16)", "date": "2026-11-30 09:00", "pairs": [pair],
              "best_config": {"batch_size": 128}, "beyond_edges": ["b128"]}
    lines = near_best_and_budget(write(tmp_path, "v.json", record))
    assert "| 0 | 8.3% | 0.50 | 99.0% | True |" in lines and any("every check held" in line for line in lines)
    pair["checks"]["wall_at_most_75pct"] = False
    assert any("wall <= 0.75x in 0 of 1, the winner within 3% of the best in 1 of 1" in line
               for line in near_best_and_budget(write(tmp_path, "w.json", record)))
