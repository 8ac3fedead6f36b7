"""The platform's first guess, replayed: what proposing it right after the baseline
(sweeps/driver/define/first_guess.py) does to a search of a recorded grid.

    python benchmarks/search_efficiency.py replay TABLE.json --first-guess --concurrency 1,4,16,32 --seeds 50

The guess is the tool's own: the CPU platform's rules (CpuPlatform.first_guess) applied
to the recording's machine (its CPU flags, oneDNN ISA limit, CPUs per trial) and its
space. The same searches (the tool's searcher, seeds, concurrency) are replayed without
and with it: device- and wall-seconds until the named best is within 5% of the grid's best.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from accelsweep.sweeps.driver.define.first_guess import guess_from_rules
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms.cpu import CpuPlatform, cpu_capabilities
from benchmarks.recorded_grid import Policy, Searcher, Table, make_searcher
from benchmarks.warm_replay import compare_starts, starts_table

__all__ = ["TableGuess", "table_guess", "compare_guess", "format_guess_report"]

STARTS = ("without", "with guess")


@dataclass(frozen=True)
class TableGuess:
    point: dict  # a point of the table's space
    reasons: dict  # knob -> (value, why), the knobs moved from the baseline
    value: Optional[float]  # the guess's recorded throughput
    best: float  # the grid's best


def table_guess(table: Table) -> Optional[TableGuess]:
    """The CPU platform's first guess for a recording (None where no rule moves a knob of its
    space from the baseline's value)."""
    machine = table.machine
    cpuinfo = f"model name\t: {machine.get('cpu_model', '')}\nflags\t\t: {' '.join(machine.get('cpu_flags', []))}\n"
    capabilities = cpu_capabilities(cpuinfo, cores=int(machine.get("usable_cpus", 1)), numa_node_count=1,
                                    source="the recording's machine",
                                    onednn_max_isa=machine.get("onednn_max_cpu_isa"))
    choices = {knob: list(values) for knob, values in table.space.items()}
    rules = CpuPlatform().first_guess(TrialConfig.from_dict(dict(table.base)), choices, capabilities)
    guess = guess_from_rules(rules, choices, table.baseline)  # as the tool's plan_first_guess
    if guess is None:
        return None
    best = max(r.throughput for r in table.rows.values() if r.throughput is not None)
    return TableGuess(guess.point, guess.reasons, table.rows[table.key(guess.point)].throughput, best)


def compare_guess(table: Table, guess: TableGuess, policy: Policy, seeds: int, concurrencies, reject_ratio=None,
                  num_samples: int = 24, progress=lambda line: None) -> dict[int, dict[str, Any]]:
    def with_guess(seed: int) -> Searcher:
        return make_searcher(policy.sampler, table, seed, num_samples, guess=guess.point)

    return compare_starts(table, policy, seeds, concurrencies, {STARTS[0]: None, STARTS[1]: with_guess},
                          reject_ratio, num_samples, progress)


def format_guess_report(table: Table, guess: TableGuess, policy: Policy,
                        results: Mapping[int, Mapping[str, Any]]) -> str:
    share = f"{guess.value / guess.best:.1%} of the grid's best" if guess.value else "failed in the recording"
    lines = [f"First guess: {' '.join(f'{k}={v}' for k, v in guess.point.items())} "
             f"(recorded {guess.value or float('nan'):.1f}: {share})"]
    lines += [f"  {knob}={value}: {why}" for knob, (value, why) in guess.reasons.items()]
    return "\n".join([*lines, *starts_table(table, policy, results)])
