"""The short run ``neuron_parallel_compile`` wraps to extract a trial's graphs.

    neuron_parallel_compile python -m accelsweep.trainables.loop.precompile --config '<TrialConfig JSON>'

Under neuron_parallel_compile the graphs are traced and handed to the compiler, not
executed: the outputs are placeholders (the Neuron docs warn the model's output is
invalid), so a non-finite loss here is expected and ignored. The same warm-up and one
window as the trial, with the same shapes and batches_per_execution, produce the same
graphs the trial will ask the cache for.
"""

from __future__ import annotations

import argparse
import json
import sys

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.loop.train_loop import NonFiniteLoss, run_training


def extraction_config(config: TrialConfig) -> TrialConfig:
    """The trial's config cut to its warm-up and one short window: every graph the trial
    compiles appears in its first steps (a graph that appears later is a recompile)."""
    return config.replace(windows=1, window_min_s=0.0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the trial's TrialConfig as JSON")
    args = parser.parse_args(argv)
    config = extraction_config(TrialConfig.from_dict(json.loads(args.config)))
    try:
        run_training(config)
    except NonFiniteLoss:
        pass  # placeholder outputs during graph extraction (see the module docstring)
    return 0


if __name__ == "__main__":
    sys.exit(main())
