"""benchmarks/sitting_spread.py: a process's own level told from its rounds' noise."""

from __future__ import annotations

import math
import random

from benchmarks.sitting_spread import ARMS, CONFIGS, COPIES, analyse


def blocks(process_level: float, huge_pages_factor: float, count: int = 30, rounds: int = 5) -> list[dict]:
    """Synthetic blocks: each round's figure noisy by 6%; each process of the second arm
    off its config's level by ``process_level`` (sd), the first arm's not."""
    rng = random.Random(7)
    out = []
    for _ in range(count):
        figures = {}
        for arm_index, arm in enumerate(ARMS):
            for config in CONFIGS:
                for copy in range(COPIES):
                    level = math.exp(rng.gauss(0, process_level)) if arm_index else 1.0
                    factor = huge_pages_factor if arm_index else 1.0
                    figures[f"{arm} | {config} | {copy}"] = [100 * level * factor * math.exp(rng.gauss(0, 0.06))
                                                             for _ in range(rounds)]
        out.append(figures)
    return out


def test_a_level_per_process_is_found_beyond_the_rounds_noise_and_none_where_there_is_none():
    found = analyse(blocks(process_level=0.05, huge_pages_factor=1.0))["process_level_sd"]
    default, huge = list(ARMS)
    for config in CONFIGS:
        assert found[f"{default} | {config}"]["one_process_sd"] < 0.02
        assert 0.025 < found[f"{huge} | {config}"]["one_process_sd"] < 0.09


def test_the_arms_ratio_is_paired_by_round():
    gain = analyse(blocks(process_level=0.0, huge_pages_factor=0.9))["thp_gain"]
    for config in CONFIGS:
        assert gain[config]["low"] < -0.1 < gain[config]["high"]
        assert abs(gain[config]["gain"] + 0.1) < 0.02
