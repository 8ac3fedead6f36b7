"""The benchmark against plain Ray Tune (benchmarks/vs_plain_tune.py): its arithmetic and
table on made-up figures, and the harness end to end on the smoke model (slow): both tools
ran in each pair, in A B / B A order, the JSON is complete, the judge interleaves. The
figures themselves are not asserted: the smoke model's are noise on 2 shared cores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks.plain_vit import BASELINE
from benchmarks.vs_plain_tune import _value, block_noise, config_key, describe, judged_result, paired_gain
from tests.conftest import REPO


def test_paired_gain_is_the_geometric_mean_ratio_with_its_interval():
    same = paired_gain([110.0, 121.0, 99.0], [100.0, 110.0, 90.0])
    assert same["gain"] == pytest.approx(0.10) and same["low"] == pytest.approx(0.10)
    spread = paired_gain([120.0, 100.0], [100.0, 100.0])
    assert spread["low"] < 0 < spread["gain"] < spread["high"]  # two rounds that disagree decide nothing
    assert math.isnan(paired_gain([120.0], [100.0])["low"])


def blocked_figures(block_levels):
    """A baseline flat at 100 and two configs whose gain moves by block (``block_levels``,
    one per block of three rounds), each round within a block 1% apart."""
    rounds = [1.0, 1.01, 0.99]
    config = [130.0 * level * r for level in block_levels for r in rounds]
    other = [150.0 * level * r for level in block_levels for r in reversed(rounds)]
    return {"base": [100.0] * len(config), "a": config, "b": other}


def test_the_judges_interval_counts_its_blocks_spread_beyond_their_rounds():
    moving = blocked_figures([1.0, 1.06, 0.95])
    noise = block_noise(moving, "base", 3)
    assert 0.04 < noise < 0.07  # the blocks' levels, not their rounds' 1%
    assert block_noise(blocked_figures([1.0, 1.0, 1.0]), "base", 3) == 0.0
    assert block_noise(moving, "base", 1) == 0.0
    rounds_only = paired_gain(moving["a"], moving["base"])
    counted = paired_gain(moving["a"], moving["base"], 3, noise)
    assert counted["gain"] == rounds_only["gain"]
    half = math.log1p(counted["high"]) - math.log1p(counted["gain"])
    assert math.isclose(half, math.hypot(math.log1p(rounds_only["high"]) - math.log1p(rounds_only["gain"]),
                                         1.96 * noise / math.sqrt(3)))


def test_a_winners_share_of_the_best_counts_the_blocks_spread_and_the_bests_own_is_exactly_one():
    moving = blocked_figures([1.0, 1.06, 0.95])
    a, b = {**BASELINE, "batch_size": 64}, {**BASELINE, "batch_size": 128}
    keys = {"base": config_key(BASELINE), "a": config_key(a), "b": config_key(b)}
    figures = {keys[name]: values for name, values in moving.items()}
    configs = {keys["base"]: BASELINE, keys["a"]: a, keys["b"]: b}

    def run(winner):
        return {"winner": winner, "wall_s": 100.0, "claimed_gain": 0.3}

    pairs = [{"seed": 0, "order": ["accelsweep", "plain"], "accelsweep": run(a), "plain": run(b)}]
    result = judged_result(pairs, configs, figures, list(configs), smoke=True, machine_name="m", date="d",
                           judged_by={"judge": "windows", "blocks": 3})
    winner, best = result["pairs"][0]["accelsweep"], result["pairs"][0]["plain"]
    assert best["of_best_interval"] == [1.0, 1.0] and best["of_best"] == 1.0
    rounds_only = paired_gain(figures[keys["a"]], figures[keys["b"]])
    low, high = winner["of_best_interval"]
    assert low < 1 + rounds_only["low"] and high > 1 + rounds_only["high"]
    assert low < winner["of_best"] < high


def test_a_config_is_keyed_by_every_knob_with_the_baseline_filling_gaps():
    assert config_key({"batch_size": 16}) == config_key(BASELINE)
    assert config_key({**BASELINE, "channels_last": True}) != config_key(BASELINE)
    assert _value("True") is True and _value("64") == 64 and _value("bf16") == "bf16"
    assert describe(BASELINE) == "the baseline"
    assert describe({**BASELINE, "batch_size": 64, "channels_last": True}) == "batch_size=64, channels_last=True"


@pytest.mark.slow
def test_the_harness_runs_both_tools_in_turn_and_judges_interleaved(tmp_path, shared_ray):
    out = tmp_path / "vs.json"
    run = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "vs_plain_tune.py"), "--smoke",
                          "--seeds", "0", "1", "--rounds", "2", "--num-samples", "2", "--confirm-rounds", "2",
                          # The judge's processes started once (blocks: the next test's).
                          "--judge-blocks", "1",
                          "--out", str(out), *shared_ray.flags], cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]  # 1: a check failed (noise here)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]  # a tool that failed ends the run without it
    result = json.loads(out.read_text())
    assert [p["order"] for p in result["pairs"]] == [["accelsweep", "plain"], ["plain", "accelsweep"]]
    for pair in result["pairs"]:
        for tool in ("accelsweep", "plain"):
            figures = pair[tool]
            assert figures["wall_s"] > 0 and figures["device_s"] > 0 and figures["trials"] >= 1
            assert set(figures["winner"]) == set(BASELINE) and math.isfinite(figures["claimed_gain"])
            assert figures["confirmed"] > 0 and 0 < figures["of_best"] <= 1
            assert set(figures["confirmed_gain"]) == {"gain", "low", "high"}
        assert set(pair["checks"]) == {"winner_within_3pct_of_best", "wall_at_most_75pct",
                                       "claim_inside_confirmed_interval"}
    assert result["best_confirmed"] == max(j["judged"] for j in result["judged"].values())
    assert result["judged"][config_key(BASELINE)]["judged"] == pytest.approx(result["baseline_confirmed"])
    # Interleaved: each round measures every config once, the order rotated between rounds.
    keys = sorted(result["judged"])
    rounds = [[key for number, key in result["judge_order"] if number == r] for r in (1, 2)]
    assert all(sorted(r) == keys for r in rounds)
    assert len(keys) == 1 or rounds[0] != rounds[1]
    assert os.path.getsize(out.with_suffix(".png")) > 1000
    assert "| seed | tool |" in run.stdout
    # The same figures judged again from the JSON alone: the same result.
    again = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "vs_plain_tune.py"), "--rejudge",
                            str(out), "--out", str(tmp_path / "again.json")], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == run.returncode, again.stderr[-2000:]
    rejudged = json.loads((tmp_path / "again.json").read_text())
    assert rejudged["pairs"] == result["pairs"] and rejudged["best_confirmed"] == result["best_confirmed"]


@pytest.mark.slow
def test_the_window_judge_takes_turns_a_window_each_in_rotated_rounds(monkeypatch):
    """--judge windows on the smoke model: each config's process measures one window per
    round, every round holds every config, the order rotates, the processes are started
    anew per block (here 2 blocks of 2 rounds) and all end."""
    from benchmarks import vs_plain_tune
    from benchmarks.vs_plain_tune import judge

    started = []
    serve = vs_plain_tune._serve
    monkeypatch.setattr(vs_plain_tune, "_serve", lambda config, env: started.append(serve(config, env)) or started[-1])
    configs = {config_key(BASELINE): dict(BASELINE), config_key({"batch_size": 32}): {**BASELINE, "batch_size": 32}}
    figures, order = judge(configs, rounds=4, smoke=True, mode="windows", blocks=2)
    assert {key: len(values) for key, values in figures.items()} == {key: 4 for key in configs}
    assert all(value > 0 for values in figures.values() for value in values)
    by_round = [[key for number, key in order if number == r] for r in (1, 2, 3, 4)]
    assert all(sorted(r) == sorted(configs) for r in by_round)
    assert by_round[0] != by_round[1] and by_round[0] == by_round[2]
    assert len(started) == 4 and all(process.returncode == 0 for process in started)  # 2 configs x 2 blocks, ended
