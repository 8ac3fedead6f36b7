"""A user's own workload through the training loop: its knobs validated like the built-in
ones, its unit counted, its memory measured (no Ray: the loop in this process)."""

import io
from dataclasses import dataclass

import pytest
import torch

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.metrics import Metric
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.timing.limiter import PROFILED_STEPS
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, import_path, knob, load_workload

QUICK = dict(warmup_steps=1, window_min_steps=3, window_min_s=0.0, windows=2, batch_size=4)


class TokenModel(torch.nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.embed(tokens))


class Tokens(Workload):
    unit = "tokens"

    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        seq_len: int = knob(16, choices=(8, 16, 32))
        items: int = knob(1024)  # dataset length

    def build_model(self, config):
        return TokenModel(64, 32)

    def dataset(self, config, rank, world_size):
        tokens = torch.randint(64, (config.workload_knobs.items, config.workload_knobs.seq_len + 1),
                               generator=torch.Generator().manual_seed(config.seed))
        return torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])


class HalfCounted(Tokens):
    def units(self, inputs, targets):
        return inputs.numel() // 2  # e.g. half of every sequence is padding


class BigModel(Workload):
    """16 Mi float32 weights (64 MiB): with gradients and AdamW's two moments, at least 256 MiB."""

    def build_model(self, config):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4096, 4096))

    def dataset(self, config, rank, world_size):
        return torch.utils.data.TensorDataset(torch.randn(64, 4096), torch.randint(4096, (64,)))


class ClashingKnobs(Tokens):
    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        batch_size: int = knob(8)


class NotAWorkload:
    pass


class NoDataset(Workload):  # build_model only: Workload's abstract dataset is left
    def build_model(self, config):
        return torch.nn.Linear(2, 2)


def test_a_user_workload_reports_its_unit_beside_samples():
    config = TrialConfig.make(workload=import_path(Tokens), seq_len=32, **QUICK)
    result = run_training(config)
    assert result["unit"] == "tokens"
    # Every sample is seq_len tokens: the two throughputs differ by exactly that factor.
    assert result["throughput_tokens_per_s"] == pytest.approx(32 * result["throughput_samples_per_s"])
    assert result["final_loss"] < result["initial_loss"] * 1.5  # it trains: a finite, sane loss
    assert result["usd_per_1m_tokens"] != result["usd_per_1m_tokens"]  # no price basis: NaN, not 0


def test_the_workload_counts_its_units_per_batch():
    result = run_training(TrialConfig.make(workload=import_path(HalfCounted), seq_len=16, **QUICK))
    assert result["throughput_tokens_per_s"] == pytest.approx(8 * result["throughput_samples_per_s"])


def test_a_short_dataset_runs_epoch_after_epoch():
    # 8 items, batches of 4: two batches an epoch, while the trial runs 1 + 2 * 3 steps.
    result = run_training(TrialConfig.make(workload=import_path(Tokens), items=8, **QUICK))
    assert result["measured_steps"] == 6


def test_a_dataset_shorter_than_a_batch_is_named():
    with pytest.raises(ConfigError, match=r"batch_size must be at most the dataset's length; got 4"):
        run_training(TrialConfig.make(workload=import_path(Tokens), items=2, **QUICK))


@pytest.mark.slow
def test_workload_memory_is_what_the_workload_allocates():
    result = run_training(TrialConfig.make(workload=import_path(BigModel), **QUICK))
    # Weights, gradients and two AdamW moments: 4 x 64 MiB (less a little of the baseline
    # the process may free meanwhile); the process's peak also holds torch and the
    # interpreter, hundreds of MB more.
    assert 0.9 * 256 <= result["workload_memory_mb"] <= result["peak_memory_mb"] - 300


def test_a_bad_workload_knob_is_refused_with_field_allowed_and_value():
    with pytest.raises(ConfigError, match=r"^seq_len must be one of 8, 16, 32; got 33$"):
        TrialConfig.make(workload=import_path(Tokens), seq_len=33)
    with pytest.raises(ConfigError, match=r"config key must be one of .*seq_len.*; got 'seq_length'"):
        TrialConfig.make(workload=import_path(Tokens), seq_length=16)


def test_the_flat_dict_carries_the_workload_and_its_knobs():
    config = TrialConfig.make(workload=import_path(Tokens), seq_len=8)
    flat = config.to_dict()
    assert flat["workload"] == "tests.test_workload:Tokens" and flat["seq_len"] == 8
    assert TrialConfig.from_dict(flat) == config


@pytest.mark.parametrize("name, says", [
    ("no_such_module:Thing", "Importing no_such_module failed"),
    ("tests.test_workload:Missing", "has no Missing"),
    ("tests.test_workload:NotAWorkload", "not a Workload"),
    ("not a path", "as an import path 'package.module:Name'"),
    ("tests.test_workload:ClashingKnobs", "knob names of workload"),
    ("tests.test_workload:NoDataset", "NoDataset does not override dataset"),
])
def test_a_bad_workload_is_refused_by_name(name, says):
    with pytest.raises(ConfigError, match="workload") as refused:
        TrialConfig.make(workload=name)
    assert says in str(refused.value)


def test_built_in_workloads_have_short_names():
    assert type(load_workload("image-classification")).__name__ == "ImageClassification"
    assert TrialConfig.make(model="resnet50").workload == "image-classification"


def test_import_path_refuses_what_another_process_cannot_import():
    assert import_path(Tokens) == "tests.test_workload:Tokens"
    with pytest.raises(ConfigError, match="top level of a module"):
        import_path(Tokens.Knobs)


class PoisonedRegression(Workload):
    """Its own loss (MSE) and optimizer (SGD); one input of step 4's batch is infinite."""

    def build_model(self, config):
        return torch.nn.Linear(8, 1)

    def dataset(self, config, rank, world_size):
        inputs = torch.randn(256, 8, generator=torch.Generator().manual_seed(config.seed))
        targets = inputs.sum(1, keepdim=True)
        inputs[4 * config.batch_size + 1, 3] = float("inf")
        return torch.utils.data.TensorDataset(inputs, targets)

    def loss(self, outputs, targets):
        return torch.nn.functional.mse_loss(outputs, targets)

    def optimizer(self, parameters, config):
        return torch.optim.SGD(parameters, lr=config.learning_rate)


def test_nan_capture_and_replay_work_for_a_user_workload(tmp_path):
    from accelsweep.trainables.loop.nan_replay import show_replay
    from accelsweep.trainables.loop.train_loop import NonFiniteGradient

    config = TrialConfig.make(workload=import_path(PoisonedRegression), nan_capture=True, **QUICK)
    with pytest.raises(NonFiniteGradient) as caught:
        run_training(config, capture_dir=str(tmp_path))
    assert caught.value.step == 4 and caught.value.capture_path
    # The replay rebuilds the workload's model, loss and optimizer from the capture's config.
    assert show_replay(caught.value.capture_path, out=io.StringIO())


def test_a_sweep_proposing_a_bad_workload_knob_is_refused_before_any_trial():
    from accelsweep import Objective, Sweep, plan_sweep
    from accelsweep.trainables.trainable import train_trainable

    def space(trial):
        trial.suggest_categorical("seq_len", [16, 33])

    sweep = Sweep(name="bad_knob", trainable=train_trainable, space=space,
                  base=TrialConfig.make(workload=import_path(Tokens)),
                  objectives=[Objective("throughput_tokens_per_s", "max")])
    with pytest.raises(ConfigError, match=r"seq_len must be one of 8, 16, 32; got 33"):
        plan_sweep(sweep)


def test_the_loop_declares_the_metrics_of_the_workload_unit():
    from accelsweep.trainables.trainable import train_trainable

    declared = train_trainable.metrics(TrialConfig.make(workload=import_path(Tokens)))
    assert declared.measurement == "throughput_tokens_per_s"
    assert {"throughput_samples_per_s", "usd_per_1m_tokens", "workload_memory_mb"} <= set(declared.names)
    assert train_trainable.metrics(TrialConfig.make()).measurement == "throughput_samples_per_s"


class NumberedBatches(Workload):
    """Batch k's targets are all k, and it counts k + 1 units: a count paired with the
    wrong step shows in the measured total."""

    unit = "items"

    def build_model(self, config):
        return torch.nn.Linear(8, 64)

    def dataset(self, config, rank, world_size):
        steps = 64
        return torch.utils.data.TensorDataset(torch.randn(steps * config.batch_size, 8),
                                              torch.arange(steps).repeat_interleave(config.batch_size))

    def units(self, inputs, targets):
        return int(targets[0]) + 1


@pytest.mark.host_timing  # a window another process contended is left out of the figures: the count changes
def test_units_stay_paired_with_their_steps_when_the_loader_runs_ahead(monkeypatch):
    from accelsweep.trainables.platforms.cpu import CpuPlatform

    def prefetching(self, loader, device, config):  # like torch-xla's MpDeviceLoader: batches read ahead
        batches, ahead = iter(loader), []
        while True:
            while len(ahead) < 3:
                ahead.append(next(batches))
            yield ahead.pop(0)

    monkeypatch.setattr(CpuPlatform, "device_batches", prefetching)
    result = run_training(TrialConfig.make(workload=import_path(NumberedBatches), **QUICK))
    # Step 0 warms up; steps 1..6 are measured, counting 2 + 3 + ... + 7 = 27 units in 6 batches.
    assert result["measured_steps"] == 6
    assert result["throughput_items_per_s"] / result["throughput_samples_per_s"] == pytest.approx(27 / (6 * 4))


class PackedTokens(Workload):
    """Inputs as a dict (tokens and a mask of the real ones); its own counts and figure
    (the padding fraction); per-step work of its own (a running count of correct tokens)."""

    unit = "tokens"
    metrics = (Metric("padding_fraction", "", "min", label="padding fraction", fmt="{:.1%}"),)
    steps_seen = 0

    def build_model(self, config):
        class Masked(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = TokenModel(64, 16)

            def forward(self, batch):
                return self.inner(batch["tokens"] * batch["real"])

        return Masked()

    def dataset(self, config, rank, world_size):
        tokens = torch.randint(1, 64, (64, 8))
        real = (torch.arange(8) < 6).long().expand(64, 8)  # 6 real tokens of 8 in every row

        class Rows(torch.utils.data.Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, index):
                return {"tokens": tokens[index], "real": real[index]}, tokens[index]

        return Rows()

    def units(self, inputs, targets):
        return int(inputs["real"].sum())

    def count(self, inputs, targets):
        return {"real": float(inputs["real"].sum()), "slots": float(inputs["real"].numel())}

    def figures(self, totals):
        return {"padding_fraction": 1 - totals["real"] / totals["slots"]}

    def on_step(self, outputs, targets, loss):
        PackedTokens.steps_seen += 1


def test_dict_inputs_counts_figures_and_per_step_work_of_a_workload():
    from accelsweep.trainables.trainable import train_trainable

    config = TrialConfig.make(workload=import_path(PackedTokens), **QUICK)
    PackedTokens.steps_seen = 0
    result = run_training(config)
    assert result["padding_fraction"] == pytest.approx(0.25)
    assert result["throughput_tokens_per_s"] == pytest.approx(6 * result["throughput_samples_per_s"])
    # Warm-up, measured, and the limiter's profiled steps after the last window (timing/limiter.py).
    assert PackedTokens.steps_seen == 1 + result["measured_steps"] + PROFILED_STEPS
    assert "padding_fraction" in train_trainable.metrics(config).names  # declared: summary, MLflow, objectives


@pytest.mark.slow
def test_a_script_is_named_by_its_package_when_it_lives_in_one(tmp_path):
    """python sweeps/study.py names its workload accelsweep.sweeps.study:Name (importable
    on every node with accelsweep installed); a loose script by its file stem."""
    import subprocess
    import sys

    probe = ("import torch\n"  # torch.classes has a __path__ that is no list of folders
             "from accelsweep.trainables.importing import importable_module\nprint(importable_module(__name__))\n")
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "__init__.py").write_text("")
    (tmp_path / "studies" / "study.py").write_text("import studies\n" + probe)
    (tmp_path / "loose.py").write_text(probe)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    named = [subprocess.run([sys.executable, str(tmp_path / script)], env=env, capture_output=True, text=True,
                            check=True).stdout.strip() for script in ("studies/study.py", "loose.py")]
    assert named == ["studies.study", "loose"]


@pytest.mark.slow
def test_a_reused_process_measures_the_same_workload_memory_again():
    """What an earlier trial freed but the C allocator kept is handed back before the
    baseline: else the next trial reuses it unseen and reports almost no memory."""
    config = TrialConfig.make(model="vit-tiny", batch_size=64, warmup_steps=1, window_min_steps=2, window_min_s=0.0,
                              windows=1, cpus_per_worker=2)
    first, again = (run_training(config)["workload_memory_mb"] for _ in range(2))
    assert first > 100 and again > 0.5 * first


class KilledBySignal(Tokens):
    def build_model(self, config):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would


@pytest.mark.slow
def test_a_fresh_process_killed_by_a_signal_is_a_lost_process_not_a_plain_error():
    from accelsweep.trainables.loop.failures import KILLED, failure_cause
    from accelsweep.trainables.fresh_process import run_in_fresh_process

    with pytest.raises(RuntimeError, match="killed by SIGKILL") as caught:
        list(run_in_fresh_process(TrialConfig.make(workload=import_path(KilledBySignal), **QUICK)))
    assert failure_cause(caught.value) == KILLED


SCRIPT_FOLDER_WORKLOAD = '''
import torch
from accelsweep.trainables.workloads.base import Workload


class Beside(Workload):
    def build_model(self, config):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))

    def dataset(self, config, rank, world_size):
        return torch.utils.data.TensorDataset(torch.randn(64, 12), torch.randint(3, (64,)))
'''


@pytest.mark.slow  # 5 s or more in the quick lane
def test_a_fresh_process_trial_imports_a_workload_from_the_driver_scripts_folder(tmp_path, monkeypatch):
    """A sweep script's own workload sits beside it; Ray puts that folder on its workers'
    path, and fresh_process_trainable's child must see it too (it once failed every trial
    with "No module named ..." though the plan accepted the workload)."""
    from accelsweep.trainables.fresh_process import run_in_fresh_process

    (tmp_path / "beside_my_sweep.py").write_text(SCRIPT_FOLDER_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))  # as Ray does on a worker: the driver script's folder
    monkeypatch.delenv("PYTHONPATH", raising=False)
    config = TrialConfig.make(workload="beside_my_sweep:Beside", **QUICK)
    results = list(run_in_fresh_process(config))
    assert len(results) == 2 and results[-1]["throughput_samples_per_s"] > 0


@pytest.mark.slow  # 5 s or more in the quick lane: two fresh processes import torch
def test_the_memory_baseline_collects_an_earlier_trials_cycles_but_walks_the_libraries_once():
    """In a trial process (a Ray worker), the first baseline collects everything, an old
    cycle included, then freezes what is left (a full collection walked half a million
    objects of the libraries per trial); a later trial's baseline still frees what an
    earlier trial left in reference cycles. Anywhere else (a notebook, this test process)
    nothing is frozen. In fresh processes: the freeze is process-wide."""
    import subprocess
    import sys

    probe = """
import gc, sys, weakref
import torch
from accelsweep.trainables.platforms import cpu
if sys.argv[1] == "trial":
    cpu._runs_only_trials = lambda: True  # what a Ray worker process is
class Node:
    pass
def cycle():
    node = Node(); node.cycle = node; node.weights = torch.zeros(1024)  # a model, in a cycle
    return node
old = cycle(); gc.collect(); gc.collect()  # in the oldest generation
first, old = weakref.ref(old), None
gc.disable()  # no automatic collection: only the baseline's may free them
platform = cpu.CpuPlatform()
platform.reset_peak_memory(torch.device("cpu"))
frozen = gc.get_freeze_count()
second = weakref.ref(cycle())  # an earlier trial's model, left in a cycle
platform.reset_peak_memory(torch.device("cpu"))
print(frozen, first() is None, second() is None)
"""
    said = {where: subprocess.run([sys.executable, "-c", probe, where], capture_output=True, text=True,
                                  check=True).stdout.split() for where in ("trial", "notebook")}
    assert int(said["trial"][0]) > 100_000 and said["trial"][1:] == ["True", "True"], said
    assert said["notebook"] == ["0", "True", "True"], said
