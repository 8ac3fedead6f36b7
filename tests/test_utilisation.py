"""How far from the hardware's limit: model FLOPs counted from the model (checked against
hand-counted ones), the CPU's peak (measured here, and theoretical from the ISA and the
clock), datasheet peaks that never claim to be measured, each training trial's MFU, and
the sweep's goal (--stop-at-utilisation) that ends it."""

from __future__ import annotations

import math
import sys

import pytest

from accelsweep.trainables import peaks
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.flop_count import FlopCount, count_model_flops
from accelsweep.trainables.peaks import Peak
from accelsweep.trainables.utilisation import TrialUtilisation, utilisation_line
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, import_path, knob

IN, HIDDEN, OUT = 8, 16, 4


class TinyMlp(Workload):
    """Linear(8, 16) -> ReLU -> Linear(16, 4): FLOPs that can be counted by hand."""

    def build_model(self, config):
        import torch

        return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))

    def dataset(self, config, rank, world_size):
        import torch

        return torch.utils.data.TensorDataset(torch.randn(64, IN), torch.randint(0, OUT, (64,)))


class TinyConv(TinyMlp):
    """Conv2d(3, 4, 3, padding=1) on 8x8 images, flattened into Linear(256, 4)."""

    def build_model(self, config):
        import torch

        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(256, OUT))

    def dataset(self, config, rank, world_size):
        import torch

        return torch.utils.data.TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, OUT, (16,)))


class NotOnMeta(TinyMlp):
    """A model whose building reads a value (as loading weights would): the meta device
    cannot give one, so the count falls back to the CPU."""

    def build_model(self, config):
        import torch

        model = super().build_model(config)
        if float(model[0].weight.detach().abs().sum()) < 0:  # a read: impossible on the meta device
            raise AssertionError
        return model


class Declared(TinyMlp):
    def flops_per_item(self, config):
        return 1234.0


def config_for(workload_class):
    from accelsweep.trainables.config import TrialConfig

    return TrialConfig.make(workload=import_path(workload_class), batch_size=4)


def test_the_flop_count_of_a_tiny_mlp_is_its_hand_counted_value(tmp_path):
    # Forward: 2 x in x out per Linear. Backward: the second Linear's input and weight
    # gradients (2 x 16 x 4 each); the first Linear's weight gradient only, its input
    # (the batch) needing none. Biases, ReLU and the loss are elementwise: not counted.
    forward = 2 * IN * HIDDEN + 2 * HIDDEN * OUT
    backward = 2 * (2 * HIDDEN * OUT) + 2 * IN * HIDDEN
    counted = count_model_flops(TinyMlp(), config_for(TinyMlp), cache=str(tmp_path / "flops.json"))
    assert counted.per_item == forward + backward == 896
    assert "meta device" in counted.method and "forward and backward" in counted.method


def test_the_flop_count_of_a_tiny_convolution_is_its_hand_counted_value(tmp_path):
    conv = 2 * (3 * 3 * 3) * 4 * 8 * 8  # 2 x (cin x k x k) x cout x output pixels
    linear = 2 * 256 * OUT
    # Backward: the conv's weight gradient (its input needs none) and the Linear's two.
    expected = conv + linear + conv + 2 * linear
    counted = count_model_flops(TinyConv(), config_for(TinyConv), cache=str(tmp_path / "flops.json"))
    assert counted.per_item == expected


def test_a_count_is_cached_on_disk_and_a_model_the_meta_device_refuses_is_counted_on_the_cpu(tmp_path):
    from accelsweep.trainables import flop_count

    cache = str(tmp_path / "flops.json")
    counted = count_model_flops(NotOnMeta(), config_for(NotOnMeta), cache=cache)
    assert counted.per_item == 896 and "on the CPU" in counted.method
    flop_count._COUNTED.clear()  # a new process: the disk's copy is found
    again = count_model_flops(NotOnMeta(), config_for(NotOnMeta), cache=cache)
    assert again.cached and again.per_item == 896


def test_a_workloads_own_count_is_taken_as_declared():
    counted = count_model_flops(Declared(), config_for(Declared))
    assert counted.per_item == 1234.0 and "declared by the workload" in counted.method


CPUINFO_AVX512 = "model name\t: Some Xeon\ncpu MHz\t\t: 3000.000\nflags\t\t: fpu avx2 avx512f amx_bf16\n"
CPUINFO_VM = "model name\t: AMD EPYC\nbogomips\t: 4890.81\nflags\t\t: fpu avx avx2 fma\n"


def test_the_theoretical_cpu_peak_is_cores_times_clock_times_flops_per_cycle():
    tflops, basis = peaks.cpu_theoretical_peak(CPUINFO_AVX512, 4, "float32")
    assert tflops == pytest.approx(4 * 3.0 * 64 / 1e3)
    assert "4 cores x 3 GHz" in basis and "64 FLOP/cycle" in basis and "avx512f" in basis
    amx, basis = peaks.cpu_theoretical_peak(CPUINFO_AVX512, 4, "bfloat16")
    assert amx == pytest.approx(4 * 3.0 * 1024 / 1e3) and "amx_bf16" in basis
    # A VM without cpufreq or cpu MHz: the TSC rate (bogomips / 2), said so; bf16 emulated.
    vm, basis = peaks.cpu_theoretical_peak(CPUINFO_VM, 2, "bfloat16")
    assert vm == pytest.approx(2 * 2.44540 * 32 / 1e3, rel=1e-4)
    assert "bogomips / 2" in basis and "no native bfloat16" in basis


def test_a_datasheet_peak_says_where_it_is_from_and_that_it_was_not_measured_here():
    peak = peaks.peak_for("cuda", "bf16-autocast", devices=2, device_name="cuda: NVIDIA H100 80GB HBM3")
    assert peak.tflops == pytest.approx(2 * 989.4) and not peak.measured
    assert "not measured here" in peak.basis and "H100" in peak.basis and "datasheet" in peak.basis
    neuron = peaks.peak_for("neuron", "bf16", device_name="neuron: NeuronCore (xla:0)")
    assert neuron.tflops == 95.0 and "Neuron docs" in neuron.basis
    unknown = peaks.peak_for("cuda", "fp32", device_name="cuda: Some Future GPU")
    assert math.isnan(unknown.tflops) and "no datasheet" in unknown.basis and "H100" in unknown.basis
    for entry in peaks.DATASHEET.values():  # every figure cites its source
        assert entry.source and all(v > 0 for v in entry.tflops.values()) and entry.bandwidth_gb_s > 0


@pytest.mark.slow  # 5 s or more in the quick lane
@pytest.mark.host_timing
def test_the_cpu_peak_microbenchmark_repeats_within_5_percent_on_a_quiet_machine():
    """Three measurements back to back, as a trial takes one (1024, best of 5 runs of 0.4 s).
    A quiet machine: no other process took cores (/proc) and its own speed held (the fixed
    CPU loop timed between them, as between a trial's windows, moved under 5%); a shared
    VM whose speed drifts is not one, and the test says so rather than time it."""
    from accelsweep.trainables.timing.windows import coefficient_of_variation, host_probe_s

    probes, figures = [host_probe_s()], []
    for _ in range(3):
        figures.append(peaks.measure_cpu_peak("float32", threads=1))
        probes.append(host_probe_s())
    if any(f["contended"] for f in figures):
        pytest.skip("not a quiet machine: other processes took cores during the measurement "
                    f"({max(f['other_cpus'] for f in figures):.1f} cores)")
    if coefficient_of_variation(probes) > 0.05:
        pytest.skip(f"not a quiet machine: its own speed moved (a fixed CPU loop's cv "
                    f"{coefficient_of_variation(probes):.0%} between the measurements)")
    best = [f["tflops"] for f in figures]
    assert max(best) / min(best) <= 1.05, (best, probes)
    theoretical, _ = peaks.cpu_theoretical_peak(peaks._read_cpuinfo(), 1, "float32")
    if math.isfinite(theoretical):  # a measured peak above the ISA's is a wrong clock or FLOP count
        assert max(best) <= theoretical * 1.3, (best, theoretical)


def fake_gemm(values, contended=False, calls=None):
    """A stand-in for ``peaks.measure_cpu_peak`` whose best runs are ``values`` in turn;
    ``calls`` collects what it was asked."""
    values = iter(values)

    def measure(dtype, threads):
        if calls is not None:
            calls.append((dtype, threads))
        value = next(values)
        return {"tflops": value, "best": value, "runs_tflops": [value], "dtype": dtype, "threads": threads,
                "gemm_size": 64, "torch": "x", "measured_at": "now", "other_cpus": 1.0 if contended else 0.0,
                "contended": contended}

    return measure


def test_a_cpu_peak_is_measured_once_per_machine_and_then_read_from_the_cache(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(peaks, "measure_cpu_peak", fake_gemm([0.1, 0.1], calls=calls))
    cache = str(tmp_path / "peaks.json")
    first = peaks.cpu_peak("float32", 2, cpuinfo=CPUINFO_VM, cache=cache)
    second = peaks.cpu_peak("float32", 2, cpuinfo=CPUINFO_VM, cache=cache)
    assert calls == [("float32", 2)] and first.tflops == second.tflops == 0.1
    assert "measured here" in first.basis and "(cached)" in second.basis and first.measured
    assert first.theoretical_tflops == pytest.approx(2 * 2.44540 * 32 / 1e3, rel=1e-4)


def test_a_quiet_peak_is_measured_again_at_later_moments_until_enough_agree_and_the_best_kept(tmp_path,
                                                                                               monkeypatch):
    """A bf16 peak cached from one slow moment of a shared VM (about half the GEMM's
    speed a minute later, with no contention flagged) made every later trial's utilisation
    twice its truth."""
    calls, clock, quiet = [], [1000.0], [True]
    monkeypatch.setattr(peaks.time, "time", lambda: clock[0])
    monkeypatch.setattr(peaks, "quiet_now", lambda: quiet[0])
    monkeypatch.setattr(peaks, "measure_cpu_peak", fake_gemm([0.2, 0.41, 0.39, 0.5], calls=calls))
    cache = str(tmp_path / "peaks.json")

    def peak_at(seconds):
        clock[0] = seconds
        return peaks.cpu_peak("bfloat16", 2, cpuinfo=CPUINFO_VM, cache=cache)

    assert peak_at(1000).tflops == 0.2
    assert peak_at(1000 + peaks.PEAK_SPACING_S - 1).tflops == 0.2  # too soon for another moment
    quiet[0] = False
    assert "(cached)" in peak_at(1000 + peaks.PEAK_SPACING_S).basis  # due, but the machine is busy: later
    quiet[0] = True
    assert peak_at(1000 + peaks.PEAK_SPACING_S + 1).tflops == 0.41  # the second moment
    third = 1000 + 3 * peaks.PEAK_SPACING_S
    assert peak_at(third).tflops == 0.41  # the third moment measured 0.39: the best stands
    assert peak_at(third + 10 * peaks.PEAK_SPACING_S).tflops == 0.41  # settled: 0.5 is never measured
    assert peaks.PEAK_MOMENTS == 3 and len(calls) == 3


def test_a_contended_peak_is_measured_again_when_the_machine_is_quiet_and_the_best_kept(tmp_path, monkeypatch):
    quiet = iter([False, True, True, True])
    monkeypatch.setattr(peaks, "quiet_now", lambda: next(quiet))
    monkeypatch.setattr(peaks, "measure_cpu_peak", fake_gemm([0.05, 0.09, 0.07, 0.2], contended=True))
    cache = str(tmp_path / "peaks.json")
    seen = [peaks.cpu_peak("float32", 2, cpuinfo=CPUINFO_VM, cache=cache) for _ in range(5)]
    # Measured; a busy machine: the cached one; quiet: measured again, the best kept each time.
    assert [p.tflops for p in seen] == [0.05, 0.05, 0.09, 0.09, 0.2]
    assert "may understate the peak" in seen[0].basis and "(cached)" in seen[1].basis


def test_a_trials_utilisation_is_its_model_flops_times_throughput_over_the_peak():
    utilisation = TrialUtilisation(FlopCount(1e9, "counted"),
                                   Peak(0.2, "float32", "measured here: ...", measured=True, theoretical_tflops=0.4,
                                        theoretical_basis="theoretical: ..."))
    fields = utilisation.fields(items_per_s=50.0)
    assert fields["model_tflops"] == pytest.approx(0.05)
    assert fields["mfu"] == pytest.approx(0.25) and fields["mfu_theoretical"] == pytest.approx(0.125)
    line = utilisation_line(fields)
    assert "25.0% of this CPU's attainable float32 peak" in line and "12.5% of its theoretical 0.4" in line
    nothing = TrialUtilisation(FlopCount(math.nan, "not counted"), Peak(math.nan, "float32", "no peak", False),
                               note="model FLOPs not counted (ValueError: x)")
    assert utilisation_line(nothing.fields(50.0)).startswith("utilisation unknown: model FLOPs not counted")


@pytest.mark.parametrize("goal", [0, 1.5, -0.1, True, "half"])
def test_a_utilisation_goal_outside_0_to_1_is_refused_by_name(goal):
    from accelsweep.sweeps.driver.define.plan import check_utilisation_goal
    from accelsweep.trainables.metrics import TRAINING_METRICS

    with pytest.raises(ConfigError) as refused:
        check_utilisation_goal(goal, TRAINING_METRICS)
    assert "stop_at_utilisation" in str(refused.value) and "(0, 1]" in str(refused.value)


def test_a_utilisation_goal_for_a_trainable_without_utilisation_is_refused():
    from accelsweep.sweeps.driver.define.plan import check_utilisation_goal
    from accelsweep.trainables.metrics import KERNEL_METRICS

    with pytest.raises(ConfigError, match="stop_at_utilisation"):
        check_utilisation_goal(0.4, KERNEL_METRICS)


def test_the_flag_reaches_the_sweep():
    from accelsweep.sweeps.driver.define.cli import common_parser, sweep_options

    parser = common_parser("t", default_samples=2)
    assert sweep_options(parser.parse_args(["--stop-at-utilisation", "0.4"]), default_samples=2)[
        "stop_at_utilisation"] == 0.4
    assert sweep_options(parser.parse_args([]), default_samples=2)["stop_at_utilisation"] is None


@pytest.mark.host_timing
@pytest.mark.slow
def test_a_sweep_stops_at_its_utilisation_goal_and_says_so(ray_session, tracking_uri):
    """A goal every trial reaches: the first trial ends the sweep, the rest are not run,
    and the summary, the parent run and the progress say why."""
    from mlflow.tracking import MlflowClient

    from accelsweep import Sweep, run_sweep
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.metrics import TRAINING_METRICS
    from accelsweep.trainables.trainable import train_trainable

    lines = []
    result = run_sweep(Sweep(
        name="goal", trainable=train_trainable, metrics=TRAINING_METRICS,
        base=TrialConfig.make(model="vit-micro", cpus_per_worker=1, batch_size=8, warmup_steps=1,
                              window_min_steps=2, window_min_s=0.05, windows=1),
        space=lambda trial: {"batch_size": trial.suggest_categorical("batch_size", [4, 8, 16])},
        num_samples=3, scheduler="none", tracking_uri=tracking_uri, stop_at_utilisation=1e-6,
        max_concurrent_trials=1, print_line=lines.append,
    ))
    ran = [r for r in result.records if r.status == "finished"]
    assert len(ran) == 1, result.summary
    assert "stopped at its goal: trial 1 reached" in result.summary, result.summary
    assert any(line.startswith("[goal] trial 1 reached") for line in lines)
    assert "utilisation: best (trial 1) at" in result.summary and "measured here" in result.summary
    parent = MlflowClient(tracking_uri).get_run(result.parent_run_id)
    assert "trial 1 reached" in parent.data.tags["goal_reached"]
    assert parent.data.tags["status"] == "finished"


class NeverBuilds(TinyMlp):
    def build_model(self, config):
        raise RuntimeError("no weights here")


def test_a_model_that_cannot_be_counted_says_why_on_each_device(tmp_path):
    counted = count_model_flops(NeverBuilds(), config_for(NeverBuilds), cache=str(tmp_path / "flops.json"))
    assert math.isnan(counted.per_item)
    assert counted.method == ("not counted: on meta: RuntimeError: no weights here; "
                              "on cpu: RuntimeError: no weights here")


def test_the_summary_names_the_baseline_s_own_peak_when_its_precision_differs():
    """On the H100 the fp32 baseline sat at 42.6% of the fp32 peak and the bf16 best at 12.4%
    of the bf16 one, 4.3x faster: the line must say whose peak each share is of."""
    from accelsweep.sweeps.driver.record.trial_record import TrialRecord
    from accelsweep.sweeps.driver.reporting.summary import utilisation_lines

    def trial(number, dtype, tflops, peak):
        return TrialRecord(number=number, trial_id=str(number), searched={}, config={}, resources={},
                           is_baseline=number == 1, created_at=0.0, status="finished",
                           result={"model_tflops": tflops, "mfu": tflops / peak, "peak_tflops": peak,
                                   "peak_dtype": dtype, "peak_measured": 0.0, "peak_basis": "datasheet",
                                   "model_flops_per_item": 1e9, "flops_method": "counted"})

    best, fp32_baseline = trial(7, "bfloat16", 122.7, 989.4), trial(1, "float32", 28.51, 66.9)
    line = utilisation_lines(best, fp32_baseline)[0]
    assert "12.4% of the datasheet bfloat16 peak" in line
    assert line.endswith("the baseline at 42.6% of its own float32 peak (66.9 TFLOP/s)")
    same_precision = utilisation_lines(best, trial(1, "bfloat16", 28.51, 989.4))[0]
    assert same_precision.endswith("the baseline at 2.9%")
