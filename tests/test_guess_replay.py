"""The platform's first guess in the search replay (benchmarks/guess_replay.py): the tool's
CPU rules applied to a recording's machine and space, the guess proposed right after the
baseline, and the command that replays searches without and with it."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.guess_replay import table_guess
from benchmarks.search_efficiency import Table, main, make_searcher
from accelsweep.trainables.errors import ConfigError

from tests.test_warm_replay import table_dict

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "data")
BF16_EPYC = {"cpu_model": "AMD EPYC", "usable_cpus": 2, "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}


def grid_dict(costs, machine=BF16_EPYC, baseline=None) -> dict:
    """A recorded grid over batch size and precision."""
    rows = [{"point": {"batch_size": batch, "precision": precision}, "batch_size": batch,
             "throughput_samples_per_s": costs(batch, precision),
             "windows": [{"window": 1, "throughput_samples_per_s": costs(batch, precision), "since_start_s": 1.0,
                          "measured_s": 0.4}],
             "setup_s": 0.1, "first_step_s": 0.1, "warmup_step_s": 0.1, "wall_s": 2.0, "error": None}
            for batch in (8, 16, 32) for precision in ("fp32", "bf16")]
    return {"space": {"batch_size": [8, 16, 32], "precision": ["fp32", "bf16"]},
            "baseline": baseline or {"batch_size": 8, "precision": "fp32"}, "machine": machine,
            "base_config": {"platform": "cpu", "cpus_per_worker": 2, "threads": 2, "windows": 1, "warmup_steps": 1,
                            "model": "vit-tiny"},
            "rows": rows}


def grid(costs, machine=BF16_EPYC) -> Table:
    return Table.from_dict(grid_dict(costs, machine))


def value(batch, precision):
    return batch / 8 + (10 if precision == "bf16" else 0)


def test_the_guess_of_a_recording_follows_its_machine():
    guess = table_guess(grid(value))
    assert guess.point == {"batch_size": 32, "precision": "bf16"} and guess.value == guess.best == 14.0
    capped = table_guess(grid(value, machine={**BF16_EPYC, "onednn_max_cpu_isa": "AVX2"}))
    assert capped.point == {"batch_size": 32, "precision": "fp32"}  # bf16 only emulated under the limit
    assert set(capped.reasons) == {"batch_size"}  # fp32 is the baseline's already: not a move


def test_the_recorded_grids_guesses():
    """What the rules pick on the two grids recorded here (a regression of the rules)."""
    avx512 = table_guess(Table.load(os.path.join(DATA, "cpu_vit_tiny_epyc_2core.json")))
    avx2 = table_guess(Table.load(os.path.join(DATA, "cpu_vit_tiny_epyc_2core_avx2.json")))
    assert avx512.point == {"batch_size": 64, "precision": "bf16", "threads": 2, "patch_embed": "conv"}
    assert avx2.point == {"batch_size": 64, "precision": "fp32", "threads": 2, "patch_embed": "conv"}


def test_the_guess_is_proposed_right_after_the_baseline():
    table = grid(value)
    searcher = make_searcher("tpe", table, seed=0, num_samples=6, guess={"batch_size": 32, "precision": "bf16"})
    first = [searcher.ask()[1] for _ in range(2)]
    assert first == [{"batch_size": 8, "precision": "fp32"}, {"batch_size": 32, "precision": "bf16"}]
    with pytest.raises(ConfigError, match="first guess"):
        make_searcher("grid", table, 0, 6, guess={"batch_size": 32, "precision": "bf16"})


def test_the_command_replays_without_and_with_the_guess(tmp_path, capsys):
    path, out = tmp_path / "grid.json", tmp_path / "guess.json"
    path.write_text(json.dumps(grid_dict(value)))
    main(["replay", str(path), "--first-guess", "--concurrency", "1,2", "--seeds", "2", "--num-samples", "6",
          "--out", str(out)])
    figures = json.loads(out.read_text())
    assert figures["guess"] == {"batch_size": 32, "precision": "bf16"} and set(figures["by_concurrency"]) == {"1", "2"}
    for starts in figures["by_concurrency"].values():
        assert set(starts) == {"without", "with guess"}
        # The guess is the grid's best: named after the baseline's 2 s and its own 2.
        assert starts["with guess"]["device_median_s"] <= starts["without"]["device_median_s"]
    assert starts["with guess"]["not_reached"] == 0
    assert "First guess: batch_size=32 precision=bf16" in capsys.readouterr().out
    flat = tmp_path / "flat.json"  # no bf16 instructions, the baseline at the largest batch: nothing to move
    flat.write_text(json.dumps(grid_dict(value, machine={"cpu_flags": ["avx2"]},
                                         baseline={"batch_size": 32, "precision": "fp32"})))
    with pytest.raises(ConfigError, match="--first-guess"):
        main(["replay", str(flat), "--first-guess", "--seeds", "1"])
