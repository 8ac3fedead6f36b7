"""A training trial's distance from the hardware's limit: its model FLOPs per item
(trainables/flop_count.py) times its throughput, as TFLOP/s and as a fraction of the peak
of what it holds (trainables/peaks.py): MFU.

    utilisation = TrialUtilisation.of(workload, config, platform, device, world)
    result.update(utilisation.fields(throughput_items_per_s))

Neither the count nor the peak may fail a trial: where one cannot be had, the figures
are NaN and ``utilisation_note`` says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accelsweep.trainables.flop_count import FlopCount, count_model_flops
from accelsweep.trainables.peaks import Peak, cpu_peak, peak_for, precision_dtype

__all__ = ["TrialUtilisation"]


@dataclass(frozen=True)
class TrialUtilisation:
    flops: FlopCount
    peak: Peak
    note: str = ""

    @classmethod
    def of(cls, workload, config, platform, device, world) -> "TrialUtilisation":
        note = []
        try:
            flops = count_model_flops(workload, config)
        except Exception as error:  # noqa: BLE001 - a figure missing, never a trial failed
            flops = FlopCount(math.nan, "not counted")
            note.append(f"model FLOPs not counted ({type(error).__name__}: {error})")
        try:
            peak = _peak(config, platform, device, world)
        except Exception as error:  # noqa: BLE001
            peak = Peak(math.nan, precision_dtype(config.precision), "no peak", measured=False)
            note.append(f"no peak ({type(error).__name__}: {error})")
        return cls(flops, peak, "; ".join(note))

    def fields(self, items_per_s: float) -> dict:
        achieved = self.flops.per_item * items_per_s / 1e12
        fields = {"model_tflops": achieved, "mfu": achieved / self.peak.tflops,
                  "mfu_theoretical": achieved / self.peak.theoretical_tflops,
                  **self.flops.fields(), **self.peak.fields()}
        if self.note:
            fields["utilisation_note"] = self.note
        return fields


def _peak(config, platform, device, world) -> Peak:
    """What the trial holds, at its peak: on a CPU (torch's, or torch-xla's CPU client) the
    cores of all its workers, measured here; elsewhere one datasheet device per worker."""
    described = platform.describe_device(device)
    # By the device that ran, not the platform's name: the Neuron stand-in trains on the CPU.
    if described.startswith(("cpu: ", "xla: CPU")):
        return cpu_peak(precision_dtype(config.precision), threads=config.cpus_per_worker * world.size)
    return peak_for(config.platform, config.precision, devices=world.size, device_name=described)


def utilisation_line(result: dict) -> str:
    """One sentence for a trial's utilisation: "41.2% of this CPU's attainable float32 peak
    (0.13 TFLOP/s measured here), 33.0% of its theoretical 0.157 TFLOP/s"."""
    mfu = result.get("mfu", math.nan)
    if not isinstance(mfu, (int, float)) or not math.isfinite(mfu):
        return "utilisation unknown: " + str(result.get("utilisation_note") or result.get("peak_basis") or
                                             "no model FLOPs or peak reported")
    dtype = result.get("peak_dtype", "")
    measured = bool(result.get("peak_measured"))
    where = "this CPU's attainable" if measured else "the datasheet"
    line = (f"{result['model_tflops']:.3g} TFLOP/s = {mfu:.1%} of {where} {dtype} peak "
            f"({result['peak_tflops']:.3g} TFLOP/s{' measured here' if measured else ', not measured here'})")
    theoretical = result.get("mfu_theoretical", math.nan)
    if measured and math.isfinite(theoretical):
        line += f", {theoretical:.1%} of its theoretical {result['peak_tflops_theoretical']:.3g} TFLOP/s"
    if measured and mfu > 1:  # the peak is a measurement: one taken while the machine ran slower understates it
        line += (" (above the measured peak: it was measured while this machine ran slower; delete "
                 "~/.cache/accelsweep/peaks.json to measure it again)")
    return line
