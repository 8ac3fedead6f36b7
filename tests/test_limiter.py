"""What limits a config (trainables/timing/limiter.py): a few profiled steps after a trial's
last window, split into compute kernels, other operators, the optimizer, waiting for data
and the host's dispatch; the largest named with the knob that attacks it."""

from __future__ import annotations

import time

import pytest
import torch

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.timing.limiter import LIMITS, limiter_line
from accelsweep.trainables.workloads.base import Workload

QUICK = dict(platform="cpu", warmup_steps=2, window_min_steps=3, window_min_s=0.05, windows=2, threads=1,
             cpus_per_worker=1)


class SlowItems(torch.utils.data.Dataset):
    """Each item takes 4 ms to make (a decode, an augmentation): the loader's work."""

    loaded = 0  # items the DataLoader fetched in this process (no loader workers)

    def __len__(self):
        return 10_000

    def __getitems__(self, indices):  # what DataLoader calls for a batch (FLOP counting reads items alone)
        SlowItems.loaded += len(indices)
        return [self[index] for index in indices]

    def __getitem__(self, index):
        time.sleep(0.004)
        return torch.randn(16), index % 4


class LoaderBound(Workload):
    def build_model(self, config):
        return torch.nn.Linear(16, 4)

    def dataset(self, config, rank, world_size):
        return SlowItems()


class LoaderBoundWider(LoaderBound):
    """The same slow items through a few 512-wide layers: a step of real work, so that
    fetching a kept batch (a few microseconds) is a sliver of it even when the host
    preempts the process inside that range (CI's parallel lane did, at Linear(16, 4))."""

    def build_model(self, config):
        return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                   torch.nn.ReLU(), torch.nn.Linear(512, 4))


class Tiny(Workload):
    """A small MLP of a few layers: at batch 1 each operator is its call's fixed cost."""

    def build_model(self, config):
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(6)],
                                   torch.nn.Linear(8, 4))

    def dataset(self, config, rank, world_size):
        return torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 4, (512,)))

    def optimizer(self, parameters, config):
        # Plain SGD: one foreach update. AdamW's dozen small kernels over 14 tensors are
        # dispatch too, but the profiler books them to the optimizer step, which under the
        # parallel lane's load measured 41% of a step against the forward and backward's.
        return torch.optim.SGD(parameters, lr=config.learning_rate)


class Wide(Tiny):
    """Two 1024-wide layers at batch 256: the matmuls are the step."""

    def build_model(self, config):
        return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 4))

    def dataset(self, config, rank, world_size):
        return torch.utils.data.TensorDataset(torch.randn(1024, 1024), torch.randint(0, 4, (1024,)))


def limits(workload: str, batch_size: int, **fields) -> dict:
    threads = torch.get_num_threads()
    try:
        result = run_training(TrialConfig.make(workload=f"{__name__}:{workload}", batch_size=batch_size,
                                               num_workers=0, **QUICK, **fields))
    finally:
        torch.set_num_threads(threads)
    shares = {limit: result[f"limit_{limit}_share"] for limit in LIMITS}
    assert 0.8 < sum(shares.values()) < 1.2, shares  # the split covers the profiled steps' time
    return {"largest": max(shares, key=shares.get), "shares": shares, "line": result["limiter"], "result": result}


def test_a_loader_bound_config_is_told_to_add_loader_workers():
    found = limits("LoaderBound", 16)
    assert found["largest"] == "data" and found["shares"]["data"] > 0.5, found
    assert found["line"].startswith("waiting for data ") and "more loader workers (num_workers)" in found["line"]
    assert "resident_batches" in found["line"]


def test_resident_batches_take_the_loader_out_of_every_step():
    """The same loader-bound workload with 3 batches kept on the device: the loader makes
    those 3 batches and no more, nothing waits for data, and every step's samples count."""
    SlowItems.loaded = 0
    found = limits("LoaderBoundWider", 16, resident_batches=3)
    assert SlowItems.loaded == 3 * 16, SlowItems.loaded
    assert found["largest"] != "data" and found["shares"]["data"] < 0.2, found["shares"]
    assert found["result"]["measured_steps"] > 3  # the kept batches went round, each step with its counts


def test_resident_batches_want_no_loader_processes_no_xla_platform_and_no_search(tmp_path):
    from accelsweep import Objective, Sweep, plan_sweep, train_trainable
    from accelsweep.trainables.errors import ConfigError

    with pytest.raises(ConfigError, match="num_workers must be 0 when resident_batches is set; got 2"):
        TrialConfig.make(workload=f"{__name__}:LoaderBound", resident_batches=4, num_workers=2)
    with pytest.raises(ConfigError, match="resident_batches must be an integer >= 0; got -1"):
        TrialConfig.make(workload=f"{__name__}:LoaderBound", resident_batches=-1)
    with pytest.raises(ConfigError, match="resident_batches must be 0 on platform 'xla'; got 2"):
        TrialConfig.make(platform="xla", resident_batches=2)  # its graph cuts wrap the loader's uploads

    def sweep(space, **base):
        return Sweep(name="ceiling", trainable=train_trainable, space=space, num_samples=4,
                     base=TrialConfig.make(workload=f"{__name__}:LoaderBound", batch_size=8, **base),
                     objectives=[Objective("throughput_samples_per_s", "max")],
                     tracking_uri=f"sqlite:///{tmp_path}/m.db")

    def searched(trial):
        if trial.suggest_categorical("resident_batches", [0, 4]) == 0:
            trial.suggest_categorical("num_workers", [0, 1])

    def batches(trial):
        trial.suggest_categorical("batch_size", [8, 16])

    with pytest.raises(ConfigError, match="search space knob resident_batches must be not searched"):
        plan_sweep(sweep(searched))
    assert plan_sweep(sweep(batches, resident_batches=4)).base_dict["resident_batches"] == 4  # a ceiling sweep


# The profiled split of a batch-1 step between dispatch gaps and small operators moves with
# the host's load: in the parallel lane it named the optimizer (41%) once and other operators
# (38%) once in three fresh-clone runs; quiet, the host's dispatch is 0.69-0.72.
@pytest.mark.host_timing
def test_a_tiny_batch_is_told_its_dispatch_dominates_and_a_wide_one_its_compute():
    tiny = limits("Tiny", 1)
    assert tiny["largest"] == "host", tiny
    assert tiny["line"].startswith("the host's dispatch ") and "a larger batch" in tiny["line"]
    wide = limits("Wide", 256)
    assert wide["largest"] == "compute", wide


def test_the_line_names_the_largest_then_the_rest_in_order():
    line = limiter_line({"compute": 0.2, "ops": 0.1, "optimizer": 0.05, "data": 0.0, "host": 0.65})
    assert line == ("the host's dispatch 65% of the step (compute kernels (matmul, convolution, attention) 20%, "
                    "other operators 10%, the optimizer step 5%): per-operator overhead: a larger batch spreads it "
                    "over more samples; compilation removes calls")


def test_the_profilers_own_log_lines_stay_out_of_the_trials_output_and_nothing_else_does(capfd):
    import os

    from accelsweep.trainables.timing.limiter import kineto_quiet, profile_steps

    with kineto_quiet():
        os.write(2, b"USDT:2026-11-30 05:37:40 7968:7968 SyncActivityProfilerHandler.cpp:39] profiler_start\n")
        os.write(2, b"a warning of the trial's own\n")
    profile_steps(lambda: torch.ones(4).sum(), lambda: None, steps=2)
    err = capfd.readouterr().err
    assert "a warning of the trial's own" in err and "USDT" not in err and "SyncActivityProfilerHandler" not in err


def test_the_summary_names_what_limits_the_sweeps_answer():
    from accelsweep.sweeps.driver.record.trial_record import TrialRecord
    from accelsweep.sweeps.driver.reporting.summary import summary

    def record(number, score, limiter, baseline=False):
        return TrialRecord(number, f"t{number}", {"batch_size": 8 * number}, {"batch_size": 8 * number}, {},
                           baseline, 0.0, status="finished", measured_by="score",
                           result={"score": score, "limiter": limiter})

    records = [record(1, 10.0, "waiting for data 70% ...", baseline=True), record(2, 30.0, "the host's dispatch 50% ...")]
    text = summary("s", records, "score", "max", ["batch_size"], "", "ui", 1.0)
    assert "limiter (trial 2, 3 profiled steps after its windows): the host's dispatch 50% ..." in text, text


def test_compute_bound_advice_names_a_narrower_precision_only_where_one_runs_natively():
    from accelsweep.trainables.loop.train_loop import narrower_precisions
    from accelsweep.trainables.platforms.capabilities import Capabilities
    from accelsweep.trainables.platforms.cpu import CpuPlatform

    shares = {"compute": 0.6, "ops": 0.1, "optimizer": 0.05, "data": 0.0, "host": 0.25}
    assert "a lower precision (bf16) or faster kernels" in limiter_line(shares, "bf16")
    assert "lower precision" not in limiter_line(shares) and "faster kernels" in limiter_line(shares)

    class Host(CpuPlatform):
        def __init__(self, emulated):
            self.emulated = emulated

        def capabilities(self, config):
            return Capabilities("test CPU", "a test", {}, {"precision": self.emulated})

    fp32, bf16 = TrialConfig.make(precision="fp32", **QUICK), TrialConfig.make(precision="bf16", **QUICK)
    assert narrower_precisions(Host({}), fp32) == "bf16-autocast or bf16"
    assert narrower_precisions(Host({}), bf16) is None  # already the narrowest
    emulated = {"bf16": "no bf16 instructions", "bf16-autocast": "no bf16 instructions"}
    assert narrower_precisions(Host(emulated), fp32) is None  # only emulated: advice would slow it
