"""The platform's first guess: one config proposed right after the baseline, made of the
values a performance engineer would try first on this hardware (bf16 where the chip
multiplies it natively, every core computing, the largest batch, ...: each platform's
``first_guess`` rules, each with its reason).

Why: a search with a time budget gets a dozen or two trials, and its random start-up
trials rarely land on the corner of a large space where those rules point (a plain Ray
Tune search finds it in some runs only). Measured first, the guess gives TPE and the
local search a leader from the second trial on. It is a proposal, measured like any
other: where the rules are wrong here, the search goes past it. Off with
``Sweep.first_guess=False`` (``--no-first-guess``); none when the sweep lists its own
first ``points``, with a grid, or where the platform has no rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.platforms import get_platform

__all__ = ["FirstGuess", "LABEL", "guess_from_rules", "plan_first_guess"]

LABEL = "first guess"  # how the trial proposed from it is named in its progress line and MLflow tag


@dataclass(frozen=True)
class FirstGuess:
    """The guessed config (a point of the space: the baseline's values where no rule
    applies) and, per knob the rules moved, (value, why)."""

    point: dict[str, Any]
    reasons: dict[str, tuple[Any, str]]

    def lines(self) -> list[str]:
        changed = "; ".join(f"{knob}={value} ({why})" for knob, (value, why) in self.reasons.items())
        return [f"first guess, proposed after the baseline (--no-first-guess: none): {changed}"]

    def tag(self) -> str:
        return ", ".join(f"{knob}={value}" for knob, (value, _) in self.reasons.items())


def guess_from_rules(rules: Mapping[str, tuple[Any, str]], choices: Mapping[str, Sequence[Any]],
                     baseline: Mapping[str, Any]) -> Optional[FirstGuess]:
    """The config a platform's rules (knob -> (value, why)) make of a space (``choices``)
    and its baseline: the rules' values where the space holds them and they move the
    baseline's, the baseline's elsewhere; None where no rule moves a knob."""
    moved = {knob: (value, why) for knob, (value, why) in rules.items()
             if knob in choices and value in choices[knob] and baseline.get(knob) != value}
    if not moved:
        return None
    return FirstGuess({**baseline, **{knob: value for knob, (value, _) in moved.items()}}, moved)


def plan_first_guess(plan) -> Optional[FirstGuess]:
    """The sweep's first guess (a Plan's), or None: turned off, the sweep's own ``points``,
    a grid, a config that is not a training config, no rule that moves a knob from the
    baseline's value, or a guessed config the platform refuses."""
    sweep = plan.sweep
    if not sweep.first_guess or sweep.points or sweep.sampler != "tpe" or not isinstance(sweep.base, TrialConfig):
        return None
    choices = {name: list(d.choices) for name, d in plan.space.distributions.items() if hasattr(d, "choices")}
    capabilities = plan.capabilities
    if capabilities is None:
        return None
    rules = get_platform(sweep.base.platform).first_guess(sweep.base, choices, capabilities)
    guess = guess_from_rules(rules, choices, plan.baseline_point)
    if guess is None:
        return None
    try:
        plan.config_for(guess.point)
    except ConfigError:
        return None  # a combination the platform refuses: no guess rather than a failed trial
    return guess
