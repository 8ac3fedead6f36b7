"""Ray Tune trainables: a trial's searched values + the sweep's base config -> one
validated config -> the loop, reporting to Tune after every window.

    tune.with_parameters(train_trainable, base=base_config.to_dict(), cost=basis)
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from trainables.config import TrialConfig
from trainables.cost import CostBasis
from trainables.platforms import get_platform


def train_trainable(searched: Mapping[str, Any], base: Mapping[str, Any],
                    cost: Optional[CostBasis] = None) -> None:
    from ray import tune

    from trainables.train_loop import run_training

    config = TrialConfig.from_dict({**base, **searched})
    resources = get_platform(config.platform).resources(config)
    usd_per_hour = cost.hourly_rate(resources) if cost else float("nan")
    run_training(config, report=tune.report, usd_per_hour=usd_per_hour)

