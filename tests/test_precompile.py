"""The Neuron precompile phase: which configs it compiles (the ones the sweep will
propose first, in order), the command and environment each gets, and the Ray tasks that
run them. neuron_parallel_compile itself is Neuron's and absent here: a stand-in script
on PATH records what it was given."""

import json
import os
import stat
import subprocess
import sys

import pytest

from tests.conftest import REPO
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.config import TrialConfig


def test_the_command_runs_the_trials_own_config_under_neuron_parallel_compile():
    from accelsweep.sweeps.driver.run.neuron_precompile import precompile_command, precompile_env

    config = TrialConfig.make(platform="neuron", model="vit-b16", batch_size=32, neuron_optlevel=3,
                              neuron_target="trn1", compile_cache="s3://bucket/cache")
    command = precompile_command(config)
    assert command[:4] == ["neuron_parallel_compile", sys.executable, "-m", "accelsweep.trainables.loop.precompile"]
    assert TrialConfig.from_dict(json.loads(command[-1])) == config
    env = precompile_env(config)
    assert env["NEURON_COMPILE_CACHE_URL"] == "s3://bucket/cache"
    assert "--optlevel=3" in env["NEURON_CC_FLAGS"] and "--target=trn1" in env["NEURON_CC_FLAGS"]


def test_precompile_is_refused_where_it_cannot_help():
    from accelsweep.sweeps.driver.run.neuron_precompile import check_precompile

    with pytest.raises(ConfigError, match="--precompile must be 0 on platform 'cpu' .it runs Neuron's "
                                          "neuron_parallel_compile.; got 3"):
        check_precompile("cpu", 3, None)
    with pytest.raises(ConfigError, match="--compile-cache must be a cache every trial reads"):
        check_precompile("neuron", 3, None)
    check_precompile("neuron", 3, "/shared/cache")
    check_precompile("cpu", 0, None)


@pytest.mark.slow
def test_the_precompiled_configs_are_the_ones_the_sweep_proposes_first(ray_session, tracking_uri):
    from accelsweep import Objective, Sweep, plan_sweep, run_sweep
    from accelsweep.sweeps.driver.run.neuron_precompile import first_proposals
    from accelsweep.trainables.trainable import train_trainable

    def space(trial):
        trial.suggest_categorical("batch_size", [8, 16, 32])
        trial.suggest_categorical("patch_embed", ["conv", "linear"])
        trial.suggest_categorical("precision", ["fp32", "bf16-autocast", "bf16"])

    sweep = Sweep(name="proposals", trainable=train_trainable,
                  base=TrialConfig.make(model="vit-micro", batch_size=8, warmup_steps=1, window_min_steps=1,
                                        window_min_s=0.0, windows=1),
                  space=space, objectives=[Objective()], num_samples=12, scheduler="none",
                  max_concurrent_trials=1, tracking_uri=tracking_uri, seed=3)
    predicted = first_proposals(plan_sweep(sweep), 12)
    assert len(predicted) == 4  # TPE's seeded start-up trials, baseline first; the rest depend on results
    assert predicted[0] == {"batch_size": 8, "patch_embed": "conv", "precision": "fp32"}
    result = run_sweep(sweep)
    ran = [record.searched for record in sorted(result.records, key=lambda r: r.number)]
    assert ran[:4] == predicted


FAKE_TOOL = """#!/bin/sh
# Stand-in for Neuron's neuron_parallel_compile: records what it was asked to do.
printf '%s\\n%s\\n%s\\n' "$NEURON_CC_FLAGS" "$NEURON_COMPILE_CACHE_URL" "$*" > "$PRECOMPILE_RECORD/$$"
echo "Compiling 3 graphs"
"""

DRIVER = """
import ray, sys
ray.init(address="local", num_cpus=2, resources={"neuron_cores": 2}, include_dashboard=False)
from accelsweep.sweeps.driver.run.neuron_precompile import run_precompile
from accelsweep.trainables.config import TrialConfig
base = TrialConfig.make(platform="neuron", model="vit-b16", neuron_target="trn1",
                        compile_cache="/shared/cache").to_dict()
config_for = lambda searched: TrialConfig.from_dict({**base, **searched})
for r in run_precompile(config_for, [{"batch_size": 8}, {"batch_size": 16, "neuron_optlevel": 3}]):
    print("RESULT", r.searched, r.returncode, round(r.seconds, 3), r.output_tail.strip())
"""


@pytest.mark.slow
def test_each_config_is_extracted_and_compiled_as_a_ray_task_holding_a_neuroncore(tmp_path):
    tool = tmp_path / "bin" / "neuron_parallel_compile"
    tool.parent.mkdir()
    tool.write_text(FAKE_TOOL)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "record"
    record.mkdir()
    env = {**os.environ, "PATH": f"{tool.parent}:{os.environ['PATH']}", "PRECOMPILE_RECORD": str(record)}
    done = subprocess.run([sys.executable, "-c", DRIVER], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(results) == 2 and all(" 0 " in line and "Compiling 3 graphs" in line for line in results)
    calls = [path.read_text().splitlines() for path in record.iterdir()]
    assert len(calls) == 2
    assert sorted("--optlevel=3" in flags for flags, _, _ in calls) == [False, True]
    assert all(cache == "/shared/cache" and "-m accelsweep.trainables.loop.precompile --config" in argv for _, cache, argv in calls)


@pytest.mark.slow
def test_dry_run_lists_what_would_be_precompiled():
    done = subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--dry-run", "--platform", "neuron",
                           "--instance-type", "trn1.2xlarge", "--precompile", "3", "--compile-cache", "s3://b/c"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    section = done.stdout[done.stdout.index("precompile: 3 configs with neuron_parallel_compile"):]
    assert section.count("NEURON_CC_FLAGS='--target=trn1") + section.count("skipped: ") == 3
    assert "cache=s3://b/c" in section
    refused = subprocess.run([sys.executable, "sweeps/neuron_vit.py", "--dry-run", "--platform", "cpu",
                              "--precompile", "2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--precompile must be 0 on platform 'cpu'" in refused.stderr
