"""A kernel sweep's thread count (KernelConfig.threads, build_kernel_sweep's threads,
the kernel studies' --threads): checked up front, applied with torch.set_num_threads in
the trial, and recorded in its result."""

from __future__ import annotations

import math
import os

import pytest

from accelsweep import plan_sweep
from accelsweep.sweeps.driver.run.kernel_sweep import build_kernel_sweep, kernel_main
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.harness.microbench import KernelConfig, run_microbench
from tests.test_kernel_ops_api import FAST, ROW_SUM_PATH


@pytest.fixture
def torch_threads():
    """The harness sets torch's threads for the process: put them back after the test."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("values, message", [
    (dict(impl="torch-sum", threads=3, cpus_per_worker=2),
     "threads must be an integer from 1 to cpus_per_worker (2); got 3. More threads than the CPUs the trial holds "
     "would oversubscribe them: raise cpus_per_worker to hold more CPUs."),
    (dict(impl="torch-sum", threads=0), "threads must be an integer from 1 to cpus_per_worker (1); got 0."),
    (dict(impl="torch-sum", threads="2", cpus_per_worker=2),
     "threads must be an integer from 1 to cpus_per_worker (2); got '2'."),
    (dict(impl="numpy-sum", threads=1),
     "threads must be None for impl numpy-sum (a numpy implementation: the harness sets torch's thread count only; "
     "torch implementations of op row_sum: torch-sum); got 1"),
])
def test_a_bad_thread_count_names_the_field_the_allowed_values_and_the_value(values, message):
    with pytest.raises(ConfigError) as refused:
        KernelConfig.make(op=ROW_SUM_PATH, **values)
    assert str(refused.value).startswith(message)


def test_the_trial_runs_with_the_threads_asked_and_records_them(torch_threads):
    import torch

    torch.set_num_threads(2)
    one = run_microbench(KernelConfig.make(op=ROW_SUM_PATH, impl="torch-sum", threads=1, cpus_per_worker=2, **FAST))
    assert one["threads"] == 1 and torch.get_num_threads() == 1
    held = run_microbench(KernelConfig.make(op=ROW_SUM_PATH, impl="torch-sum", cpus_per_worker=2, **FAST))
    assert held["threads"] == 2  # not set: every CPU the trial holds, as before
    assert math.isnan(run_microbench(KernelConfig.make(op=ROW_SUM_PATH, impl="numpy-sum", **FAST))["threads"])


def test_several_thread_counts_are_a_knob_of_the_grid_and_leave_out_what_is_not_torch(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    lines = []
    sweep = build_kernel_sweep(ROW_SUM_PATH, {"rows": [4, 8]}, platform="cpu", threads=[1, 4], print_line=lines.append)
    assert sweep.num_samples == 4 and sweep.base.threads == 1 and sweep.base.cpus_per_worker == 4  # 1 impl x 2 x 2
    assert len(lines) == 1 and lines[0].startswith("skipping numpy-sum: threads must be None for impl numpy-sum")
    assert "threads: one of 1, 4" in plan_sweep(sweep).describe()
    assert "torch threads 1, 4" in sweep.platform_note
    one = build_kernel_sweep(ROW_SUM_PATH, platform="cpu", threads=2, print_line=lines.append)
    assert one.base.threads == 2 and one.num_samples == 1  # one value: the base's, not a knob
    assert build_kernel_sweep(ROW_SUM_PATH, platform="cpu").base.threads is None


@pytest.mark.parametrize("threads, message", [
    (8, "threads must be integers from 1 to 4 (this machine's CPUs, all of which a kernel trial holds); got 8"),
    ([1, 0], "threads must be integers from 1 to 4 (this machine's CPUs, all of which a kernel trial holds); got 0"),
    ([], "threads must be an integer from 1 to 4 or a non-empty list of them; got []"),
])
def test_the_builder_refuses_thread_counts_this_machine_cannot_hold(monkeypatch, threads, message):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with pytest.raises(ConfigError) as refused:
        build_kernel_sweep(ROW_SUM_PATH, platform="cpu", threads=threads)
    assert str(refused.value) == message


def test_kernel_studies_take_a_threads_flag(capsys, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    kernel_main("giou", "GIoU", shapes={"batch": [64]}, smoke_shapes={"batch": [8], "boxes": [64]},
                argv=["--dry-run", "--smoke", "--platform", "cpu", "--threads", "1", "2"])
    out = capsys.readouterr().out
    assert "threads: one of 1, 2" in out and "skipping jax-jit: threads must be None for impl jax-jit" in out
    with pytest.raises(SystemExit) as ended:
        kernel_main("giou", "GIoU", shapes={}, smoke_shapes={}, argv=["--dry-run", "--threads", "0"])
    assert ended.value.code == 2
    assert "argument --threads: must be an integer >= 1; got '0'" in capsys.readouterr().err
