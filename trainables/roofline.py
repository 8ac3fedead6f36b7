"""A kernel against its roofline: how fast it could run, given what one call computes and moves, on what it runs.

    roofline = kernel_roofline(config, device_label, flops=True, bytes_moved=True)
    result.update(roofline.fields(flops, bytes_moved, latency_p50_s))

The roofline model (Williams, Waterman and Patterson, CACM 2009): a call doing F FLOPs
while moving B bytes (its arithmetic intensity I = F / B, FLOP/byte) runs no faster than
min(peak compute, I x peak bandwidth). Left of the ridge point (peak compute / peak
bandwidth) the bandwidth bounds it (memory-bound), right of it the compute. B is the
least a call must move (kernels/registry.py ``OpSpec.bytes_moved``), so the bound is the
hardware's, not the kernel's: a kernel that moves more than it must sits further below.

The peaks come from trainables/peaks.py (``kernel_roofline`` says which). A peak that
cannot be had never fails a trial: its figures are NaN and its basis says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from accelsweep.kernels.registry import get_op
from accelsweep.trainables import peaks

__all__ = ["DATASHEET", "IN_WORDS", "MEASURED_HERE", "Roofline", "basis_kind", "is_integer_dtype", "kernel_roofline",
           "roofline_phrase"]

MEASURED_HERE = "measured here"
HALF_DTYPES = ("bfloat16", "float16")
DATASHEET = "datasheet"


# How a roof's figure is said beside it: a datasheet's figure is never called measured.
IN_WORDS = {MEASURED_HERE: "measured here", DATASHEET: "datasheet, not measured here"}


def basis_kind(basis: str) -> str:
    """"measured here" or "datasheet" for a peak's basis (trainables/peaks.py starts each
    basis with one), else "" (no peak)."""
    for kind in (MEASURED_HERE, DATASHEET):
        if basis.startswith(kind):
            return kind
    return ""


def _in_words(basis: str) -> str:
    return IN_WORDS.get(basis_kind(basis), "of unknown basis")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ratio(numerator: Optional[float], denominator: float) -> float:
    if not (_finite(numerator) and _finite(denominator)) or denominator <= 0:
        return math.nan
    return numerator / denominator


@dataclass(frozen=True)
class Roofline:
    """The two roofs: peak compute (TFLOP/s) and peak bandwidth (GB/s), each with how it
    was found (its basis: "measured here: ...", "datasheet ...", or why there is none)."""

    peak_tflops: float
    peak_basis: str
    bandwidth_gb_s: float
    bandwidth_basis: str

    @property
    def ridge_intensity(self) -> float:
        """FLOP/byte where the bandwidth slope meets the compute roof."""
        return _ratio(self.peak_tflops * 1e3, self.bandwidth_gb_s)

    def bound_tflops(self, intensity: float) -> float:
        """The most TFLOP/s a call of this arithmetic intensity can reach: NaN where a roof
        is unknown (one roof alone bounds nothing: the other may be the lower)."""
        slope = intensity * self.bandwidth_gb_s / 1e3  # FLOP/byte x GB/s = GFLOP/s
        if not (_finite(slope) and _finite(self.peak_tflops)):
            return math.nan
        return min(self.peak_tflops, slope)

    def bound(self, intensity: float) -> str:
        """"compute" or "memory": which roof bounds a call of this intensity ("" unknown)."""
        ridge = self.ridge_intensity
        if not (_finite(ridge) and _finite(intensity)):
            return ""
        return "compute" if intensity >= ridge else "memory"

    def fields(self, flops: Optional[float], bytes_moved: Optional[float], seconds: float) -> dict:
        """What a kernel result carries: its rates at ``seconds`` per call (the p50), its
        intensity, the roofs and its fractions of them. NaN where the op declares no count
        (``flops`` or ``bytes_moved`` None) or a roof is unknown."""
        tflops = _ratio(flops, seconds) / 1e12
        gbytes_per_s = _ratio(bytes_moved, seconds) / 1e9
        intensity = _ratio(flops, bytes_moved)
        bound = self.bound_tflops(intensity)
        return {
            "tflops": tflops,
            "gbytes_per_s": gbytes_per_s,
            "arithmetic_intensity": intensity,
            "peak_tflops": self.peak_tflops,
            "peak_gbytes_per_s": self.bandwidth_gb_s,
            "compute_fraction": _ratio(tflops, self.peak_tflops),
            "bandwidth_fraction": _ratio(gbytes_per_s, self.bandwidth_gb_s),
            "roofline_tflops": bound,
            "roofline_fraction": _ratio(tflops, bound),
            "peak_basis": self.peak_basis,
            "bandwidth_basis": self.bandwidth_basis,
        }

    @classmethod
    def of_result(cls, result: Mapping) -> "Roofline":
        """The roofs a kernel result was held against (as ``fields`` wrote them)."""
        def number(name: str) -> float:
            value = result.get(name, math.nan)
            return float(value) if _finite(value) else math.nan

        return cls(number("peak_tflops"), str(result.get("peak_basis", "")), number("peak_gbytes_per_s"),
                   str(result.get("bandwidth_basis", "")))


def kernel_roofline(config, device_label: str, flops: bool, bytes_moved: bool) -> Roofline:
    """The roofs of what a kernel trial runs on, looked up only where its op declares the
    count each one needs (``flops``: compute; ``bytes_moved``: bandwidth) and the trial is
    a speed figure. ``config``: a KernelConfig (platform, dtype, torch_threads);
    ``device_label``: the harness's description of the device it ran on.

    On a CPU both peaks are measured here (a GEMM in the kernel's dtype, or in float32
    where that is faster for a 16-bit dtype; the best of STREAM-style kernels) on the
    threads the kernel runs with, cached per machine; elsewhere they are the datasheet's,
    never called measured. An integer dtype (int8) has no FLOP peak here: its compute roof
    is NaN, and the basis says so."""
    spec = get_op(config.op)
    if config.platform in spec.impl(config.impl).interpreted_on:
        why = "none: interpreted (not a speed figure)"
        return Roofline(math.nan, why, math.nan, why)
    peak, peak_basis = math.nan, f"none: op {spec.name} declares no FLOP count"
    bandwidth, bandwidth_basis = math.nan, f"none: op {spec.name} declares no bytes moved"
    if flops:
        peak, peak_basis = _unfailing(lambda: _compute_peak(config, device_label))
    if bytes_moved:
        bandwidth, bandwidth_basis = _unfailing(lambda: _bandwidth(config, device_label))
    return Roofline(peak, peak_basis, bandwidth, bandwidth_basis)


def _unfailing(look_up) -> tuple[float, str]:
    try:
        return look_up()
    except Exception as error:  # noqa: BLE001 - a figure missing, never a trial failed
        return math.nan, f"none: it could not be had ({type(error).__name__}: {error})"


def _on_cpu(config, device_label: str) -> bool:
    """A CPU's peaks hold: torch's, numpy's and JAX's CPU, and torch-xla's CPU client."""
    return config.platform == "cpu" or device_label.startswith("xla: CPU")


def is_integer_dtype(dtype: str) -> bool:
    """int8 and the like: ops on them are integer ops, TOP/s, not FLOP/s."""
    import numpy as np

    try:
        return np.dtype(dtype).kind in "iu"
    except TypeError:  # bfloat16: ml_dtypes', not numpy's
        return False


def _compute_peak(config, device_label: str) -> tuple[float, str]:
    if is_integer_dtype(config.dtype):
        # Its multiplies are integer ops (its tflops is TOP/s), for which nothing here
        # measures or tabulates a peak: a FLOP peak would be the wrong roof.
        return math.nan, f"none: {config.dtype} runs integer ops, and no integer peak is measured or tabulated here"
    if _on_cpu(config, device_label):
        peak = peaks.cpu_peak(config.dtype, config.torch_threads)
        if config.dtype in HALF_DTYPES:
            # A 16-bit kernel may convert to float32 and compute there. Where torch's 16-bit
            # GEMM is the slower (no native bfloat16, e.g. AVX2 without AVX512_BF16: emulated),
            # the float32 rate is the roof; the 16-bit GEMM's would be one a kernel passes.
            single = peaks.cpu_peak("float32", config.torch_threads)
            if single.tflops > peak.tflops:
                return single.tflops, (f"{single.basis}; the float32 rate, above this CPU's {config.dtype} GEMM "
                                       f"({peak.tflops:.3g} TFLOP/s): a {config.dtype} kernel may compute in float32")
    else:
        peak = peaks.peak_for(config.platform, config.dtype, devices=1, device_name=device_label)
    return peak.tflops, peak.basis


def _bandwidth(config, device_label: str) -> tuple[float, str]:
    if _on_cpu(config, device_label):
        return peaks.cpu_bandwidth(config.torch_threads)
    sheet = peaks.datasheet_peak(device_label or config.platform)
    if sheet is None:
        known = ", ".join(d.device for d in peaks.DATASHEET.values())
        return math.nan, f"none: no datasheet bandwidth for {device_label or config.platform!r} (known: {known})"
    return sheet.bandwidth_gb_s, (f"datasheet (not measured here): {sheet.bandwidth_gb_s:g} GB/s per "
                                  f"{sheet.device}, from the {sheet.source}")


def roofline_phrase(result: Mapping) -> str:
    """Where a kernel result stands, in words: "at 62% of its roofline bound (compute-bound,
    85.3 FLOP/byte; peak 0.13 TFLOP/s measured here)"; with bytes moved but no bound (no
    FLOP count, or no FLOP peak), its share of the peak bandwidth and why there is no
    bound; "" where it has neither."""
    roofline = Roofline.of_result(result)
    fraction, intensity = result.get("roofline_fraction"), result.get("arithmetic_intensity")
    if _finite(fraction):
        bound = roofline.bound(intensity)
        if bound == "compute":
            roof = f"peak {roofline.peak_tflops:.3g} TFLOP/s {_in_words(roofline.peak_basis)}"
        else:
            roof = f"peak {roofline.bandwidth_gb_s:.3g} GB/s {_in_words(roofline.bandwidth_basis)}"
        return f"at {_percent(fraction)} of its roofline bound ({bound}-bound, {intensity:.3g} FLOP/byte; {roof})"
    share = result.get("bandwidth_fraction")
    if not _finite(share):
        return ""
    said = (f"moving {result['gbytes_per_s']:.3g} GB/s, {_percent(share)} of the peak bandwidth "
            f"({roofline.bandwidth_gb_s:.3g} GB/s {_in_words(roofline.bandwidth_basis)})")
    if _finite(result.get("tflops")) and roofline.peak_basis.startswith("none: "):
        said += f"; no roofline bound: no compute roof ({roofline.peak_basis[len('none: '):]})"
    return said


def _percent(fraction: float) -> str:
    """62%, 5.3%, 0.061%: a small share keeps two figures rather than reading 0%."""
    return f"{fraction:.0%}" if fraction >= 0.1 else f"{fraction * 100:.2g}%"
