"""benchmarks/host_rules.py: each rule checked against a record, the record's CPU named."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.host_rules import (_block_spreads, _claims_round_spreads, claim_precision, contention,
                                   near_best_and_budget, quiet_sweep, tie_margin)
from benchmarks.plain_vit import BASELINE
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
              "best_config": {"batch_size": 128}, "beyond_edges": ["b128"], "time_budget_s": 215, "confirm_share": 0.35}
    lines = near_best_and_budget(write(tmp_path, "v.json", record))
    assert "| 0 | 8.3% | 0.50 | 99.0% | True |" in lines and any("every check held" in line for line in lines)
    assert any(line.startswith("Budget 215 s and confirmation share 35%: every check held") for line in lines)
    pair["checks"]["wall_at_most_75pct"] = False
    assert any("wall <= 0.75x in 0 of 1, the winner within 3% of the best in 1 of 1" in line
               for line in near_best_and_budget(write(tmp_path, "w.json", record)))


def test_the_judges_paired_noise_and_each_claims_error_are_shown(tmp_path):
    """One round's paired log ratio spreads by 0.1 (+0.1, 0, -0.1 about the gain). A claim
    of 4 rounds, +50% against the judged +45%, is off by log(1.5 / 1.45), where its rounds
    alone explain 0.1 / sqrt(4)."""
    base = [100.0, 120.0, 90.0]
    other = [b * 1.45 * math.exp(d) for b, d in zip(base, (0.1, 0.0, -0.1))]
    gain = {"gain": 0.45, "low": 0.40, "high": 0.50}
    record = {"machine": "AMD EPYC, 2 CPUs (avx512_bf16)", "date": "2026-11-30 15:00",
              "judged": {"base": {"config": dict(BASELINE), "figures": base},
                         "fast": {"config": {**BASELINE, "precision": "bf16"}, "figures": other}},
              "pairs": [{"seed": 0, "accelsweep": {"claimed_gain": 0.5, "confirmed_gain": gain,
                                                   "verdict": "confirmed: trial 3's config beats the baseline by "
                                                              "+50.0% (95% interval +30.0% to +70.0%, 4 interleaved rounds)"}}]}
    lines = claim_precision(write(tmp_path, "c.json", record))
    assert any("One round's paired noise in the judge: median 0.100" in line for line in lines)
    assert "| 0 | +50.0% | +45.0% [+40.0%, +50.0%] | 4 | +0.034 | 0.050 |" in lines
    # The tie margin: sqrt(2) x the claims' rms error over every record (here one, +0.034).
    assert any("rms 0.034" in line and "= 0.048 (TIE_MARGIN" in line
               for line in tie_margin([write(tmp_path, "c.json", record)]))


def test_a_sittings_noise_is_the_judges_block_spread_beyond_its_rounds_and_a_claims_rounds_are_read_back(tmp_path):
    """Three blocks of four rounds: within each the candidate's log ratio spreads by +-0.01
    about the block's level, and the levels (0.30, 0.40, 0.35) spread by 0.05: nearly all of
    it a sitting's, not the rounds'. A claim's interval, with the sitting's share taken out
    where its record says its claims held one, gives back its rounds' own spread."""
    levels, wobble = (0.30, 0.40, 0.35), (0.01, -0.01, 0.01, -0.01)
    base = [100.0] * 12
    other = [100.0 * math.exp(level + d) for level in levels for d in wobble]
    record = {"judge": "windows", "blocks": 3,
              "judged": {"base": {"config": dict(BASELINE), "figures": base},
                         "fast": {"config": {**BASELINE, "precision": "bf16"}, "figures": other}}}
    [(between, rounds)] = _block_spreads(record)
    assert math.sqrt(between) == pytest.approx(0.05) and rounds < 0.0001
    # A claim of 4 rounds whose interval is +-t(3) x 0.05 / 2 in log terms, widened by a sitting of 0.03.
    half = math.hypot(3.182 * 0.05 / 2, 1.96 * 0.03)
    verdict = (f"confirmed: trial 3's config beats the baseline by +40.0% (95% interval "
               f"{math.expm1(math.log(1.4) - half):+.1%} to {math.expm1(math.log(1.4) + half):+.1%}, 4 interleaved rounds)")
    claim = {"pairs": [{"accelsweep": {"verdict": verdict}}]}
    [(sd, count)] = _claims_round_spreads([write(tmp_path, "s.json", {**claim, "claim_sitting_noise": 0.03})])
    assert count == 4 and sd == pytest.approx(0.05, abs=0.002)
    [(unsat, _)] = _claims_round_spreads([write(tmp_path, "r.json", claim)])  # read as the rounds' alone: wider
    assert unsat > 0.06
